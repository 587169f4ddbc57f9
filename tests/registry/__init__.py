"""The registry contract for every kind, the table of kinds, connect(), plugins and wire formats."""

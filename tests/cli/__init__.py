"""The waypost command as a user runs it."""

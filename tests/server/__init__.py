"""waypost.serve / serve_async: lifecycle, advertised addresses, shutdown hooks, registries late or absent."""

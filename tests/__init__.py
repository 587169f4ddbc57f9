"""waypost's test suite: one folder per registry kind and per layer of src/waypost (fixtures: conftest.py)."""

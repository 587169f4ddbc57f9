"""Test backends: the Echo gRPC service (generated stubs, unchanged) and helpers to run it in-process or as a subprocess."""

"""The memory kind: an in-process registry with etcd's semantics (``memory://NAME`` registry URLs,
``memory://NAME/?key=K`` dial targets), for tests, examples and single-process setups."""

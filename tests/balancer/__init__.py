"""The load-balancing policies: on a fake clock, and through channels over real servers."""

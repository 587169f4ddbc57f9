"""waypost's etcd client and the etcd registry against real etcd processes (and their shared helpers)."""

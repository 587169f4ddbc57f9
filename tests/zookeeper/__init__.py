"""zk:// registries and targets against a real ZooKeeper (and the server it runs)."""

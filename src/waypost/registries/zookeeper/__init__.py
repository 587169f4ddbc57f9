"""ZooKeeper: Kratos' layout of service instances as ephemeral nodes (``zk://``). docs/zookeeper.md."""

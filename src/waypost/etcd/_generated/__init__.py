"""Generated etcd message classes (scripts/gen_proto.sh); do not edit."""

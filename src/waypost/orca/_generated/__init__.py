"""Generated waypost.load.v1 message classes (scripts/gen_proto.sh); do not edit."""

"""Generated load-report message classes (scripts/gen_proto.sh); do not edit."""

"""The DNS kind (``dns:///host:port``: A/AAAA records, re-resolved periodically): its row (``kind.py``), its target
grammar, gRPC's (``target.py``), and its ``waypost.kinds.Discovery`` (``discovery.py``). docs/dns.md."""

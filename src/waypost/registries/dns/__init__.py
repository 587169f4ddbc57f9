"""The DNS kind's resolver (``dns:///host:port``: A/AAAA records, re-resolved periodically). Its target grammar is
gRPC's own and lives with the other built-in grammars (``resolver/target.py``); its row is in
``registry/kinds.py``. docs/dns.md."""

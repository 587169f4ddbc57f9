"""The direct kind: ``direct:///a:1,b:2`` dial targets (and gRPC's ``ipv4:``/``ipv6:`` forms, and plain ``host:port``):
the addresses given, nothing read. Its row (``kind.py``) and its ``waypost.kinds.Discovery`` (``discovery.py``)."""

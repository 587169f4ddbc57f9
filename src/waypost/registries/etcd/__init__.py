"""The etcd kind: keys under leases in an etcd cluster (``etcd://`` registry URLs, ``etcd:///HOSTS?key=K`` and
go-zero's ``discov://`` dial targets), over waypost's own etcd client (``waypost.etcd``). docs/etcd.md.

The package imports nothing heavy: ``kind`` is read by the table of kinds without loading the etcd client.
"""

"""The real-process test harness shared by tests/ and bench/: what both start and drive.

* ``backends``: the Echo gRPC service (generated stubs) run in-process or as processes of their own;
* ``chaos``: the chaos scenarios (tests/chaos asserts the short versions, bench/chaos_report.py prints the table);
* ``k8s``: a real kube-apiserver over a real etcd, and the scenarios run in a private network namespace;
* ``consul_agent``: a real Consul agent (built once from the Go module proxy);
* ``etcd_partition``: a 3-member etcd cluster whose peer links can be cut;
* ``tcp_proxy`` / ``latency_proxy``: a cuttable TCP proxy and a slow link;
* ``go_servers`` (Go builds, cached), ``proc_reaper`` (every started process stopped at exit), ``waiting``
  (bounded waits).

It imports nothing from tests/ (tests/project/test_architecture.py checks that, and that bench/ imports nothing
from tests/ either). It is not part of the package: pyproject.toml finds packages under src/ only
(tests/project/test_packaging.py checks that the wheel holds none of harness/, tests/, bench/ or examples/).
"""

"""A slow but working link to etcd (0.9 s each way) must not make a live lease count as lost."""

from __future__ import annotations

import json
import logging
import time

from harness.latency_proxy import LatencyProxy
from tests.etcd.helpers import registry
from waypost import Publisher

WATCH_FOR = 20.0  # seconds: four TTLs


def test_publisher_keeps_one_key_and_one_lease_over_a_slow_link(etcd, unique_key, caplog):
    caplog.set_level(logging.INFO, logger="waypost")
    host, port = etcd.endpoint.rsplit(":", 1)
    proxy = LatencyProxy((host, int(port)), delay=0.9)
    try:
        with registry(proxy.endpoint, dial_timeout=10.0, request_timeout=10.0) as slow, \
                registry(etcd.endpoint) as direct:
            pub = Publisher(slow, unique_key, "127.0.0.1:7301", ttl=5, timeout=30.0).start()
            try:
                key, lease = pub.key, pub.lease_id
                assert key and lease
                samples = 0
                end = time.monotonic() + WATCH_FOR
                while time.monotonic() < end:
                    kvs = direct.sync.get(unique_key, prefix=True).kvs
                    assert [(kv.key, kv.lease) for kv in kvs] == [(key, lease)]
                    assert (pub.key, pub.lease_id) == (key, lease)
                    samples += 1
                    time.sleep(1.0)
                assert samples >= 10 and pub.registrations == 1
                leases = json.loads(etcd.etcdctl("lease", "list", "-w", "json")).get("leases") or []
                assert [le["id"] for le in leases] == [lease]
                assert direct.sync.time_to_live(lease) > 0
            finally:
                pub.stop()
    finally:
        proxy.close()
    lost = [r.getMessage() for r in caplog.records if "lost" in r.getMessage() or r.levelno >= logging.WARNING]
    assert lost == []


def test_stall_limit_follows_the_lease_deadline_not_one_answer():
    from waypost.etcd.lease import _Lease

    st = _Lease(1, ttl=5, now=100.0)  # deadline 105
    st.sent.append(101.7)  # a renewal on its way (1.8 s round trip: due at 103.5)
    assert st.stall_at() == 104.0  # 1 s (TTL/5) before the deadline: a slow answer still counts
    st.expires = 101.2  # the deadline is (nearly) gone: give the renewal 1 s, then move
    assert st.stall_at() == 102.7
    long = _Lease(2, ttl=60, now=0.0)
    long.sent.append(20.0)
    assert long.stall_at() == 57.0  # the margin is capped at 3 s

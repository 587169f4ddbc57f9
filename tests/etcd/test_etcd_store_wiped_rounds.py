"""A single etcd wiped and restarted, round after round, at the very revision the client had seen.

Two puts on a fresh store take it to revision 3; the store that comes back after the wipe takes two
puts to revision 3 as well, with the same cluster id (same name, peer URL and cluster token). The
subscriber must end with exactly the two new addresses whatever the timing of the puts relative to
the restart (at once, or after the watch stream is back), and whichever client writes them: the
subscriber's own registry, or another process (``etcdctl``), whose writes this client never sees.
Real etcd, real SIGKILL/SIGTERM, several rounds per case (the failure depended on timing).
"""

from __future__ import annotations

import logging
import shutil
import time

import pytest

import waypost
from harness.waiting import wait_until
from tests.etcd.helpers import put_when_back
from waypost.etcd.local import LocalEtcd, free_port

ROUNDS = 6
CONVERGE_S = 10.0


def _put(etcd: LocalEtcd, reg, writer: str, key: str, value: str) -> None:
    if writer == "etcdctl":
        etcd.etcdctl("put", key, value)
    else:
        put_when_back(reg, key, value, interval=0.1)


@pytest.mark.parametrize("delay", [0.0, 1.0], ids=["puts-at-once", "puts-after-1s"])
@pytest.mark.parametrize("writer", ["same-client", "etcdctl"])
@pytest.mark.parametrize("stop", ["kill", "term"])
def test_subscriber_follows_a_wiped_etcd_back_at_the_same_revision(etcd, unique_key, delay, writer, stop):
    member = etcd.members[0]
    reg = waypost.connect(etcd.url())
    key = unique_key
    _put(etcd, reg, writer, f"{key}/1", "10.0.0.1:1")
    _put(etcd, reg, writer, f"{key}/2", "10.0.0.2:2")
    assert etcd.revision() == 3
    sub = waypost.Subscriber(reg, key)
    try:
        assert sorted(sub.values()) == ["10.0.0.1:1", "10.0.0.2:2"]
        failures = []
        for rnd in range(ROUNDS):
            member.kill() if stop == "kill" else member.stop()
            shutil.rmtree(member.data_dir)
            member.cluster_state = "new"
            member.start()
            if delay:
                time.sleep(delay)
            want = [f"10.0.{rnd + 1}.1:1", f"10.0.{rnd + 1}.2:2"]
            _put(etcd, reg, writer, f"{key}/1", want[0])
            _put(etcd, reg, writer, f"{key}/2", want[1])
            assert etcd.revision() == 3  # the same revision as the store the subscriber followed
            try:
                wait_until(lambda w=want: sorted(sub.values()) == w, CONVERGE_S, what=f"round {rnd}: view {want}")
            except AssertionError as e:
                failures.append(str(e))
                break  # stuck for good: the next rounds would only repeat it
        assert not failures, failures
    finally:
        sub.close()


def _store_warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "waypost.etcd.watch" and "back in time" in r.getMessage()]


def test_a_store_written_up_to_the_same_revision_before_the_watch_returns_is_told_apart(etcd, unique_key, caplog):
    """The emptied store is written to revision 3 by another client while it listens elsewhere, so the
    watch stream comes back to a store already at the revision it had seen, with the same cluster id:
    only the records tell the stores apart."""
    caplog.set_level(logging.WARNING, logger="waypost.etcd.watch")
    member = etcd.members[0]
    reg = waypost.connect(etcd.url())
    key = unique_key
    etcd.etcdctl("put", f"{key}/1", "10.0.0.1:1")
    etcd.etcdctl("put", f"{key}/2", "10.0.0.2:2")
    with waypost.Subscriber(reg, key) as sub:
        assert sorted(sub.values()) == ["10.0.0.1:1", "10.0.0.2:2"]
        port = member.client_port
        member.kill()
        shutil.rmtree(member.data_dir)
        member.cluster_state = "new"
        member.client_port = free_port()  # out of the subscriber's reach while the new store is written
        try:
            member.start()
            etcd.etcdctl("put", f"{key}/1", "10.0.9.1:1")
            etcd.etcdctl("put", f"{key}/2", "10.0.9.2:2")
            assert etcd.revision() == 3
            member.stop()
        finally:
            member.client_port = port
        member.start()
        wait_until(lambda: sorted(sub.values()) == ["10.0.9.1:1", "10.0.9.2:2"], CONVERGE_S, what="the new store's view")
        assert len(_store_warnings(caplog)) == 1, _store_warnings(caplog)


@pytest.mark.parametrize("stop", ["kill", "term"])
def test_a_restart_that_keeps_the_store_is_no_reset(etcd, unique_key, caplog, stop):
    """The same store coming back (data kept) at the same revision is followed without a reload."""
    caplog.set_level(logging.WARNING, logger="waypost.etcd.watch")
    member = etcd.members[0]
    reg = waypost.connect(etcd.url())
    key = unique_key
    reg.sync.put(f"{key}/1", "10.0.0.1:1")
    reg.sync.put(f"{key}/2", "10.0.0.2:2")
    with waypost.Subscriber(reg, key) as sub:
        assert sorted(sub.values()) == ["10.0.0.1:1", "10.0.0.2:2"]
        for _ in range(3):
            member.kill() if stop == "kill" else member.stop()
            member.cluster_state = "existing"
            member.start()
            _put(etcd, reg, "same-client", f"{key}/3", "10.0.0.3:3")
            wait_until(lambda: "10.0.0.3:3" in sub.values(), CONVERGE_S, what="the put after the restart")
            reg.sync.delete(f"{key}/3")
            wait_until(lambda: "10.0.0.3:3" not in sub.values(), CONVERGE_S, what="the delete after the restart")
        assert _store_warnings(caplog) == []
        assert sorted(sub.values()) == ["10.0.0.1:1", "10.0.0.2:2"]

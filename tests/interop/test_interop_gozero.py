"""Interop with real go-zero (v1.10.3) peers through one etcd: the go-zero cases 1-4.

The Go programs live in ``interop/cmd`` (built once per session by ``tests/interop/support.py``).
Every backend names itself in the ``x-backend`` trailer, so both sides can tell who answered.
"""

from __future__ import annotations

import base64
import collections
import json
import queue
import random
import re
import time

import pytest

import waypost
from harness.waiting import wait_until
from tests.interop.support import (  # noqa: F401  (fixture_*: pytest fixtures go_bins, go_peers)
    call_counts,
    fixture_go_bins,
    fixture_go_peers,
    py_backends,
    timeout_mark,
)
from waypost.balancer.consistent_hash import HashRing
from waypost.etcd.local import free_port
from waypost.service_config import DEFAULT_POLICY

pytestmark = [pytest.mark.interop, timeout_mark()]

#: bounds for conditions that depend on processes, watches and connections (loaded 2-core machines)
SETTLE = 30.0


def _ready(proc) -> dict:
    return proc.expect(lambda d: d.get("event") == "ready", SETTLE, "ready")


def _go_server(go_peers, etcd, key: str, id: int = 0):
    addr = f"127.0.0.1:{free_port()}"
    args = ["-etcd", etcd.endpoint, "-key", key, "-listen", addr, "-name", f"go-{addr}"]
    if id:
        args += ["-id", str(id)]
    proc = go_peers.start("gozero-server", *args)
    _ready(proc)
    return proc, addr


def _registrations(etcd, key: str) -> dict[str, tuple[str, int]]:
    """etcd key -> (value, lease id) for every key under ``key/``."""
    out = json.loads(etcd.etcdctl("get", key + "/", "--prefix", "-w", "json"))
    return {base64.b64decode(kv["key"]).decode():
            (base64.b64decode(kv["value"]).decode(), int(kv.get("lease", 0)))
            for kv in out.get("kvs", [])}


# -- case 1: go-zero zrpc servers called by a waypost client --------------------------------------


def test_gozero_registration_layout(go_peers, shared_etcd, unique_key):
    """zrpc registers ``<key>/<lease id>`` (default) or ``<key>/<id>`` (custom), value ``host:port``."""
    _, a = _go_server(go_peers, shared_etcd, unique_key)
    _, b = _go_server(go_peers, shared_etcd, unique_key, id=42)
    regs = wait_until(lambda: (r := _registrations(shared_etcd, unique_key)) and len(r) == 2 and r, SETTLE,
                      "two go-zero registrations")
    by_value = {v: (k, lease) for k, (v, lease) in regs.items()}
    key_a, lease_a = by_value[a]
    key_b, lease_b = by_value[b]
    assert re.fullmatch(re.escape(unique_key) + r"/\d+", key_a)
    assert key_a == f"{unique_key}/{lease_a}", "default id is the lease id as a decimal int64"
    assert key_b == f"{unique_key}/42" and lease_b > 0


def test_gozero_server_revokes_on_shutdown(go_peers, shared_etcd, unique_key):
    """go-zero's shutdown (here from stdin EOF, as when the test process dies) revokes the key at once;
    the harness relies on this so no Go server outlives its test."""
    proc, addr = _go_server(go_peers, shared_etcd, unique_key)
    wait_until(lambda: [v for v, _ in _registrations(shared_etcd, unique_key).values()] == [addr], SETTLE,
               "registered")
    assert proc.proc.stdin is not None
    proc.proc.stdin.close()
    wait_until(lambda: not _registrations(shared_etcd, unique_key), SETTLE, "key revoked")
    wait_until(lambda: proc.proc.poll() is not None, SETTLE, "process exited")


@pytest.mark.parametrize("balancer", ["round_robin", "p2c_ewma", None, "prequal"],
                         ids=["round_robin", "p2c_ewma", "default", "prequal"])
@pytest.mark.parametrize("custom_id", [False, True], ids=["lease-id", "custom-id"])
def test_waypost_client_calls_gozero_servers(go_peers, shared_etcd, unique_key, balancer, custom_id):
    srv_a, a = _go_server(go_peers, shared_etcd, unique_key, id=7 if custom_id else 0)
    _, b = _go_server(go_peers, shared_etcd, unique_key, id=8 if custom_id else 0)
    names = {f"go-{a}", f"go-{b}"}
    channel = waypost.dial(f"etcd:///{shared_etcd.endpoint}?key={unique_key}", balancer=balancer)
    try:
        # both backends discovered and answering (p2c_ewma: forcePick guarantees the other within 1 s)
        seen: collections.Counter[str] = collections.Counter()
        wait_until(lambda: (seen.update(call_counts(channel, 20)), set(seen) >= names)[1], SETTLE,
                   f"answers from both {names}")
        assert {k for k in seen if not k.startswith("error:")} == names, seen
        # settled: no errors, only the registered backends (round_robin: an exact split)
        counts = call_counts(channel, 60)
        if balancer == "round_robin":
            assert counts == {f"go-{a}": 30, f"go-{b}": 30}
        else:
            assert set(counts) <= names and sum(counts.values()) == 60, counts
        policy = channel.balancer.policy
        assert policy.name == (balancer or DEFAULT_POLICY)
        if balancer == "prequal":  # go-zero servers have no load reports: it learned so, and keeps working
            wait_until(lambda: call_counts(channel, 5) and len(policy.without_reports()) == 2, SETTLE,
                       "both go-zero servers known to have no load reports")

        # SIGTERM: go-zero revokes its lease; all traffic moves to the survivor, without errors once settled
        srv_a.stop()
        wait_until(lambda: call_counts(channel, 10) == {f"go-{b}": 10}, SETTLE,
                   "traffic moved to the survivor")
        assert call_counts(channel, 30) == {f"go-{b}": 30}
    finally:
        channel.close()


# -- case 2: waypost servers called by a go-zero zrpc client ---------------------------------------


@pytest.mark.parametrize("balancer", ["p2c_ewma", "round_robin"])
def test_gozero_client_calls_waypost_servers(go_peers, shared_etcd, unique_key, balancer):
    with py_backends(["py-a", "py-b"], unique_key, shared_etcd.url(), metadata={"weight": 20}) as handles:
        client = go_peers.start("gozero-client", "-etcd", shared_etcd.endpoint, "-key", unique_key,
                                "-balancer", balancer)
        _ready(client)
        seen: collections.Counter[str] = collections.Counter()

        def both() -> bool:
            seen.update(client.request("call 20", "counts", SETTLE))
            return {"py-a", "py-b"} <= set(seen)

        wait_until(both, SETTLE, "go-zero client reaches both Python backends")
        errors = {k: v for k, v in seen.items() if k.startswith("error:")}
        assert set(seen) - set(errors) == {"py-a", "py-b"}, seen
        if balancer == "round_robin":
            assert client.request("call 60", "counts", SETTLE) == {"py-a": 30, "py-b": 30}
        else:
            spread = client.request("call 200", "counts", SETTLE)
            assert set(spread) <= {"py-a", "py-b"} and sum(spread.values()) == 200, spread

        # graceful stop deregisters first: the go-zero client moves all traffic to the survivor
        handles["py-a"].stop(1.0)
        wait_until(lambda: client.request("call 10", "counts", SETTLE) == {"py-b": 10}, SETTLE,
                   "go-zero client moved to py-b")
        assert client.request("call 50", "counts", SETTLE) == {"py-b": 50}


# -- case 3: a go-zero subscriber sees waypost registrations exactly as Go ones ----------------------


def _go_sub(go_peers, etcd, key, exclusive: bool):
    args = ["-etcd", etcd.endpoint, "-key", key, "-timeout", "120s"]
    if exclusive:
        args.append("-exclusive")
    return go_peers.start("gozero-sub", *args)


class _GoPublishers:
    def __init__(self, go_peers, etcd, key):
        self.go_peers, self.etcd, self.key = go_peers, etcd, key
        self.procs = {}

    def add(self, value: str, id: int) -> None:
        p = self.go_peers.start("gozero-pub", "-etcd", self.etcd.endpoint, "-key", self.key, "-value", value,
                                "-id", str(id))
        _ready(p)
        self.procs[id] = p

    def remove(self, id: int) -> None:
        self.procs.pop(id).stop()


class _WaypostPublishers:
    def __init__(self, etcd, key, metadata):
        self.etcd, self.key, self.metadata = etcd, key, metadata
        self.pubs = {}

    def add(self, value: str, id: int) -> None:
        pub = waypost.Publisher(self.etcd.url(), self.key, value, id=id, metadata=self.metadata)
        self.pubs[id] = pub.start()

    def remove(self, id: int) -> None:
        self.pubs.pop(id).stop()

    def close(self) -> None:
        for p in self.pubs.values():
            p.stop()


#: go-zero's container semantics (core/discov/subscriber.go) for the steps in ``_STEPS``: in exclusive mode
#: the second key for address x evicts the first, so removing the second drops x although key 1 remains.
_STEPS = [("add", "x", 1), ("add", "x", 2), ("add", "y", 3), ("remove", "x", 2), ("remove", "x", 1)]
_EXPECTED = {
    False: [["x"], ["x"], ["x", "y"], ["x", "y"], ["y"]],
    True: [["x"], ["x"], ["x", "y"], ["y"], ["y"]],
}


class _GoSubView:
    """The latest ``Values()`` a gozero-sub printed (it prints on change only)."""

    def __init__(self, proc):
        self.proc = proc
        self.values: list[str] | None = None

    def current(self) -> list[str] | None:
        while True:
            try:
                line = self.proc.lines.get_nowait()
            except queue.Empty:
                return self.values
            if line is None:
                raise AssertionError(f"gozero-sub exited: {self.proc.stderr_tail()}")
            if "values" in line:
                self.values = line["values"]


@pytest.mark.parametrize("exclusive", [False, True], ids=["shared", "exclusive"])
def test_gozero_subscriber_sees_waypost_like_go(go_peers, shared_etcd, unique_key, exclusive):
    """The same steps published by go-zero's Publisher and by waypost's (with metadata) give go-zero's
    subscriber the same ``Values()`` after every step; waypost's Subscriber (same mode) agrees."""
    for side in ("go", "waypost"):
        key = f"{unique_key}-{side}"
        gosub = _GoSubView(_go_sub(go_peers, shared_etcd, key, exclusive))
        wait_until(lambda g=gosub: g.current() == [], SETTLE, "gozero-sub starts empty")
        wsub = waypost.Subscriber(shared_etcd.url(), key, exclusive=exclusive)
        pubs = (_GoPublishers(go_peers, shared_etcd, key) if side == "go"
                else _WaypostPublishers(shared_etcd, key, {"weight": 5, "zone": "z1"}))
        addr = {"x": f"127.0.0.1:{free_port()}", "y": f"127.0.0.1:{free_port()}"}
        try:
            for (op, label, id), want in zip(_STEPS, _EXPECTED[exclusive]):
                if op == "add":
                    pubs.add(addr[label], id)
                else:
                    pubs.remove(id)
                want_addrs = sorted(addr[w] for w in want)
                seen = {}

                def agree(want_addrs=want_addrs, seen=seen, gosub=gosub, wsub=wsub) -> bool:
                    seen["go-zero"] = gosub.current()
                    seen["waypost"] = sorted(wsub.values())
                    return seen["go-zero"] == want_addrs and seen["waypost"] == want_addrs

                try:
                    wait_until(agree, SETTLE, f"{side} publishers, after {op} {label}#{id}")
                except AssertionError as e:
                    raise AssertionError(f"{e}: want {want_addrs}, saw {seen}") from None
                # a step with no visible change must stay unchanged: give a late event a moment to show
                time.sleep(0.3)
                assert agree(), f"{side} publishers, after {op} {label}#{id}: want {want_addrs}, saw {seen}"
        finally:
            if isinstance(pubs, _WaypostPublishers):
                pubs.close()
            wsub.close()
            gosub.proc.stop()


def test_gozero_subscriber_never_reads_metadata_as_address(go_peers, shared_etcd, unique_key):
    """waypost keeps metadata out of ``<key>/`` (side record): a go-zero subscriber sees addresses only."""
    addr = f"127.0.0.1:{free_port()}"
    pub = waypost.Publisher(shared_etcd.url(), unique_key, addr, metadata={"weight": 20, "zone": "z1"})
    pub.start()
    try:
        sub = _go_sub(go_peers, shared_etcd, unique_key, exclusive=False)
        view = _GoSubView(sub)
        wait_until(lambda: view.current() == [addr], SETTLE, "go-zero sees the address")
        regs = _registrations(shared_etcd, unique_key)
        assert list(regs.values()) == [(addr, pub.lease_id)], "exactly one raw host:port under <key>/"
        assert list(regs) == [f"{unique_key}/{pub.lease_id}"]
    finally:
        pub.stop()


# -- case 4: consistent hash ring -----------------------------------------------------------------


@pytest.mark.parametrize("n_addrs", [1, 3, 10])
def test_consistent_hash_matches_gozero_ring(go_peers, n_addrs):
    rng = random.Random(8 + n_addrs)
    addrs = [f"127.0.0.{rng.randint(1, 254)}:{rng.randint(1024, 65535)}" for _ in range(n_addrs)]
    keys = [f"user-{i}" for i in range(9_000)]
    keys += [f"{rng.getrandbits(64):x}" for _ in range(500)]
    keys += ["".join(chr(rng.randint(0x20, 0x2FFF)) for _ in range(rng.randint(1, 12))).strip() or "k"
             for _ in range(500)]
    keys = list(dict.fromkeys(k for k in keys if "\n" not in k and "\r" not in k))
    assert len(keys) >= 9_900
    go = go_peers.run("gozero-hash", "-addrs", ",".join(addrs), stdin="\n".join(keys) + "\n", timeout=120)
    assert len(go) == len(keys)
    ring = HashRing(addrs)
    mismatches = {k: (go[k], ring.get(k)) for k in keys if go[k] != ring.get(k)}
    assert not mismatches, f"{len(mismatches)} keys map differently, e.g. {list(mismatches.items())[:5]}"
    if n_addrs > 1:
        assert len(set(go.values())) == n_addrs


def _stable(read, names: set[str], who: str) -> dict[str, str]:
    """``read()`` until two successive key maps are equal and cover every backend (a map taken while a
    connection was still coming up is not the final ring)."""
    prev: list[dict[str, str]] = [{}]

    def settled() -> dict[str, str] | None:
        cur = read()
        ok = set(cur.values()) == names and cur == prev[0]
        prev[0] = cur
        return cur if ok else None

    return wait_until(settled, SETTLE, f"{who}: a stable ring over {sorted(names)}")


def test_consistent_hash_routes_like_gozero_client(go_peers, shared_etcd, unique_key):
    """End to end: over the same three waypost-registered backends, go-zero's consistent_hash client and
    waypost's route every hash key to the same backend."""
    names = {"py-a", "py-b", "py-c"}
    n_keys = 300
    with py_backends(sorted(names), unique_key, shared_etcd.url()):
        client = go_peers.start("gozero-client", "-etcd", shared_etcd.endpoint, "-key", unique_key,
                                "-balancer", "consistent_hash")
        _ready(client)
        # the ring is built from READY connections: wait until go-zero's has all three and stays so
        go_keys = _stable(lambda: client.request(f"keys {n_keys}", "keys", SETTLE), names, "go-zero")
        channel = waypost.dial(f"etcd:///{shared_etcd.endpoint}?key={unique_key}", balancer="consistent_hash")
        try:
            def waypost_keys() -> dict[str, str]:
                out = {}
                for i in range(n_keys):
                    with waypost.hash_key(f"key-{i}"):
                        out[f"key-{i}"] = next(iter(call_counts(channel, 1)))
                return out

            py_keys = _stable(waypost_keys, names, "waypost")
        finally:
            channel.close()
    diff = {k: (go_keys[k], py_keys.get(k)) for k in go_keys if go_keys[k] != py_keys.get(k)}
    assert len(go_keys) == n_keys
    assert not diff, f"{len(diff)} keys routed differently, e.g. {list(diff.items())[:5]}"


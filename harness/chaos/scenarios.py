"""Chaos scenarios shared by ``tests/test_chaos.py`` (short versions, asserted) and ``bench/chaos_report.py``
(the table and JSON). Real etcd (``LocalEtcd``), real backend processes (``harness/chaos/node.py``: an Echo
server whose ports are registered by waypost Publishers), clients in this process under steady load
through ``waypost.dial``. Loopback only; every wait is bounded.

Each scenario returns a :class:`Result` with the figures the report prints: RPCs sent and failed,
registrations lost, and the recovery time against its bound. ``Result.problems`` lists every broken
promise (empty when the scenario held), so the test asserts ``problems == []`` and shows what it saw.
"""

from __future__ import annotations

import collections
import contextlib
import json
import logging
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import grpc

import waypost
from harness.backends import echo_pb2, echo_pb2_grpc
from harness.etcd_partition import PartitionCluster
from harness.waiting import holds_within, wait_until
from waypost import _loop
from waypost.discovery import Publisher, Subscriber
from waypost.etcd.config import EtcdConfig
from waypost.etcd.local import LocalEtcd
from waypost.registry.etcd import EtcdRegistry

ROOT = Path(__file__).resolve().parents[2]

Req = echo_pb2.EchoRequest

#: the clients' service config: round robin, retry UNAVAILABLE on another backend
RETRY_CONFIG: dict[str, Any] = {
    "loadBalancingConfig": [{"round_robin": {}}],
    "methodConfig": [{"name": [{"service": "waypost.test.Echo"}], "retryPolicy": {
        "maxAttempts": 5, "initialBackoff": "0.02s", "maxBackoff": "0.2s", "backoffMultiplier": 2,
        "retryableStatusCodes": ["UNAVAILABLE"]}}],
}


@dataclass
class Result:
    """One row of the chaos table."""

    scenario: str
    sent: int = 0
    failed: int = 0
    lost: int = 0
    recovery_s: float | None = None  # what "recovery" means is in ``recovery_what``
    bound_s: float | None = None
    recovery_what: str = ""
    details: dict[str, Any] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    def check(self, cond: bool, problem: str) -> None:
        if not cond:
            self.problems.append(problem)

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["ok"] = self.ok
        return d


# ---- small tools ---------------------------------------------------------------------------------


def private_registry(endpoints: list[str]) -> EtcdRegistry:
    """An etcd registry of its own (its own connection and watches), not connect()'s shared one."""
    return EtcdRegistry(EtcdConfig(endpoints=tuple(endpoints)))


def close_registry(reg: EtcdRegistry) -> None:
    with contextlib.suppress(Exception):
        _loop.run(reg.close(), 15)


def registered_values(reg: EtcdRegistry, key: str, timeout: float = 2.0) -> set[str] | None:
    """The addresses registered under ``key/`` now, or None if etcd does not answer within ``timeout``."""
    try:
        res = _loop.run(reg.get(key + "/", prefix=True), timeout)
    except Exception:  # noqa: BLE001  # unreachable right now: the caller polls again
        return None
    return {kv.value.decode() for kv in res.kvs}


class _RecentLog(logging.Handler):
    """The library's INFO+ log lines with their monotonic time (bounded), to explain a failure."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lines: collections.deque[tuple[float, str]] = collections.deque(maxlen=2000)

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append((time.monotonic(), f"{record.levelname} {record.name}: {record.getMessage()[:300]}"))

    def around(self, t: float, before: float = 2.0, after: float = 0.5) -> list[str]:
        return [f"{ts - t:+.3f}s {text}" for ts, text in list(self.lines) if t - before <= ts <= t + after][-30:]


    @contextlib.contextmanager
    def recording(self) -> Iterator[None]:
        """Capture the library's INFO+ lines meanwhile (the logger's level is restored afterwards)."""
        wp = logging.getLogger("waypost")
        old = wp.level
        if wp.getEffectiveLevel() > logging.INFO:
            wp.setLevel(logging.INFO)
        wp.addHandler(self)
        try:
            yield
        finally:
            wp.removeHandler(self)
            wp.setLevel(old)


LOG = _RecentLog()


class History:
    """Every state a client went through, timestamped by its change listener (so the moment a client
    reached its final state is known exactly, not when we happened to look)."""

    def __init__(self, read: Callable[[], set[str]]) -> None:
        self._read = read
        self._lock = threading.Lock()
        self.changes: list[tuple[float, frozenset[str]]] = [(time.monotonic(), frozenset(read()))]

    def __call__(self) -> None:
        now = time.monotonic()
        v = frozenset(self._read())
        with self._lock:
            if v != self.changes[-1][1]:
                self.changes.append((now, v))

    def settled_at(self, final: set[str]) -> float | None:
        """When this client last changed, if it holds ``final`` now; None if it does not."""
        with self._lock:
            t, v = self.changes[-1]
        return t if v == final else None


def convergence(histories: list[History], live: set[str], t_end: float, timeout: float) -> float | None:
    """Seconds from ``t_end`` until every client held ``live`` for good (0 if they already did), waiting up
    to ``timeout``; None if some client never got there."""
    if not holds_within(lambda: all(h.settled_at(live) is not None for h in histories), timeout, interval=0.01):
        return None
    time.sleep(0.3)  # a late straggler event would show up as a further change
    settled = [h.settled_at(live) for h in histories]
    if any(t is None for t in settled):
        return None
    return max(0.0, max(t for t in settled if t is not None) - t_end)


class Node:
    """A backend process (``harness/chaos/node.py``). Construct several, then ``ready()`` each: they start in
    parallel."""

    def __init__(self, registry_url: str | list[str], key: str, name: str, ports: int = 1, ttl: int = 10,
                 serve: bool = False) -> None:
        self.name = name
        urls = [registry_url] if isinstance(registry_url, str) else registry_url
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(ROOT / "src"), env.get("PYTHONPATH", "")])
        self.proc = subprocess.Popen(
            [sys.executable, str(ROOT / "harness" / "chaos" / "node.py"), *(a for u in urls for a in ("--registry", u)),
             "--key", key,
             "--name", name, "--ports", str(ports), "--ttl", str(ttl), *(["--serve"] if serve else [])],
            cwd=ROOT, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.addresses: list[str] = []

    def _line(self, prefix: str, timeout: float) -> str:
        assert self.proc.stdout is not None
        result: list[str] = []

        def read() -> None:
            assert self.proc.stdout is not None
            for line in self.proc.stdout:
                if line.startswith(prefix):
                    result.append(line)
                    return

        t = threading.Thread(target=read, daemon=True)
        t.start()
        t.join(timeout)
        if not result:
            err = ""
            if self.proc.poll() is not None and self.proc.stderr is not None:
                err = self.proc.stderr.read()[-2000:]
            raise RuntimeError(f"node {self.name}: no {prefix!r} line within {timeout} s {err}")
        return result[0]

    def ready(self, timeout: float = 60.0) -> Node:
        self.addresses = json.loads(self._line("READY ", timeout).split(" ", 1)[1])
        return self

    def churn(self, seconds: float, rate: float, seed: int) -> tuple[float, set[str]]:
        """Run the node's churn; returns (monotonic time it stopped, addresses registered then)."""
        assert self.proc.stdin is not None
        self.proc.stdin.write(f"churn {seconds} {rate} {seed}\n")
        self.proc.stdin.flush()
        _, t_end, live = self._line("LIVE ", seconds + 60).split(" ", 2)
        return float(t_end), set(json.loads(live))

    @property
    def address(self) -> str:
        return self.addresses[0]

    def quit(self, timeout: float = 30.0) -> bool:
        """Ask the node to stop gracefully; True if it exited within ``timeout``."""
        assert self.proc.stdin is not None
        self.proc.stdin.write("quit\n")
        self.proc.stdin.flush()
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            return False
        return True

    def signal(self, sig: int) -> None:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, sig)

    def close(self) -> None:
        """Ask the node to deregister and exit; kill it if it does not within a few seconds."""
        if self.proc.poll() is None:
            self.signal(signal.SIGCONT)
            with contextlib.suppress(OSError):
                assert self.proc.stdin is not None
                self.proc.stdin.write("quit\n")
                self.proc.stdin.close()
            try:
                self.proc.wait(8)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        for f in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
            if f is not None:
                with contextlib.suppress(OSError):
                    f.close()


@contextlib.contextmanager
def nodes(registry_url: str | list[str], key: str, names: list[str], **kw: Any) -> Iterator[list[Node]]:
    started: list[Node] = []
    try:
        for n in names:
            started.append(Node(registry_url, key, n, **kw))
        for n in started:
            n.ready()
        yield started
    finally:
        for n in started:
            n.close()


class Load:
    """``threads`` callers in a loop through ``stub`` until stopped; counts calls, failures and who answered."""

    def __init__(self, stub: Any, threads: int = 3, delay_ms: int = 2, timeout: float = 15.0) -> None:
        self.stub = stub
        self.sent = 0
        self.failed: list[tuple[float, str, str]] = []
        self.answers: list[tuple[float, str]] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._delay_ms = delay_ms
        self._timeout = timeout
        self._threads = [threading.Thread(target=self._run, daemon=True) for _ in range(threads)]

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                r = self.stub.Unary(Req(delay_ms=self._delay_ms), timeout=self._timeout)
            except grpc.RpcError as e:
                with self._lock:
                    self.sent += 1
                    self.failed.append((time.monotonic(), e.code().name, str(e.details())[:200]))
            except Exception as e:  # noqa: BLE001  # not an RpcError: a client-visible failure all the same
                with self._lock:
                    self.sent += 1
                    self.failed.append((time.monotonic(), type(e).__name__, str(e)[:200]))
            else:
                with self._lock:
                    self.sent += 1
                    self.answers.append((time.monotonic(), r.server))

    def start(self) -> Load:
        for t in self._threads:
            t.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(self._timeout + 10)

    def count(self) -> int:
        with self._lock:
            return len(self.answers)

    def servers_after(self, t: float) -> set[str]:
        with self._lock:
            return {s for ts, s in self.answers if ts > t}

    def fill(self, r: Result) -> None:
        r.sent = self.sent
        r.failed = len(self.failed)
        if self.failed:
            r.details["failures"] = self.failed[:5]
            r.details["log_around_first_failure"] = LOG.around(self.failed[0][0])
        r.check(not self.failed, f"{len(self.failed)} of {self.sent} RPCs failed: {self.failed[:3]}")


@contextlib.contextmanager
def loaded_channel(target: str | list[str], *, threads: int = 3, warm: int = 1, **dial_kw: Any) -> Iterator[tuple[Any, Load]]:
    """A balanced channel under steady load (started once ``warm`` backends are READY); the library's log
    lines are recorded meanwhile to explain failures."""
    ch = waypost.dial(target, service_config=RETRY_CONFIG, **dial_kw)
    load = None
    try:
        with LOG.recording():
            stub = echo_pb2_grpc.EchoStub(ch)
            wait_until(lambda: len(ch.balancer.ready_addresses()) >= warm, 30, f"warm-up: {warm} backends READY")
            stub.Unary(Req(), timeout=30, wait_for_ready=True)
            load = Load(stub, threads=threads).start()
            wait_until(lambda: load.count() > 20, 20, "warm-up: 20 RPCs answered under load")
            try:
                yield ch, load
            finally:
                load.stop()
    finally:
        ch.close()


def etcd_target(endpoints: list[str], key: str) -> str:
    return f"etcd:///{','.join(endpoints)}?key={key}"


# ---- scenarios -----------------------------------------------------------------------------------


def etcd_down(etcd: LocalEtcd, down_s: float = 10.0, ttl: int = 10, key: str = "chaos-down.rpc") -> Result:
    """A single etcd stopped for ``down_s`` seconds under load, then started again. With ``down_s`` >= ``ttl``
    the publishers count their leases as lost meanwhile and register again with new ones on etcd's return."""
    r = Result(f"etcd down {down_s:g} s (TTL {ttl} s)", bound_s=2.0,
               recovery_what="registrations back after etcd returns")
    probe = private_registry(etcd.endpoints)
    try:
        with nodes(etcd.url(), key, ["a", "b"], ttl=ttl) as (a, b), \
                loaded_channel(etcd_target(etcd.endpoints, key), warm=2) as (_ch, load):
            want = {a.address, b.address}
            etcd.members[0].stop()
            time.sleep(down_s)
            close_registry(probe)
            etcd.members[0].start()
            t_back = time.monotonic()
            # a fresh client: the time measured is the publishers', not this probe's own reconnection
            probe = private_registry(etcd.endpoints)
            back = holds_within(lambda: registered_values(probe, key) == want, 30)
            r.recovery_s = round(time.monotonic() - t_back, 3)
            seen = registered_values(probe, key) or set()
            r.lost = len(want - seen)
            r.check(back, f"registrations after etcd's return: {sorted(seen)}, expected {sorted(want)}")
            r.check(r.recovery_s <= r.bound_s, f"registrations back only {r.recovery_s} s after etcd returned")
            # watches resumed: a backend registered after the return gets traffic
            with nodes(etcd.url(), key, ["late"]) as (_late,):
                t_late = time.monotonic()
                got = holds_within(lambda: "late" in load.servers_after(t_late), 30)
                r.details["new_backend_served_after_s"] = round(time.monotonic() - t_late, 3)
                r.check(got, "a backend registered after etcd's return never got traffic (watch not resumed)")
            load.stop()
            load.fill(r)
    finally:
        close_registry(probe)
    return r


def one_of_two_registries_down(etcd: LocalEtcd, down_s: float = 10.0, ttl: int = 5,
                                key: str = "chaos-two.rpc") -> Result:
    """Two registries backing each other up (each server registered in both, each client reading both): one
    stopped for ``down_s`` seconds under load (longer than the TTL: its leases expire), then started again.
    Promise: no failed call, and the registrations are complete again in it within 2 s of its return."""
    r = Result(f"one of 2 registries down {down_s:g} s (TTL {ttl} s)", bound_s=2.0,
               recovery_what="registrations back in the returned registry")
    other = LocalEtcd().start()
    probe = None
    try:
        with nodes([etcd.url(), other.url()], key, ["a", "b"], ttl=ttl, serve=True) as (a, b), \
                loaded_channel([etcd_target(etcd.endpoints, key), etcd_target(other.endpoints, key)],
                               warm=2) as (_ch, load):
            want = {a.address, b.address}
            etcd.members[0].stop()
            time.sleep(down_s)
            etcd.members[0].start()
            t_back = time.monotonic()
            probe = private_registry(etcd.endpoints)
            back = holds_within(lambda: registered_values(probe, key) == want, 30)
            r.recovery_s = round(time.monotonic() - t_back, 3)
            seen = registered_values(probe, key) or set()
            r.lost = len(want - seen)
            r.check(back, f"registrations in the returned registry: {sorted(seen)}, expected {sorted(want)}")
            r.check(r.recovery_s <= r.bound_s, f"registrations back only {r.recovery_s} s after the registry returned")
            load.stop()
            load.fill(r)  # no failed call
    finally:
        if probe is not None:
            close_registry(probe)
        other.close()
    return r


def leader_killed(cluster: LocalEtcd, key: str = "chaos-leader.rpc", observe_s: float = 4.0) -> Result:
    """The leader of a 3-member cluster SIGKILLed under load."""
    r = Result("etcd leader killed (3 members)", bound_s=10.0, recovery_what="writes accepted again")
    probe = private_registry(cluster.endpoints)
    try:
        with nodes(cluster.url(), key, ["a", "b"]) as (a, b), \
                loaded_channel(etcd_target(cluster.endpoints, key), warm=2) as (_ch, load):
            want = {a.address, b.address}
            leader = cluster.leader()
            r.details["killed"] = leader.name
            leader.kill()
            t_kill = time.monotonic()
            # a write succeeds again once a new leader is elected
            wrote = holds_within(lambda: _try_put(probe, key + "-probe"), 30, interval=0.05)
            r.recovery_s = round(time.monotonic() - t_kill, 3)
            r.check(wrote, "no write accepted after the leader was killed")
            # registrations are checked continuously for a while (longer than nothing; the TTL is 10 s)
            worst = 0
            deadline = time.monotonic() + observe_s
            while time.monotonic() < deadline:
                seen = registered_values(probe, key)
                if seen is not None:
                    worst = max(worst, len(want - seen))
                time.sleep(0.2)
            r.lost = worst
            r.check(worst == 0, f"{worst} registrations missing after the leader was killed")
            with nodes(cluster.url(), key, ["late"]) as (_late,):
                t_late = time.monotonic()
                got = holds_within(lambda: "late" in load.servers_after(t_late), 30)
                r.check(got, "a backend registered after the leader died never got traffic")
            load.stop()
            load.fill(r)
            r.check(r.recovery_s <= r.bound_s, f"writes resumed only after {r.recovery_s} s")
    finally:
        close_registry(probe)
    return r


class _LogCounter(logging.Handler):
    """Counts log records of ``logger`` whose message contains ``needle`` (evidence a path was taken)."""

    def __init__(self, logger: str, needle: str) -> None:
        super().__init__(logging.DEBUG)
        self.needle = needle
        self.count = 0
        self._logger = logging.getLogger(logger)
        self._old_level = self._logger.level
        if self._logger.getEffectiveLevel() > logging.WARNING:
            self._logger.setLevel(logging.WARNING)
        self._logger.addHandler(self)

    def emit(self, record: logging.LogRecord) -> None:
        if self.needle in record.getMessage():
            self.count += 1

    def close(self) -> None:
        self._logger.removeHandler(self)
        self._logger.setLevel(self._old_level)
        super().close()


def _try_put(reg: EtcdRegistry, key: str) -> bool:
    try:
        _loop.run(reg.put(key, b"x"), 1.5)
    except Exception:  # noqa: BLE001  # no leader yet: poll again
        return False
    return True


def compaction_churn(etcd: LocalEtcd, churn_s: float = 3.0, publishers: int = 12, rate: float = 20.0,
                     key: str = "chaos-compact.rpc", seed: int = 7) -> Result:
    """Publishers churn while one subscriber is cut off from etcd and the history it would need is compacted
    away; every subscriber must converge to exactly the live set."""
    from harness.tcp_proxy import TcpProxy

    r = Result("compaction under churn", bound_s=5.0, recovery_what="subscribers converged after churn stopped")
    rng = random.Random(seed)
    proxy = TcpProxy((etcd.members[0].host, etcd.members[0].client_port))
    regs = [private_registry([proxy.endpoint]), private_registry(etcd.endpoints), private_registry(etcd.endpoints)]
    pub_reg = private_registry(etcd.endpoints)
    pubs = [Publisher(pub_reg, key, f"127.0.0.1:{20000 + i}", ttl=10) for i in range(publishers)]
    subs: list[Subscriber] = []
    changes = 0
    reloads = _LogCounter("waypost.discovery", "compacted")
    try:
        for p in pubs:
            p.start()
        subs = [Subscriber(reg, key) for reg in regs]
        histories = [History(lambda s=s: set(s.values())) for s in subs]
        for s, h in zip(subs, histories):
            s.add_listener(h)

        def churn(seconds: float) -> None:
            nonlocal changes
            end = time.monotonic() + seconds
            while time.monotonic() < end:
                p = rng.choice(pubs)
                (p.pause if p.state == "running" else p.resume)()
                changes += 1
                time.sleep(1.0 / rate)

        churn(churn_s / 3)
        proxy.cut()
        churn(churn_s / 3)
        compacted_at = etcd.compact()
        r.details["compacted_at_revision"] = compacted_at
        proxy.restore()
        churn(churn_s / 3)
        t_end = time.monotonic()
        live = {p.value for p in pubs if p.state == "running"}
        took = convergence(histories, live, t_end, 30)
        converged = took is not None
        r.recovery_s = None if took is None else round(took, 3)
        r.details["changes"] = changes
        r.details["live"] = len(live)
        r.details["reloads_after_compaction"] = reloads.count
        r.check(reloads.count >= 1, "the cut subscriber never met the compaction (scenario did not exercise it)")
        wrong = [sorted(set(s.values()) ^ live) for s in subs if set(s.values()) != live]
        r.lost = sum(len(live - set(s.values())) for s in subs)
        r.check(converged, f"subscribers did not converge to the live set; differences: {wrong}")
        r.check(took is None or took <= (r.bound_s or 0), f"converged only {r.recovery_s} s after the churn stopped")
    finally:
        for s in subs:
            s.close()
        for p in pubs:
            with contextlib.suppress(Exception):
                p.stop()
        for reg in (*regs, pub_reg):
            close_registry(reg)
        proxy.close()
        reloads.close()
    return r


def publisher_churn(etcd: LocalEtcd, churn_s: float = 5.0, publishers: int = 100, rate: float = 50.0,
                    clients: int = 3, key: str = "chaos-churn.rpc", seed: int = 11) -> Result:
    """``publishers`` publishers (one helper process, one Echo server on as many ports) pause/resume at
    ``rate`` changes/s while a balanced channel calls them; every client must hold exactly the live set
    within 1 s of the churn stopping."""
    r = Result(f"{publishers} publishers churning ~{rate:g}/s", bound_s=1.0,
               recovery_what="every client holds the live set after churn stops")
    regs = [private_registry(etcd.endpoints) for _ in range(clients)]
    subs: list[Subscriber] = []
    try:
        with nodes(etcd.url(), key, ["churn"], ports=publishers) as (node,):
            subs = [Subscriber(reg, key) for reg in regs]
            with loaded_channel(etcd_target(etcd.endpoints, key), warm=publishers // 2,
                                subset_size=publishers * 2) as (ch, load):

                def views() -> list[set[str]]:
                    return [set(s.values()) for s in subs] + [{sc.address for sc in ch.balancer.subconns()}]

                histories = [History(lambda s=s: set(s.values())) for s in subs]
                for s, h in zip(subs, histories):
                    s.add_listener(h)
                chh = History(lambda: {sc.address for sc in ch.balancer.subconns()})
                ch.balancer.add_listener(chh)
                histories.append(chh)
                t_end, live = node.churn(churn_s, rate, seed)
                took = convergence(histories, live, t_end, 30)
                converged = took is not None
                r.recovery_s = None if took is None else round(took, 3)
                r.details["changes_seen_per_client"] = [len(h.changes) - 1 for h in histories]
                wrong = [sorted(v ^ live)[:5] for v in views() if v != live]
                r.lost = sum(len(live - v) for v in views())
                r.details["live"] = len(live)
                r.details["clients"] = len(subs) + 1
                load.stop()
                load.fill(r)
                r.check(converged, f"clients never converged; differences (first 5 each): {wrong}")
                r.check(took is None or took <= (r.bound_s or 0),
                        f"clients converged only {r.recovery_s} s after churn stopped")
    finally:
        for s in subs:
            s.close()
        for reg in regs:
            close_registry(reg)
    return r


def backend_kill_and_stop(etcd: LocalEtcd, stop_s: float = 3.0, key: str = "chaos-backend.rpc") -> list[Result]:
    """Under load with a retryPolicy: one backend SIGKILLed, then another SIGSTOPped for ``stop_s`` seconds
    and continued. Recovery: the time until the victim stops getting picks."""
    kill = Result("backend SIGKILL", bound_s=3.0, recovery_what="victim out of the picker")
    stop = Result(f"backend SIGSTOP {stop_s:g} s", bound_s=5.0, recovery_what="victim out of the picker")
    with nodes(etcd.url(), key, ["a", "b", "c"]) as (a, b, _c), \
            loaded_channel(etcd_target(etcd.endpoints, key), warm=3) as (ch, load):
        sent0 = 0
        a.signal(signal.SIGKILL)
        t0 = time.monotonic()
        gone = holds_within(lambda: a.address not in ch.balancer.ready_addresses(), 20)
        kill.recovery_s = round(time.monotonic() - t0, 3)
        kill.check(gone, "killed backend still in the picker")
        time.sleep(0.5)
        with load._lock:
            kill.sent, kill.failed = load.sent - sent0, len(load.failed)
            sent0, failed0 = load.sent, len(load.failed)
        b.signal(signal.SIGSTOP)
        t0 = time.monotonic()
        try:
            gone = holds_within(lambda: b.address not in ch.balancer.ready_addresses(), 20)
            stop.recovery_s = round(time.monotonic() - t0, 3)
            stop.check(gone, "frozen backend still in the picker")
            time.sleep(max(0.0, stop_s - (time.monotonic() - t0)))
        finally:
            b.signal(signal.SIGCONT)
        t_cont = time.monotonic()
        back = holds_within(lambda: "b" in load.servers_after(t_cont), 30)
        stop.details["served_again_after_s"] = round(time.monotonic() - t_cont, 3)
        stop.check(back, "continued backend never served again")
        load.stop()
        stop.sent, stop.failed = load.sent - sent0, len(load.failed) - failed0
    for res in (kill, stop):
        res.check(res.failed == 0, f"{res.failed} of {res.sent} RPCs failed: {load.failed[:3]}")
        res.check(res.recovery_s is not None and res.recovery_s <= (res.bound_s or 0),
                  f"victim left the picker only after {res.recovery_s} s")
    return [kill, stop]


def graceful_stop(etcd: LocalEtcd, key: str = "chaos-graceful.rpc") -> Result:
    """A backend run by ``waypost.serve`` stopped gracefully (its own stop sequence: deregister, NOT_SERVING,
    refuse new calls, drain) while the clients call it without pause: no call may fail."""
    r = Result("backend graceful stop (serve)", bound_s=3.0, recovery_what="victim out of the picker")
    with nodes(etcd.url(), key, ["a", "b", "victim"], serve=True) as (_a, _b, victim), \
            loaded_channel(etcd_target(etcd.endpoints, key), warm=3) as (ch, load):
        t0 = time.monotonic()
        stopped = victim.quit()
        r.check(stopped, "the victim did not finish its graceful stop in time")
        gone = holds_within(lambda: victim.address not in ch.balancer.ready_addresses(), 20)
        r.recovery_s = round(time.monotonic() - t0, 3)
        r.check(gone, "the stopped backend is still in the picker")
        time.sleep(0.5)
        load.stop()
        load.fill(r)
        r.check(r.recovery_s <= (r.bound_s or 0), f"left the picker only after {r.recovery_s} s")
    return r


def publisher_frozen(etcd: LocalEtcd, ttl: int = 2, key: str = "chaos-frozen.rpc") -> Result:
    """A backend process (with its publisher) SIGSTOPped longer than its TTL, then continued: its lease
    expires meanwhile; it must be registered again within 2 s of SIGCONT, with no failed RPC."""
    r = Result(f"publisher SIGSTOP > TTL ({ttl} s)", bound_s=2.0, recovery_what="registered again after SIGCONT")
    probe = private_registry(etcd.endpoints)
    try:
        with nodes(etcd.url(), key, ["frozen", "steady"], ttl=ttl) as (frozen, steady), \
                loaded_channel(etcd_target(etcd.endpoints, key), warm=2) as (_ch, load):
            frozen.signal(signal.SIGSTOP)
            try:
                expired = holds_within(lambda: frozen.address not in (registered_values(probe, key) or {frozen.address}),
                                   ttl + 15)
                r.check(expired, "the frozen publisher's lease never expired")
                time.sleep(0.5)
            finally:
                frozen.signal(signal.SIGCONT)
            t_cont = time.monotonic()
            back = holds_within(lambda: frozen.address in (registered_values(probe, key) or set()), 20)
            r.recovery_s = round(time.monotonic() - t_cont, 3)
            r.check(back, "the continued publisher never registered again")
            r.check(r.recovery_s <= r.bound_s, f"registered again only {r.recovery_s} s after SIGCONT")
            served = holds_within(lambda: "frozen" in load.servers_after(t_cont), 30)
            r.check(served, "the continued backend never got traffic again")
            seen = registered_values(probe, key) or set()
            r.lost = len({frozen.address, steady.address} - seen)
            load.stop()
            load.fill(r)
    finally:
        close_registry(probe)
    return r


# ---- consul agent restart ------------------------------------------------------------------------


def consul_agent_restart(down_s: float = 10.0, ttl: int = 5, key: str = "chaos-consul",
                         base_dir: str | os.PathLike[str] | None = None) -> Result:
    """A Consul server agent that keeps its data dir (not -dev), stopped with SIGTERM for ``down_s`` seconds
    under load and started again with the same data. Two backend processes registered by ``waypost.serve``
    (ConsulPublisher, TTL ``ttl`` s), clients reading ``consul://agent/key``. With ``down_s`` > ``ttl`` the agent
    comes back with both instances in its catalog but critical until each publisher passes its check again; a
    resolver reading in that moment must keep the last list. Promise: no failed call, the instances passing
    again within 5 s of the agent's return, and a backend registered afterwards gets traffic."""
    from harness import consul_agent

    r = Result(f"consul agent restart, down {down_s:g} s (TTL {ttl} s)", bound_s=5.0,
               recovery_what="instances passing again after the agent returns")
    with consul_agent.ConsulAgent(base_dir, persistent=True) as agent, \
            nodes(agent.url, key, ["a", "b"], ttl=ttl, serve=True) as (a, b), \
            loaded_channel(f"consul://{agent.address}/{key}", warm=2) as (ch, load):
        want = sorted([a.address, b.address])
        agent.stop()  # SIGTERM
        time.sleep(down_s)
        agent.start()  # same data dir: services, checks and catalog come back
        t_back = time.monotonic()

        def passing() -> list[str] | None:
            """Passing in the agent's own state and in the catalog clients read (which, right after the start,
            can still show the passing state saved before the stop)."""
            try:
                local = agent.locally_passing_addresses(key)
                return local if agent.passing_addresses(key) == local else None
            except Exception:  # noqa: BLE001  # not answering yet: asked again
                return None

        back = holds_within(lambda: passing() == want, 30)
        r.recovery_s = round(time.monotonic() - t_back, 3)
        seen = passing() or []
        r.lost = len(set(want) - set(seen))
        r.check(back, f"passing instances after the agent's return: {seen}, expected {want}")
        r.check(r.recovery_s <= (r.bound_s or 0), f"instances passing again only {r.recovery_s} s after the return")
        # the client follows: both served again before the next change (a backend joining while they were still
        # critical would be the whole list, and its leaving would leave none)
        both = holds_within(lambda: sorted(ch.balancer.ready_addresses()) == want, 10)
        r.details["channel_has_both_after_s"] = round(time.monotonic() - t_back, 3)
        r.check(both, f"the channel holds {sorted(ch.balancer.ready_addresses())} after the agent's return, "
                      f"expected {want}")
        with nodes(agent.url, key, ["late"], ttl=ttl, serve=True) as (_late,):
            t_late = time.monotonic()
            got = holds_within(lambda: "late" in load.servers_after(t_late), 30)
            r.details["new_backend_served_after_s"] = round(time.monotonic() - t_late, 3)
            r.check(got, "a backend registered after the agent's return never got traffic")
        load.stop()
        r.details["agent_startup_s"] = round(agent.startup_seconds or 0.0, 3)
        r.details["empty_answers_held"] = getattr(ch._resolver, "holds", None)
        load.fill(r)
    return r


def pin_member(reg: EtcdRegistry, address: str, tries: int = 50) -> None:
    """Make ``address`` the member ``reg``'s client uses (connected), as the first of its list would be had it
    connected first (another one may connect sooner)."""
    async def pin() -> str:
        pool = reg.client.pool
        pool._current = next(i for i, ep in enumerate(pool.endpoints) if ep.address == address)
        await reg.client.range(b"pin", serializable=True)
        return await _uses(reg)

    for _ in range(tries):
        if _loop.run(pin(), 10) == address:
            return
        time.sleep(0.1)
    raise RuntimeError(f"{reg!r} does not settle on {address}")


async def _uses(reg: EtcdRegistry) -> str:
    """The member ``reg``'s unary calls go to now."""
    pool = reg.client.pool
    return pool.endpoints[pool._current].address


def partitioned_member(pc: PartitionCluster, partition_s: float = 8.0, key: str = "chaos-partition.rpc",
                       request_timeout: float = 10.0) -> Result:
    """One member of a 3-member cluster cut off from the other two (``harness/etcd_partition.py``) for
    ``partition_s`` seconds under load, while every client talks to it: it is listed first by the backends'
    publishers, the loaded channel's resolver and a subscriber, all with ``request_timeout`` (10 s: one
    attempt on a member would outlast the callers' own budgets). A backend registered during the partition,
    through the isolated member first, must get traffic; no call may fail, no registration may go, and after
    the heal and that backend's stop every view holds the three others again."""
    r = Result(f"etcd member partitioned {partition_s:g} s (3 members)", bound_s=10.0,
               recovery_what="a backend registered during the partition is served")
    iso = pc.follower()
    others = [i for i in range(len(pc.endpoints)) if i != iso]
    eps = [pc.endpoints[i] for i in [iso, *others]]
    opts = f"request_timeout={request_timeout:g}"
    reg_url = f"etcd://{','.join(eps)}?{opts}"
    probe = private_registry([pc.endpoints[i] for i in others])  # reads through the healthy members
    view = EtcdRegistry(EtcdConfig(endpoints=tuple(eps), request_timeout=request_timeout))
    sub = None
    shared = waypost.connect(reg_url)  # the registry the channel's resolver and the nodes' URL share (same settings)
    try:
        for reg in (view, shared):  # they talk to the member to be cut off, their watches included
            pin_member(reg, eps[0])
        sub = Subscriber(view, key)  # watching well before the cut
        with nodes(reg_url, key, ["a", "b", "c"]) as trio, \
                loaded_channel(f"{etcd_target(eps, key)}&{opts}", warm=3) as (ch, load):
            want = {n.address for n in trio}
            wait_until(lambda: set(sub.values()) == want, 20, "the subscriber sees the three backends")
            r.details["isolated"] = pc.etcd.members[iso].name
            r.details["clients_on_it"] = [_loop.run(_uses(reg)) == eps[0] for reg in (view, shared)]
            t_cut = time.monotonic()
            pc.isolate(iso)
            r.details["member_leaderless_after_s"] = round(pc.wait_leaderless(iso), 3)
            with nodes(reg_url, key, ["late"]) as (late,):
                served = holds_within(lambda: "late" in load.servers_after(t_cut), 30)
                r.recovery_s = round(time.monotonic() - t_cut, 3)
                r.check(served, "a backend registered during the partition never got traffic")
                seen_late = holds_within(lambda: late.address in sub.values(), 20)
                r.details["subscriber_saw_it_after_s"] = round(time.monotonic() - t_cut, 3)
                r.check(seen_late, "the subscriber never saw the backend registered during the partition")
                worst = 0  # registrations are checked through the healthy members until the heal
                while time.monotonic() < t_cut + partition_s:
                    seen = registered_values(probe, key)
                    if seen is not None:
                        worst = max(worst, len(want - seen))
                    time.sleep(0.2)
                r.lost = worst
                r.check(worst == 0, f"{worst} registrations missing during the partition")
                pc.heal()
                t_heal = time.monotonic()
            # "late" deregistered on leaving the block: every view converges on the three others
            converged = holds_within(lambda: set(sub.values()) == want
                                     and set(ch.balancer.ready_addresses()) == want, 30)
            r.details["views_converged_after_heal_s"] = round(time.monotonic() - t_heal, 3)
            r.check(converged, f"views after the heal: subscriber {sorted(sub.values())}, channel "
                               f"{sorted(ch.balancer.ready_addresses())}, expected {sorted(want)}")
            load.stop()
            load.fill(r)
            r.check(r.recovery_s <= (r.bound_s or 0), f"the new backend was served only after {r.recovery_s} s")
    finally:
        pc.heal()
        if sub is not None:
            sub.close()
        for reg in (view, probe, shared):
            close_registry(reg)
    return r


# ---- the report ----------------------------------------------------------------------------------


def fmt_table(results: list[Result]) -> str:
    head = ("scenario", "sent", "failed", "lost", "recovery", "bound", "ok")
    rows = [head]
    for x in results:
        rec = "-" if x.recovery_s is None else f"{x.recovery_s:.3f} s"
        bound = "-" if x.bound_s is None else f"{x.bound_s:g} s"
        rows.append((x.scenario, str(x.sent), str(x.failed), str(x.lost), rec, bound, "yes" if x.ok else "NO"))
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    lines = ["  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths)))
             for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    for x in results:
        for p in x.problems:
            lines.append(f"! {x.scenario}: {p}")
    return "\n".join(lines)

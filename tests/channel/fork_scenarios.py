"""The fork scenarios of ``tests/channel/test_fork_etcd.py``, each run in a fresh process of its own:

    python -m tests.channel.fork_scenarios NAME ETCD_ENDPOINT KEY ADDRESS_A ADDRESS_B

(exit status 0 when the scenario held, the failed assertion on stderr otherwise). A fresh process because
what a fork can do depends on every gRPC object alive in the forking process: a test process that ran other
tests before may hold grpc.aio objects, which make gRPC unusable in any child (that case has its own scenario).

Each round forks 8 children at once. A child exits with a code the parent checks: 0 when every call it was
asked to make answered, a bit per failed step otherwise (see ``_OLD``, ``_FRESH``, ...); a signal means it
crashed. Every child has an alarm, every wait a deadline. The parent keeps calling, watching and publishing
across the forks.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable

import waypost
import waypost.aio
from harness.backends import echo_pb2, echo_pb2_grpc
from harness.waiting import wait_until
from waypost.etcd.local import find_binary

Req = echo_pb2.EchoRequest
CHILDREN = 8
ROUNDS = 3
CHILD_ALARM_S = 40  # a child stuck anywhere dies of SIGALRM: reported as a crash, never a hang

# exit-code bits of a child
_OLD = 1  # a call on the channel dialed before the fork failed
_FRESH = 2  # a fresh dial in the child, or a call on it, failed
_UNEXPECTED = 4  # the child failed in an unexpected way (message on stderr)


def _fork_children(child: Callable[[], int]) -> list[int]:
    """Fork CHILDREN children running ``child`` (its return value is the exit code); their wait statuses."""
    pids = []
    for _ in range(CHILDREN):
        pid = os.fork()
        if pid == 0:  # child: never return into the caller
            code = _UNEXPECTED
            try:
                signal.alarm(CHILD_ALARM_S)
                code = child()
            except BaseException as e:  # noqa: BLE001
                os.write(2, f"fork child {os.getpid()}: {type(e).__name__}: {e}\n".encode()[:2000])
            finally:
                os._exit(code)
        pids.append(pid)
    return [_wait(pid) for pid in pids]


def _wait(pid: int) -> int:
    """The wait status of ``pid``, SIGKILLing it past the children's alarm (bounded)."""
    deadline = time.monotonic() + CHILD_ALARM_S + 10
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return status
        time.sleep(0.02)
    os.kill(pid, signal.SIGKILL)
    return os.waitpid(pid, 0)[1]


def _summary(statuses: list[int]) -> str:
    ok = sum(1 for s in statuses if os.WIFEXITED(s) and os.WEXITSTATUS(s) == 0)
    crashed = [signal.Signals(os.WTERMSIG(s)).name for s in statuses if os.WIFSIGNALED(s)]
    failed = [os.WEXITSTATUS(s) for s in statuses if os.WIFEXITED(s) and os.WEXITSTATUS(s)]
    return f"ok={ok}/{len(statuses)} crashed={crashed} failed={failed}"


def _etcdctl(endpoint: str, *args: str) -> str:
    out = subprocess.run([find_binary("etcdctl"), f"--endpoints={endpoint}", "--command-timeout=5s", *args],
                         capture_output=True, timeout=15, check=True)
    return out.stdout.decode()


def _register(endpoint: str, key: str, name: str, address: str) -> None:
    _etcdctl(endpoint, "put", f"{key}/{name}", address)


def _old_and_fresh_call(stub: echo_pb2_grpc.EchoStub, target: str, service_config: dict[str, object] | None = None,
                        ) -> int:
    """In a child: one call on the channel dialed before the fork, one on a fresh dial (``service_config``); the
    exit-code bits of what failed. The fresh channel must not health-check (off in a child of a process that
    used gRPC: waypost._fork)."""
    code = 0
    try:
        if stub.Unary(Req(), timeout=15).server != "a":
            code |= _OLD
    except Exception as e:  # noqa: BLE001
        os.write(2, f"old channel: {e}\n".encode()[:500])
        code |= _OLD
    try:
        with waypost.dial(target, service_config=service_config) as fresh:
            if echo_pb2_grpc.EchoStub(fresh).Unary(Req(), timeout=15).server != "a":
                code |= _FRESH
            if any(sc.health_task is not None for sc in fresh.balancer.subconns()):
                code |= _FRESH
    except Exception as e:  # noqa: BLE001
        os.write(2, f"fresh dial: {e}\n".encode()[:500])
        code |= _FRESH
    return code


def sync_channel_and_fresh_dial(endpoint: str, key: str, a: str, b: str, health: bool = False,
                                parent_health: bool | None = None) -> None:
    """health: the channel's health watches (grpc.aio streams) pause for each fork too; in a child the inherited
    channel and a fresh health-checked dial work, without health checking (logged: waypost._fork says why)."""
    service_config = {"healthCheckConfig": {"serviceName": ""}} if health else None
    parent_health = health if parent_health is None else parent_health
    parent_config = service_config if parent_health else None
    _register(endpoint, key, "a", a)
    target = f"etcd:///{endpoint}?key={key}"
    registry = waypost.connect(f"etcd://{endpoint}")
    # a publisher alive across the forks: its keepalive stream pauses and resumes around each one
    pub = waypost.Publisher(registry, f"{key}-pub", b, ttl=5)
    pub.start()
    lease = pub.lease_id
    try:
        with waypost.dial(target, balancer="round_robin", service_config=parent_config) as ch:
            stub = echo_pb2_grpc.EchoStub(ch)
            assert stub.Unary(Req(), timeout=10).server == "a"
            if parent_health:
                assert all(sc.health_task is not None and sc.healthy for sc in ch.balancer.subconns())

            for rnd in range(ROUNDS):
                statuses = _fork_children(lambda: _old_and_fresh_call(stub, target, service_config))
                assert all(os.WIFEXITED(s) and os.WEXITSTATUS(s) == 0 for s in statuses), \
                    f"round {rnd}: {_summary(statuses)}"
                assert stub.Unary(Req(), timeout=10).server == "a"  # the parent keeps working

            # the parent's watch resumed after the forks: a backend registered now gets traffic
            _register(endpoint, key, "b", b)
            wait_until(lambda: len(ch.balancer.subconns()) == 2, 20, what="parent sees b after the forks")
            wait_until(lambda: {stub.Unary(Req(), timeout=10).server for _ in range(6)} == {"a", "b"}, 20,
                       what="b gets traffic in the parent")
        # ... and its publisher still holds its registration, under the same lease (kept alive across the forks)
        assert b in _etcdctl(endpoint, "get", "--prefix", f"{key}-pub/", "--print-value-only")
        assert pub.registered and pub.lease_id == lease
    finally:
        pub.stop()


def inherited_channel_follows_the_registry(endpoint: str, key: str, a: str, b: str) -> None:
    _register(endpoint, key, "a", a)
    with waypost.dial(f"etcd:///{endpoint}?key={key}", balancer="round_robin") as ch:
        stub = echo_pb2_grpc.EchoStub(ch)
        assert stub.Unary(Req(), timeout=10).server == "a"
        r, w = os.pipe()

        def child() -> int:
            os.close(w)
            # the parent registers b right after the fork: the re-resolved list may already hold it
            if stub.Unary(Req(), timeout=15).server not in ("a", "b"):
                return _OLD
            os.read(r, 1)  # the parent registered b
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline:
                if {stub.Unary(Req(), timeout=10).server for _ in range(4)} == {"a", "b"}:
                    return 0
                time.sleep(0.05)
            return _OLD

        pid = os.fork()
        if pid == 0:
            code = _UNEXPECTED
            try:
                signal.alarm(CHILD_ALARM_S)
                code = child()
            finally:
                os._exit(code)
        os.close(r)
        _register(endpoint, key, "b", b)
        os.write(w, b"x")
        os.close(w)
        status = _wait(pid)
        assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, _summary([status])


async def _aio_call(target: str) -> str:
    async with waypost.aio.dial(target) as ch:
        reply = await echo_pb2_grpc.EchoStub(ch).Unary(Req(), timeout=15)
        return str(reply.server)


def aio_dial_after_an_aio_parent(endpoint: str, key: str, a: str, b: str) -> None:
    """The safe aio pattern: the parent used (and closed) its waypost.aio channel before forking; every child
    dials its own, and a sync dial works there too."""
    _register(endpoint, key, "a", a)
    target = f"etcd:///{endpoint}?key={key}"
    assert asyncio.run(_aio_call(target)) == "a"

    def child() -> int:
        code = 0
        try:
            if asyncio.run(_aio_call(target)) != "a":
                code |= _FRESH
        except Exception as e:  # noqa: BLE001
            os.write(2, f"aio dial: {e}\n".encode()[:500])
            code |= _FRESH
        try:
            with waypost.dial(target) as ch:
                if echo_pb2_grpc.EchoStub(ch).Unary(Req(), timeout=15).server != "a":
                    code |= _OLD
        except Exception as e:  # noqa: BLE001
            os.write(2, f"sync dial: {e}\n".encode()[:500])
            code |= _OLD
        return code

    for rnd in range(ROUNDS - 1):
        statuses = _fork_children(child)
        assert all(os.WIFEXITED(s) and os.WEXITSTATUS(s) == 0 for s in statuses), f"round {rnd}: {_summary(statuses)}"
        assert asyncio.run(_aio_call(target)) == "a"  # the parent keeps working


def open_aio_channel_is_a_clear_error(endpoint: str, key: str, a: str, b: str) -> None:
    """grpc.aio cannot cross fork: with a waypost.aio channel still open in the parent, the child's etcd
    dial refuses at once with a message naming the cause and the fix (instead of hanging or crashing)."""
    _register(endpoint, key, "a", a)
    target = f"etcd:///{endpoint}?key={key}"

    async def parent() -> None:
        ch = waypost.aio.dial(target)
        try:
            assert (await echo_pb2_grpc.EchoStub(ch).Unary(Req(), timeout=15)).server == "a"
            r, w = os.pipe()
            pid = os.fork()
            if pid == 0:
                code = _UNEXPECTED
                try:
                    signal.alarm(CHILD_ALARM_S)
                    os.close(r)
                    try:
                        waypost.dial(target)
                        os.write(w, b"dial succeeded")
                    except Exception as e:  # noqa: BLE001
                        os.write(w, str(e).encode()[:1000])
                    code = 0
                finally:
                    os._exit(code)
            os.close(w)
            status = await asyncio.get_running_loop().run_in_executor(None, _wait, pid)
            out = os.read(r, 2000).decode()
            os.close(r)
            assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, _summary([status])
            assert "forked while grpc.aio objects" in out and "after the fork" in out, out
            # the parent's aio channel is untouched
            assert (await echo_pb2_grpc.EchoStub(ch).Unary(Req(), timeout=15)).server == "a"
        finally:
            await ch.close()

    asyncio.run(parent())


def closed_registry_before_fork(endpoint: str, key: str, a: str, b: str) -> None:
    """A registry closed (but still referenced) before the fork: its closed channels must not keep grpc.aio's
    poller alive, which would leave the children unable to use gRPC at all."""
    from waypost import _loop
    from waypost.etcd.config import EtcdConfig
    from waypost.registries.etcd.store import EtcdRegistry

    _register(endpoint, key, "a", a)
    target = f"etcd:///{endpoint}?key={key}"
    closed = EtcdRegistry(EtcdConfig(endpoints=(endpoint,)))
    assert _loop.run(closed.get(key + "/", prefix=True), 10).kvs
    _loop.run(closed.close(), 10)
    with waypost.dial(target) as ch:
        stub = echo_pb2_grpc.EchoStub(ch)
        assert stub.Unary(Req(), timeout=10).server == "a"

        statuses = _fork_children(lambda: _old_and_fresh_call(stub, target))
        assert all(os.WIFEXITED(s) and os.WEXITSTATUS(s) == 0 for s in statuses), _summary(statuses)
    del closed


SCENARIOS: dict[str, Callable[..., None]] = {
    "sync": sync_channel_and_fresh_dial,
    "sync-health": lambda *args: sync_channel_and_fresh_dial(*args, health=True),
    "sync-health-child": lambda *args: sync_channel_and_fresh_dial(*args, health=True, parent_health=False),
    "inherited-follows": inherited_channel_follows_the_registry,
    "aio": aio_dial_after_an_aio_parent,
    "open-aio": open_aio_channel_is_a_clear_error,
    "closed-registry": closed_registry_before_fork,
}

if __name__ == "__main__":
    name, *args = sys.argv[1:]
    SCENARIOS[name](*args)

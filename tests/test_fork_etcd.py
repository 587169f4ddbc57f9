"""fork() after dialing an etcd target (gunicorn/uWSGI preload): real etcd, real backend processes, real forks.

Each round forks 8 children at once. A child exits with a code the parent checks: 0 when every call it was
asked to make answered, a bit per failed step otherwise (see ``_OLD``, ``_FRESH``, ...); a signal means it
crashed. Every child has an alarm, every wait a deadline. The parent keeps calling, watching and publishing
across the forks.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time
from collections.abc import Callable, Iterator

import pytest

import waypost
import waypost.aio
from tests.backends import echo_pb2, echo_pb2_grpc
from tests.backends.helpers import wait_until
from tests.backends.procs import EchoProcess

pytestmark = pytest.mark.skipif(not hasattr(os, "fork") or sys.platform == "darwin", reason="needs fork (Linux)")

Req = echo_pb2.EchoRequest
CHILDREN = 8
ROUNDS = 3
CHILD_ALARM_S = 40  # a child stuck anywhere dies of SIGALRM: reported as a crash, never a hang

# exit-code bits of a child
_OLD = 1  # a call on the channel dialed before the fork failed
_FRESH = 2  # a fresh dial in the child, or a call on it, failed
_UNEXPECTED = 4  # the child failed in an unexpected way (message on stderr)


@pytest.fixture(scope="module")
def backends() -> Iterator[tuple[EchoProcess, EchoProcess]]:
    a, b = EchoProcess("a"), EchoProcess("b")
    try:
        yield a, b
    finally:
        a.kill()
        b.kill()


def _fork_children(child: Callable[[], int]) -> list[int]:
    """Fork CHILDREN children running ``child`` (its return value is the exit code); their wait statuses."""
    pids = []
    for _ in range(CHILDREN):
        pid = os.fork()
        if pid == 0:  # child: never return into pytest
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


def _register(etcd, key: str, name: str, address: str) -> None:
    etcd.etcdctl("put", f"{key}/{name}", address)


@pytest.mark.slow
@pytest.mark.parametrize("health", [False, True], ids=["plain", "health-checked"])
def test_sync_channel_and_fresh_dial_work_in_forked_children(shared_etcd, unique_key, backends, health):
    """health-checked: the channel's health watches (grpc.aio streams) pause for each fork too."""
    a, b = backends
    service_config = {"healthCheckConfig": {"serviceName": ""}} if health else None
    _register(shared_etcd, unique_key, "a", a.address)
    target = f"etcd:///{shared_etcd.endpoint}?key={unique_key}"
    registry = waypost.connect(shared_etcd.url())
    # a publisher alive across the forks: its keepalive stream pauses and resumes around each one
    pub = waypost.Publisher(registry, f"{unique_key}-pub", b.address, ttl=5)
    pub.start()
    lease = pub.lease_id
    try:
        with waypost.dial(target, balancer="round_robin", service_config=service_config) as ch:
            stub = echo_pb2_grpc.EchoStub(ch)
            assert stub.Unary(Req(), timeout=10).server == "a"
            if health:
                assert all(sc.health_task is not None and sc.healthy for sc in ch.balancer.subconns())

            def child() -> int:
                code = 0
                try:
                    if stub.Unary(Req(), timeout=15).server != "a":
                        code |= _OLD
                except Exception as e:  # noqa: BLE001
                    os.write(2, f"old channel: {e}\n".encode()[:500])
                    code |= _OLD
                try:
                    with waypost.dial(target) as fresh:
                        if echo_pb2_grpc.EchoStub(fresh).Unary(Req(), timeout=15).server != "a":
                            code |= _FRESH
                except Exception as e:  # noqa: BLE001
                    os.write(2, f"fresh dial: {e}\n".encode()[:500])
                    code |= _FRESH
                return code

            for rnd in range(ROUNDS):
                statuses = _fork_children(child)
                assert all(os.WIFEXITED(s) and os.WEXITSTATUS(s) == 0 for s in statuses), \
                    f"round {rnd}: {_summary(statuses)}"
                assert stub.Unary(Req(), timeout=10).server == "a"  # the parent keeps working

            # the parent's watch resumed after the forks: a backend registered now gets traffic
            _register(shared_etcd, unique_key, "b", b.address)
            wait_until(lambda: len(ch.balancer.subconns()) == 2, 20, what="parent sees b after the forks")
            wait_until(lambda: {stub.Unary(Req(), timeout=10).server for _ in range(6)} == {"a", "b"}, 20,
                       what="b gets traffic in the parent")
        # ... and its publisher still holds its registration, under the same lease (kept alive across the forks)
        assert b.address in shared_etcd.etcdctl("get", "--prefix", f"{unique_key}-pub/", "--print-value-only")
        assert pub.registered and pub.lease_id == lease
    finally:
        pub.stop()


@pytest.mark.slow
def test_inherited_sync_channel_follows_the_registry_in_the_child(shared_etcd, unique_key, backends):
    a, b = backends
    _register(shared_etcd, unique_key, "a", a.address)
    with waypost.dial(f"etcd:///{shared_etcd.endpoint}?key={unique_key}", balancer="round_robin") as ch:
        stub = echo_pb2_grpc.EchoStub(ch)
        assert stub.Unary(Req(), timeout=10).server == "a"
        r, w = os.pipe()

        def child() -> int:
            os.close(w)
            if stub.Unary(Req(), timeout=15).server != "a":
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
        _register(shared_etcd, unique_key, "b", b.address)
        os.write(w, b"x")
        os.close(w)
        status = _wait(pid)
        assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, _summary([status])


async def _aio_call(target: str) -> str:
    async with waypost.aio.dial(target) as ch:
        reply = await echo_pb2_grpc.EchoStub(ch).Unary(Req(), timeout=15)
        return str(reply.server)


@pytest.mark.slow
def test_aio_dial_in_forked_children_after_an_aio_parent(shared_etcd, unique_key, backends):
    """The safe aio pattern: the parent used (and closed) its waypost.aio channel before forking; every child
    dials its own, and a sync dial works there too."""
    a, _ = backends
    _register(shared_etcd, unique_key, "a", a.address)
    target = f"etcd:///{shared_etcd.endpoint}?key={unique_key}"
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


def test_fork_with_an_open_aio_channel_is_a_clear_error_in_the_child(shared_etcd, unique_key, backends):
    """grpc.aio cannot cross fork: with a waypost.aio channel still open in the parent, the child's etcd
    dial refuses at once with a message naming the cause and the fix (instead of hanging or crashing)."""
    a, _ = backends
    _register(shared_etcd, unique_key, "a", a.address)
    target = f"etcd:///{shared_etcd.endpoint}?key={unique_key}"

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

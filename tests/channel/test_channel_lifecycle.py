"""Backend channel lifecycle: draining removed backends, fork, subsetting through dial."""

from __future__ import annotations

import itertools
import os
import signal
import threading
import time

import grpc
import pytest

import waypost
from harness.backends import echo_pb2, echo_pb2_grpc
from harness.waiting import wait_until
from tests.channel.support import direct, echo_servers

Req = echo_pb2.EchoRequest
_n = itertools.count()


def _memory(name_hint: str):
    name = f"{name_hint}{os.getpid()}x{next(_n)}"
    return name, waypost.connect(f"memory://{name}")


def test_removed_backend_drains_in_flight_calls_then_closes():
    name, registry = _memory("drain")
    with echo_servers("a", "b") as (a, b):
        pa = waypost.Publisher(registry, "d.rpc", a.address)
        pb = waypost.Publisher(registry, "d.rpc", b.address)
        pa.start()
        pb.start()
        try:
            with waypost.dial(f"memory://{name}/?key=d.rpc", balancer="pick_first") as ch:
                stub = echo_pb2_grpc.EchoStub(ch)
                order = [sc.address for sc in ch.balancer.subconns()]
                first = order[0]
                pub_first = pa if first == a.address else pb
                fut = stub.Unary.future(Req(delay_ms=1500), timeout=30)
                wait_until(lambda: any(sc.inflight for sc in ch.balancer.subconns()), 10)
                victim = next(sc for sc in ch.balancer.subconns() if sc.address == first)
                pub_first.stop()
                wait_until(lambda: first not in [sc.address for sc in ch.balancer.subconns()], 10)
                assert victim in ch.balancer.draining()  # kept while its call runs
                assert fut.result(timeout=30).server in {"a", "b"}  # the in-flight call completed
                wait_until(lambda: victim not in ch.balancer.draining(), 10, what="drained channel closed")
                with pytest.raises(ValueError):  # closed
                    victim.channel.unary_unary("/x")(b"")
        finally:
            pa.stop()
            pb.stop()


def test_subset_size_limits_backends_per_client():
    name, registry = _memory("subset")
    with echo_servers("a", "b", "c", "d") as srv:
        pubs = [waypost.Publisher(registry, "s.rpc", s.address) for s in srv]
        for p in pubs:
            p.start()
        try:
            with waypost.dial(f"memory://{name}/?key=s.rpc", balancer="round_robin", subset_size=2) as ch:
                assert len(ch.balancer.subconns()) == 2
                stub = echo_pb2_grpc.EchoStub(ch)
                assert len({stub.Unary(Req()).server for _ in range(8)}) <= 2
            with waypost.dial(f"memory://{name}/?key=s.rpc", subset_size=2, client_id=1) as ch:
                assert len(ch.balancer.subconns()) == 2
        finally:
            for p in pubs:
                p.stop()


def test_forked_child_gets_fresh_backend_channels():
    with echo_servers("a") as srv, waypost.dial(direct(srv), balancer="round_robin") as ch:
        stub = echo_pb2_grpc.EchoStub(ch)
        assert stub.Unary(Req()).server == "a"
        parent_channels = [sc.channel for sc in ch.balancer.subconns()]
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:  # child: never return into pytest
            code = 1
            try:
                os.close(r)
                ok = stub.Unary(Req(), timeout=20).server == "a"
                fresh = all(sc.channel not in parent_channels for sc in ch.balancer.subconns())
                os.write(w, f"{ok} {fresh}".encode())
                code = 0
            except BaseException as e:  # noqa: BLE001
                os.write(w, f"error {type(e).__name__}: {e}".encode()[:500])
            finally:
                os._exit(code)
        os.close(w)
        deadline = time.monotonic() + 60
        status = None
        while time.monotonic() < deadline:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                break
            time.sleep(0.05)
        else:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            pytest.fail("forked child did not finish")
        out = os.read(r, 1000).decode()
        os.close(r)
        assert out == "True True", out
        assert os.waitstatus_to_exitcode(status) == 0
        assert stub.Unary(Req()).server == "a"  # the parent is unaffected


def test_many_threads_share_one_channel():
    with echo_servers("a", "b", "c") as srv, waypost.dial(direct(srv), balancer="least_request") as ch:
        stub = echo_pb2_grpc.EchoStub(ch)
        errors: list[BaseException] = []
        seen: set[str] = set()

        def worker() -> None:
            try:
                for _ in range(40):
                    seen.add(stub.Unary(Req(), timeout=30).server)
            except BaseException as e:  # noqa: BLE001
                errors.append(e)

        ts = [threading.Thread(target=worker) for _ in range(8)]
        for t in ts:
            t.start()
        for t in ts:
            t.join(60)
        assert errors == [] and seen == {"a", "b", "c"}
        assert all(sc.inflight == 0 for sc in ch.balancer.subconns())


def test_watcher_uses_one_thread_for_many_channels():
    before = {t.name for t in threading.enumerate()}
    with echo_servers("a", "b") as srv:
        chans = [waypost.dial(direct(srv), balancer="round_robin") for _ in range(20)]
        try:
            for c in chans:
                echo_pb2_grpc.EchoStub(c).Unary(Req(), timeout=30)
            names = [t.name for t in threading.enumerate()]
            assert names.count("waypost-connectivity") == 1
            new = [n for n in names if n not in before and n.startswith("waypost")]
            assert len(new) <= 2  # the connectivity watcher (+ the control loop), not one per backend
        finally:
            for c in chans:
                c.close()


def test_rpc_error_from_balancer_is_a_grpc_call():
    with waypost.dial("direct:///127.0.0.1:1", balancer="round_robin") as ch:
        with pytest.raises(grpc.RpcError) as ei:
            echo_pb2_grpc.EchoStub(ch).Unary(Req(), timeout=20)
        e = ei.value
        assert isinstance(e, grpc.Call)
        assert e.code() == grpc.StatusCode.UNAVAILABLE and "127.0.0.1:1" in e.details()
        assert e.trailing_metadata() == () and e.initial_metadata() == ()


def test_address_updates_keep_channels_of_backends_that_stay():
    name, registry = _memory("keep")
    with echo_servers("a", "b", "c") as (a, b, c):
        pa = waypost.Publisher(registry, "k.rpc", a.address)
        pb = waypost.Publisher(registry, "k.rpc", b.address)
        pc = waypost.Publisher(registry, "k.rpc", c.address)
        pa.start()
        pb.start()
        try:
            with waypost.dial(f"memory://{name}/?key=k.rpc", balancer="round_robin") as ch:
                stub = echo_pb2_grpc.EchoStub(ch)
                stub.Unary(Req())
                before = {sc.address: sc.channel for sc in ch.balancer.subconns()}
                pc.start()
                wait_until(lambda: len(ch.balancer.subconns()) == 3, 20)
                pb.stop()
                wait_until(lambda: len(ch.balancer.subconns()) == 2, 20)
                after = {sc.address: sc.channel for sc in ch.balancer.subconns()}
                assert after[a.address] is before[a.address]  # same grpc channel, same connection
                assert set(after) == {a.address, c.address}
                wait_until(lambda: len(ch.balancer.ready_addresses()) == 2, 20)
                assert {stub.Unary(Req()).server for _ in range(6)} == {"a", "c"}
        finally:
            for p in (pa, pb, pc):
                p.stop()


def test_flapping_address_gets_its_channel_back_and_no_call_fails():
    from waypost.types import Backend

    with echo_servers("a", "b") as (a, b), waypost.dial(direct([a, b]), balancer="round_robin") as ch:
        stub = echo_pb2_grpc.EchoStub(ch)
        wait_until(lambda: len(ch.balancer.ready_addresses()) == 2 or stub.Unary(Req()) and False, 20)
        original = {sc.address: sc.channel for sc in ch.balancer.subconns()}
        errors: list[BaseException] = []
        stop = threading.Event()

        def caller() -> None:
            while not stop.is_set():
                try:
                    stub.Unary(Req(), timeout=10)
                except BaseException as e:  # noqa: BLE001  # any failure counts
                    errors.append(e)

        ts = [threading.Thread(target=caller) for _ in range(3)]
        for t in ts:
            t.start()
        try:
            for _ in range(200):  # remove and re-add b every ~1 ms, as a flapping registration would
                ch.balancer.update([Backend(a.address)])
                ch.balancer.update([Backend(a.address), Backend(b.address)])
                time.sleep(0.001)
        finally:
            stop.set()
            for t in ts:
                t.join(30)
        assert errors == []
        assert {sc.address: sc.channel for sc in ch.balancer.subconns()} == original  # same connections

"""What a new user runs into first, against real etcd and real gRPC servers: `waypost resolve KEY`,
`waypost watch KEY` through an etcd outage, a key with nothing registered, a bare etcd address dialed as a
backend, a call that fails after its backend died."""

from __future__ import annotations

import asyncio
import json
import queue
import subprocess
import sys
import threading
import time
from pathlib import Path

import grpc
import grpc.aio
import pytest
from click.testing import CliRunner

import waypost
import waypost.aio
from harness.backends import echo_pb2, echo_pb2_grpc
from harness.backends.procs import spawn_many
from harness.waiting import wait_until
from waypost.cli.commands import app
from waypost.etcd.local import LocalEtcd

ROOT = Path(__file__).resolve().parents[2]


def cli(*args: str):
    return CliRunner().invoke(app, list(args), catch_exceptions=False)


# ---------------------------------------------------------------------------------------- resolve KEY


def test_resolve_takes_a_bare_key_in_the_registry_as_ls_and_watch_do(shared_etcd, unique_key):
    url = shared_etcd.url()
    with waypost.Publisher(url, unique_key, "127.0.0.1:9001", metadata={"weight": 3}):
        res = cli("--registry", url, "--json", "resolve", unique_key)
        assert res.exit_code == 0, res.output
        out = json.loads(res.stdout)
        assert out["scheme"] == "etcd" and out["key"] == unique_key
        assert [(b["address"], b["metadata"]) for b in out["backends"]] == [("127.0.0.1:9001", {"weight": 3})]
        # the same answer as the full target
        full = json.loads(cli("--json", "resolve", f"etcd:///{shared_etcd.endpoint}?key={unique_key}").stdout)
        assert full["backends"] == out["backends"]


# ---------------------------------------------------------------------------------------- watch through an outage


def _lines(proc: subprocess.Popen[str], into: queue.Queue[str]) -> None:
    assert proc.stdout is not None
    for line in proc.stdout:
        into.put(line)


def _next_event(lines: queue.Queue[str], event: str, timeout: float) -> dict:
    """The next JSON line whose event is ``event`` (within ``timeout`` seconds per line)."""
    while True:
        try:
            line = lines.get(timeout=timeout)
        except queue.Empty:
            raise AssertionError(f"no {event!r} event within {timeout}s") from None
        obj = json.loads(line)
        if obj["event"] == event:
            return obj


def test_watch_reports_the_registry_going_away_and_coming_back(tmp_path, unique_key):
    node = LocalEtcd(1, base_dir=tmp_path / "etcd").start()
    proc = None
    try:
        waypost.connect(node.url()).sync.put(f"{unique_key}/1", b"127.0.0.1:9001")  # no lease: survives restarts
        proc = subprocess.Popen([sys.executable, "-m", "waypost.cli", "--registry", node.url(), "watch", unique_key,
                                 "--json", "--for", "90"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True, cwd=ROOT)
        lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=_lines, args=(proc, lines), daemon=True).start()
        present = _next_event(lines, "present", 30)
        assert present["address"] == "127.0.0.1:9001"

        node.members[0].stop()
        down = _next_event(lines, "registry_unreachable", 30)
        assert down["key"] == unique_key and down["registry"] == node.url()
        assert "unreachable" in down["reason"] or "refused" in down["reason"].lower(), down

        node.members[0].start()
        up = _next_event(lines, "registry_reachable", 40)
        assert up["reason"] is None
        proc.terminate()
        _, err = proc.communicate(timeout=30)
        err_lines = [ln for ln in err.splitlines() if "unreachable" in ln or "is back" in ln]
        assert len(err_lines) == 2, err  # one line when it went away, one when it came back
        assert node.endpoint in err_lines[0] and "showing the last list" in err_lines[0], err_lines
        assert err_lines[1].endswith(f"{node.url()} is back"), err_lines
    finally:
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait(10)
        node.close()


# ---------------------------------------------------------------------------------------- a key with nothing


def _unavailable_details(stub) -> str:
    try:
        stub.Unary(echo_pb2.EchoRequest(), timeout=10)
    except grpc.RpcError as e:
        assert e.code() == grpc.StatusCode.UNAVAILABLE, e
        return e.details()
    raise AssertionError("the call succeeded")


def test_a_key_with_nothing_registered_says_so_and_names_the_close_keys_at_the_first_call(etcd):
    with waypost.Publisher(etcd.url(), "inventory.rpc", "127.0.0.1:9001"), \
            waypost.Publisher(etcd.url(), "billing.rpc", "127.0.0.1:9002"):
        # the first call, right after the dial: it waits for the (bounded) read of the registry's keys
        with waypost.dial(f"etcd:///{etcd.endpoint}?key=inventry.rpc") as ch:
            first = _unavailable_details(echo_pb2_grpc.EchoStub(ch))
        assert "nothing is registered under key 'inventry.rpc'" in first and "waypost ls" in first, first
        assert "did you mean 'inventory.rpc'?" in first and "billing" not in first, first

        # aio too (the read's end reaches the channel on its own loop), and a key close to nothing gets no suggestion
        async def first_details(key: str) -> str:
            async with waypost.aio.dial(f"etcd:///{etcd.endpoint}?key={key}") as ch:
                try:
                    await echo_pb2_grpc.EchoStub(ch).Unary(echo_pb2.EchoRequest(), timeout=10)
                except grpc.aio.AioRpcError as e:
                    assert e.code() == grpc.StatusCode.UNAVAILABLE, e
                    return e.details() or ""
            return ""

        details = asyncio.run(first_details("billng.rpc"))
        assert "nothing is registered under key 'billng.rpc'; did you mean 'billing.rpc'?" in details, details
        details = asyncio.run(first_details("zzzz.qqq"))
        assert "nothing is registered under key 'zzzz.qqq'" in details and "did you mean" not in details, details


# ---------------------------------------------------------------------------------------- etcd dialed as a backend


def test_an_etcd_endpoint_dialed_as_a_backend_says_which_target_was_meant(shared_etcd):
    with waypost.dial(shared_etcd.endpoint) as ch, pytest.raises(grpc.RpcError) as ei:  # a bare host:port
        echo_pb2_grpc.EchoStub(ch).Unary(echo_pb2.EchoRequest(), timeout=10)
    assert ei.value.code() == grpc.StatusCode.UNIMPLEMENTED
    details = ei.value.details()
    assert details.startswith("unknown service waypost.test.Echo"), details  # the original text first
    assert (f"this looks like an etcd endpoint: did you mean etcd:///{shared_etcd.endpoint}?key=SERVICE_KEY"
            in details), details


def test_a_direct_target_on_port_2379_warns_at_dial():
    with pytest.warns(waypost.ConfigWarning, match=r"did you mean 'etcd:///127\.0\.0\.1:2379\?key=SERVICE_KEY'"):
        ch = waypost.dial("127.0.0.1:2379", block=False)
    ch.close()


# ---------------------------------------------------------------------------------------- a backend dies mid-call


@pytest.mark.parametrize("flavour", ["sync", "aio"])
def test_a_call_failing_as_its_backend_dies_names_the_backend_and_retries(shared_etcd, unique_key, flavour):
    (proc,) = spawn_many(["victim"])
    target = f"etcd:///{shared_etcd.endpoint}?key={unique_key}"
    slow = echo_pb2.EchoRequest(delay_ms=30_000)
    try:
        with waypost.Publisher(shared_etcd.url(), unique_key, proc.address):
            if flavour == "sync":
                with waypost.dial(target) as ch:
                    stub = echo_pb2_grpc.EchoStub(ch)
                    stub.Unary(echo_pb2.EchoRequest(), timeout=20)  # connected
                    failed: queue.Queue[grpc.RpcError] = queue.Queue()

                    def call() -> None:
                        try:
                            stub.Unary(slow, timeout=60)
                        except grpc.RpcError as e:
                            failed.put(e)

                    caller = threading.Thread(target=call, daemon=True)
                    caller.start()
                    wait_until(lambda: ch.balancer.subconns()[0].inflight == 1, 10)
                    time.sleep(0.5)  # the request on the wire (a call never sent is re-picked, not failed)
                    proc.kill()
                    err = failed.get(timeout=60)
                    caller.join(10)
            else:
                async def main() -> grpc.RpcError:
                    async with waypost.aio.dial(target) as ch:
                        stub = echo_pb2_grpc.EchoStub(ch)
                        await stub.Unary(echo_pb2.EchoRequest(), timeout=20)
                        call = stub.Unary(slow, timeout=60)
                        for _ in range(200):
                            if ch.balancer.subconns()[0].inflight == 1:
                                break
                            await asyncio.sleep(0.05)
                        await asyncio.sleep(0.5)
                        proc.kill()
                        try:
                            await call
                        except grpc.RpcError as e:
                            return e
                    raise AssertionError("the call succeeded")

                err = asyncio.run(asyncio.wait_for(main(), 90))
    finally:
        proc.close()
    assert err.code() == grpc.StatusCode.UNAVAILABLE, err
    details = err.details()
    assert not details.startswith("["), details  # grpc's own text first
    assert f"[backend {proc.address}: the call was in flight" in details and "retries=N" in details, details


# ---------------------------------------------------------------------------------------- dial with etcd down


def test_a_blocking_dial_with_etcd_down_names_the_endpoint_and_the_refusal_first():
    from waypost.etcd.local import free_port

    endpoint = f"127.0.0.1:{free_port()}"
    with pytest.raises(waypost.RegistryUnavailable) as ei:
        waypost.dial(f"etcd:///{endpoint}?key=inventory.rpc")
    text = str(ei.value)
    assert text.startswith(f"etcd at {endpoint} unreachable: connection refused"), text
    assert "'inventory.rpc'" in text and "_waypost" not in text, text

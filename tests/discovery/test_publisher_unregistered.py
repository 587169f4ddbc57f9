"""A publisher that cannot renew its lease for long: the outage clock, the gauges, the alert, and "exit".

Unit tests with a fake clock for the clock and the gauges' folding; a real etcd frozen with SIGSTOP for the
alert and the gauges; real child processes (serve, serve_async, a bare Publisher) for "exit".
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from harness.waiting import wait_until
from tests.balancer.support import FakeClock
from tests.etcd.helpers import run
from waypost import Publisher, metrics
from waypost.discovery.connections import connect
from waypost.registration.outage import UNREGISTERED_EXIT_CODE, Outage, check_unregistered_args

ROOT = Path(__file__).resolve().parents[2]


# ---- unit: the outage clock, the arguments, the gauges' folding --------------------------------------------


def test_outage_clock_counts_one_outage_at_a_time():
    clock = FakeClock(100.0)
    outage = Outage("pub", None, None, clock)
    assert outage.seconds() == 0.0
    outage.begin()
    clock.now = 103.5
    outage.begin()  # still the same outage
    assert outage.seconds() == 3.5
    clock.now = 110.0
    assert outage.end() == 10.0
    assert outage.seconds() == 0.0 and outage.end() == 0.0  # over; ending again changes nothing


def test_alert_fires_once_per_outage_and_not_after_recovery():
    called: list[object] = []
    done = threading.Event()

    def on_unregistered(pub: object) -> None:
        called.append(pub)
        done.set()

    async def scenario() -> Outage:
        outage = Outage("pub", 0.05, on_unregistered)
        outage.begin()
        outage.end()  # recovered before the alarm: no alert
        await asyncio.sleep(0.1)
        assert outage.alerts == 0
        outage.begin()  # a second outage, long enough
        while outage.alerts == 0:
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.1)
        return outage

    outage = asyncio.run(asyncio.wait_for(scenario(), 30))
    assert done.wait(30)
    assert outage.alerts == 1 and called == ["pub"]


@pytest.mark.parametrize(("max_unregistered", "on_unregistered", "message"), [
    (0, None, "positive number"),
    (-1, None, "positive number"),
    (float("inf"), None, "positive number"),
    (True, None, "positive number"),
    ("5", None, "positive number"),
    (5, "quit", "callable f\\(publisher\\) or 'exit'"),
    (None, "exit", "needs max_unregistered"),
])
def test_bad_arguments_are_named(max_unregistered, on_unregistered, message):
    with pytest.raises(ValueError, match=message):
        check_unregistered_args(max_unregistered, on_unregistered)
    with pytest.raises(ValueError, match=message):
        Publisher("memory://unreg-args", "k.rpc", "127.0.0.1:1", max_unregistered=max_unregistered,
                  on_unregistered=on_unregistered)


def test_gauges_fold_publishers_of_one_key():
    samples = [metrics.PublisherSample("a.rpc", True, 0.0), metrics.PublisherSample("a.rpc", False, 4.0),
               metrics.PublisherSample("b.rpc", True, 0.0)]
    assert metrics.publisher_gauges(samples) == {("a.rpc", ""): (0, 4.0), ("b.rpc", ""): (1, 0.0)}


def test_gauges_of_a_paused_publisher_show_unregistered_but_no_outage():
    reg = CollectorRegistry()
    metrics.enable(reg)
    try:
        with Publisher("memory://unreg-gauges", "g.rpc", "127.0.0.1:7301") as pub:
            assert reg.get_sample_value("waypost_publisher_registered", {"key": "g.rpc", "registry": "memory://unreg-gauges"}) == 1
            pub.pause()
            assert reg.get_sample_value("waypost_publisher_registered", {"key": "g.rpc", "registry": "memory://unreg-gauges"}) == 0
            assert reg.get_sample_value("waypost_publisher_unregistered_seconds", {"key": "g.rpc", "registry": "memory://unreg-gauges"}) == 0
        # stopped: the key has no series any more
        assert reg.get_sample_value("waypost_publisher_registered", {"key": "g.rpc", "registry": "memory://unreg-gauges"}) is None
    finally:
        metrics.disable()


# ---- real etcd, frozen: the alert, the gauges, the recovery ------------------------------------------------


def test_frozen_etcd_raises_the_alert_and_the_gauges_then_recovery_clears_them(etcd):
    prom = CollectorRegistry()
    metrics.enable(prom)
    reg = connect(etcd.url())
    alerts: list[float] = []

    def gauge(name: str) -> float | None:
        return prom.get_sample_value(name, {"key": "frozen.rpc", "registry": reg.url})

    pub = Publisher(reg, "frozen.rpc", "127.0.0.1:7302", ttl=2, max_unregistered=1,
                    on_unregistered=lambda p: alerts.append(p.unregistered_seconds))
    try:
        pub.start()
        assert gauge("waypost_publisher_registered") == 1
        assert gauge("waypost_publisher_unregistered_seconds") == 0
        etcd.members[0].pause()
        try:
            # the lease runs out (2 s without a renewal), then max_unregistered (1 s) passes
            wait_until(lambda: alerts, 30, what="on_unregistered called")
            assert alerts[0] >= 1.0  # it ran after max_unregistered, not before
            assert not pub.registered and gauge("waypost_publisher_registered") == 0
            assert gauge("waypost_publisher_unregistered_seconds") >= 1.0
        finally:
            etcd.members[0].resume()
        wait_until(lambda: pub.registered, 30, what="registered again after etcd thawed")
        assert gauge("waypost_publisher_registered") == 1
        assert gauge("waypost_publisher_unregistered_seconds") == 0
        assert pub.outage.alerts == 1 and len(alerts) == 1  # once per outage
    finally:
        pub.stop()
        run(reg.close(), 10)
        metrics.disable()


# ---- "exit": real child processes, real signals --------------------------------------------------------------

CHILD = textwrap.dedent("""
    import asyncio, atexit, logging, sys, time
    from concurrent import futures
    import grpc, waypost
    from harness.backends import echo_pb2_grpc
    from harness.backends.server import EchoServicer

    mode, url, key = sys.argv[1:4]
    logging.basicConfig(level=logging.INFO, stream=sys.stderr)
    atexit.register(lambda: print("atexit ran", flush=True))
    ARGS = dict(listen_on="127.0.0.1:0", registry=url, ttl=2, grace=1, drain_delay=0.2,
                max_unregistered=1, on_unregistered="exit")

    def sync_server():
        s = grpc.server(futures.ThreadPoolExecutor(4))
        echo_pb2_grpc.add_EchoServicer_to_server(EchoServicer(mode), s)
        return s

    if mode == "wait":        # serve(), the main thread in handle.wait(): SystemExit from wait()
        handle = waypost.serve(sync_server(), key, **ARGS)
        print("ready", flush=True)
        try:
            handle.wait()
        finally:
            print("finally ran", flush=True)
        print("wait returned", flush=True)  # never: wait() raises SystemExit
    elif mode == "busy":      # serve(), the main thread busy elsewhere: exit from the stopping thread
        handle = waypost.serve(sync_server(), key, **ARGS)
        print("ready", flush=True)
        while True:
            time.sleep(0.1)
    elif mode == "aio":       # serve_async(): SystemExit out of the event loop
        async def main():
            server = grpc.aio.server()
            echo_pb2_grpc.add_EchoServicer_to_server(EchoServicer(mode), server)
            handle = await waypost.serve_async(server, key, **ARGS)
            print("ready", flush=True)
            await handle.wait()
        asyncio.run(main())
    elif mode == "publisher":  # a bare Publisher: stop it, then exit
        pub = waypost.Publisher(url, key, "127.0.0.1:7399", ttl=2, max_unregistered=1, on_unregistered="exit")
        pub.start()
        print("ready", flush=True)
        while True:
            time.sleep(0.1)
""")


def test_exit_after_max_unregistered_in_real_processes(etcd, unique_key):
    """Four children on one etcd; SIGSTOP etcd; each stops and exits with status 75 within a bound."""
    modes = ["wait", "busy", "aio", "publisher"]
    procs = {m: subprocess.Popen([sys.executable, "-c", CHILD, m, etcd.url(), f"{unique_key}.{m}"], cwd=ROOT,
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
             for m in modes}
    try:
        for m, p in procs.items():
            line = p.stdout.readline()
            assert line.strip() == "ready", (m, line, p.stderr.read() if p.poll() is not None else "")
        reg = connect(etcd.url())
        try:
            wait_until(lambda: len(reg.sync.get(unique_key, prefix=True).kvs) == len(modes), 30,
                       what="every child registered")
        finally:
            run(reg.close(), 10)
        etcd.members[0].pause()
        started = time.monotonic()
        outputs = {}
        for m, p in procs.items():
            # the lease (2 s) + max_unregistered (1 s) + the graceful stop, with room for a loaded machine
            left = max(1.0, 60 - (time.monotonic() - started))
            out, err = p.communicate(timeout=left)
            outputs[m] = (p.returncode, out, err)
    finally:
        etcd.members[0].resume()
        for p in procs.values():
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait(10)
    for m, (code, out, err) in outputs.items():
        assert code == UNREGISTERED_EXIT_CODE, (m, code, out, err[-3000:])
        assert "max_unregistered=1s" in err and "exiting with status 75" in err, (m, err[-3000:])
    # serve(): the graceful stop ran (health NOT_SERVING, drain, server stopped) before the exit
    for m in ("wait", "busy", "aio"):
        assert ": stopped" in outputs[m][2], (m, outputs[m][2][-3000:])
    # wait() on the main thread exits by SystemExit: finally blocks and atexit handlers run
    assert "finally ran" in outputs["wait"][1] and "atexit ran" in outputs["wait"][1]
    assert "wait returned" not in outputs["wait"][1]
    assert "atexit ran" in outputs["aio"][1]

"""Faults under an xDS client's load: a backend's graceful stop (SIGTERM to a ``waypost.serve`` process), the control
plane killed and restarted, etcd down for 10 s. The client is the stock grpcio process of ``test_xds_support``."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("envoy.service.discovery.v3.ads_pb2", reason="the xds extra (xds-protos) is not installed")

from harness.waiting import wait_until
from tests.xds.test_xds_support import ROOT, Backends, XdsServe, _env, free_port, picks_all, stock_client

BACKEND = r'''
import sys
from concurrent import futures
import grpc
import waypost
from harness.backends import echo_pb2_grpc
from harness.backends.server import EchoServicer

name, key, registry = sys.argv[1:4]
server = grpc.server(futures.ThreadPoolExecutor(max_workers=16))
echo_pb2_grpc.add_EchoServicer_to_server(EchoServicer(name), server)
handle = waypost.serve(server, key, listen_on="127.0.0.1:0", registry=registry, grace=5.0, register_timeout=30.0)
print("READY", handle.address, flush=True)
handle.wait()
'''


def _serve_backend(tmp: Path, name: str, key: str, registry: str) -> subprocess.Popen[str]:
    script = tmp / "xds_backend.py"
    script.write_text(BACKEND)
    proc = subprocess.Popen([sys.executable, str(script), name, key, registry], cwd=ROOT, env=_env(),
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert line.startswith("READY "), line
    return proc


def _errors(events: list[tuple[float, str]]) -> list[tuple[float, str]]:
    return [e for e in events if e[1].startswith("!")]


def test_graceful_stop_of_a_backend_loses_no_call(shared_etcd, unique_key, tmp_path) -> None:
    """SIGTERM to a waypost.serve backend: it deregisters, the xDS push reaches the client within serve()'s
    drain delay (1 s), and only then does the backend refuse calls: no call fails."""
    url = shared_etcd.url()
    procs = [_serve_backend(tmp_path, n, unique_key, url) for n in ("g1", "g2")]
    serve = XdsServe([f"gs=etcd:///{shared_etcd.endpoint}?key={unique_key}"], log=tmp_path / "serve.log")
    try:
        with stock_client(serve.bootstrap(), tmp_path) as client:
            picks_all(client, "gs", {"g1", "g2"})
            client.start("gs", pause_ms=1)
            time.sleep(0.5)
            t_term = time.monotonic()
            procs[0].send_signal(signal.SIGTERM)
            assert procs[0].wait(15) == 0
            t_exit = time.monotonic()
            time.sleep(0.3)
            events = client.stop()
        assert not _errors(events), _errors(events)[:5]
        last_g1 = max(t for t, s in events if s == "g1")
        print(f"\ngraceful stop: {len(events)} calls, 0 failed; g1 last picked {(last_g1 - t_term) * 1000:.0f} ms "
              f"after SIGTERM (it exited {(t_exit - t_term) * 1000:.0f} ms after)")
        assert {s for t, s in events if t > t_exit} == {"g2"}
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.wait(10)
        serve.close()


def test_control_plane_killed_and_restarted_under_load(shared_etcd, unique_key, tmp_path) -> None:
    """The control plane is SIGKILLed: the client keeps its configuration (no failed call); restarted on the same
    port, the client reconnects and follows the next change."""
    b = Backends(shared_etcd.url(), unique_key)
    serve = XdsServe([f"cp=etcd:///{shared_etcd.endpoint}?key={unique_key}"], port=free_port(),
                     log=tmp_path / "serve.log")
    try:
        b.add("k1")
        b.add("k2")
        with stock_client(serve.bootstrap(), tmp_path) as client:
            picks_all(client, "cp", {"k1", "k2"})
            client.start("cp", pause_ms=2)
            serve.kill()
            opened = serve.log().count("opened")
            time.sleep(2.0)
            serve.start()  # same port
            t_restart = time.monotonic()
            wait_until(lambda: serve.log().count("opened") > opened, 20, "the client's stream to the new process")
            t_back = time.monotonic()
            b.add("k3")
            t_add = time.monotonic()
            time.sleep(1.0)
            events = client.stop()
        assert not _errors(events), _errors(events)[:5]
        k3 = [t for t, s in events if s == "k3"]
        assert k3, "the client did not follow the restarted control plane"
        print(f"\ncontrol plane killed 2 s, restarted: {len(events)} calls, 0 failed; the client's stream was back "
              f"{(t_back - t_restart) * 1000:.0f} ms after the restart; a new endpoint first picked "
              f"{(min(k3) - t_add) * 1000:.0f} ms after its registration")
    finally:
        serve.close()
        b.close()


def test_etcd_down_10s_under_load(etcd, unique_key, tmp_path) -> None:
    """etcd stops for 10 s: the control plane keeps its last list (no empty push), the client's calls all succeed
    and keep going to both backends; after etcd is back a change is followed again."""
    b = Backends(etcd.url(), unique_key)
    b.add("e1")
    b.add("e2")
    serve = XdsServe([f"ed=etcd:///{etcd.endpoint}?key={unique_key}"], log=tmp_path / "serve.log")
    try:
        with stock_client(serve.bootstrap(), tmp_path) as client:
            picks_all(client, "ed", {"e1", "e2"})
            client.start("ed", pause_ms=5)
            t_down = time.monotonic()
            etcd.members[0].stop()
            time.sleep(10.0)
            etcd.members[0].start()
            t_up = time.monotonic()
            time.sleep(0.5)
            events = client.stop()
            assert not _errors(events), _errors(events)[:5]
            during = {s for t, s in events if t_down + 1 < t < t_up}
            assert during == {"e1", "e2"}, during
            b.add("e3")
            picks_all(client, "ed", {"e1", "e2", "e3"}, timeout=30)
        assert "ed: 0 endpoint(s)" not in serve.log(), serve.log()[-3000:]  # never an empty assignment
        print(f"\netcd down 10 s: {len(events)} calls, 0 failed, both backends used throughout")
    finally:
        serve.close()
        b.close()


def test_serve_exits_cleanly_and_reports_bad_exports(tmp_path) -> None:
    env = _env()
    bad = subprocess.run([sys.executable, "-m", "waypost.cli", "xds", "serve", "--listen", "127.0.0.1:0",
                          "--export", "greeter=direct:///127.0.0.1:1 policy=peak_ewma"], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=60, check=False)
    assert bad.returncode != 0
    assert "peak_ewma" in bad.stderr and "round_robin" in bad.stderr and "Traceback" not in bad.stderr, bad.stderr
    assert len(bad.stderr.strip().splitlines()) == 1, bad.stderr
    serve = XdsServe(["greeter=direct:///127.0.0.1:1"])
    assert serve.terminate() == 0
    serve.close()


def test_a_dead_source_is_one_line_down_and_one_back(etcd, unique_key, caplog) -> None:
    """etcd is down when the control plane starts and comes up later: one WARNING names the export, its target,
    the cause and that it never had endpoints; the retries in between are DEBUG lines only (no resolver or
    subscriber warnings); one WARNING when it is back; waypost_xds_source_up goes 0 then 1."""
    import logging

    prometheus_client = pytest.importorskip("prometheus_client")
    from waypost import _loop, connect, metrics
    from waypost.xds import ControlPlane, parse_export

    registry = prometheus_client.CollectorRegistry()
    metrics.enable(registry)
    etcd.members[0].stop()
    control = ControlPlane([parse_export(f"late=etcd:///{etcd.endpoint}?key={unique_key}")])
    try:
        with caplog.at_level(logging.DEBUG, logger="waypost"):
            control.start()

            def lines(text: str, level: int = logging.WARNING) -> list[str]:
                return [r.getMessage() for r in caplog.records if r.levelno >= level and text in r.getMessage()]

            wait_until(lambda: lines("is down"), 30, "the down line")
            wait_until(lambda: lines("still failing", logging.DEBUG), 60, "a repeated failure (at DEBUG)")
            assert registry.get_sample_value("waypost_xds_source_up", {"export": "late"}) == 0
            etcd.members[0].start()
            _loop.run(connect(etcd.url()).put(f"{unique_key}/1", b"127.0.0.1:9"), 30)
            wait_until(lambda: lines("is back"), 60, "the back line")
            wait_until(lambda: len(control.endpoints("late") or ()) == 1, 30, "the endpoint served")
        warnings = [f"{r.name}: {r.getMessage()}" for r in caplog.records
                    if r.levelno >= logging.WARNING and r.name.startswith("waypost")]
        print("\n" + "\n".join(warnings))
        (down,) = lines("is down")
        assert "'late'" in down and etcd.endpoint in down and "refused" in down and "no endpoints yet" in down, down
        assert len(warnings) == 2 and "is back" in warnings[1], warnings
        assert registry.get_sample_value("waypost_xds_source_up", {"export": "late"}) == 1
    finally:
        control.stop()
        metrics.disable()

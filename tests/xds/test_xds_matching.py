"""Route matching through ``waypost xds serve --config examples/xds/matching.toml`` (its targets pointed at a real
etcd) seen by real clients: every case of gRPC's xDS interop suite (path_matching, header_matching,
traffic_splitting, circuit_breaking) and runtime_fraction, each call counted per backend.

grpcio (a child process importing only ``grpc``) makes both of the suite's calls, Unary and ServerStream, with
their headers; the stock grpc-go and grpc-java clients call Unary only (with the Unary headers), so each case is
checked for that call there. A route's own max_requests (gRFC A32, on clusters of its own) is checked with waves
of parallel calls to servers answering in 0.5 s."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from harness.backends.server import EchoServer
from tests.xds.go_peers import go_programs, go_timeout_mark
from tests.xds.java_peers import JAVA_MAIN, java_binary, java_classpath, java_timeout_mark
from tests.xds.matching_cases import CALLS, EXAMPLE, EXPECT, SHARES
from tests.xds.orca_peers import ClientRun, client_args
from tests.xds.peer_procs import ROOT, fixture_xds_procs  # noqa: F401 (the xds_procs fixture)
from tests.xds.xds_peers import run_xds_client, serve_echo, xds_control_plane
from waypost import Publisher

pytestmark = pytest.mark.usefixtures("xds_procs")

SERVERS = {"orig": "original", "alt": "alternate"}
#: per-route circuit breaking: at most 1 call in flight by default, 3 on the Unary route; per split target: 2 to
#: "original" (its subset cluster's own limit) where the export's is 5
BREAKER = """
[exports.breaker-routes]
target = "{target}"
subset_key = "backend"
split = {{ original = 1 }}
max_requests = 1
[[exports.breaker-routes.routes]]
path = "/waypost.test.Echo/Unary"
subset = "original"
max_requests = 3

[exports.breaker-split]
target = "{target}"
subset_key = "backend"
split = {{ original = {{ weight = 1, max_requests = 2 }} }}
max_requests = 5
"""


class MatchingSetup:
    """``waypost xds serve`` with examples/xds/matching.toml over a real etcd: echo.rpc holds "orig" (backend
    original) and "alt" (backend alternate); the breaker export's key holds one server of each answering in
    0.5 s."""

    def __init__(self, etcd: Any, tmp: Path) -> None:
        self.registry = etcd.url()
        prefix = f"xdsm{os.getpid()}-{time.monotonic_ns() % 10**9}"
        key, slow_key = f"{prefix}-echo.rpc", f"{prefix}-slow.rpc"
        text = EXAMPLE.read_text().replace("etcd:///127.0.0.1:2379?key=echo.rpc", f"etcd:///{etcd.endpoint}?key={key}")
        text += BREAKER.format(target=f"etcd:///{etcd.endpoint}?key={slow_key}")
        self.path = tmp / "matching.toml"
        self.path.write_text(text)
        self.handles: list[Any] = []
        self.slow: list[tuple[EchoServer, Publisher]] = []
        try:
            for name, backend in SERVERS.items():
                self.handles.append(serve_echo(name, key, self.registry, metadata={"backend": backend}))
                server = EchoServer(f"slow-{name}", delay_ms=500).start()
                pub = Publisher(self.registry, slow_key, server.address, ttl=10, metadata={"backend": backend})
                pub.start()
                self.slow.append((server, pub))
            self.addr, self.bootstrap, self.proc = xds_control_plane({}, extra_args=["--config", str(self.path)])
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        if getattr(self, "proc", None) is not None:
            self.proc.stop()
        for h in self.handles:
            h.stop(0)
        for server, pub in self.slow:
            pub.stop()
            server.stop(0)


@pytest.fixture(scope="module", name="setup")
def fixture_setup(shared_etcd, tmp_path_factory) -> Iterator[MatchingSetup]:
    s = MatchingSetup(shared_etcd, tmp_path_factory.mktemp("matching"))
    try:
        yield s
    finally:
        s.close()


# -- grpcio ---------------------------------------------------------------------------------------------------

_GRPCIO = r"""
import json, sys
from concurrent import futures
import grpc
from harness.backends import echo_pb2, echo_pb2_grpc

plan = json.loads(sys.argv[1])
channels = {}
def stub(name):
    if name not in channels:
        channels[name] = echo_pb2_grpc.EchoStub(grpc.insecure_channel("xds:///" + name))
    return channels[name]

def one(name, call, headers, delay_ms=0):
    req = echo_pb2.EchoRequest(message="x", delay_ms=delay_ms)
    md = list(headers.items())
    try:
        if call == "unary":
            return stub(name).Unary(req, timeout=20, metadata=md, wait_for_ready=True).server
        return next(iter(stub(name).ServerStream(req, timeout=20, metadata=md, wait_for_ready=True))).server
    except grpc.RpcError as e:
        return "!" + e.code().name

out = []
for name, call, headers, n, width in plan:
    counts = {}
    with futures.ThreadPoolExecutor(width) as pool:
        for _ in range(n // width):
            for r in pool.map(lambda _: one(name, call, headers, 500 if width > 1 else 0), range(width)):
                counts[r] = counts.get(r, 0) + 1
    out.append(counts)
print(json.dumps(out))
"""


def _grpcio(setup: MatchingSetup, tmp: Path, plan: list[tuple[str, str, dict[str, str], int, int]]) -> list[dict]:
    """Run ``plan`` ((export, call, headers, calls, parallel width)) in one grpcio process; per entry, its calls
    counted per server (or ``!CODE``)."""
    script = tmp / "matching_grpcio.py"
    script.write_text(_GRPCIO)
    env = {**os.environ, "GRPC_XDS_BOOTSTRAP_CONFIG": setup.bootstrap,
           "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "src")])}
    env.pop("GRPC_XDS_BOOTSTRAP", None)
    out = subprocess.run([sys.executable, str(script), json.dumps(plan)], capture_output=True, text=True, env=env,
                         cwd=ROOT, timeout=240, check=False)
    assert out.returncode == 0, out.stderr[-3000:]
    return list(json.loads(out.stdout.strip().splitlines()[-1]))


def test_grpcio_every_case_sends_each_call_where_the_suite_expects(setup: MatchingSetup, tmp_path: Path) -> None:
    plan = [(name, call, CALLS[call][1], 20, 1) for name in sorted(EXPECT) for call in ("unary", "stream")]
    results = _grpcio(setup, tmp_path, plan)
    wrong = []
    for (name, call, _, n, _), counts in zip(plan, results):
        print(f"grpcio {name:20s} {call:6s} -> {counts}")
        want = {next(s for s, b in SERVERS.items() if b == EXPECT[name][call]): n}
        if counts != want:
            wrong.append((name, call, counts, want))
    assert not wrong, wrong


def test_grpcio_shares_of_the_split_and_runtime_fraction(setup: MatchingSetup, tmp_path: Path) -> None:
    plan = [(name, "unary", CALLS["unary"][1], 1000, 1) for name in sorted(SHARES)]
    for (name, *_), counts in zip(plan, _grpcio(setup, tmp_path, plan)):
        alt = 100 * counts.get("alt", 0) / 1000
        print(f"grpcio {name}: {counts} -> alternate {alt:.1f} % (configured {SHARES[name]:g} %)")
        assert set(counts) <= {"orig", "alt"} and abs(alt - SHARES[name]) <= 6, counts


def test_grpcio_a_routes_own_max_requests(setup: MatchingSetup, tmp_path: Path) -> None:
    """Waves of 6 parallel calls answered in 0.5 s: the Unary route's own limit 3 lets 3 of each wave through,
    ServerStream (the default route, the export's limit 1) 1 of each; the rest fail at once with UNAVAILABLE."""
    plan = [("breaker-routes", "unary", {}, 24, 6), ("breaker-routes", "stream", {}, 24, 6),
            ("breaker-split", "unary", {}, 24, 6)]
    unary, stream, split = _grpcio(setup, tmp_path, plan)
    print(f"\ngrpcio per-route max_requests, 4 waves of 6: Unary (limit 3) {unary}; ServerStream (limit 1) {stream}; "
          f"split target limit 2: {split}")
    assert set(unary) == {"slow-orig", "!UNAVAILABLE"} and 10 <= unary["slow-orig"] <= 14, unary
    assert set(stream) == {"slow-orig", "!UNAVAILABLE"} and 3 <= stream["slow-orig"] <= 6, stream
    assert set(split) == {"slow-orig", "!UNAVAILABLE"} and 6 <= split["slow-orig"] <= 10, split


# -- grpc-go and grpc-java ------------------------------------------------------------------------------------


@pytest.fixture(params=[pytest.param("go", marks=go_timeout_mark()), pytest.param("java", marks=java_timeout_mark())])
def lang(request) -> str:
    (go_programs if request.param == "go" else java_classpath)()  # build (or skip) first
    return str(request.param)


def test_every_case_sends_unary_where_the_suite_expects(lang: str, setup: MatchingSetup) -> None:
    wrong = []
    for name in sorted(EXPECT):
        result = run_xds_client(lang, f"xds:///{name}", setup.bootstrap, 20, headers=CALLS["unary"][1],
                                wait_for_ready=True, deadline=30.0, timeout=120)
        print(f"{lang} {name:20s} unary -> {result['counts']} ({result['errors']} failed)")
        want = {next(s for s, b in SERVERS.items() if b == EXPECT[name]["unary"]): 20}
        if result["errors"] or result["counts"] != want:
            wrong.append((name, result["counts"], result.get("first_error", "")))
    assert not wrong, wrong


def test_shares_of_the_split_and_runtime_fraction(lang: str, setup: MatchingSetup) -> None:
    for name, share in SHARES.items():
        result = run_xds_client(lang, f"xds:///{name}", setup.bootstrap, 1000, headers=CALLS["unary"][1],
                                wait_for_ready=True, deadline=30.0, timeout=180)
        alt = 100 * result["counts"].get("alt", 0) / 1000
        print(f"{lang} {name}: {result['counts']} -> alternate {alt:.1f} % (configured {share:g} %)")
        assert result["errors"] == 0 and abs(alt - share) <= 6, result


def _waves(lang: str, setup: MatchingSetup, export: str) -> dict[str, Any]:
    """4 waves of 6 parallel Unary calls (started 20 ms apart) on ``xds:///export``: the client's final line."""
    args = [*client_args(24, 0, 0.02, 10.0, None, 0, True, 120.0), "-parallel", "6"]
    env = {"GRPC_XDS_BOOTSTRAP_CONFIG": setup.bootstrap}
    if lang == "go":
        argv = [str(go_programs()["xds-client"]), "-target", f"xds:///{export}", *args]
    else:
        argv = [str(java_binary()), "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1", "-cp", java_classpath(), JAVA_MAIN,
                "-target", f"xds:///{export}", *args]
    run = ClientRun(argv, f"xds-client-{lang}-{export}", env=env)
    run.batches = []
    try:
        return run.finish(150.0)
    finally:
        run.stop()


def test_a_routes_and_a_split_targets_own_max_requests(lang: str, setup: MatchingSetup) -> None:
    """The Unary route's own limit 3 (the export's is 1), and a split target's own limit 2 (the export's is 5):
    waves of 6 parallel calls answered in 0.5 s, 3 (2) of each pass in grpc-go; grpc-java 1.85 does not enforce
    max_requests without a load-reporting server (docs/xds.md)."""
    for export, limit in (("breaker-routes", 3), ("breaker-split", 2)):
        result = _waves(lang, setup, export)
        ok = sum(result["counts"].values())
        codes = {str(k).upper(): v for k, v in (result.get("codes") or {}).items()}
        print(f"\n{lang} {export}: max_requests {limit}, 4 waves of 6: {ok} succeeded, {codes}: "
              f"{result.get('first_error', '')[:120]}")
        if lang == "java":
            assert result["errors"] == 0 and ok == 24, result
        else:
            assert set(codes) == {"UNAVAILABLE"} and 4 * limit - 2 <= ok <= 4 * limit + 2, result


def test_grpcio_a_raised_route_limit_in_the_file_is_applied(setup: MatchingSetup, tmp_path: Path) -> None:
    """The suite's circuit_breaking raises a limit (500 -> 800) while clients run: here the Unary route's 3 -> 5 in
    the file (re-read within about a second): waves of 6 then pass 5 each. Back to 3 after."""
    from harness.waiting import wait_until

    text = setup.path.read_text()
    assert text.count("max_requests = 3\n") == 1
    tmp = setup.path.with_suffix(".new")
    tmp.write_text(text.replace("max_requests = 3\n", "max_requests = 5\n"))
    tmp.replace(setup.path)
    try:
        got = wait_until(lambda: (r := _grpcio(setup, tmp_path, [("breaker-routes", "unary", {}, 12, 6)])[0])
                         .get("slow-orig") == 10 and r, 30, "5 of each wave of 6 through", interval=0.5)
        print(f"\ngrpcio after the route's max_requests 3 -> 5 in the file, 2 waves of 6: {got}")
    finally:
        tmp.write_text(text)
        tmp.replace(setup.path)

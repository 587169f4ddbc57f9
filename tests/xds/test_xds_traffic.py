"""Traffic policy through ``waypost xds serve --config FILE`` over a real etcd, seen by the stock grpc-go and grpc-java
xDS clients, and by grpcio (the stock client process of tests/xds/test_xds_support.py): a 95/5 canary split by
``version``, a header route to the canary, a subset with no instance losing no call, a split changed in the file
reaching running clients with no restart, faults (gRFC A33) and route timeouts (gRFC A31) as configured, and the
subset cluster names (``NAME/version=v2``) taken by all three."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from harness.backends.server import EchoServer
from harness.waiting import wait_until
from tests.xds.go_peers import go_programs, go_timeout_mark
from tests.xds.java_peers import JAVA_MAIN, java_binary, java_classpath, java_timeout_mark
from tests.xds.orca_peers import ClientRun, client_args
from tests.xds.peer_procs import ROOT, fixture_xds_procs  # noqa: F401 (the xds_procs fixture)
from tests.xds.test_xds_support import stock_client
from tests.xds.xds_peers import run_xds_client, serve_echo, start_xds_client, xds_control_plane
from tests.xds.xds_scenarios import PROPAGATION_BOUND, watch
from waypost import Publisher

pytestmark = pytest.mark.usefixtures("xds_procs")

#: the instances of each export: name -> metadata (a canary v2 beside two v1)
INSTANCES = {"s1": {"version": "v1"}, "s2": {"version": "v1"}, "c1": {"version": "v2"}}


def toml_config(exports: dict[str, dict[str, Any]]) -> str:
    """A config file's text: each export's options as TOML (inline tables; routes as an array of tables)."""
    lines = []
    for name, body in exports.items():
        lines.append(f"[exports.{json.dumps(name)}]")
        for k, v in body.items():
            if k != "routes":
                lines.append(f"{k} = {_toml(v)}")
        for r in body.get("routes", []):
            lines.append(f"[[exports.{json.dumps(name)}.routes]]")
            lines += [f"{k} = {_toml(v)}" for k, v in r.items()]
    return "\n".join(lines) + "\n"


def _toml(v: Any) -> str:
    if isinstance(v, dict):
        return "{ " + ", ".join(f"{json.dumps(k)} = {_toml(x)}" for k, x in v.items()) + " }"
    if isinstance(v, bool):
        return "true" if v else "false"
    return json.dumps(v)


class TrafficSetup:
    """One ``waypost xds serve --config FILE`` with the exports below, each over its own etcd key with INSTANCES
    registered (but ``lonely``: v1 only)."""

    def __init__(self, etcd: Any, tmp: Path) -> None:
        self.registry = etcd.url()
        prefix = f"xdst{os.getpid()}-{time.monotonic_ns() % 10**9}"
        names = ("canary", "moving", "lonely", "faulty", "quick", "slow", "breaker")
        self.keys = {n: f"{prefix}-{n}.rpc" for n in names}
        target = {n: f"etcd:///{etcd.endpoint}?key={self.keys[n]}" for n in names}
        canary_route = {"headers": {"x-canary": "1"}, "subset": "v2"}
        self.exports: dict[str, dict[str, Any]] = {
            "canary": {"target": target["canary"], "subset_key": "version", "split": {"v1": 95, "v2": 5},
                       "routes": [canary_route]},
            "moving": {"target": target["moving"], "subset_key": "version", "split": {"v1": 95, "v2": 5}},
            "lonely": {"target": target["lonely"], "subset_key": "version", "split": {"v1": 95, "v2": 5},
                       "routes": [canary_route]},
            "faulty": {"target": target["faulty"], "fault": {"abort": "unavailable", "abort_percent": 25},
                       "routes": [{"headers": {"x-slow": {"present": True}},
                                   "fault": {"delay": "0.25s", "delay_percent": 100}}]},
        }
        # quick answers in 0.3 s, slow in 2 s (the servers' own delay): both under a 1 s route timeout
        for n in ("quick", "slow"):
            self.exports[n] = {"target": target[n], "routes": [{"service": "waypost.test.Echo", "timeout": "1s"}]}
        # circuit breaking (gRFC A32): at most 2 calls in flight to a server answering in 0.5 s
        self.exports["breaker"] = {"target": target["breaker"], "max_requests": 2}
        self.path = tmp / "xds.toml"
        self.path.write_text(toml_config(self.exports))
        self.handles: list[Any] = []
        self.delayed: list[tuple[EchoServer, Publisher]] = []
        try:
            for n, delay in (("quick", 300), ("slow", 2000), ("breaker", 500)):
                server = EchoServer(f"{n}-1", delay_ms=delay).start()
                pub = Publisher(self.registry, self.keys[n], server.address, ttl=10)
                pub.start()
                self.delayed.append((server, pub))
            for n in names[:4]:
                for inst, meta in INSTANCES.items():
                    if n == "lonely" and meta["version"] == "v2":
                        continue
                    self.handles.append(serve_echo(f"{n}-{inst}", self.keys[n], self.registry, metadata=meta))
            # -v: a reload that works is an INFO line
            self.addr, self.bootstrap, self.proc = xds_control_plane({}, extra_args=["--config", str(self.path), "-v"])
        except BaseException:
            self.close()
            raise

    def rewrite(self, name: str, **changes: Any) -> None:
        """Change one export's options in the file (atomically: written beside it, then renamed over it)."""
        self.exports[name] = {**self.exports[name], **changes}
        tmp = self.path.with_suffix(".new")
        tmp.write_text(toml_config(self.exports))
        tmp.replace(self.path)

    def close(self) -> None:
        if getattr(self, "proc", None) is not None:
            self.proc.stop()
        for h in self.handles:
            h.stop(0)
        for server, pub in self.delayed:
            pub.stop()
            server.stop(0)


@pytest.fixture(scope="module", name="setup")
def fixture_setup(shared_etcd, tmp_path_factory) -> Iterator[TrafficSetup]:
    s = TrafficSetup(shared_etcd, tmp_path_factory.mktemp("traffic"))
    try:
        yield s
    finally:
        s.close()


@pytest.fixture(params=[pytest.param("go", marks=go_timeout_mark()), pytest.param("java", marks=java_timeout_mark())])
def lang(request) -> str:
    (go_programs if request.param == "go" else java_classpath)()  # build (or skip) first
    return str(request.param)


def _by_version(counts: dict[str, int], export: str) -> dict[str, int]:
    out = {"v1": 0, "v2": 0}
    for server, n in counts.items():
        out[INSTANCES[server.removeprefix(f"{export}-")]["version"]] += n
    return out


def test_canary_split_95_5_by_version(lang: str, setup: TrafficSetup) -> None:
    """4,000 calls split 95/5 between the v1 and v2 subsets (clusters canary/version=v1 and canary/version=v2),
    within 2 points; both v1 instances share theirs; no call fails."""
    result = run_xds_client(lang, "xds:///canary", setup.bootstrap, 4000, wait_for_ready=True, deadline=30.0,
                            timeout=240)
    assert result["errors"] == 0 and result["calls"] == 4000, result
    split = _by_version(result["counts"], "canary")
    share = 100 * split["v2"] / 4000
    print(f"\n{lang} canary 95/5: {result['counts']} -> v2 {share:.2f} % of 4000 calls")
    assert 3.0 <= share <= 7.0, result["counts"]
    assert min(result["counts"].get(f"canary-{s}", 0) for s in ("s1", "s2")) > 1000, result["counts"]


def test_header_route_sends_every_call_to_the_canary(lang: str, setup: TrafficSetup) -> None:
    result = run_xds_client(lang, "xds:///canary", setup.bootstrap, 200, headers={"x-canary": "1"},
                            wait_for_ready=True, deadline=30.0, timeout=120)
    print(f"\n{lang} x-canary: 1 -> {result['counts']}")
    assert result["errors"] == 0 and result["counts"] == {"canary-c1": 200}, result


def test_a_canary_with_no_instance_loses_no_call(lang: str, setup: TrafficSetup) -> None:
    """lonely's v2 subset has no instance: it is left out of the split (else gRPC would fail ~5 % of the calls)
    and its header route sends to the whole cluster."""
    plain = run_xds_client(lang, "xds:///lonely", setup.bootstrap, 400, wait_for_ready=True, deadline=30.0,
                           timeout=120)
    header = run_xds_client(lang, "xds:///lonely", setup.bootstrap, 50, headers={"x-canary": "1"},
                            wait_for_ready=True, deadline=30.0, timeout=120)
    print(f"\n{lang} empty canary: {plain['counts']}; with the header: {header['counts']}")
    for r in (plain, header):
        assert r["errors"] == 0 and set(r["counts"]) == {"lonely-s1", "lonely-s2"}, r


def test_split_changed_in_the_file_moves_running_clients(lang: str, setup: TrafficSetup) -> None:
    """95/5 -> 50/50 in the file, no restart: a running client's batches follow within PROPAGATION_BOUND (the
    file is polled every second); no call fails. Then back to 95/5."""
    run = start_xds_client(lang, "xds:///moving", setup.bootstrap, 200_000, batch=200, interval=0.001,
                           deadline=10.0, max_time=120.0)
    try:
        watch(run, lambda c: sum(c.values()) == 200 and _by_version(c, "moving")["v2"] <= 25, 60.0, "a 95/5 batch")
        t0 = time.monotonic()
        setup.rewrite("moving", split={"v1": 50, "v2": 50})
        line = watch(run, lambda c: 70 <= _by_version(c, "moving")["v2"] <= 130, PROPAGATION_BOUND, "a 50/50 batch")
        took = line["_at"] - t0
        setup.rewrite("moving", split={"v1": 95, "v2": 5})
        watch(run, lambda c: _by_version(c, "moving")["v2"] <= 25, PROPAGATION_BOUND, "95/5 again")
        final = run.finish(30.0, interrupt=True)
    finally:
        run.stop()
        setup.rewrite("moving", split={"v1": 95, "v2": 5})
    print(f"\n{lang}: split 95/5 -> 50/50 in the file reached the client's picks in {took * 1000:.0f} ms; "
          f"{final['calls']} calls, {final['errors']} failed")
    assert final["errors"] == 0, final


def test_faults_as_configured(lang: str, setup: TrafficSetup) -> None:
    """The export's fault aborts 25 % of the calls with UNAVAILABLE; the x-slow route's own fault (which replaces
    it there) delays every call by 0.25 s and aborts none."""
    result = run_xds_client(lang, "xds:///faulty", setup.bootstrap, 800, wait_for_ready=True, deadline=30.0,
                            timeout=180)
    codes = {str(k).upper(): v for k, v in (result.get("codes") or {}).items()}
    share = 100 * result["errors"] / 800
    print(f"\n{lang} fault abort 25 %: {share:.1f} % failed ({codes}): {result.get('first_error', '')[:120]}")
    assert set(codes) == {"UNAVAILABLE"} and 18 <= share <= 32, result
    slow = run_xds_client(lang, "xds:///faulty", setup.bootstrap, 9, headers={"x-slow": "1"}, wait_for_ready=True,
                          deadline=30.0, timeout=120)
    print(f"{lang} fault delay 0.25 s x 9 calls (x-slow): {slow['seconds']:.2f} s, {slow['errors']} failed")
    assert slow["errors"] == 0 and slow["seconds"] >= 2.0, slow  # 8 calls after the first at least 0.25 s each


def test_route_timeout_ends_calls_at_it(lang: str, setup: TrafficSetup) -> None:
    """A route's timeout (max_stream_duration, gRFC A31) of 1 s with a 10 s client deadline: calls answered in 0.3 s
    succeed, calls answered in 2 s end with DEADLINE_EXCEEDED at about 1 s each."""
    quick = run_xds_client(lang, "xds:///quick", setup.bootstrap, 5, wait_for_ready=True, deadline=10.0, timeout=120)
    slow = run_xds_client(lang, "xds:///slow", setup.bootstrap, 4, wait_for_ready=True, deadline=10.0, timeout=120)
    codes = {str(k).upper().replace("DEADLINEEXCEEDED", "DEADLINE_EXCEEDED"): v
             for k, v in (slow.get("codes") or {}).items()}
    print(f"\n{lang} route timeout 1 s: 0.3 s calls {quick['counts']} ({quick['errors']} failed); 2 s calls "
          f"{codes} in {slow['seconds']:.2f} s for 4: {slow.get('first_error', '')[:100]}")
    assert quick["errors"] == 0 and quick["counts"] == {"quick-1": 5}, quick
    assert codes == {"DEADLINE_EXCEEDED": 4}, slow
    assert slow["seconds"] < 4 * 2.0, slow  # each ended at the route's 1 s, not the server's 2 s


# -- grpcio (gRPC C-core) ---------------------------------------------------------------------------------


@pytest.fixture(scope="module", name="grpcio")
def fixture_grpcio(setup: TrafficSetup, tmp_path_factory) -> Iterator[Any]:
    with stock_client(setup.bootstrap, tmp_path_factory.mktemp("grpcio")) as client:
        yield client


def test_grpcio_canary_split_header_route_and_empty_canary(setup: TrafficSetup, grpcio: Any) -> None:
    got = grpcio.calls("canary", 2000, timeout=30)
    assert not got["errors"], got
    share = 100 * _by_version(got["servers"], "canary")["v2"] / 2000
    print(f"\ngrpcio canary 95/5: {got['servers']} -> v2 {share:.2f} % of 2000 calls")
    assert 3.0 <= share <= 7.0, got
    assert grpcio.calls("canary", 100, header="x-canary=1") == {"servers": {"canary-c1": 100}, "errors": []}
    lonely = grpcio.calls("lonely", 300, timeout=30)
    assert not lonely["errors"] and set(lonely["servers"]) == {"lonely-s1", "lonely-s2"}, lonely


def test_grpcio_subset_clusters_are_no_unknown_names_and_a_typo_is(setup: TrafficSetup, grpcio: Any) -> None:
    """grpcio subscribes to the canary's subset clusters (``canary/version=v1``...) and their assignments: names
    the control plane serves, so nothing is logged about them; a typo'd name is logged once, with the exported
    names and the name it is closest to."""
    got = grpcio.calls("canary", 200, timeout=30)
    assert not got["errors"] and _by_version(got["servers"], "canary")["v2"] > 0, got  # both subsets in use
    warned = [line for line in setup.proc.stderr_tail(200_000).splitlines()
              if "not exported" in line and "'canray'" not in line]
    assert warned == [], warned
    assert grpcio.timed("canray", 10)["code"] == "UNAVAILABLE"
    line = wait_until(lambda: next((t for t in setup.proc.stderr_tail(200_000).splitlines() if "'canray'" in t), None),
                      10, "the typo's warning")
    print(f"\na typo: {line.strip()[-200:]}")
    assert "LDS 'canray', which is not exported (exported: breaker, canary, faulty" in line, line
    assert "did you mean 'canary'?" in line, line


def test_grpcio_faults_as_configured(setup: TrafficSetup, grpcio: Any) -> None:
    got = grpcio.calls("faulty", 800, timeout=30)
    share = 100 * len(got["errors"]) / 800
    print(f"\ngrpcio fault abort 25 %: {share:.1f} % failed ({set(got['errors'])})")
    assert set(got["errors"]) == {"!UNAVAILABLE"} and 18 <= share <= 32, got
    started = time.monotonic()
    slow = grpcio.calls("faulty", 8, header="x-slow=1", timeout=30)
    took = time.monotonic() - started
    print(f"grpcio fault delay 0.25 s x 8 calls (x-slow): {took:.2f} s")
    assert not slow["errors"] and took >= 8 * 0.25, slow


def test_grpcio_route_timeout_ends_calls_about_a_second_early(setup: TrafficSetup, grpcio: Any) -> None:
    """grpcio 1.85 (C-core) misapplies a route's max_stream_duration: it ends calls about 1.06 s before it (measured
    for 1.2 s to 4 s), so a 1 s route timeout fails every call at once with DEADLINE_EXCEEDED, even those the
    server answers in 0.3 s (docs/xds.md). If this fails, grpcio honours A31 now: update docs/xds.md."""
    started = time.monotonic()
    quick = grpcio.calls("quick", 5, timeout=10)
    took = time.monotonic() - started
    print(f"\ngrpcio route timeout 1 s, server answering in 0.3 s: {quick} in {took:.2f} s for 5")
    assert quick == {"servers": {}, "errors": ["!DEADLINE_EXCEEDED"] * 5} and took < 5 * 0.3, (quick, took)


def _parallel_client(lang: str, target: str, bootstrap: str, calls: int, parallel: int,
                     interval: float) -> dict[str, Any]:
    """The stock client's ``-parallel N`` (its calls N at a time, started ``interval`` apart) run to the end;
    returns its final line."""
    args = [*client_args(calls, 0, interval, 10.0, None, 0, True, 120.0), "-parallel", str(parallel)]
    env = {"GRPC_XDS_BOOTSTRAP_CONFIG": bootstrap}
    if lang == "go":
        argv = [str(go_programs()["xds-client"]), "-target", target, *args]
    else:
        argv = [str(java_binary()), "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1", "-cp", java_classpath(), JAVA_MAIN,
                "-target", target, *args]
    run = ClientRun(argv, f"xds-client-{lang}-parallel", env=env)
    run.batches = []
    try:
        return run.finish(150.0)
    finally:
        run.stop()


def test_circuit_breaking_fails_calls_beyond_max_requests(lang: str, setup: TrafficSetup) -> None:
    """max_requests = 2 (gRFC A32) and waves of 6 calls (started 20 ms apart) to a server answering in 0.5 s:
    grpc-go fails 4 of each wave at once with UNAVAILABLE. grpc-java 1.85 counts calls in flight only when the
    Cluster has a load-reporting server (its counting stream tracer comes with the LRS locality stats), and this
    export has no ``load_reporting``, so it never trips: every call succeeds (docs/xds.md; with load reporting it
    trips: tests/xds/test_xds_lrs.py). Without max_requests every call succeeds."""
    result = _parallel_client(lang, "xds:///breaker", setup.bootstrap, 30, 6, 0.02)
    codes = {str(k).upper(): v for k, v in (result.get("codes") or {}).items()}
    ok = sum(result["counts"].values())
    print(f"\n{lang} max_requests 2, 5 waves of 6 calls: {ok} succeeded, {codes} in {result['seconds']:.2f} s: "
          f"{result.get('first_error', '')[:100]}")
    if lang == "java":  # if this fails, grpc-java enforces max_requests now: update docs/xds.md
        assert result["errors"] == 0 and ok == 30, result
    else:
        assert set(codes) == {"UNAVAILABLE"} and 8 <= ok <= 12, result
    free = _parallel_client(lang, "xds:///quick", setup.bootstrap, 30, 6, 0.02)
    assert free["errors"] == 0 and free["counts"] == {"quick-1": 30}, free


_GRPCIO_WAVES = r"""
import json, sys
from concurrent import futures
import grpc
from harness.backends import echo_pb2, echo_pb2_grpc

target, waves, width = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
stub = echo_pb2_grpc.EchoStub(grpc.insecure_channel(target))
def one(_):
    try:
        return stub.Unary(echo_pb2.EchoRequest(message="x"), timeout=10, wait_for_ready=True).server
    except grpc.RpcError as e:
        return "!" + e.code().name
out = {}
with futures.ThreadPoolExecutor(width) as pool:
    for _ in range(waves):
        for r in pool.map(one, range(width)):
            out[r] = out.get(r, 0) + 1
print(json.dumps(out))
"""


def test_grpcio_circuit_breaking(setup: TrafficSetup, tmp_path: Path) -> None:
    script = tmp_path / "waves.py"
    script.write_text(_GRPCIO_WAVES)
    env = {**os.environ, "GRPC_XDS_BOOTSTRAP_CONFIG": setup.bootstrap,
           "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "src")])}
    env.pop("GRPC_XDS_BOOTSTRAP", None)
    out = subprocess.run([sys.executable, str(script), "xds:///breaker", "5", "6"], capture_output=True, text=True,
                         env=env, cwd=ROOT, timeout=120, check=True)
    got = json.loads(out.stdout.strip().splitlines()[-1])
    print(f"\ngrpcio max_requests 2, 5 waves of 6 calls: {got}")
    assert set(got) == {"breaker-1", "!UNAVAILABLE"} and 8 <= got["breaker-1"] <= 12, got


def test_bad_file_keeps_the_last_good_config_and_sighup_reloads(setup: TrafficSetup, grpcio: Any) -> None:
    """A file that does not load is logged in one line naming the export and field, and the last good config stays
    served; SIGHUP reads the file again even unchanged."""
    def logged(text: str, what: str) -> str:
        return wait_until(lambda: text in setup.proc.stderr_tail(20000) and setup.proc.stderr_tail(20000), 15.0, what)

    setup.rewrite("moving", split={"v1": 0, "v2": 0})
    try:
        log = logged("not reloaded", "the bad file's log line")
        line = next(t for t in log.splitlines() if "not reloaded" in t)
        print(f"\nbad file: {line.strip()[-160:]}")
        assert "export 'moving': split: every weight is 0" in line, line
        got = grpcio.calls("moving", 200, timeout=30)
        assert not got["errors"] and 2 <= _by_version(got["servers"], "moving")["v2"] <= 25, got  # still 95/5
    finally:
        setup.rewrite("moving", split={"v1": 95, "v2": 5})
    reloaded = f"INFO waypost.xds: xds: config {setup.path} reloaded"  # an INFO line: nothing went wrong
    logged(f"{reloaded} (the file changed)", "the good file's reload")
    setup.proc.proc.send_signal(signal.SIGHUP)
    logged(f"{reloaded} (SIGHUP)", "the SIGHUP reload")
    assert setup.proc.proc.poll() is None

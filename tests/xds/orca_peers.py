"""grpc-go's ORCA peers: the orca-server (reporting through grpc-go's own ``orca`` package) and the
weighted_round_robin client (A58) over a fixed address list.

Stable API (other tests import these; keep names and signatures):

``start_orca_server(name, *, cpu=None, app=None, mem=None, rps=None, eps=None, oob=False, percall=True,
call_cpu=None, named=None, util=None, listen="127.0.0.1:0", timeout=30.0, oob_floor=None) -> OrcaServer``
    A running grpc-go orca-server; ``.address`` ("127.0.0.1:PORT"), ``.name``, ``.set(cpu=..., rps=...,
    named={...}, util={...}) -> dict`` changes what it reports (per call at once; OOB on the next report),
    ``.served() -> int``, ``.stop()``; a context manager. ``None`` = that metric is not reported; ``call_cpu``
    makes the per-call cpu_utilization differ from the OOB one (to see which one a client follows);
    ``oob_floor`` (s) serves OOB through the module's own OpenRcaService with that floor instead of grpc-go's 30 s.
``start_wrr_client(addresses, config, calls, *, batch=0, interval=0.0, deadline=5.0, max_time=300.0) -> ClientRun``
    The same client running: ``.progress()`` returns each batch line, ``.finish(interrupt=True)`` the final one.
``run_wrr_client(addresses, config, calls, *, batch=0, interval=0.0, deadline=5.0, timeout=120.0) -> dict``
    grpc-go over ``addresses`` (list of "HOST:PORT") with the service config ``config`` (dict or JSON text);
    returns the final line plus ``"batches"``: the progress lines in order.
``wrr_config(*, oob=False, blackout="1s", weight_update="0.1s", oob_period="0.2s", **more) -> dict``
    A weighted_round_robin service config (give a non-zero blackout: see the trap at the end).

Trap (grpc-go): a client_side_weighted_round_robin blackout_period of 0 received over xDS is dropped by grpc-go's
converter, so gRPC's 10 s default applies (the control plane sends 1 ns instead, docs/xds.md); in a service config
here, too, give a non-zero blackout so that weights apply within a test's time.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from tests.xds.go_peers import go_programs
from tests.xds.peer_procs import PeerProc, go_duration

# -- ORCA peers (stable API) ---------------------------------------------------------------------------------

class OrcaServer(PeerProc):
    """A running ``orca-server`` (see the module docstring)."""

    address: str

    def set(self, **values: Any) -> dict[str, Any]:
        """Change the reported load: cpu, app, mem, rps, eps (floats; negative stops reporting one),
        named={k: v}, util={k: v}. Returns what it reports now."""
        words = []
        for k, v in values.items():
            if k in ("named", "util"):
                words += [f"{k}.{nk}={float(nv)}" for nk, nv in dict(v).items()]
            else:
                words.append(f"{k}={float(v)}")
        self.send("set " + " ".join(words))
        line = self.expect(lambda d: "set" in d or "error" in d, 10.0, "answer to set")
        if "error" in line:
            raise ValueError(f"orca-server {self.name}: {line['error']}")
        return line["set"]

    def served(self) -> int:
        """Echo calls answered so far."""
        return int(self.request("stats", "served", 10.0))


def start_orca_server(name: str, *, cpu: float | None = None, app: float | None = None, mem: float | None = None,
                      rps: float | None = None, eps: float | None = None, oob: bool = False, percall: bool = True,
                      call_cpu: float | None = None, named: Mapping[str, float] | None = None,
                      util: Mapping[str, float] | None = None, listen: str = "127.0.0.1:0",
                      timeout: float = 30.0, oob_floor: float | None = None) -> OrcaServer:
    """Start a grpc-go Echo server reporting ORCA (module docstring); returns once it listens.
    ``oob_floor`` (seconds, with ``oob``): serve OpenRcaService from the same recorder with this minimum interval
    instead of grpc-go's orca.Register (floor 30 s), so that ``set`` reaches OOB clients quickly."""
    binary = go_programs()["orca-server"]
    args = [str(binary), "-listen", listen, "-name", name, f"-oob={'true' if oob else 'false'}",
            f"-percall={'true' if percall else 'false'}"]
    for flag, value in (("-cpu", cpu), ("-app", app), ("-mem", mem), ("-rps", rps), ("-eps", eps),
                        ("-call-cpu", call_cpu)):
        if value is not None:
            args += [flag, repr(float(value))]
    if oob_floor is not None:
        args += ["-oob-floor", go_duration(oob_floor)]
    for k, v in (named or {}).items():
        args += ["-named", f"{k}={float(v)}"]
    for k, v in (util or {}).items():
        args += ["-util", f"{k}={float(v)}"]
    server = OrcaServer(args, f"orca-server-{name}")
    try:
        line = server.expect(lambda d: "listening" in d or "fatal" in d, timeout, "listening")
        if "fatal" in line:
            raise RuntimeError(f"orca-server {name}: {line['fatal']}")
    except BaseException:
        server.stop()
        raise
    server.address = line["listening"]
    return server


#: gRFC A58, weight = qps / utilization: cpu 0.9/0.3/0.1 at 100 rps each -> 111/333/1000 -> of 600 calls
A58_LOADS = {"hot": 0.9, "warm": 0.3, "cool": 0.1}
A58_EXPECTED_600 = {name: 600 * (1 / cpu) / sum(1 / c for c in A58_LOADS.values()) for name, cpu in A58_LOADS.items()}


def check_a58_split(counts: Mapping[str, int], label: str, prefix: str = "") -> None:
    """600 calls split as A58 predicts for A58_LOADS (names with ``prefix``), within a generous tolerance
    (25 %, at least 20 calls); prints the figures."""
    want = {prefix + k: v for k, v in A58_EXPECTED_600.items()}
    print(f"\n{label}: {dict(sorted(counts.items()))} (A58 expects "
          + ", ".join(f"{k} {v:.0f}" for k, v in want.items()) + ")")
    assert sum(counts.values()) == 600, counts
    for name, expected in want.items():
        assert abs(counts.get(name, 0) - expected) <= max(0.25 * expected, 20), (label, counts)


def wrr_config(*, oob: bool = False, blackout: str = "1s", weight_update: str = "0.1s", oob_period: str = "0.2s",
               **more: Any) -> dict[str, Any]:
    """A grpc-go service config running weighted_round_robin (gRFC A58) with these settings."""
    cfg: dict[str, Any] = {"enableOobLoadReport": oob, "blackoutPeriod": blackout,
                           "weightUpdatePeriod": weight_update}
    if oob:
        cfg["oobReportingPeriod"] = oob_period
    cfg.update(more)
    return {"loadBalancingConfig": [{"weighted_round_robin": cfg}]}


def client_args(calls: int, batch: int, interval: float, deadline: float,
                 headers: Mapping[str, str] | None, keys: int, wait_for_ready: bool, max_time: float) -> list[str]:
    args = ["-calls", str(calls), "-batch", str(batch), "-interval", go_duration(interval),
            "-deadline", go_duration(deadline), "-max-time", go_duration(max_time)]
    for k, v in (headers or {}).items():
        args += ["-header", f"{k}={v}"]
    if keys:
        args += ["-keys", str(keys)]
    if wait_for_ready:
        args.append("-wait-for-ready")
    return args


class ClientRun(PeerProc):
    """A running client: ``progress()`` returns its next batch line, ``finish()`` its final line (plus
    ``"batches"``: every progress line it printed)."""

    batches: list[dict[str, Any]]

    def progress(self, timeout: float = 30.0) -> dict[str, Any]:
        line = self.expect(lambda d: "batch" in d or "calls" in d or "fatal" in d, timeout, "a progress line")
        if "batch" not in line:
            self.lines.put(line)  # the final line: leave it for finish()
            raise AssertionError(f"{self.name} ended before another batch: {line}")
        self.batches.append(line)
        return line

    def finish(self, timeout: float = 120.0, interrupt: bool = False) -> dict[str, Any]:
        """Wait for the final line (SIGTERM first with ``interrupt``: the client stops calling and reports)."""
        if interrupt:
            self.terminate()
        while True:
            line = self.expect(lambda d: "batch" in d or "calls" in d or "fatal" in d, timeout, "the final line")
            if "fatal" in line:
                raise AssertionError(f"{self.name}: {line['fatal']}; stderr: {self.stderr_tail()}")
            if "batch" in line:
                self.batches.append(line)
                continue
            self.stop()
            return {**line, "batches": list(self.batches)}


def start_wrr_client(addresses: Sequence[str], config: Mapping[str, Any] | str, calls: int, *, batch: int = 0,
                     interval: float = 0.0, deadline: float = 5.0, max_time: float = 300.0) -> ClientRun:
    """grpc-go ``wrr-client`` running (see run_wrr_client)."""
    binary = go_programs()["wrr-client"]
    cfg = config if isinstance(config, str) else json.dumps(config)
    args = [str(binary), "-target", "ipv4:" + ",".join(addresses), "-config", cfg,
            *client_args(calls, batch, interval, deadline, None, 0, False, max_time)]
    run = ClientRun(args, "wrr-client")
    run.batches = []
    return run


def run_wrr_client(addresses: Sequence[str], config: Mapping[str, Any] | str, calls: int, *, batch: int = 0,
                   interval: float = 0.0, deadline: float = 5.0, timeout: float = 120.0) -> dict[str, Any]:
    """grpc-go over ``addresses`` with the service config ``config``: ``calls`` Echo calls, then the final line
    (``counts``, ``errors``, ``first_error``, ``calls``, ``seconds``) with ``batches`` (progress lines)."""
    run = start_wrr_client(addresses, config, calls, batch=batch, interval=interval, deadline=deadline,
                           max_time=timeout)
    try:
        return run.finish(timeout + 10.0)
    finally:
        run.stop()

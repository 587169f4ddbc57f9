"""The demo's script: set up, run each policy, fail over under load, report, chart, clean up."""

from __future__ import annotations

import contextlib
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.table import Table

from ..service_config import DEFAULT_POLICY
from .backend import SLOTS
from .cluster import Cluster
from .load import Load, Sample, summarize

if TYPE_CHECKING:
    from ..channel import Channel

#: the policies the demo runs (``NOT_SHOWN`` says why the others are not); the default (what ``dial`` uses without ``balancer=``) comes last, beside
#: go-zero's p2c_ewma and round_robin in the comparison table
POLICIES = [*dict.fromkeys(["pick_first", "round_robin", "smooth_weighted_round_robin", "least_request",
                            "consistent_hash", "p2c_ewma", DEFAULT_POLICY])]
#: the registered policies the demo does not run, and why (printed after the comparison table)
NOT_SHOWN = {
    "random": "round_robin's shares with more variance",
    "weighted_random": "smooth_weighted_round_robin's shares with more variance",
    "outlier_detection": "it wraps another policy and ejects failing backends: none fails here until step 4",
    "prequal": "it balances on server load reports, which the demo backends do not send",
    "weighted_round_robin": "gRPC's policy (A58): it weighs backends by their ORCA load reports, which need "
                            "seconds of traffic (its 10 s blackout) before they count",
}
#: name, delay in ms, weight (metadata "weight", used by smooth_weighted_round_robin)
BACKENDS = [("b1", 2.0, 40), ("b2", 2.0, 30), ("b3", 2.0, 20), ("b4", 25.0, 10)]
SLOW = "b4"
NEWCOMER = ("b5", 2.0, 30)
VICTIM = "b2"

SERVICE_CONFIG: dict[str, Any] = {
    "methodConfig": [{
        "name": [{"service": "waypost.demo.Demo"}],
        "timeout": "3s",
        "retryPolicy": {"maxAttempts": 3, "initialBackoff": "0.01s", "maxBackoff": "0.1s",
                        "backoffMultiplier": 2, "retryableStatusCodes": ["UNAVAILABLE"]},
    }],
}


@dataclass(frozen=True)
class DemoSettings:
    per_policy: float  # seconds of load per policy
    threads: int
    failover: float  # seconds of load in the failover phase
    kill_at: float
    add_at: float
    after_add: float  # seconds of load at least after the newcomer registered

    @classmethod
    def for_mode(cls, quick: bool) -> DemoSettings:
        if quick:
            return cls(per_policy=0.8, threads=4, failover=3.0, kill_at=0.8, add_at=1.5, after_add=1.2)
        return cls(per_policy=3.0, threads=6, failover=7.0, kill_at=2.0, add_at=3.5, after_add=2.5)


def run_demo(quick: bool = False, out_dir: Path | None = None, chart: bool = True, console: Console | None = None,
             registry_url: str | None = "etcd://127.0.0.1:2379", summary_path: Path | None = None) -> int:
    """Run the demo, printing as it goes; returns the exit status (0: everything behaved as promised).

    Every process it starts is ended before it returns, also on Ctrl-C or an error.
    """
    out = console or Console(highlight=False)
    settings = DemoSettings.for_mode(quick)
    t_start = time.monotonic()
    key = f"waypost-demo-{os.getpid()}.rpc"
    cluster = Cluster(key, registry_url)
    results: dict[str, Any] = {"mode": "quick" if quick else "full", "policies": {}}
    try:
        out.print(f"[bold]waypost demo[/] ({'quick' if quick else 'full'} run): 4 backends behind {key!r}, "
                  f"{SLOTS} calls at once each (the rest queue), {settings.threads} client threads")
        cluster.start_registry()
        out.print(f"[1] registry: {cluster.notice}")
        started = cluster.start_backends(list(BACKENDS))
        out.print("[2] backends up, each registered only once its port was open:")
        for b in started:
            out.print(f"    {b.name}  {b.address:<21} {b.delay_ms:>4g} ms{' (slow)' if b.name == SLOW else '       '}"
                      f"  weight {b.weight}")
        names = [b[0] for b in BACKENDS]
        samples_by_policy: dict[str, list[Sample]] = {}
        for i, policy in enumerate(POLICIES, 1):
            with _progress(out, f"policy {i}/{len(POLICIES)}: {_label(policy)}, {settings.per_policy:g} s of load ..."):
                samples = _run_policy(cluster, policy, settings)
            samples_by_policy[policy] = samples
            summary = summarize(samples, names)
            if policy == "consistent_hash":
                summary["sticky"] = _stickiness(samples)
            results["policies"][policy] = summary
            out.print(_policy_table(f"[3] {i}/{len(POLICIES)} {_label(policy)}", summary))
        out.print(_comparison_table(results["policies"]))
        out.print(_not_shown_line())

        out.print(f"[4] failover under load ({_label(DEFAULT_POLICY)} + retryPolicy): kill {VICTIM} at {settings.kill_at:g}s, "
                  f"add {NEWCOMER[0]} at {settings.add_at:g}s")
        with _progress(out, "failover under load ..."):
            fo = _run_failover(cluster, settings, out)
        results["failover"] = fo
        out.print(_failover_table(fo))
        ok = fo["errors"] == 0 and fo["newcomer_first_call_s"] is not None
        codes = ", ".join(f"{k}: {v}" for ph in fo["phases"].values() for k, v in ph["error_codes"].items())
        verdict = ("[green]0 failed calls[/]" if fo["errors"] == 0
                   else f"[red]{fo['errors']} failed calls ({codes})[/]")
        first = fo["newcomer_first_call_s"]
        out.print(f"    {verdict} while {VICTIM} went away; {NEWCOMER[0]} served its first call "
                  + (f"{first * 1000:.0f} ms after it registered" if first is not None else "[red]never[/]"))

        if chart:
            from .chart import write_chart

            path, why = write_chart(samples_by_policy, results, (out_dir or Path.cwd()) / "waypost-demo.png")
            out.print(f"[5] chart: {path}" if path else f"[5] chart skipped: {why}")
            results["chart"] = str(path) if path else None
        results["takeaway"] = takeaway(results["policies"])
        out.print(f"[bold]{results['takeaway']}[/]", soft_wrap=True)  # one line, whatever the width
        results["seconds"] = round(time.monotonic() - t_start, 1)
        results["registry_mode"] = cluster.mode
        out.print(f"done in {results['seconds']:.1f} s; cleaning up")
        return 0 if ok else 1
    finally:
        results["pids"] = cluster.pids()
        cluster.close()
        if summary_path is not None:
            summary_path.write_text(json.dumps(results, indent=1, sort_keys=True))


def takeaway(policies: dict[str, Any], baseline: str = "round_robin") -> str:
    """The run in one line, from its measured figures: among the policies that spread the calls (a policy whose
    calls all went to one backend, pick_first, is fast only while that backend has room), the one with the
    lowest p99, by how much it beat ``baseline``'s p99, and the share each sent to the slow backend."""
    ran = {p: s for p, s in policies.items() if s.get("calls") and not s.get("errors")}
    spread = {p: s for p, s in ran.items() if sum(1 for b in s["backends"].values() if b["calls"]) > 1}
    if not spread:
        return "Takeaway: no policy spread its calls without errors on this run."
    best = min(spread, key=lambda p: spread[p]["p99_ms"])
    b = spread[best]
    head = f"Takeaway: {_label(best)} gave the lowest p99 of the policies that spread the calls, {b['p99_ms']:.1f} ms"
    base = spread.get(baseline)
    if base is None:
        return f"{head}."
    if best == baseline:
        return f"{head}: {baseline} itself; no policy beat it on this run."
    shares = (b["backends"][SLOW]["share"], base["backends"][SLOW]["share"])
    return (f"{head}, {base['p99_ms'] / max(b['p99_ms'], 1e-9):.1f}x lower than {baseline}'s {base['p99_ms']:.1f} ms "
            f"(it sent {shares[0]:.0%} of its calls to the slow {SLOW}, {baseline} {shares[1]:.0%}).")


def _progress(out: Console, text: str) -> contextlib.AbstractContextManager[Any]:
    """A spinner on a terminal (the step lines are the progress elsewhere, e.g. in CI logs)."""
    return out.status(text) if out.is_terminal else contextlib.nullcontext()


def _label(policy: str) -> str:
    return f"{policy} (default)" if policy == DEFAULT_POLICY else policy


def _dial(cluster: Cluster, policy: str | None) -> Channel:
    """A channel whose connections to every live backend are up, so each policy starts from the same
    state (pick_first, say, would otherwise take whichever backend connected first, then move)."""
    from ..channel import dial

    # the default policy is dialed without balancer=, as a user would
    channel = dial(cluster.target, balancer=None if policy == DEFAULT_POLICY else policy, service_config=SERVICE_CONFIG)
    live = sum(1 for b in cluster.backends.values() if not b.killed)
    balancer = getattr(channel, "balancer", None)
    deadline = time.monotonic() + 10
    while balancer is not None and time.monotonic() < deadline and len(balancer.ready_addresses()) < live:
        time.sleep(0.02)
    return channel


def _run_policy(cluster: Cluster, policy: str, settings: DemoSettings) -> list[Sample]:
    channel = _dial(cluster, policy)
    try:
        hash_keys = 50 if policy == "consistent_hash" else 0
        load = Load(channel, settings.threads, duration=settings.per_policy, hash_keys=hash_keys).start()
        return load.join(settings.per_policy + 30)
    finally:
        channel.close()


def _stickiness(samples: list[Sample]) -> dict[str, int]:
    seen: dict[str, set[str]] = {}
    for s in samples:
        if s.key is not None and s.backend is not None:
            seen.setdefault(s.key, set()).add(s.backend)
    return {"keys": len(seen), "always_same_backend": sum(1 for v in seen.values() if len(v) == 1)}


def _run_failover(cluster: Cluster, settings: DemoSettings, out: Console) -> dict[str, Any]:
    channel = _dial(cluster, DEFAULT_POLICY)
    try:
        load = Load(channel, settings.threads).start()
        _sleep_until(load, settings.kill_at)
        t_kill = load.elapsed()
        what = cluster.kill(VICTIM)
        out.print(f"    {t_kill:4.1f}s  {what}")
        _sleep_until(load, settings.add_at)
        (newcomer,) = cluster.start_backends([NEWCOMER])
        t_add = newcomer.registered_at - load.t0
        out.print(f"    {t_add:4.1f}s  {newcomer.name} registered at {newcomer.address}")
        # keep the load on for a while after the newcomer joined, however long it took to start
        _sleep_until(load, max(settings.failover, t_add + settings.after_add))
        samples = load.stop()
    finally:
        channel.close()
    names = [b[0] for b in BACKENDS] + [NEWCOMER[0]]
    first = next((s.t for s in sorted(samples, key=lambda s: s.t) if s.backend == NEWCOMER[0]), None)
    phases = {
        "before kill": [s for s in samples if s.t < t_kill],
        "after kill": [s for s in samples if t_kill <= s.t < t_add],
        "after add": [s for s in samples if s.t >= t_add],
    }
    errors = sum(1 for s in samples if s.error is not None)
    return {
        "calls": len(samples), "errors": errors, "kill_at_s": round(t_kill, 3), "add_at_s": round(t_add, 3),
        "newcomer_first_call_s": None if first is None else round(max(0.0, first - t_add), 3),
        "victim_calls_after_kill": sum(1 for s in phases["after kill"] if s.backend == VICTIM and s.t > t_kill + 0.5),
        "phases": {k: summarize(v, names) for k, v in phases.items()},
    }


def _sleep_until(load: Load, t: float) -> None:
    while load.elapsed() < t:
        time.sleep(min(0.05, max(0.0, t - load.elapsed())))


# -- tables ---------------------------------------------------------------------------------------


def _bar(share: float, width: int = 20) -> str:
    n = round(share * width)
    return "█" * n + "·" * (width - n)


def _policy_table(title: str, summary: dict[str, Any]) -> Table:
    extra = ""
    if "sticky" in summary:
        st = summary["sticky"]
        extra = f", {st['always_same_backend']}/{st['keys']} keys always on the same backend"
    t = Table(title=f"{title}: {summary['calls']} calls, {summary['errors']} errors, "
              f"p50 {summary['p50_ms']:.1f} ms, p99 {summary['p99_ms']:.1f} ms{extra}",
              title_justify="left", title_style="bold")
    for col, justify in (("backend", "left"), ("share", "left"), ("calls", "right"), ("p50 ms", "right"),
                         ("p99 ms", "right")):
        t.add_column(col, justify=justify)  # type: ignore[arg-type]
    for name, b in summary["backends"].items():
        label = f"{name} (slow)" if name == SLOW else name
        t.add_row(label, f"{_bar(b['share'])} {b['share'] * 100:5.1f}%", str(b["calls"]),
                  f"{b['p50_ms']:.1f}" if b["calls"] else "-", f"{b['p99_ms']:.1f}" if b["calls"] else "-")
    return t


def _comparison_table(policies: dict[str, Any]) -> Table:
    t = Table(title="all policies (the slow backend is b4)", title_justify="left", title_style="bold")
    for col in ("policy", "calls", "errors", "p50 ms", "p99 ms", "p99 / round_robin", "share on slow b4"):
        t.add_column(col, justify="left" if col == "policy" else "right")
    rr = policies.get("round_robin", {}).get("p99_ms")
    for name, s in policies.items():
        ratio = f"{s['p99_ms'] / rr:.2f}" if rr else "-"
        t.add_row(_label(name), str(s["calls"]), str(s["errors"]), f"{s['p50_ms']:.1f}", f"{s['p99_ms']:.1f}", ratio,
                  f"{s['backends'][SLOW]['share'] * 100:.1f}%", style="bold" if name == DEFAULT_POLICY else None)
    return t


def _failover_table(fo: dict[str, Any]) -> Table:
    names = [b[0] for b in BACKENDS] + [NEWCOMER[0]]
    t = Table(title=f"failover: {fo['calls']} calls, {fo['errors']} errors", title_justify="left",
              title_style="bold")
    t.add_column("phase")
    t.add_column("calls", justify="right")
    t.add_column("errors", justify="right")
    for n in names:
        t.add_column(n, justify="right")
    for phase, s in fo["phases"].items():
        t.add_row(phase, str(s["calls"]), str(s["errors"]),
                  *(f"{s['backends'][n]['share'] * 100:.0f}%" for n in names))
    return t


def _not_shown_line() -> str:
    """Which registered policies the demo left out, and why (a custom one: not part of the demo)."""
    from ..balancer.policies import POLICIES as REGISTERED

    left = [p for p in sorted(REGISTERED) if p not in POLICIES]
    why = "; ".join(f"{p} ({NOT_SHOWN.get(p, 'not part of the demo')})" for p in left)
    return f"    {len(POLICIES)} of {len(REGISTERED)} policies run; not run here: {why}" if left else \
        f"    all {len(REGISTERED)} policies run"

"""``waypost xds status --load``: what the control plane's clients report over LRS, one row per export, cluster
and locality (docs/xds.md, "Load reporting").

Asks ``waypost.xds.v1.LoadStatus/Fetch`` (``xds/lrs.py``; JSON) and prints, per locality: the calls issued,
succeeded and errored per second in the clients' last reports, the calls in flight now, the totals since the
control plane started, the cluster's dropped calls (circuit breaking and drop policies; on its first row) and the
named ORCA metrics with the most calls (mean value, calls). ``--json`` prints the answer itself. The table is
printed by ``cli.xds_status`` (rich on a terminal, plain text otherwise), as its own.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import click

if TYPE_CHECKING:
    import grpc

#: how many ORCA metrics a row names (the ones most calls carried)
TOP_METRICS = 3
HEADER = ["EXPORT", "CLUSTER", "LOCALITY", "ISSUED/S", "OK/S", "ERR/S", "IN FLIGHT", "SUCCEEDED", "ERRORED",
          "DROPPED", "METRICS"]


def fetch_load(server: str, credentials: grpc.ChannelCredentials | None, timeout: float) -> dict[str, Any]:
    """The load view of the control plane at ``server``; raises click.ClickException saying why there is none."""
    import grpc

    from ..xds.lrs import STATUS_PATH

    channel = grpc.secure_channel(server, credentials) if credentials is not None else grpc.insecure_channel(server)
    try:
        fetch = channel.unary_unary(STATUS_PATH, request_serializer=lambda b: b, response_deserializer=json.loads)
        view: dict[str, Any] = fetch(b"", timeout=timeout)
        return view
    except grpc.RpcError as e:
        code, details = e.code(), e.details() or ""  # type: ignore[attr-defined]  # a call's error is its Call
        if code is grpc.StatusCode.UNIMPLEMENTED:
            raise click.ClickException(f"{server} serves no load reports (a waypost xds serve of this version "
                                       "answers waypost.xds.v1.LoadStatus)") from None
        raise call_failed(server, code, details, timeout) from None
    finally:
        channel.close()


def call_failed(server: str, code: Any, details: str, timeout: float) -> click.ClickException:
    """A call to the control plane at ``server`` that failed with ``code``, in one line (the status views')."""
    import grpc

    if code is grpc.StatusCode.UNAVAILABLE:
        return click.ClickException(f"cannot reach {server}: {details}")
    if code is grpc.StatusCode.DEADLINE_EXCEEDED:
        return click.ClickException(f"{server} did not answer within {timeout:g}s")
    return click.ClickException(f"{server}: {code.name}: {details}")


def _rate(x: float) -> str:
    return f"{x:.1f}" if x < 100 else f"{x:.0f}"


def metrics_cell(metrics: dict[str, Any], top: int = TOP_METRICS) -> str:
    """The ``top`` metrics most calls carried, the application's named ones before the utilizations:
    ``name=mean (calls)``, comma-separated; ``-`` for none."""
    ranked = sorted(metrics.items(),
                    key=lambda kv: (not kv[0].startswith("named_metrics."), -kv[1]["count"], kv[0]))[:top]
    return ", ".join(f"{name}={m['mean']:.3g} ({m['count']})" for name, m in ranked) or "-"


def dropped_cell(cluster: dict[str, Any]) -> str:
    text = str(cluster["dropped"])
    if cluster["dropped_by_category"]:
        text += " (" + ", ".join(f"{k}={v}" for k, v in cluster["dropped_by_category"].items()) + ")"
    return text


def load_rows(view: dict[str, Any]) -> list[list[str]]:
    """The table's rows: one per (cluster, locality); a cluster's drops on its first row."""
    rows = []
    for cluster in view["clusters"]:
        for i, loc in enumerate(cluster["localities"] or [None]):
            if loc is None:  # drops only: the cluster's calls never reached a locality
                rows.append([cluster["export"], cluster["cluster"], "-", "0.0", "0.0", "0.0", "0", "0", "0",
                             dropped_cell(cluster), "-"])
                continue
            r = loc["rates"]
            rows.append([cluster["export"], cluster["cluster"], loc["locality"], _rate(r["issued"]),
                         _rate(r["succeeded"]), _rate(r["errored"]), str(loc["in_flight"]), str(loc["succeeded"]),
                         str(loc["errored"]), dropped_cell(cluster) if i == 0 else "", metrics_cell(loc["metrics"])])
    return rows


def load_title(server: str, view: dict[str, Any]) -> str:
    """The line above the table: who reports, how often."""
    clients = view["clients"]
    return (f"{server}  load reported by {clients} client{'s' if clients != 1 else ''}, every "
            f"{view['interval']:g}s ({view['reports']} reports)")


#: what ``--load`` prints when no load was reported yet
NONE_YET = ": none yet (exports report load with load_reporting = true, or serve with --load-reporting)"

"""Load reporting without clients: how reports are summed (``LoadStats``, on an injected clock), the Cluster of a
load-reporting export, the option and flag, the LRS answer, and the ``--load`` table built from a view."""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("envoy.service.load_stats.v3.lrs_pb2", reason="the xds extra (xds-protos) is not installed")

from envoy.config.core.v3 import base_pb2
from envoy.config.endpoint.v3 import load_report_pb2

from waypost.cli.xds_load import load_rows, metrics_cell
from waypost.xds.control import ControlPlane
from waypost.xds.errors import XdsConfigError
from waypost.xds.exports import PrefixExport, config_from_dict, parse_export
from waypost.xds.load_stats import REPORTED_ORCA, LoadStats
from waypost.xds.lrs import SEND_ALL_FEATURE, LrsServer, with_load_reporting
from waypost.xds.resources import cluster, subset_clusters


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def stats(cluster_name: str, zone: str, *, ok: int = 0, err: int = 0, issued: int = 0, in_progress: int = 0,
          dropped: int = 0, categories: dict[str, int] | None = None, interval: float = 1.0,
          metrics: dict[str, tuple[int, float]] | None = None, cpu: tuple[int, float] | None = None
          ) -> load_report_pb2.ClusterStats:
    cs = load_report_pb2.ClusterStats(cluster_name=cluster_name, total_dropped_requests=dropped)
    cs.load_report_interval.FromNanoseconds(int(interval * 1e9))
    for cat, n in (categories or {}).items():
        cs.dropped_requests.add(category=cat, dropped_count=n)
    ls = cs.upstream_locality_stats.add(locality=base_pb2.Locality(region="r", zone=zone),
                                        total_successful_requests=ok, total_error_requests=err,
                                        total_issued_requests=issued, total_requests_in_progress=in_progress)
    for name, (n, total) in (metrics or {}).items():
        ls.load_metric_stats.add(metric_name=name, num_requests_finished_with_metric=n, total_metric_value=total)
    if cpu is not None:
        ls.cpu_utilization.num_requests_finished_with_metric, ls.cpu_utilization.total_metric_value = cpu
    return cs


def _loc(view: dict[str, Any], cluster_name: str, where: str) -> dict[str, Any]:
    c = next(c for c in view["clusters"] if c["cluster"] == cluster_name)
    return next(x for x in c["localities"] if x["locality"] == where)


def test_reports_of_two_clients_add_up() -> None:
    clock = Clock()
    load = LoadStats(1.0, clock=clock)
    load.opened(1)
    load.opened(2)
    load.record(1, [stats("shop", "a", ok=8, err=2, issued=11, in_progress=1, metrics={"named_metrics.q": (10, 30.0)},
                          cpu=(10, 5.0))])
    load.record(2, [stats("shop", "a", ok=4, issued=6, in_progress=2, interval=2.0),
                    stats("shop", "b", ok=1, issued=1, dropped=3, categories={"throttle": 1})])
    view = load.view()
    a = _loc(view, "shop", "r/a")
    assert (a["succeeded"], a["errored"], a["issued"], a["in_flight"]) == (12, 2, 17, 3)
    # rates: client 1 over 1 s, client 2 over 2 s (its report's load_report_interval)
    assert a["rates"] == {"issued": 11 + 6 / 2, "succeeded": 8 + 4 / 2, "errored": 2.0}
    assert a["metrics"] == {"cpu_utilization": {"count": 10, "sum": 5.0, "mean": 0.5},
                            "named_metrics.q": {"count": 10, "sum": 30.0, "mean": 3.0}}
    shop = view["clusters"][0]
    assert shop["dropped"] == 3 and shop["dropped_by_category"] == {"throttle": 1} and shop["drop_rate"] == 1.5
    assert view["clients"] == 2 and view["reports"] == 2


def test_in_flight_follows_each_clients_last_report_and_goes_with_its_stream() -> None:
    clock = Clock()
    load = LoadStats(1.0, clock=clock)
    load.opened(1)
    load.opened(2)
    load.record(1, [stats("shop", "a", issued=3, in_progress=3)])
    load.record(2, [stats("shop", "a", issued=2, in_progress=2)])
    assert load.in_flight("shop", "r/a") == 5
    clock.now += 1
    load.record(1, [stats("shop", "a", ok=3)])  # its 3 calls finished
    assert load.in_flight("shop", "r/a") == 2
    load.record(2, [stats("shop", "b", issued=1, in_progress=1)])  # nothing in r/a any more
    assert load.in_flight("shop", "r/a") == 0 and load.in_flight("shop", "r/b") == 1
    load.closed(2)
    assert load.in_flight("shop", "r/b") == 0 and load.view()["clients"] == 1
    totals = _loc(load.view(), "shop", "r/a")
    assert (totals["issued"], totals["succeeded"]) == (5, 3)  # totals stay


def test_rates_of_a_report_older_than_two_intervals_count_no_more() -> None:
    clock = Clock()
    load = LoadStats(1.0, clock=clock)
    load.opened(1)
    load.record(1, [stats("shop", "a", ok=10, issued=10)])
    assert _loc(load.view(), "shop", "r/a")["rates"]["issued"] == 10.0
    clock.now += 2.5
    assert _loc(load.view(), "shop", "r/a")["rates"]["issued"] == 0.0


def test_a_report_without_its_interval_uses_the_time_since_the_last_one() -> None:
    clock = Clock()
    load = LoadStats(10.0, clock=clock)
    load.opened(1)
    clock.now += 4
    cs = stats("shop", "a", ok=8, issued=8)
    cs.ClearField("load_report_interval")
    load.record(1, [cs])
    assert _loc(load.view(), "shop", "r/a")["rates"]["issued"] == 2.0


def test_the_export_of_a_subset_cluster() -> None:
    load = LoadStats(1.0, export_of=lambda c: c.split("/")[0])
    load.record(1, [stats("shop/version=v2", "a", ok=1, issued=1)])
    assert load.view()["clusters"][0]["export"] == "shop"
    assert load.samples()[0][:3] == ("shop", "shop/version=v2", "r/a")


def test_a_load_reporting_cluster_names_this_control_plane() -> None:
    on = parse_export("shop=direct:///127.0.0.1:1 load_reporting=true subset_key=version split=v1:9,v2:1")
    c = cluster(on)
    assert c.lrs_server.HasField("self") and list(c.lrs_report_endpoint_metrics) == list(REPORTED_ORCA)
    assert all(s.lrs_server.HasField("self") for s in subset_clusters(on).values())
    off = cluster(parse_export("shop=direct:///127.0.0.1:1"))
    assert not off.HasField("lrs_server") and not off.lrs_report_endpoint_metrics


def test_the_option_and_the_flag() -> None:
    cfg = config_from_dict({"exports": {"a": {"target": "direct:///127.0.0.1:1", "load_reporting": True},
                                        "b": {"target": "direct:///127.0.0.1:1", "load_reporting": False},
                                        "c": "direct:///127.0.0.1:1"}})
    assert [e.load_reporting for e in cfg.exports] == [True, False, None]
    exports, prefixes = with_load_reporting(cfg.exports, [PrefixExport("memory://x", "p/")])
    assert [e.load_reporting for e in exports] == [True, False, True]  # an export's own false stands
    assert prefixes[0].options == {"load_reporting": True}
    with pytest.raises(XdsConfigError, match=r"export 'a': load_reporting: expected true or false, got 'often'"):
        parse_export("a=direct:///127.0.0.1:1 load_reporting=often")
    with pytest.raises(XdsConfigError, match="load reporting interval: expected seconds from 0.1 to 3600, got 0"):
        ControlPlane([], load_reporting_interval=0)


def test_the_answer_asks_for_every_cluster_at_the_interval() -> None:
    from envoy.config.core.v3 import base_pb2 as core

    server = LrsServer(LoadStats(2.5), lambda: ["a", "b"])
    knows = server.response(core.Node(id="n", client_features=[SEND_ALL_FEATURE]))
    assert knows.send_all_clusters and not knows.clusters
    assert knows.load_reporting_interval.ToTimedelta().total_seconds() == 2.5
    older = server.response(core.Node(id="n"))  # a client that does not know send_all_clusters: the names
    assert older.send_all_clusters and list(older.clusters) == ["a", "b"]


def test_the_load_table_rows() -> None:
    clock = Clock()
    load = LoadStats(1.0, clock=clock)
    load.opened(1)
    load.record(1, [stats("shop", "a", ok=3, err=1, issued=5, in_progress=1, dropped=2,
                          metrics={"named_metrics.q": (4, 2.0), "named_metrics.z": (1, 9.0)}),
                    stats("shop", "b", ok=1, issued=1)])
    rows = load_rows(load.view())
    assert rows == [["shop", "shop", "r/a", "5.0", "3.0", "1.0", "1", "3", "1", "2",
                     "named_metrics.q=0.5 (4), named_metrics.z=9 (1)"],
                    ["shop", "shop", "r/b", "1.0", "1.0", "0.0", "0", "1", "0", "", "-"]]
    assert metrics_cell({}) == "-"
    # the application's named metrics before the utilizations, then by calls
    cell = metrics_cell({"cpu_utilization": {"count": 9, "mean": 0.5}, "named_metrics.a": {"count": 2, "mean": 1.0},
                         "named_metrics.b": {"count": 5, "mean": 2.0}, "mem_utilization": {"count": 9, "mean": 0.1}})
    assert cell == "named_metrics.b=2 (5), named_metrics.a=1 (2), cpu_utilization=0.5 (9)"


def test_locality_names_keep_their_places() -> None:
    from waypost.xds.load_stats import locality_text

    def text(region: str = "", zone: str = "", sub_zone: str = "") -> str:
        return locality_text(base_pb2.Locality(region=region, zone=zone, sub_zone=sub_zone))

    assert [text("r1", "a"), text(zone="a"), text("r1"), text(sub_zone="weight-5"), text()] == \
        ["r1/a", "/a", "r1", "//weight-5", "-"]


def test_status_load_refuses_node_and_names_an_unreachable_server() -> None:
    import subprocess
    import sys

    def status(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "waypost.cli", "xds", "status", "--server", "127.0.0.1:1",
                               "--load", "--timeout", "5", *args], capture_output=True, text=True, timeout=60,
                              check=False)

    both = status("--node", "x")
    assert both.returncode != 0 and "--node filters the client status; --load sums" in both.stderr, both.stderr
    gone = status()
    assert gone.returncode != 0 and "cannot reach 127.0.0.1:1" in gone.stderr, gone.stderr

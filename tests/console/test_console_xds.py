"""``waypost console --xds HOST:PORT``: each exported service's xDS clients, read from the control plane's client
status service, in ``GET /api/xds`` and on the page (Playwright with Debian's chromium), and an unreachable
control plane shown as an error."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("envoy.service.discovery.v3.ads_pb2", reason="the xds extra (xds-protos) is not installed")

from harness.waiting import wait_until
from tests.channel.support import echo_servers
from tests.console.support import echo_serve, http, running_console
from tests.console.test_console_browser import _screenshot, browser, page  # noqa: F401 (fixtures)
from tests.xds.test_xds_support import free_port, stock_client
from waypost.xds import ControlPlane, bootstrap_json, parse_export


@pytest.fixture(name="xds_plane")
def fixture_xds_plane(tmp_path) -> Iterator[int]:
    with echo_servers("x1", "x2") as servers:
        control = ControlPlane([parse_export("shop=direct:///" + ",".join(s.address for s in servers))])
        port = control.start()
        try:
            with stock_client(bootstrap_json([f"127.0.0.1:{port}"], "console-grpcio", zone="z9"), tmp_path) as c:
                wait_until(lambda: set(c.calls("shop", 10)["servers"]) == {"x1", "x2"}, 20, "calls through xDS")
                yield port
        finally:
            control.stop()


def _synced(url: str) -> Any:
    status, body = http(url + "api/xds")
    clients = body.get("services", {}).get("shop", []) if status == 200 else []
    return clients if clients and set(clients[0]["types"].values()) == {"SYNCED"} else None


def test_api_lists_each_service_with_its_clients(xds_plane) -> None:
    with running_console(registries=["memory://console-xds"], xds=f"127.0.0.1:{xds_plane}") as (_, url):
        clients = wait_until(lambda: _synced(url), 20, "the grpcio client SYNCED under shop")
        assert clients[0]["node"] == "console-grpcio" and clients[0]["zone"] == "z9"
        assert set(clients[0]["types"]) == {"LDS", "RDS", "CDS", "EDS"}
        assert http(url + "api/config")[1]["xds"] == f"127.0.0.1:{xds_plane}"


def test_without_xds_the_api_says_how_to_ask_and_a_dead_plane_is_an_error() -> None:
    with running_console(registries=["memory://console-xds2"]) as (_, url):
        status, body = http(url + "api/xds")
        assert status == 404 and "--xds" in body["error"]
    with running_console(registries=["memory://console-xds3"], xds=f"127.0.0.1:{free_port()}", timeout=1.0) as (_, url):
        body = wait_until(lambda: (b := http(url + "api/xds")[1]).get("error") and b, 20, "the error shown")
        assert "UNAVAILABLE" in body["error"]


def test_the_page_shows_the_clients(xds_plane, page) -> None:  # noqa: F811 (the fixture)
    with running_console(registries=["memory://console-xds4"], xds=f"127.0.0.1:{xds_plane}") as (_, url):
        wait_until(lambda: _synced(url), 20, "the client SYNCED")
        page.goto(url)
        row = page.locator('[data-xds-service="shop"] [data-node="console-grpcio"]')
        row.wait_for(timeout=15000)
        text = row.inner_text()
        assert "SYNCED" in text and "z9" in text, text


def test_a_canary_split_is_shown_beside_its_instances(tmp_path, page) -> None:  # noqa: F811 (the fixture)
    """An export splitting 90/10 between version=v1 and version=v2: the page shows each instance's subset and
    its share (as the control plane's clients were sent it), and the split in the xDS card."""
    reg, key = "memory://console-canary", "canary.rpc"
    versions = {"s1": "v1", "s2": "v1", "c1": "v2"}
    servers = {n: echo_serve(n, key, reg, metadata={"version": v}) for n, v in versions.items()}
    control = ControlPlane([parse_export(f"shop={reg}/?key={key} subset_key=version split=v1:90,v2:10")])
    port = control.start()
    try:
        with stock_client(bootstrap_json([f"127.0.0.1:{port}"], "canary-grpcio"), tmp_path) as c, \
                running_console(registries=[reg], xds=f"127.0.0.1:{port}") as (_, url):
            wait_until(lambda: set(c.calls("shop", 60)["servers"]) == set(versions), 30, "calls on all three")
            traffic = wait_until(lambda: http(url + "api/xds")[1].get("traffic", {}).get("shop"), 20,
                                 "the split of shop in /api/xds")
            split = {p["subset"]: (p["share"], sorted(p["addresses"])) for p in traffic["split"]}
            assert split == {"version=v1": (0.9, sorted([servers["s1"].address, servers["s2"].address])),
                             "version=v2": (0.1, [servers["c1"].address])}, split
            page.goto(url)
            for name, version in versions.items():
                badge = page.locator(f'div.service[data-service="{key}"] tr[data-address="{servers[name].address}"] '
                                     "td.weight .badge.split")
                badge.wait_for(timeout=15_000)
                want = "version=v1 · 90 %" if version == "v1" else "version=v2 · 10 %"
                assert badge.inner_text() == want, (name, badge.inner_text())
            line = page.locator('[data-xds-split="shop"]')
            line.wait_for(timeout=15_000)
            assert "version=v1 · 90 %" in line.inner_text() and "version=v2 · 10 %" in line.inner_text()
            _screenshot(page, tmp_path / "console-canary.png")
    finally:
        control.stop()
        for s in servers.values():
            s.stop()


def test_traffic_of_reads_the_default_routes_split() -> None:
    """``traffic_of`` over a client status answer holding the RouteConfiguration the control plane builds."""
    from envoy.service.status.v3 import csds_pb2

    from waypost.console.xds_clients import traffic_of
    from waypost.xds.resources import ROUTE, route_config

    def answer(spec: str) -> csds_pb2.ClientStatusResponse:
        resp = csds_pb2.ClientStatusResponse()
        g = resp.config.add().generic_xds_configs.add(type_url=ROUTE, name="shop")
        g.xds_config.Pack(route_config(parse_export(spec)))
        return resp

    split = traffic_of(answer("shop=direct:///127.0.0.1:1 subset_key=version split=v1:3,v2:1"), "shop")
    assert split == {"split": [
        {"cluster": "shop/version=v1", "subset": "version=v1", "weight": 3, "share": 0.75, "addresses": []},
        {"cluster": "shop/version=v2", "subset": "version=v2", "weight": 1, "share": 0.25, "addresses": []}]}
    plain = traffic_of(answer("shop=direct:///127.0.0.1:1"), "shop")
    assert plain == {"split": [{"cluster": "shop", "subset": "", "weight": 1, "share": 1.0, "addresses": []}]}
    assert traffic_of(answer("shop=direct:///127.0.0.1:1"), "other") is None


def test_the_load_the_clients_report_is_shown(tmp_path, page) -> None:  # noqa: F811 (the fixture)
    """An export with load reporting: ``/api/xds`` carries the load its grpcio client reports (per cluster and
    locality, the same view as ``waypost xds status --load``), and the xDS card shows it under the clients."""
    with echo_servers("l1", "l2") as servers:
        control = ControlPlane([parse_export("shop=direct:///" + ",".join(s.address for s in servers)
                                             + " load_reporting=true")], load_reporting_interval=0.5)
        port = control.start()
        try:
            with stock_client(bootstrap_json([f"127.0.0.1:{port}"], "load-grpcio"), tmp_path) as c, \
                    running_console(registries=["memory://console-load"], xds=f"127.0.0.1:{port}") as (_, url):
                got = c.calls("shop", 20, timeout=10)
                assert sum(got["servers"].values()) == 20, got

                def reported() -> Any:
                    load = http(url + "api/xds")[1].get("load", {}).get("shop") or []
                    locs = [x for cluster in load for x in cluster["localities"]]
                    return locs if sum(x["succeeded"] for x in locs) == 20 else None

                locs = wait_until(reported, 30, "the 20 calls in the load of shop in /api/xds")
                assert [x["locality"] for x in locs] == ["-"] and locs[0]["in_flight"] == 0, locs
                page.goto(url)
                row = page.locator('[data-xds-load="shop"] tr[data-locality="-"]')
                row.wait_for(timeout=15_000)
                cells = row.locator("td").all_inner_texts()
                assert cells[0] == "shop" and cells[5] == "20" and cells[6] == "0" and cells[7] == "0", cells
                _screenshot(page, tmp_path / "console-xds-load.png")
        finally:
            control.stop()

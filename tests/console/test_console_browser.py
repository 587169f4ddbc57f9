"""The console page in a real browser (Playwright driving Debian's chromium): live listing, a drain clicked on the
page (asked first) taking traffic off a backend in a running client, a write without the token refused and the
token badge saying what the server said, the layout at 800 and 1400 px (screenshots checked: no sideways scroll,
every button inside its card), counts, filters kept in the URL, client charts (axes, the search box, a gone
backend's past line) and a registry that does not answer at start.

Screenshots go to the test's tmp_path, and also to $WAYPOST_SCREENSHOTS when set (to look at them).

Skips, saying why, without the ``playwright`` package or a chromium binary (``apt-get install chromium``;
``.ci/run`` installs it when it can)."""

from __future__ import annotations

import itertools
import math
import os
import re
import shutil
import struct
import threading
import time
import urllib.parse
from collections.abc import Iterator
from typing import Any

import grpc
import pytest

import waypost
from harness.backends import echo_pb2, echo_pb2_grpc
from harness.waiting import wait_until
from tests.console.support import TOKEN, echo_serve, http, running_console, write
from waypost import metrics
from waypost.discovery.override import override_key

CHROMIUM = os.environ.get("WAYPOST_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    sync_api = pytest.importorskip("playwright.sync_api", reason="the browser tests need playwright (pip install "
                                   "playwright)")
    if not os.path.exists(CHROMIUM):
        pytest.skip(f"no chromium at {CHROMIUM} (apt-get install chromium, or set WAYPOST_CHROMIUM)")
    with sync_api.sync_playwright() as p:
        args = ["--no-sandbox"] if os.geteuid() == 0 else []
        b = p.chromium.launch(executable_path=CHROMIUM, args=args)
        try:
            yield b
        finally:
            b.close()


@pytest.fixture
def page(browser: Any) -> Iterator[Any]:
    ctx = browser.new_context()
    pg = ctx.new_page()
    try:
        yield pg
    finally:
        ctx.close()


def _row(page: Any, key: str, address: str) -> Any:
    return page.locator(f'div.service[data-service="{key}"] tr[data-address="{address}"]')


def _screenshot(page: Any, path: Any) -> tuple[int, int]:
    """A full-page screenshot at ``path`` (and in $WAYPOST_SCREENSHOTS); returns its (width, height) in pixels:
    a page wider than the viewport makes a wider picture."""
    data = page.screenshot(path=str(path), full_page=True)
    shots = os.environ.get("WAYPOST_SCREENSHOTS")
    if shots:
        os.makedirs(shots, exist_ok=True)
        with open(os.path.join(shots, os.path.basename(str(path))), "wb") as f:
            f.write(data)
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    return struct.unpack(">II", data[16:24])


#: the boxes (x, right edge, y, bottom) of every control of the instance rows and of their card, in the page
_BOXES = """() => [...document.querySelectorAll("div.service[data-service]")].map((card) => {
  const c = card.getBoundingClientRect();
  return { card: [c.left, c.right, c.top, c.bottom], key: card.dataset.service,
           controls: [...card.querySelectorAll("td.actions button, td.actions input")].map((e) => {
             const r = e.getBoundingClientRect(); return [e.className || e.tagName, r.left, r.right, r.top, r.bottom];
           }) };
})"""


#: per chart: its frame, its value axis's x, and each tick label's text, value (data-value, value ticks only) and box
_CHART_BOXES = """() => [...document.querySelectorAll('div.client .chart svg')].map((s) => {
  const f = s.getBoundingClientRect();
  const axis = [...s.querySelectorAll('line.axis')].find((l) => l.getAttribute('x1') === l.getAttribute('x2'));
  return { title: s.getAttribute('aria-label'), frame: [f.left, f.right, f.top, f.bottom],
           axis: f.left + Number(axis.getAttribute('x1')) * f.width / s.viewBox.baseVal.width,
           labels: [...s.querySelectorAll('text.tick')].map((t) => { const r = t.getBoundingClientRect();
             return { text: t.textContent, value: t.dataset.value === undefined ? null : Number(t.dataset.value),
                      box: [r.left, r.right, r.top, r.bottom] }; }) };
})"""


def _is_round_step(step: float) -> bool:
    """A step of 1, 2 or 5 times a power of ten."""
    exponent = math.floor(math.log10(step) + 1e-9)
    return any(math.isclose(step, m * 10**exponent, rel_tol=1e-6) for m in (1, 2, 5, 10))


def _check_charts(page: Any) -> None:
    """Every tick label inside its chart's frame (1 px border) and clear of the value axis and of each other;
    the value ticks round: 0, then equal steps of 1, 2 or 5 times a power of ten, their labels those numbers."""
    charts = page.evaluate(_CHART_BOXES)
    assert charts
    for c in charts:
        left, right, top, bottom = c["frame"]
        for lab in c["labels"]:
            x0, x1, y0, y1 = lab["box"]
            assert left + 1 <= x0 and x1 <= right - 1 and top + 1 <= y0 and y1 <= bottom - 1, (c["title"], lab, c)
        values = [lab for lab in c["labels"] if lab["value"] is not None]
        assert len(values) >= 2, c
        for lab in values:
            assert lab["box"][1] <= c["axis"] - 1, (c["title"], "a value label over the axis", lab, c["axis"])
        for a, b in itertools.pairwise(sorted(values, key=lambda v: v["box"][2])):
            assert a["box"][3] <= b["box"][2], (c["title"], "value labels overlap", a, b)
        ticks = sorted(lab["value"] for lab in values)
        step = ticks[1] - ticks[0]
        assert ticks[0] == 0 and _is_round_step(step), (c["title"], ticks)
        assert all(math.isclose(t, i * step, rel_tol=1e-9) for i, t in enumerate(ticks)), (c["title"], ticks)
        shown = [float(re.match(r"[0-9.]+", lab["text"]).group()) for lab in sorted(values, key=lambda v: v["value"])]
        shown_step = shown[1] - shown[0]
        assert _is_round_step(shown_step), (c["title"], shown)
        assert all(math.isclose(v, i * shown_step, rel_tol=1e-9, abs_tol=1e-9) for i, v in enumerate(shown)), shown


def test_the_page_lists_a_live_registration_and_removes_a_stopped_one(page, shared_etcd, unique_key):
    with running_console(registries=[shared_etcd.url()]) as (_, url):
        page.goto(url)
        page.locator("#live.on").wait_for(timeout=10_000)
        began = time.monotonic()
        a = echo_serve("a", unique_key, shared_etcd.url(), metadata={"weight": 20, "zone": "z1"})
        try:
            row = _row(page, unique_key, a.address)
            row.wait_for(timeout=2_000)  # within 2 s of the registration
            took = time.monotonic() - began
            assert "z1" in row.inner_text() and "20" in row.locator("td.weight").inner_text()
            row.locator("td.health.h-SERVING").wait_for(timeout=10_000)  # the console's own probe
            page.fill("#search", "no-such-service-anywhere")
            row.wait_for(state="detached", timeout=5_000)
            page.fill("#search", unique_key)
            row.wait_for(timeout=5_000)
        finally:
            a.stop()
        row.wait_for(state="detached", timeout=10_000)
    print(f"listed {took:.2f}s after the registration")


def test_a_drain_clicked_on_the_page_stops_traffic_to_that_backend(page, shared_etcd, unique_key):
    reg_url = shared_etcd.url()
    servers = [echo_serve(n, unique_key, reg_url) for n in ("a", "b", "c")]
    victim = servers[0]
    names = {s.address: n for s, n in zip(servers, "abc", strict=True)}
    calls: list[tuple[float, str]] = []
    failures: list[str] = []
    reached: list[float] = []
    stop = threading.Event()
    try:
        with running_console(registries=[reg_url]) as (_, url), \
                waypost.dial(f"etcd:///{shared_etcd.endpoint}?key={unique_key}") as ch:
            stub = echo_pb2_grpc.EchoStub(ch)

            def watch_client() -> None:  # the moment the client's own view carries weight 0
                if not reached and any(sc.address == victim.address and sc.backend.metadata.get("weight") == 0
                                       for sc in ch.balancer.subconns()):
                    reached.append(time.monotonic())

            ch.balancer.add_listener(watch_client)

            def load() -> None:
                deadline = time.monotonic() + 40
                for _ in range(20_000):  # bounded in count and time
                    if stop.is_set() or time.monotonic() > deadline:
                        return
                    started = time.monotonic()
                    try:
                        calls.append((started, stub.Unary(echo_pb2.EchoRequest(), timeout=10).server))
                    except grpc.RpcError as e:
                        failures.append(f"{e.code()}: {e.details()}")
                    time.sleep(0.002)

            wait_until(lambda: len(ch.balancer.ready_addresses()) == 3
                       or stub.Unary(echo_pb2.EchoRequest(), timeout=10) and False, 20, what="3 READY backends")
            worker = threading.Thread(target=load, name="test-load")
            worker.start()
            try:
                wait_until(lambda: {"a", "b", "c"} <= {s for _, s in calls}, 20, what="calls on every backend")
                page.goto(f"{url}#token={TOKEN}")
                page.locator("#token-state", has_text="accepted").wait_for(timeout=10_000)
                row = _row(page, unique_key, victim.address)
                asked: list[str] = []
                page.once("dialog", lambda d: (asked.append(d.message), d.accept()))
                row.locator("button.drain").click(timeout=10_000)
                page.locator("#message.ok").wait_for(timeout=10_000)
                row.locator("td.weight .badge").wait_for(timeout=10_000)  # the page shows it drained
                assert "drained" in row.locator("td.weight").inner_text()
                assert asked and victim.address in asked[0] and unique_key in asked[0], asked
                wait_until(lambda: reached, 10, what="the client's view carrying weight 0")
                after = len(calls)
                wait_until(lambda: len(calls) >= after + 200, 20, what="200 more calls after the drain")
            finally:
                stop.set()
                worker.join(20)
            assert not failures, failures[:5]
            late = [(t, s) for t, s in calls if t > reached[0] and s == "a"]
            assert not late, f"{len(late)} call(s) to the drained backend after the client saw weight 0"
            assert {s for t, s in calls if t > reached[0]} <= {"b", "c"}  # (the policy picks among the rest)
            assert names[victim.address] == "a"
            waypost.connect(reg_url).sync.delete(override_key(unique_key, victim.address))
    finally:
        for s in servers:
            s.stop()


def test_a_write_without_the_token_is_refused_on_the_page(page, shared_etcd, unique_key):
    a = echo_serve("a", unique_key, shared_etcd.url())
    reg = waypost.connect(shared_etcd.url())
    try:
        with running_console(registries=[shared_etcd.url()]) as (_, url):
            page.goto(url)
            assert page.locator("#token-state").inner_text() == "not set"
            row = _row(page, unique_key, a.address)
            page.once("dialog", lambda d: d.accept())
            row.locator("button.drain").click(timeout=10_000)
            msg = page.locator("#message.error")
            msg.wait_for(timeout=10_000)
            text = msg.inner_text()
            assert "401" in text and "token field" in text and "X-Waypost-Token" not in text, text
            assert page.evaluate("document.activeElement.id") == "token"  # the field to fill
            page.fill("#token", "not-the-token")
            page.click("#token-form button")
            # the badge says what the server said of the token, not that a field was filled
            page.locator("#token-state.off", has_text="refused").wait_for(timeout=10_000)
            page.once("dialog", lambda d: d.accept())
            row.locator("button.drain").click()
            page.locator("#message.error", has_text="403").wait_for(timeout=10_000)
            assert "token field" in page.locator("#message").inner_text()
            assert page.locator("#token-state").inner_text() == "refused"  # still, after the 403
            assert not reg.sync.get(override_key(unique_key, a.address)).kvs
            assert "drained" not in row.locator("td.weight").inner_text()

            page.fill("#token", TOKEN)
            page.click("#token-form button")
            page.locator("#token-state.on", has_text="accepted").wait_for(timeout=10_000)
            asked: list[str] = []
            page.once("dialog", lambda d: (asked.append(d.message), d.dismiss()))  # asked, and said no
            row.locator("button.drain").click()
            page.locator("#message.ok", has_text="cancelled").wait_for(timeout=10_000)
            assert asked and a.address in asked[0] and unique_key in asked[0], asked
            assert not reg.sync.get(override_key(unique_key, a.address)).kvs, "a cancelled drain wrote"
    finally:
        a.stop()


@pytest.mark.parametrize("width", [800, 1400])
def test_the_layout_fits_the_window_and_the_charts_have_axes(browser, tmp_path, unique_key, width):
    prometheus_client = pytest.importorskip("prometheus_client")
    reg, other = f"memory://{unique_key}", f"{unique_key}-other"
    md = {"weight": 20, "zone": "eu-west-1a", "version": "1.2.3-rc1", "region": "eu-west-1",
          "build": "2026-01-01T00:00:00Z-0123456789abcdef"}
    servers = [echo_serve(n, unique_key, reg, metadata=md) for n in ("a", "b", "c")]
    lone = echo_serve("o", other, reg)
    gone = servers[2]
    exporter = metrics.serve(0, registry=prometheus_client.CollectorRegistry())
    ctx = browser.new_context(viewport={"width": width, "height": 900})
    page = ctx.new_page()
    failed: list[str] = []
    page.on("response", lambda r: r.status >= 400 and failed.append(f"{r.status} {r.url}"))
    try:
        murl = f"http://127.0.0.1:{exporter.server_port}/metrics"
        with waypost.dial(f"{reg}/?key={unique_key}", balancer="round_robin") as ch, \
                running_console(registries=[reg], metrics=[murl], metrics_interval=0.3) as (_, url):
            stub = echo_pb2_grpc.EchoStub(ch)
            # an override: its row has the most controls (drain, weight, set, undo)
            assert write(url, "weight", {"key": unique_key, "address": servers[1].address, "weight": 5})[0] == 200

            def calls_on(n: int) -> bool:
                for _ in range(20):
                    stub.Unary(echo_pb2.EchoRequest(), timeout=10)
                snap = http(f"{url}api/services")[1]["clients"][murl]["targets"]
                return any(len([p for p in t["series"] if p["calls"].get(gone.address)]) >= 2 and
                           len({b for p in t["series"] for b, c in p["calls"].items() if c}) >= n
                           for t in snap.values())

            wait_until(lambda: calls_on(3), 20, what="chart points with calls on the three backends")
            gone.stop()
            wait_until(lambda: gone.address not in {sc.address for sc in ch.balancer.subconns()}, 10,
                       what="the client's list without the stopped backend")
            for _ in range(3):  # scrapes without it
                calls_on(2)
                time.sleep(0.4)
            page.goto(f"{url}#token={TOKEN}")
            page.locator("#token-state", has_text="accepted").wait_for(timeout=10_000)
            _row(page, unique_key, servers[1].address).locator("button.undo").wait_for(timeout=10_000)
            page.locator(f'div.service[data-service="{other}"] tr[data-address]').wait_for(timeout=10_000)
            page.locator(f'.legend [data-backend="{gone.address}"]').wait_for(timeout=10_000)

            shot_w, _ = _screenshot(page, tmp_path / f"console-{width}.png")
            inner = page.evaluate("innerWidth")
            assert page.evaluate("document.scrollingElement.scrollWidth") <= inner
            assert shot_w == inner, f"the page is {shot_w} px wide in a {inner} px window"
            for card in page.evaluate(_BOXES):
                left, right, top, bottom = card["card"]
                assert card["controls"], card
                for name, x0, x1, y0, y1 in card["controls"]:
                    assert left <= x0 and x1 <= right and top <= y0 and y1 <= bottom, (card["key"], name, card)
            assert page.locator("#counts").inner_text() == "2 keys, 3 instances"
            # no empty band between the filters and the first card (only main's own padding)
            gap = page.evaluate("""() => document.querySelector('div.service').getBoundingClientRect().top -
                document.querySelector('nav').getBoundingClientRect().bottom""")
            assert 0 <= gap <= 12, f"{gap:.1f} px between the filters and the first card"
            _check_charts(page)

            # the charts: value ticks and clock times on each; the gone backend keeps its past line
            target = page.locator("div.client .target").first
            assert target.locator("svg[aria-label]").count() == 3
            ticks = target.locator("svg[aria-label='share of calls'] text.tick").all_text_contents()
            assert "0%" in ticks and any(t.count(":") == 2 for t in ticks), ticks
            line = target.locator(f'svg[aria-label="share of calls"] polyline[data-backend="{gone.address}"]')
            assert line.count() == 1
            assert "(gone)" in target.locator(f'.legend [data-backend="{gone.address}"]').inner_text()
            for box in page.evaluate("""() => [...document.querySelectorAll('div.client .chart')].map((c) => {
                const r = c.getBoundingClientRect(); return r.right; })"""):
                assert box <= inner

            # the search box filters the charts too: a backend's address keeps only its lines
            page.fill("#search", servers[0].address)
            page.locator(f'.legend [data-backend="{servers[1].address}"]').wait_for(state="detached", timeout=5_000)
            assert target.locator(f'.legend [data-backend="{servers[0].address}"]').count() == 1
            assert page.locator("#counts").inner_text() == "1 of 2 keys, 1 of 3 instances shown"
            page.fill("#search", "nothing-matches-this")
            page.locator("div.client").wait_for(state="detached", timeout=5_000)
            assert page.locator("#counts").inner_text() == "0 of 2 keys, 0 of 3 instances shown"

            status, icon = page.request.get(f"{url}favicon.ico").status, page.locator("link[rel=icon]")
            assert status == 200 and icon.count() == 1
            assert page.request.get(urllib.parse.urljoin(url, icon.get_attribute("href"))).status == 200
            assert not failed, failed
    finally:
        ctx.close()
        exporter.shutdown()
        metrics.disable()
        for s in [*servers, lone]:
            s.stop()


_COLUMN_WIDTHS = """(key) => [...document.querySelectorAll(`div.service[data-service="${key}"] th`)]
  .map((th) => th.getBoundingClientRect().width)"""


@pytest.mark.parametrize("width", [800, 1400])
def test_a_drain_does_not_move_the_columns(browser, unique_key, width):
    reg = f"memory://{unique_key}"
    md = {"weight": 20, "zone": "eu-west-1a", "version": "1.2.3"}
    servers = [echo_serve(n, unique_key, reg, metadata=md) for n in ("a", "b")]
    ctx = browser.new_context(viewport={"width": width, "height": 900})
    page = ctx.new_page()
    try:
        with running_console(registries=[reg]) as (_, url):
            page.goto(url)
            row = _row(page, unique_key, servers[0].address)
            row.locator("td.health.h-SERVING").wait_for(timeout=10_000)
            before = page.evaluate(_COLUMN_WIDTHS, unique_key)
            assert write(url, "drain", {"key": unique_key, "address": servers[0].address})[0] == 200
            row.locator("td.weight .badge", has_text="drained").wait_for(timeout=10_000)
            row.locator("button.undrain").wait_for(timeout=10_000)  # the row's other controls changed too
            after = page.evaluate(_COLUMN_WIDTHS, unique_key)
            assert len(before) == len(after) == 9
            assert all(abs(a - b) < 0.5 for a, b in zip(before, after, strict=True)), (before, after)
    finally:
        ctx.close()
        for s in servers:
            s.stop()


def test_the_filters_are_kept_in_the_url_and_restored_from_it(page, browser, unique_key):
    reg, other = f"memory://{unique_key}", f"{unique_key}-other"
    servers = [echo_serve("a", unique_key, reg), echo_serve("b", unique_key, reg), echo_serve("o", other, reg)]
    try:
        with running_console(registries=[reg]) as (_, url):
            page.goto(url)
            for s in servers:
                page.locator(f'tr[data-address="{s.address}"]').wait_for(timeout=10_000)
            assert page.locator("#counts").inner_text() == "2 keys, 3 instances"
            page.fill("#search", other)
            page.select_option("#f-format", "gozero")
            page.check("#f-drained")
            query = urllib.parse.parse_qs(urllib.parse.urlsplit(page.url).query)
            assert query == {"q": [other], "format": ["gozero"], "drained": ["1"]}, page.url
            page.uncheck("#f-drained")
            link = page.url
            assert urllib.parse.parse_qs(urllib.parse.urlsplit(link).query) == {"q": [other], "format": ["gozero"]}
            assert page.locator("#counts").inner_text() == "1 of 2 keys, 1 of 3 instances shown"

            fresh = browser.new_context(viewport={"width": 1400, "height": 900}).new_page()  # the link, opened anew
            try:
                fresh.goto(link)
                fresh.locator(f'div.service[data-service="{other}"] tr[data-address]').wait_for(timeout=10_000)
                assert fresh.input_value("#search") == other and fresh.input_value("#f-format") == "gozero"
                assert fresh.locator(f'div.service[data-service="{unique_key}"]').count() == 0
                assert fresh.locator("#counts").inner_text() == "1 of 2 keys, 1 of 3 instances shown"
            finally:
                fresh.context.close()
    finally:
        for s in servers:
            s.stop()


def test_a_registry_down_at_start_is_named_on_the_page_until_it_answers(page, etcd, tmp_path, unique_key):
    reg_url = etcd.url()
    etcd.stop()
    with running_console(registries=[reg_url], timeout=3.0) as (console, url):
        name = console.source_names()[0]
        page.goto(url)
        banner = page.locator(f'#sources .source-down[data-source="{name}"]')
        banner.wait_for(timeout=15_000)
        text = banner.inner_text()
        assert etcd.endpoint in text and "since" in text and "Nothing read from it yet" in text, text
        assert f"nothing read yet: {name} does not answer" in page.locator("#services").inner_text()
        _screenshot(page, tmp_path / "console-registry-down.png")
        etcd.start()
        a = echo_serve("a", unique_key, reg_url)
        try:
            _row(page, unique_key, a.address).wait_for(timeout=30_000)
            banner.wait_for(state="detached", timeout=15_000)
        finally:
            a.stop()

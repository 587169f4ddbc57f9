"""The console page in a real browser (Playwright driving Debian's chromium): live listing, a drain clicked on the
page taking traffic off a backend in a running client, and a write without the token refused.

Skips, saying why, without the ``playwright`` package or a chromium binary (``apt-get install chromium``;
``.ci/run`` installs it when it can)."""

from __future__ import annotations

import os
import shutil
import threading
import time
from collections.abc import Iterator
from typing import Any

import grpc
import pytest

import waypost
from tests.backends import echo_pb2, echo_pb2_grpc
from tests.console_support import TOKEN, echo_serve, running_console
from tests.waiting import wait_until
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
                assert page.locator("#token-state").inner_text() == "set"
                row = _row(page, unique_key, victim.address)
                row.locator("button.drain").click(timeout=10_000)
                page.locator("#message.ok").wait_for(timeout=10_000)
                row.locator("td.weight .badge").wait_for(timeout=10_000)  # the page shows it drained
                assert "drained" in row.locator("td.weight").inner_text()
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
    try:
        with running_console(registries=[shared_etcd.url()]) as (_, url):
            page.goto(url)
            assert page.locator("#token-state").inner_text() == "not set"
            row = _row(page, unique_key, a.address)
            row.locator("button.drain").click(timeout=10_000)
            msg = page.locator("#message.error")
            msg.wait_for(timeout=10_000)
            assert "401" in msg.inner_text()
            page.fill("#token", "not-the-token")
            page.click("#token-form button")
            row.locator("button.drain").click()
            page.locator("#message.error", has_text="403").wait_for(timeout=10_000)
            assert not waypost.connect(shared_etcd.url()).sync.get(override_key(unique_key, a.address)).kvs
            assert "drained" not in row.locator("td.weight").inner_text()
    finally:
        a.stop()

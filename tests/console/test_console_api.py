"""The console's JSON API against a real console over a real etcd and real ``waypost.serve`` servers: listing,
drain (surviving the publisher's guard) and undrain, and the refusals of writes (token, cross-site, read-only)."""

from __future__ import annotations

import json
import logging
import time
import urllib.request

import pytest
from click.testing import CliRunner

import waypost
from harness.waiting import wait_until
from tests.console.support import TOKEN, echo_serve, http, instances, running_console, write
from waypost.cli.commands import app
from waypost.discovery.override import override_key


def _weights_seen_by_clients(sub: waypost.Subscriber) -> dict[str, object]:
    return {b.address: b.metadata.get("weight") for b in sub.backends()}


def test_lists_drains_through_the_guard_and_undrains(shared_etcd, unique_key):
    url_reg = shared_etcd.url()
    a = echo_serve("a", unique_key, url_reg, metadata={"weight": 20, "zone": "z1", "version": "1.2"})
    b = echo_serve("b", unique_key, url_reg, metadata={"weight": 20})
    try:
        with running_console(registries=[url_reg]) as (_console, url), \
                waypost.Subscriber(url_reg, unique_key, timeout=10) as sub:
            got = wait_until(lambda: len(i := instances(url, unique_key)) == 2 and i, 10, what="both listed")
            ia = got[a.address]
            assert ia["metadata"] == {"weight": 20, "zone": "z1", "version": "1.2"} and ia["weight"] == 20
            assert ia["lease"] and ia["override"] is None
            wait_until(lambda: instances(url, unique_key)[a.address]["health"] == "SERVING"
                       and instances(url, unique_key)[a.address]["ttl"] is not None, 10, what="health and TTL")
            status, _ = http(f"{url}api/services")
            assert status == 200

            status, answer = write(url, "drain", {"key": unique_key, "address": a.address})
            assert status == 200 and answer["ok"], answer
            wait_until(lambda: _weights_seen_by_clients(sub)[a.address] == 0, 10, what="weight 0 seen by clients")
            shown = wait_until(lambda: (i := instances(url, unique_key)[a.address])["weight"] == 0 and i, 10)
            assert shown["override"]["weight"] == 0 and shown["override"]["by"] == "127.0.0.1"
            assert shown["metadata"]["zone"] == "z1"  # the rest of the metadata stays

            # the publisher's guard puts its records back when they go: with the override applied
            reg = waypost.connect(url_reg)
            for k, _ in a.publisher.client.records:  # the registrar's records (side records first)
                reg.sync.delete(k)
            time.sleep(2.0)  # longer than a guard cycle (~1 s)
            wait_until(lambda: _weights_seen_by_clients(sub).get(a.address) == 0, 10, what="still drained")
            assert _weights_seen_by_clients(sub)[b.address] == 20

            status, answer = write(url, "weight", {"key": unique_key, "address": b.address, "weight": 5})
            assert status == 200, answer
            wait_until(lambda: _weights_seen_by_clients(sub)[b.address] == 5, 10, what="weight 5")

            for addr in (a.address, b.address):
                status, answer = write(url, "undrain", {"key": unique_key, "address": addr})
                assert status == 200, answer
            wait_until(lambda: _weights_seen_by_clients(sub) == {a.address: 20, b.address: 20}, 10,
                       what="own weights back")
            assert not reg.sync.get(override_key(unique_key, a.address)).kvs

            b.stop()
            wait_until(lambda: set(instances(url, unique_key)) == {a.address}, 10, what="the stopped one removed")
    finally:
        a.stop()
        b.stop()


def test_writes_need_the_token_a_json_body_and_the_same_site(shared_etcd, unique_key, caplog):
    caplog.set_level(logging.WARNING, logger="waypost.console.audit")
    body = {"key": unique_key, "address": "127.0.0.1:7411"}
    reg = waypost.connect(shared_etcd.url())
    with running_console(registries=[shared_etcd.url()]) as (_, url):
        origin = url.rstrip("/")
        assert write(url, "drain", body, token=None)[0] == 401
        assert write(url, "drain", body, token="wrong")[0] == 403
        assert http(f"{url}api/drain", "POST", body, {"Authorization": f"Bearer {TOKEN}x"})[0] == 403
        assert write(url, "drain", body, Origin="http://evil.example")[0] == 403
        assert write(url, "drain", body, **{"Sec-Fetch-Site": "cross-site"})[0] == 403
        assert write(url, "drain", body, Origin="null")[0] == 403
        form = f"key={unique_key}&address=127.0.0.1:7411".encode()
        for ctype in ("application/x-www-form-urlencoded", "multipart/form-data; boundary=x", "text/plain"):
            status, _ = http(f"{url}api/drain", "POST", raw=form,
                             headers={"Content-Type": ctype, "X-Waypost-Token": TOKEN, "Origin": origin})
            assert status == 415, ctype
        assert write(url, "drain", {"key": unique_key, "address": "nope"})[0] == 400
        assert write(url, "weight", {**body, "weight": -1})[0] == 400
        assert write(url, "weight", {**body, "weight": True})[0] == 400
        # a rebinding page reaching the loopback console under another name is refused, reads too
        assert http(f"{url}api/services", headers={"Host": "attacker.example"})[0] == 403
        assert not reg.sync.get(override_key(unique_key, "127.0.0.1:7411")).kvs, "a refused write wrote"

        status, _ = write(url, "drain", body, Origin=origin, **{"Sec-Fetch-Site": "same-origin"})
        assert status == 200
        assert json.loads(reg.sync.get(override_key(unique_key, "127.0.0.1:7411")).kvs[0].value)["weight"] == 0
        assert http(f"{url}api/undrain", "POST", body, {"Authorization": f"Bearer {TOKEN}"})[0] == 200
        assert not reg.sync.get(override_key(unique_key, "127.0.0.1:7411")).kvs
        audit = [r.getMessage() for r in caplog.records if r.name == "waypost.console.audit"]
        assert any(f"drain {unique_key} 127.0.0.1:7411 -> weight 0 by 127.0.0.1 at " in m for m in audit), audit
        assert any(f"undrain {unique_key} 127.0.0.1:7411 (override removed) by 127.0.0.1" in m for m in audit), audit
        assert any("refused drain from 127.0.0.1" in m and ": 401 " in m for m in audit), audit
        assert any("refused drain from 127.0.0.1" in m and ": 403 wrong token" in m for m in audit), audit

        with urllib.request.urlopen(url, timeout=10) as resp:  # the page and its security headers
            assert b"waypost console" in resp.read()
            assert "frame-ancestors 'none'" in resp.headers["Content-Security-Policy"]
        with urllib.request.urlopen(f"{url}static/app.js", timeout=10) as resp:
            assert b"EventSource" in resp.read()


def test_read_only_refuses_writes(shared_etcd, unique_key):
    with running_console(registries=[shared_etcd.url()], read_only=True) as (_, url):
        status, answer = write(url, "drain", {"key": unique_key, "address": "127.0.0.1:7412"})
        assert status == 403 and "read-only" in answer["error"]
        assert http(f"{url}api/config")[1]["read_only"] is True


def test_event_stream_sends_the_snapshot(shared_etcd, unique_key):
    a = echo_serve("a", unique_key, shared_etcd.url())
    try:
        with running_console(registries=[shared_etcd.url()]) as (_, url), \
                urllib.request.urlopen(f"{url}api/events", timeout=10) as resp:
            assert resp.headers["Content-Type"].startswith("text/event-stream")
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                line = resp.readline().decode()
                if line.startswith("data: ") and a.address in line:
                    break
            else:
                pytest.fail("no snapshot with the registration in the event stream")
    finally:
        a.stop()


def test_cli_drain_weight_undrain(shared_etcd, unique_key):
    reg = waypost.connect(shared_etcd.url())
    addr = "127.0.0.1:7413"
    run = CliRunner()
    args = ["--registry", shared_etcd.url()]
    res = run.invoke(app, [*args, "--json", "drain", unique_key, addr], catch_exceptions=False)
    assert res.exit_code == 0, res.output
    line = json.loads(res.output.splitlines()[0])
    assert line["weight"] == 0 and line["registered"] is False
    assert "(cli)" in json.loads(reg.sync.get(override_key(unique_key, addr)).kvs[0].value)["by"]
    res = run.invoke(app, [*args, "--json", "ls", "_waypost/"], catch_exceptions=False)
    assert json.loads(res.output)["services"] == {}, res.output  # an override is no registration for ls
    res = run.invoke(app, [*args, "weight", unique_key, addr, "7"], catch_exceptions=False)
    assert res.exit_code == 0 and "weight set to 7" in res.output, res.output
    assert json.loads(reg.sync.get(override_key(unique_key, addr)).kvs[0].value)["weight"] == 7
    res = run.invoke(app, [*args, "undrain", unique_key, addr], catch_exceptions=False)
    assert res.exit_code == 0, res.output
    assert not reg.sync.get(override_key(unique_key, addr)).kvs
    res = run.invoke(app, [*args, "weight", unique_key, addr, "-3"])
    assert res.exit_code == 2
    res = run.invoke(app, [*args, "drain", unique_key, "0.0.0.0:80"])
    assert res.exit_code == 1 and "Error:" in res.output


def test_the_token_check_says_whether_the_token_is_right_and_writes_nothing(shared_etcd, unique_key, caplog):
    caplog.set_level(logging.WARNING, logger="waypost.console.audit")
    with running_console(registries=[shared_etcd.url()]) as (_, url):
        assert http(f"{url}api/token", "POST", headers={"X-Waypost-Token": TOKEN}) == \
            (200, {"ok": True, "read_only": False})
        assert http(f"{url}api/token", "POST", headers={"Authorization": f"Bearer {TOKEN}"})[0] == 200
        status, answer = http(f"{url}api/token", "POST")
        assert status == 401 and answer["token"] == "missing", answer
        status, answer = http(f"{url}api/token", "POST", headers={"X-Waypost-Token": "nope"})
        assert status == 403 and answer["token"] == "wrong", answer
        assert http(f"{url}api/token", "POST", headers={"X-Waypost-Token": TOKEN, "Origin": "http://evil.example"}
                    )[0] == 403
        # a write refused for its token says which way too (the page names its token field from it)
        assert write(url, "drain", {"key": unique_key, "address": "127.0.0.1:7414"}, token=None)[1]["token"] \
            == "missing"
        assert write(url, "drain", {"key": unique_key, "address": "127.0.0.1:7414"}, token="x")[1]["token"] == "wrong"
    audit = [r.getMessage() for r in caplog.records if r.name == "waypost.console.audit"]
    assert any("refused token check from 127.0.0.1" in m and ": 403 wrong token" in m for m in audit), audit
    assert not any(" by 127.0.0.1 at " in m for m in audit), audit  # no action was done


def test_the_favicon_is_served(shared_etcd):
    with running_console(registries=[shared_etcd.url()]) as (_, url):
        for path in ("favicon.ico", "static/favicon.svg"):
            with urllib.request.urlopen(f"{url}{path}", timeout=10) as resp:
                assert resp.headers["Content-Type"].startswith("image/svg+xml") and b"<svg" in resp.read()

"""A console started while its etcd is down: it serves, shows the registry as down (which one, why, since when)
and lists its services on its own once a real etcd answers on that address (``tests/conftest.py``'s fixture,
stopped before the console starts and started after). Consul and ZooKeeper: tests/console/test_console_consul.py and
tests/console/test_console_zk.py."""

from __future__ import annotations

import json
import time

from click.testing import CliRunner

from harness.waiting import wait_until
from tests.console.support import echo_serve, http, instances, running_console
from waypost.cli.commands import app
from waypost.etcd.local import free_port


def _state(url: str, name: str) -> dict:
    return http(f"{url}api/services")[1]["sources"][name]


def test_a_console_on_a_dead_etcd_shows_it_down_and_recovers_when_it_answers(etcd, unique_key):
    reg_url = etcd.url()
    etcd.stop()
    began = time.time()
    with running_console(registries=[reg_url], timeout=3.0) as (console, url):
        name = console.source_names()[0]
        down = wait_until(lambda: (s := _state(url, name))["error"] and s, 10, what="the registry shown as down")
        assert etcd.endpoint in down["error"] and down["kind"] == "etcd" and down["read"] is False, down
        assert began <= down["since"] <= time.time()
        etcd.start()
        a = echo_serve("a", unique_key, reg_url)
        try:
            wait_until(lambda: a.address in instances(url, unique_key), 30, what="the registration listed")
            up = _state(url, name)
            assert up["error"] is None and up["read"] is True and up["since"] >= down["since"], up
        finally:
            a.stop()


def test_the_command_serves_on_a_dead_etcd():
    res = CliRunner().invoke(app, ["--json", "console", "--registry", f"etcd://127.0.0.1:{free_port()}",
                                   "--listen", "127.0.0.1:0", "--for", "0.5"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.output.splitlines()[0])["event"] == "serving"

"""The `waypost` command against a real etcd: output, JSON, and one-line errors."""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

import waypost
from waypost.cli.commands import app
from waypost.etcd.local import free_port

ROOT = Path(__file__).resolve().parents[2]


def run(*args: str, registry: str | None = None):
    argv = (["--registry", registry] if registry else []) + list(args)
    return CliRunner().invoke(app, argv, catch_exceptions=False)


def one_line_error(result) -> str:
    assert result.exit_code != 0
    err = result.stderr.strip()
    assert "Traceback" not in result.output and "Traceback" not in err
    assert len(err.splitlines()) == 1, err
    return err


@pytest.fixture
def registrations(shared_etcd, unique_key):
    """Three registrations of one service in three wire formats, plus a record that is no registration."""
    url = shared_etcd.url()
    pubs = [
        waypost.Publisher(url, unique_key, "127.0.0.1:9001", metadata={"weight": 20, "zone": "a"}).start(),
        waypost.Publisher(url, unique_key, "127.0.0.1:9002", format="etcd-naming").start(),
        waypost.Publisher(url, unique_key, "127.0.0.1:9003", id="k1", format="kratos",
                          metadata={"version": "v2"}).start(),
    ]
    waypost.connect(url).sync.put(f"{unique_key}/junk", b"not an address")
    try:
        yield url, unique_key, pubs
    finally:
        for p in pubs:
            p.stop()
        waypost.connect(url).sync.delete(f"{unique_key}/junk")


def test_ls_detects_formats_and_joins_metadata(registrations):
    url, key, pubs = registrations
    res = run("--json", "ls", key, registry=url)
    assert res.exit_code == 0, res.output
    services = json.loads(res.stdout)["services"]
    got = {(i["address"], i["format"]) for i in services[key]}
    assert got == {("127.0.0.1:9001", "gozero"), ("127.0.0.1:9002", "etcd-naming"), (None, "?")}
    by_addr = {i["address"]: i for i in services[key]}
    assert by_addr["127.0.0.1:9001"]["metadata"] == {"weight": 20, "zone": "a"}
    assert by_addr["127.0.0.1:9001"]["id"] == str(pubs[0].lease_id)
    assert 0 < by_addr["127.0.0.1:9001"]["ttl"] <= 10
    assert by_addr[None]["value"] == "not an address"

    res = run("ls", "/microservices/" + key, registry=url)  # kratos lives under its namespace
    assert res.exit_code == 0 and "127.0.0.1:9003" in res.stdout and "kratos" in res.stdout
    assert "version=v2" in res.stdout

    res = run("ls", registry=url)  # everything: people's view
    assert res.exit_code == 0
    for addr in ("127.0.0.1:9001", "127.0.0.1:9002", "127.0.0.1:9003"):
        assert addr in res.stdout


def test_ls_empty_prefix_says_so(shared_etcd, unique_key):
    res = run("ls", unique_key, registry=shared_etcd.url())
    assert res.exit_code == 0 and "nothing under" in res.stdout


def test_resolve_shows_addresses_metadata_and_subset(registrations, shared_etcd):
    _, key, _ = registrations
    target = f"etcd:///{shared_etcd.endpoint}?key={key}"
    res = run("--json", "resolve", target)
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    assert out["scheme"] == "etcd" and out["key"] == key and out["format"] == "gozero"
    assert [(b["address"], b["metadata"], b["in_subset"]) for b in out["backends"]] == [
        ("127.0.0.1:9001", {"weight": 20, "zone": "a"}, True)]

    out = json.loads(run("--json", "resolve", target + "&format=kratos").stdout)
    assert [(b["address"], b["metadata"]) for b in out["backends"]] == [("127.0.0.1:9003", {"version": "v2"})]

    res = run("resolve", "--subset", "1", "--client-id", "0", "direct:///127.0.0.1:1,127.0.0.1:2")
    assert res.exit_code == 0 and "127.0.0.1:1" in res.stdout and "127.0.0.1:2" in res.stdout


def test_register_then_watch_sees_add_and_remove(shared_etcd, unique_key):
    url = shared_etcd.url()
    reg = waypost.connect(url)
    reg.sync.put(f"{unique_key}/sentinel", "127.0.0.1:9554")  # the watch shows it once it is watching
    events: queue.Queue[dict] = queue.Queue()
    watcher = subprocess.Popen(
        [sys.executable, "-m", "waypost.cli", "--registry", url, "--json", "watch", unique_key, "--for", "60"],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, cwd=ROOT,
    )

    def read() -> None:
        assert watcher.stdout is not None
        for line in watcher.stdout:
            if line.strip():
                events.put(json.loads(line))

    threading.Thread(target=read, daemon=True).start()
    seen: list[dict] = []

    def until(event: str, address: str) -> None:
        while not any(e["event"] == event and e["address"] == address for e in seen):
            seen.append(events.get(timeout=30))

    try:
        until("present", "127.0.0.1:9554")  # watching now: no sleep that guesses how long the start takes
        res = run("--json", "register", unique_key, "127.0.0.1:9555", "--meta", "weight=7", "--ttl", "5", "--for",
                  "1", registry=url)
        assert res.exit_code == 0, res.output
        lines = [json.loads(x) for x in res.stdout.splitlines()]
        assert lines[0]["event"] == "registered" and lines[0]["metadata"] == {"weight": 7}
        assert lines[-1]["event"] == "deregistered"
        assert [kv.value for kv in reg.sync.get(unique_key + "/", prefix=True).kvs] == [b"127.0.0.1:9554"]
        until("remove", "127.0.0.1:9555")
    finally:
        watcher.terminate()
        watcher.wait(10)
    kinds = [(e["event"], e["address"]) for e in seen if e["address"] == "127.0.0.1:9555"]
    assert kinds == [("add", "127.0.0.1:9555"), ("remove", "127.0.0.1:9555")], kinds
    add = next(e for e in seen if e["event"] == "add")
    assert add["metadata"] == {"weight": 7}


def test_error_exits_are_one_clear_line(shared_etcd, unique_key):
    err = one_line_error(run("ls", registry="etcd://"))
    assert "Error:" in err
    err = one_line_error(run("ls", registry="bogus://x"))
    assert "bogus" in err
    t0 = time.monotonic()
    err = one_line_error(run("ls", registry=f"etcd://127.0.0.1:{free_port()}?dial_timeout=1"))
    assert time.monotonic() - t0 < 60
    assert "Error:" in err
    err = one_line_error(run("resolve", "etcd:///127.0.0.1:2379"))  # no key
    assert "key" in err
    err = one_line_error(run("register", unique_key, "nohostport", registry=shared_etcd.url()))
    assert "ADDR" in err
    err = one_line_error(run("register", unique_key, "127.0.0.1:1", "--meta", "oops", registry=shared_etcd.url()))
    assert "--meta" in err
    err = one_line_error(run("register", unique_key, "127.0.0.1:1", "--id", "a/b", registry=shared_etcd.url()))
    assert "id" in err
    err = one_line_error(run("resolve", "--client-id", "abc", "memory:///?key=x"))
    assert "client_id" in err
    err = one_line_error(run("bench", "no-such-bench"))
    assert "no-such-bench" in err or "bench/" in err


def test_error_exit_via_entry_point_has_no_traceback():
    proc = subprocess.run([sys.executable, "-m", "waypost.cli", "--registry", "etcd://", "ls"],
                          check=False, capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert proc.returncode == 1
    assert "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and proc.stderr.startswith("Error:")


def test_etcd_command_serves_and_stops_on_sigterm(tmp_path):
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "waypost.cli", "--json", "etcd", "--port", str(port), "--data-dir", str(tmp_path / "d")],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT,
    )
    try:
        line = proc.stdout.readline()
        info = json.loads(line)
        assert info["registry"] == f"etcd://127.0.0.1:{port}"
        reg = waypost.connect(info["registry"]).sync
        reg.put("cli-test/a", b"127.0.0.1:1")
        assert [kv.key for kv in reg.get("cli-test/", prefix=True).kvs] == ["cli-test/a"]

        # a second one on the same port: one clear line, non-zero
        second = subprocess.run([sys.executable, "-m", "waypost.cli", "etcd", "--port", str(port)],
                                check=False, capture_output=True, text=True, timeout=60, cwd=ROOT)
        assert second.returncode == 1 and "already in use" in second.stderr
        assert len(second.stderr.strip().splitlines()) == 1

        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
        etcd_pid = info["pid"]
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and _alive(etcd_pid):
            time.sleep(0.05)
        assert not _alive(etcd_pid), "the etcd process outlived the command"
        assert (tmp_path / "d" / "m0" / "member").is_dir()  # --data-dir kept
        _loop_close(info["registry"])
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(5)
        proc.stdout.close()
        proc.stderr.close()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie child of the (exited) command is reaped by init; treat it as gone
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def _loop_close(url: str) -> None:
    from waypost import _loop

    _loop.run(waypost.connect(url).close(), 10)


def test_missing_cli_extra_is_one_line(tmp_path):
    # Simulate an install without click: a module named click that fails to import shadows the real one.
    (tmp_path / "click").mkdir()
    (tmp_path / "click" / "__init__.py").write_text("raise ImportError('no click here')\n")
    code = ("import importlib.util, sys\n"
            "sys.modules.pop('click', None)\n"
            "real = importlib.util.find_spec\n"
            "importlib.util.find_spec = lambda n, *a: None if n == 'click' else real(n, *a)\n"
            "from waypost.cli import main\n"
            "sys.exit(main(['ls']))\n")
    proc = subprocess.run([sys.executable, "-c", code], check=False, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert "pip install 'waypost[cli]'" in proc.stderr and "Traceback" not in proc.stderr


def test_bench_lists_scripts():
    res = run("bench")
    if (ROOT / "bench").is_dir() and any((ROOT / "bench").glob("*.py")):
        assert res.exit_code == 0 and "benchmarks in" in res.stdout
    else:
        assert res.exit_code == 1

"""The `waypost` command as a process: failed lookups fail in time, verbosity, options anywhere, Ctrl-C, a restart
of `waypost etcd` on the same port. Real etcd, real subprocesses, real signals."""

from __future__ import annotations

import json
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import waypost
from harness.waiting import wait_until
from waypost.etcd.local import free_port

ROOT = Path(__file__).resolve().parents[2]
#: what a command may take past its --timeout: interpreter and grpc start-up on a loaded 2-core machine
MARGIN = 4.0


def waypost_cmd(*args: str, timeout: float = 60) -> tuple[subprocess.CompletedProcess[str], float]:
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "waypost.cli", *args], check=False, capture_output=True,
                          text=True, timeout=timeout, cwd=ROOT)
    return proc, time.monotonic() - t0


def single_error(proc: subprocess.CompletedProcess[str]) -> str:
    assert proc.returncode == 1, (proc.returncode, proc.stdout, proc.stderr)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: "), proc.stderr
    assert "Traceback" not in proc.stderr
    return lines[0]


def read_line(proc: subprocess.Popen[str], timeout: float = 30) -> str:
    assert proc.stdout is not None
    ready, _, _ = select.select([proc.stdout], [], [], timeout)
    assert ready, f"no output within {timeout}s"
    return proc.stdout.readline()


# ---------------------------------------------------------------------------------------- failed lookups


def _refused() -> str:
    return f"127.0.0.1:{free_port()}"


@pytest.mark.parametrize("case", ["resolve-etcd", "resolve-dns", "ls", "watch"])
def test_a_failed_lookup_fails_within_its_timeout(case):
    addr = _refused()  # nothing listens there: etcd refused, or a DNS server that does not exist
    args = {
        "resolve-etcd": ["resolve", f"etcd:///{addr}?key=greet.rpc"],
        "resolve-dns": ["resolve", f"dns://{addr}/greet.test:80"],
        "ls": ["--registry", f"etcd://{addr}", "ls"],
        "watch": ["--registry", f"etcd://{addr}", "watch", "greet.rpc"],
    }[case]
    timeout = 1.0  # the lookups used to take 5.3-5.5 s whatever --timeout said
    proc, elapsed = waypost_cmd(*args, "--timeout", str(timeout))
    err = single_error(proc)
    assert addr in err or "greet" in err, err
    assert proc.stdout == ""  # no empty table
    assert elapsed < timeout + MARGIN, elapsed


def test_lookups_in_a_stopped_etcd_fail(etcd, unique_key):
    url, endpoint = etcd.url(), etcd.endpoint
    waypost.connect(url).sync.put(f"{unique_key}/a", b"127.0.0.1:9001")
    proc, _ = waypost_cmd("resolve", f"etcd:///{endpoint}?key={unique_key}")
    assert proc.returncode == 0 and "127.0.0.1:9001" in proc.stdout, proc.stderr
    etcd.stop()
    for args in (["resolve", f"etcd:///{endpoint}?key={unique_key}"], ["--registry", url, "ls", unique_key],
                 ["watch", unique_key, "--registry", url]):
        proc, elapsed = waypost_cmd(*args, "--timeout", "2")
        err = single_error(proc)
        assert endpoint in err, err
        assert elapsed < 2 + MARGIN, (args, elapsed)


def test_a_key_with_nothing_registered_is_status_1_naming_the_close_keys(shared_etcd, unique_key):
    """``resolve`` found nothing: a client dialing it would fail its calls, so the command fails too (as ``host``
    does for a name it does not find), saying so in one line with the registered keys closest to it; ``--json``
    still prints what was found (no address) for scripts, which tell it from a failed lookup (no JSON)."""
    key = f"{unique_key}.greeter"
    misspelt = f"{unique_key}.greetr"
    with waypost.Publisher(shared_etcd.url(), key, "127.0.0.1:9001"):
        for args in (["resolve", f"etcd:///{shared_etcd.endpoint}?key={misspelt}"],
                     ["--registry", shared_etcd.url(), "resolve", misspelt]):
            proc, _ = waypost_cmd(*args)
            err = single_error(proc)
            # (the shared etcd may hold other tests' keys, close ones too: the closest is named first)
            assert err.startswith(f"Error: nothing is registered under key {misspelt!r} in "
                                  f"etcd:///{shared_etcd.endpoint}; did you mean {key!r}"), err
            assert err.endswith("? (`waypost ls` lists the registered keys)"), err
            assert proc.stdout == ""  # no empty table
        proc, _ = waypost_cmd("--json", "resolve", f"etcd:///{shared_etcd.endpoint}?key={misspelt}")
        assert proc.returncode == 1 and "did you mean" in proc.stderr, proc.stderr
        out = json.loads(proc.stdout)
        assert out["backends"] == [] and out["close_keys"][0] == key


def test_records_of_another_format_than_asked_are_pointed_out(shared_etcd, unique_key):
    reg = waypost.connect(shared_etcd.url())
    pub = waypost.Publisher(reg, unique_key, "127.0.0.1:7001", format="etcd-naming")
    pub.start()
    try:
        proc, _ = waypost_cmd("resolve", f"etcd:///{shared_etcd.endpoint}?key={unique_key}")  # gozero asked
        err = single_error(proc)  # no address for a go-zero client: status 1, saying why
        assert "another wire format (1 etcd-naming) than 'gozero', which found 0: try format=etcd-naming" in err, err
        proc, _ = waypost_cmd("--registry", shared_etcd.url(), "watch", unique_key, "--for", "0.5")
        assert proc.returncode == 0, proc.stderr
        assert "try --format etcd-naming" in proc.stderr, proc.stderr
        # asked in the right format: no note
        proc, _ = waypost_cmd("resolve", f"etcd:///{shared_etcd.endpoint}?key={unique_key}&format=etcd-naming")
        assert proc.returncode == 0 and "127.0.0.1:7001" in proc.stdout and "another wire format" not in proc.stderr
    finally:
        pub.stop()


# ---------------------------------------------------------------------------------------- verbosity, options


def test_verbosity_levels_and_connect_failures_at_debug(shared_etcd):
    refused = f"etcd://{_refused()}?dial_timeout=1"
    quiet, _ = waypost_cmd("--registry", refused, "ls")
    single_error(quiet)
    assert "refused" in quiet.stderr.lower()  # the cause is in the error line itself

    info, _ = waypost_cmd("--registry", refused, "-v", "ls")
    assert info.returncode == 1 and " DEBUG " not in info.stderr, info.stderr

    debug, _ = waypost_cmd("--registry", refused, "-vv", "ls")
    lines = [line for line in debug.stderr.splitlines() if " DEBUG " in line]
    assert any("connection refused" in line.lower() for line in lines), debug.stderr

    # TLS to a plaintext etcd: the handshake fails, and -vv says so (also given after the command)
    tls, _ = waypost_cmd("--registry", f"etcd://{shared_etcd.endpoint}?tls=1&dial_timeout=1", "ls", "-vv")
    lines = [line for line in tls.stderr.splitlines() if " DEBUG " in line]
    assert any("handshake" in line.lower() for line in lines), tls.stderr
    assert tls.stderr.strip().splitlines()[-1].startswith("Error: ")


def test_global_options_after_the_command(shared_etcd, unique_key):
    url = shared_etcd.url()
    waypost.connect(url).sync.put(f"{unique_key}/a", b"127.0.0.1:9001")
    try:
        before, _ = waypost_cmd("--registry", url, "--json", "-v", "ls", unique_key)
        after, _ = waypost_cmd("ls", unique_key, "--registry", url, "--json", "-v")
        assert before.returncode == after.returncode == 0, (before.stderr, after.stderr)
        assert json.loads(before.stdout)["services"] == json.loads(after.stdout)["services"]
        proc, _ = waypost_cmd("watch", unique_key, "-v", "--json", "--for", "0.5", "--registry", url)
        assert proc.returncode == 0, proc.stderr
        events = [json.loads(line) for line in proc.stdout.splitlines()]
        assert events == [{"event": "present", "key": unique_key, "address": "127.0.0.1:9001", "metadata": {},
                           "time": events[0]["time"]}]
    finally:
        waypost.connect(url).sync.delete(f"{unique_key}/a")


def test_bench_name_help_is_the_benchmarks_own():
    if not (ROOT / "bench" / "simulate.py").exists():
        pytest.skip("no bench/ in this checkout")
    proc, _ = waypost_cmd("bench", "simulate", "--help")
    assert proc.returncode == 0, proc.stderr
    assert "simulate.py" in proc.stdout and "waypost bench" not in proc.stdout
    proc, _ = waypost_cmd("bench", "simulate", "--no-such-option")  # passed through: argparse refuses it
    assert proc.returncode == 2 and "--no-such-option" in proc.stderr, proc.stderr


def test_demo_help_says_how_long_it_takes():
    proc, _ = waypost_cmd("demo", "--help")
    assert proc.returncode == 0
    text = " ".join(proc.stdout.split())
    assert "about 40 s" in text and "about 20 s" in text, text


# ---------------------------------------------------------------------------------------- signals, restart


def test_ctrl_c_exits_130(shared_etcd, unique_key):
    proc = subprocess.Popen([sys.executable, "-m", "waypost.cli", "--registry", shared_etcd.url(), "watch",
                             unique_key], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        assert read_line(proc).startswith("watching ")
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=30) == 130
        assert "Traceback" not in proc.stderr.read()  # type: ignore[union-attr]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(5)
        proc.stdout.close()  # type: ignore[union-attr]
        proc.stderr.close()  # type: ignore[union-attr]


def _time_wait_on(port: int) -> int:
    """Sockets in TIME_WAIT (state 06) with local port ``port`` (Linux /proc/net/tcp)."""
    count = 0
    with open("/proc/net/tcp") as f:
        for line in f.readlines()[1:]:
            fields = line.split()
            if fields[1].endswith(f":{port:04X}") and fields[3] == "06":
                count += 1
    return count


@pytest.mark.skipif(not Path("/proc/net/tcp").exists(), reason="needs Linux /proc/net/tcp to see TIME_WAIT")
def test_etcd_command_restarts_at_once_on_the_same_port(tmp_path, unique_key):
    """Stopped while a client is connected, etcd leaves that connection in TIME_WAIT on its port for a
    minute; a new `waypost etcd` on that port starts at once (etcd binds with SO_REUSEADDR, so does the check)."""
    port = free_port()
    cmd = [sys.executable, "-m", "waypost.cli", "--json", "etcd", "--port", str(port), "--data-dir",
           str(tmp_path / "d")]
    url = f"etcd://127.0.0.1:{port}"
    for run in range(2):
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)
        try:
            line = read_line(proc)
            assert line.strip(), proc.stderr.read() if proc.poll() is not None else ""  # type: ignore[union-attr]
            assert json.loads(line)["registry"] == url
            reg = waypost.connect(url).sync  # the same client both times: its connection stays open
            if run == 0:
                reg.put(f"{unique_key}/a", b"127.0.0.1:9001")
            else:
                assert [kv.value for kv in reg.get(f"{unique_key}/", prefix=True).kvs] == [b"127.0.0.1:9001"]
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(timeout=30) == 0
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(5)
            proc.stdout.close()  # type: ignore[union-attr]
            proc.stderr.close()  # type: ignore[union-attr]
        if run == 0:  # what made the restart fail: the client's connection, closed by etcd, in TIME_WAIT
            wait_until(lambda: _time_wait_on(port) > 0, 10, "a connection in TIME_WAIT on the etcd port")
    from waypost import _loop

    _loop.run(waypost.connect(url).close(), 10)


def test_readme_names_every_extra_and_the_demos_policy_count():
    """The README's set-up paragraph says what the demo really runs, and its extras list has every extra."""
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+

    from waypost.balancer.policies import POLICIES as REGISTERED
    from waypost.demo.runner import POLICIES

    readme = " ".join((ROOT / "README.md").read_text().split())
    assert f"{len(POLICIES)} of the {len(REGISTERED)} policies" in readme
    assert f"the other {len(REGISTERED) - len(POLICIES)} and why" in readme
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    listed = readme.split("Extras: ", 1)[1].split("```", 1)[0]
    missing = [name for name in extras if f"`{name}`" not in listed]
    assert not missing, missing

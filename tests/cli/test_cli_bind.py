"""The long-running commands against a port the test holds, and their listening-address forms: one `Error:` line naming
the address and the cause, exit 1, never a traceback; `:PORT` and a bare `PORT` mean every interface. Also the
one-line errors of `xds serve`'s `--export` / `--prefix`, and `drain`'s audit line (in the audit log, not on the
terminal). Real CLI processes, real sockets, real signals."""

from __future__ import annotations

import logging
import select
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from click.testing import CliRunner

from waypost.cli.commands import app
from waypost.etcd.local import EtcdNotFound, find_binary, free_port

ROOT = Path(__file__).resolve().parents[2]
EXPORT = ("--export", "greet=direct:///127.0.0.1:1")


def waypost_cmd(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "waypost.cli", *args], check=False, capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT)


def single_error(proc: subprocess.CompletedProcess[str]) -> str:
    assert proc.returncode == 1, (proc.returncode, proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: "), proc.stderr
    return lines[0]


@contextmanager
def held_port() -> Iterator[int]:
    """A port some other program listens on (no SO_REUSEADDR: nothing else may bind it)."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        yield taken.getsockname()[1]


# ------------------------------------------------------------------------------------------- a port in use


def test_xds_serve_on_a_port_in_use_is_one_line():
    with held_port() as port:
        err = single_error(waypost_cmd("xds", "serve", "--listen", f"127.0.0.1:{port}", *EXPORT))
    assert err == f"Error: xds serve cannot listen on 127.0.0.1:{port}: Address already in use", err


@pytest.mark.parametrize("form", [":{port}", "{port}", "0.0.0.0:{port}"])
def test_xds_serve_on_every_interface_with_a_port_in_use_is_one_line(form):
    with held_port() as port:
        err = single_error(waypost_cmd("xds", "serve", "--listen", form.format(port=port), *EXPORT))
    assert err.startswith(f"Error: xds serve cannot listen on 0.0.0.0:{port}: Address already in use"), err


def test_xds_serve_metrics_on_a_port_in_use_is_one_line():
    with held_port() as port:
        err = single_error(waypost_cmd("xds", "serve", "--listen", "127.0.0.1:0", "--metrics-port", str(port),
                                       *EXPORT))
    assert err == f"Error: xds serve cannot serve metrics on 127.0.0.1:{port}: Address already in use", err


def test_console_on_a_port_in_use_is_one_line():
    with held_port() as port:
        err = single_error(waypost_cmd("console", "--listen", f"127.0.0.1:{port}", "--registry", "memory://bind"))
    assert err == f"Error: the console cannot listen on 127.0.0.1:{port}: Address already in use", err


@pytest.mark.parametrize("option", ["--port", "--peer-port"])
def test_etcd_on_a_port_in_use_is_one_line(option, tmp_path):
    try:
        find_binary("etcd")
    except EtcdNotFound:
        pytest.skip("no etcd binary")
    with held_port() as port:
        err = single_error(waypost_cmd("etcd", option, str(port), "--data-dir", str(tmp_path / "etcd")))
    assert f"127.0.0.1:{port} is already in use" in err, err


@pytest.mark.parametrize("listen", ["x:y", "127.0.0.1", "123456"])
def test_xds_serve_bad_listen_address_is_one_line(listen):
    err = single_error(waypost_cmd("xds", "serve", "--listen", listen, *EXPORT))
    assert f"--listen {listen!r}: " in err and "expected HOST:PORT, :PORT or PORT (every interface)" in err, err


# -------------------------------------------------------------------------------------- :PORT and bare PORT


@pytest.mark.parametrize("form", [":{port}", "{port}", ":0", "0"])
def test_xds_serve_colon_port_and_bare_port_listen_on_every_interface(form):
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "waypost.cli", "xds", "serve", "--listen", form.format(port=port),
                             *EXPORT], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        assert proc.stdout is not None
        ready, _, _ = select.select([proc.stdout], [], [], 60)
        line = proc.stdout.readline() if ready else ""
        assert line.startswith("xds: serving on 0.0.0.0:"), (line, proc.poll(), _stderr_if_done(proc))
        if "{port}" in form:
            assert line.strip() == f"xds: serving on 0.0.0.0:{port}", line
        else:  # port 0: the free port it got
            port = int(line.strip().rpartition(":")[2])
            assert port > 0, line
        with socket.create_connection(("127.0.0.1", port), timeout=10):  # every interface: loopback included
            pass
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
        for stream in (proc.stdout, proc.stderr):
            if stream is not None:
                stream.close()


def _stderr_if_done(proc: subprocess.Popen[str]) -> str:
    return proc.stderr.read()[-2000:] if proc.poll() is not None and proc.stderr is not None else ""


# ------------------------------------------------------------------------------------- --export / --prefix


@pytest.mark.parametrize(("args", "expected"), [
    (("--prefix", ""), "Error: --prefix '': no PREFIX: expected 'PREFIX [OPTION=VALUE ...]'"),
    (("--prefix", "prod/ policy"), "Error: --prefix 'prod/ policy': option 'policy' is not OPTION=VALUE"),
    (("--export", "etcd:///127.0.0.1:2379?key=greet.rpc"),
     ("Error: --export 'etcd:///127.0.0.1:2379?key=greet.rpc': a dial target without NAME=: expected "
      "'NAME=TARGET [OPTION=VALUE ...]' (e.g. --export 'greeter=etcd:///127.0.0.1:2379?key=greet.rpc')")),
    (("--export", "a:b=dns:///h:1"), "Error: --export 'a:b=dns:///h:1': export 'a:b': NAME must be letters"),
])
def test_xds_serve_bad_export_or_prefix_names_the_flag_the_value_and_the_form(args, expected):
    err = single_error(waypost_cmd("--registry", "memory://bind", "xds", "serve", "--listen", "127.0.0.1:0", *args))
    assert err.startswith(expected), err
    if args[0] == "--export":
        assert "NAME=TARGET" in err, err


# ----------------------------------------------------------------------------------------------- the audit line


def test_drain_and_undrain_keep_the_audit_line_off_the_terminal(shared_etcd, unique_key):
    url = shared_etcd.url()
    for verb, said in (("drain", "drained (weight 0)"), ("undrain", "override removed")):
        proc = waypost_cmd("--registry", url, verb, unique_key, "127.0.0.1:7411")
        assert proc.returncode == 0, proc.stderr
        assert said in proc.stdout, proc.stdout
        assert "audit" not in proc.stderr, proc.stderr  # only the note that the address is not registered
        assert "is not registered under" in proc.stderr, proc.stderr


def test_drain_still_writes_its_audit_line_to_the_audit_log(shared_etcd, unique_key, caplog):
    caplog.set_level(logging.WARNING, logger="waypost.console.audit")
    res = CliRunner().invoke(app, ["--registry", shared_etcd.url(), "drain", unique_key, "127.0.0.1:7412"])
    assert res.exit_code == 0, res.output
    audit = [r.getMessage() for r in caplog.records if r.name == "waypost.console.audit"]
    assert any(m.startswith(f"audit: drain {unique_key} 127.0.0.1:7412 -> weight 0 by ") for m in audit), audit
    CliRunner().invoke(app, ["--registry", shared_etcd.url(), "undrain", unique_key, "127.0.0.1:7412"])

"""What a new user's mistakes print: one ``Error:`` line and status 1 for everything a command finds once it runs
(options that do not go together, a registry of the wrong kind, a misspelt scheme, etcd not running), click's usage
and status 2 for a malformed command line only. Real commands (click's runner, and the installed entry point as a
process), real etcd."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from waypost import kind_table as kinds
from waypost.cli.commands import app
from waypost.etcd.local import LocalEtcd, free_port

ROOT = Path(__file__).resolve().parents[2]
EXPORT = ("--export", "e=direct:///127.0.0.1:1")


def run(*args: str):
    return CliRunner().invoke(app, list(args), catch_exceptions=False)


def one_line(result) -> str:
    """The single ``Error:`` line of a command that failed with status 1 (no usage banner, no traceback)."""
    assert result.exit_code == 1, (result.exit_code, result.output)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: "), result.stderr
    assert "Usage:" not in result.output and "Traceback" not in result.output
    return lines[0]


# ---------------------------------------------------------------------------------- options that do not go together


def test_xds_option_combinations_are_one_line_and_status_1(tmp_path):
    config = tmp_path / "xds.toml"
    config.write_text(f'[exports]\na = "direct:///127.0.0.1:1"\n[tls]\ncert = "{tmp_path / "c.pem"}"\n'
                      f'key = "{tmp_path / "k.pem"}"\n')
    cases = [
        (("xds", "serve", *EXPORT, "--client-ca", "ca.pem"),
         "Error: --client-ca needs --tls-cert and --tls-key (mTLS is TLS whose clients also show a certificate)"),
        (("xds", "serve", *EXPORT, "--tls-cert", "c.pem"), "Error: --tls-cert and --tls-key go together"),
        (("xds", "serve", *EXPORT, "--tls-key", "k.pem"), "Error: --tls-cert and --tls-key go together"),
        (("xds", "serve", "--config", str(config), "--tls-cert", "c.pem", "--tls-key", "k.pem"),
         f"Error: TLS is given both by --tls-cert and in the [tls] table of {config}: give it in one place"),
        (("xds", "bootstrap", "--server", "cp:18000", "--cert-file", "c.pem"),
         "Error: --cert-file goes with --tls (the bootstrap is insecure without it)"),
        (("xds", "serve"), "Error: nothing to serve: give --export NAME=TARGET, --prefix PREFIX or --config FILE"),
    ]
    for argv, line in cases:
        assert one_line(run(*argv)) == line, argv


def test_the_installed_command_prints_one_line_too():
    proc = subprocess.run([sys.executable, "-m", "waypost.cli", "xds", "serve", *EXPORT, "--client-ca", "ca.pem"],
                          check=False, capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert proc.returncode == 1, proc.stderr
    assert proc.stderr.splitlines() == [("Error: --client-ca needs --tls-cert and --tls-key (mTLS is TLS whose "
                                        "clients also show a certificate)")]


@pytest.mark.parametrize("argv", [
    ("xds", "serve", "--no-such-option"),
    ("ls", "--timeout", "soon"),
    ("xds", "bootstrap"),  # --server is required
    ("weight", "greet.rpc", "127.0.0.1:1", "-3"),
])
def test_a_malformed_command_line_keeps_clicks_usage_and_status_2(argv):
    res = CliRunner().invoke(app, list(argv))
    assert res.exit_code == 2, res.output
    assert res.stderr.startswith("Usage: ") and "Error: " in res.stderr, res.stderr


# ---------------------------------------------------------------------------------- etcd not running


def test_ls_without_etcd_says_so_and_how_to_start_one_whatever_the_timeout():
    url = f"etcd://127.0.0.1:{free_port()}"  # nothing listens there
    for timeout in (None, "1"):
        res = run("--registry", url, "ls", *(("--timeout", timeout) if timeout else ()))
        line = one_line(res)
        assert line == (f"Error: etcd at {url.removeprefix('etcd://')} unreachable: connection refused (could not "
                        f"list the keys within {timeout or 5}s; is etcd running there? `waypost etcd` starts one)"), line
    line = one_line(run("--registry", url, "watch", "greet.rpc", "--timeout", "1"))
    assert "connection refused (could not read 'greet.rpc' within 1s; is etcd running there?" in line, line
    assert "_waypost" not in line


def test_drain_without_etcd_says_how_to_start_one():
    """Every command that writes to an etcd that is not running ends with the same hint as ls (the first mistake)."""
    url = f"etcd://127.0.0.1:{free_port()}"
    line = one_line(run("--registry", url, "drain", "greet.rpc", "127.0.0.1:50051"))
    assert line.startswith("Error: etcd "), line
    assert line.endswith("(is etcd running there? `waypost etcd` starts one)"), line


def test_ls_waits_its_timeout_for_an_etcd_that_is_starting(tmp_path):
    """--timeout is how long ls waits for etcd, not the etcd client's own dial timeout (3 s): an etcd that starts
    4 s after the command is listed."""
    port = free_port()
    node = LocalEtcd(1, base_dir=tmp_path / "etcd", client_ports=[port])
    starter = threading.Timer(4.0, node.start)
    try:
        t0 = time.monotonic()
        starter.start()
        proc = subprocess.run([sys.executable, "-m", "waypost.cli", "--registry", f"etcd://127.0.0.1:{port}", "ls",
                               "--timeout", "60"], check=False, capture_output=True, text=True, timeout=120, cwd=ROOT)
        assert proc.returncode == 0, proc.stderr
        assert "nothing under ''" in proc.stdout, proc.stdout
        assert time.monotonic() - t0 >= 4.0  # it did wait for the etcd started later (an ordering, not a bound)
    finally:
        starter.join()
        node.close()


# ---------------------------------------------------------------------------------- registries of another kind


@pytest.fixture
def plugin_kind() -> Iterator[kinds.RegistryKind]:
    """A kind from outside waypost, with a target grammar of its own (the table restored after the test)."""
    kinds.load_plugins()
    saved = dict(kinds.KINDS), dict(kinds.SCHEMES)
    kind = kinds.register_kind(kinds.RegistryKind(
        "nacos", 8848, "nacos://127.0.0.1:8848/greeter?group=DEFAULT_GROUP", "nacos://127.0.0.1:8848",
        registrar="waypost_nacos:NacosRegistrar", discovery="waypost_nacos:NacosDiscovery", title="Nacos"))
    yield kind
    with kinds._lock:
        kinds.KINDS.clear()
        kinds.KINDS.update(saved[0])
        kinds.SCHEMES.clear()
        kinds.SCHEMES.update(saved[1])


def test_ls_on_a_registry_of_another_kind_says_what_to_run(plugin_kind):
    line = one_line(run("--registry", "eureka://127.0.0.1:8761", "ls"))
    assert line == ("Error: `waypost ls` works on etcd and memory registries (keys); --registry eureka://127.0.0.1:8761 "
                    "is a Eureka registry, which holds service instances: `waypost resolve "
                    "eureka://127.0.0.1:8761/greeter` shows the instances of one service"), line
    assert "serve(" not in line and "connect()" not in line
    # watch and resolve take the target itself
    line = one_line(run("--registry", "eureka://127.0.0.1:8761", "watch", "greeter"))
    assert line == ("Error: a bare KEY of `waypost watch` is a key in an etcd or memory registry; --registry "
                    "eureka://127.0.0.1:8761 is a Eureka registry, which holds service instances: `waypost watch "
                    "eureka://127.0.0.1:8761/greeter` shows the instances of one service"), line
    # a plug-in's kind: its own target grammar, from its entry in the table of kinds
    line = one_line(run("--registry", "nacos://127.0.0.1:8848", "register", "greeter", "127.0.0.1:9001"))
    assert "`waypost register` works on etcd and memory registries" in line, line
    assert "`waypost resolve nacos://127.0.0.1:8848/greeter?group=DEFAULT_GROUP`" in line, line
    # the library's words name that grammar too
    import waypost

    with pytest.raises(waypost.InvalidTarget, match=r"dial its targets \(nacos://127\.0\.0\.1:8848/greeter\?group="):
        waypost.connect("nacos://127.0.0.1:8848")


def test_a_misspelt_scheme_gets_a_suggestion():
    line = one_line(run("--registry", "etdc://127.0.0.1:2379", "ls"))
    assert "unknown scheme 'etdc' (did you mean 'etcd'?)" in line, line
    line = one_line(run("resolve", "etdc:///127.0.0.1:2379?key=greet.rpc"))
    assert "unknown target scheme 'etdc' (did you mean 'etcd'?)" in line, line
    line = one_line(run("--registry", "eurka://127.0.0.1:8761", "ls"))
    assert "(did you mean 'eureka'?)" in line, line


def test_help_names_the_registries():
    text = " ".join(run("--help").stdout.split())
    assert "over etcd." not in text
    for name in ("etcd", "Consul", "ZooKeeper", "Eureka", "Kubernetes", "DNS", "xDS"):
        assert name in text, name

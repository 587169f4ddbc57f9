"""fork() after dialing an etcd target (gunicorn/uWSGI preload): real etcd, real backend processes, real forks.

Every scenario (``tests/channel/fork_scenarios.py``) runs in a fresh Python process of its own, which dials, calls,
and forks 8 children per round; each child exits with a code its parent checks (a signal = a crash), and the
parent keeps calling, watching and publishing across the forks. Each scenario process is bounded (timeout).
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from harness.backends.procs import EchoProcess

ROOT = Path(__file__).resolve().parents[2]
SCENARIO_TIMEOUT_S = 120

pytestmark = pytest.mark.skipif(not hasattr(os, "fork") or sys.platform == "darwin", reason="needs fork (Linux)")


@pytest.fixture
def backends() -> Iterator[tuple[EchoProcess, EchoProcess]]:
    # grpcio's health servicer holds a server thread per Watch stream, and every fork adds streams (each child's
    # inherited channel, the parent's watches restarting): more threads than the default 32, and fresh backends per
    # test so that streams still being torn down after one scenario do not hold threads the next one needs
    a, b = EchoProcess("a", workers=256), EchoProcess("b", workers=256)
    try:
        yield a, b
    finally:
        a.kill()
        b.kill()


def run_scenario(name: str, etcd, key: str, backends: tuple[EchoProcess, EchoProcess]) -> None:
    a, b = backends
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(ROOT / "src"), env.get("PYTHONPATH", "")])
    env.pop("GRPC_ENABLE_FORK_SUPPORT", None)  # gRPC's default: core prepares for fork
    try:
        out = subprocess.run(
            [sys.executable, "-m", "tests.channel.fork_scenarios", name, etcd.endpoint, key, a.address, b.address],
            check=False, cwd=ROOT, env=env, capture_output=True, text=True, timeout=SCENARIO_TIMEOUT_S,
        )
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"scenario {name} did not finish within {SCENARIO_TIMEOUT_S}s: {e.stderr!r:.3000}")
    assert out.returncode == 0, f"scenario {name} failed (exit status {out.returncode}):\n{out.stderr[-4000:]}"


@pytest.mark.slow
def test_sync_channel_and_fresh_dial_work_in_forked_children(shared_etcd, unique_key, backends):
    """8 children x 3 rounds: calls on the channel dialed before the fork and on a fresh dial; the parent's
    channel, watch (a backend registered after the forks gets traffic) and publisher (same lease) go on."""
    run_scenario("sync", shared_etcd, unique_key, backends)


@pytest.mark.slow
def test_health_checked_channel_works_in_forked_children(shared_etcd, unique_key):
    """The same with healthCheckConfig: the parent's health watches (grpc.aio) pause for each fork too; in each
    child the inherited channel works without health checking (starting grpc.aio health watches there made a few
    children's calls hang, about 1 run in 5) and a fresh health-checked dial works. Backends of its own."""
    a, b = EchoProcess("a", workers=128), EchoProcess("b", workers=128)
    try:
        run_scenario("sync-health", shared_etcd, unique_key, (a, b))
    finally:
        a.kill()
        b.kill()


@pytest.mark.slow
def test_inherited_sync_channel_follows_the_registry_in_the_child(shared_etcd, unique_key, backends):
    run_scenario("inherited-follows", shared_etcd, unique_key, backends)


@pytest.mark.slow
def test_aio_dial_in_forked_children_after_an_aio_parent(shared_etcd, unique_key, backends):
    """The safe aio pattern: the parent closed its waypost.aio channel before forking; children dial their own."""
    run_scenario("aio", shared_etcd, unique_key, backends)


def test_fork_with_an_open_aio_channel_is_a_clear_error_in_the_child(shared_etcd, unique_key, backends):
    """grpc.aio cannot cross fork: with a waypost.aio channel open in the parent, dial in the child raises a
    RuntimeError naming the cause and the fix, at once (instead of hanging or crashing)."""
    run_scenario("open-aio", shared_etcd, unique_key, backends)


def test_a_registry_closed_before_the_fork_leaves_the_children_able_to_use_grpc(shared_etcd, unique_key, backends):
    """A closed etcd client kept its closed grpc.aio channels referenced: grpc.aio's poller thread lived on, and
    every child of a later fork was refused gRPC (found by the chaos report: a probe registry closed earlier)."""
    run_scenario("closed-registry", shared_etcd, unique_key, backends)

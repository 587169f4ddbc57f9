"""``on_shutdown`` hooks and ``hard_deadline``: real child processes (serve and serve_async) sent SIGTERM."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from concurrent import futures
from pathlib import Path

import grpc
import pytest

import waypost
from waypost.server import serve
from waypost.server.flavours import HARD_DEADLINE_EXIT_CODE

ROOT = Path(__file__).resolve().parents[2]

CHILD = r'''
import asyncio, logging, signal, sys, threading, time
from concurrent import futures
import grpc, waypost

url, key, out, flavor, mode = sys.argv[1:6]
logging.basicConfig(level=logging.WARNING)
reg = waypost.connect(url)

def note(text):
    with open(out, "a") as f:
        f.write(text + "\n")

def first():  # runs after deregistration: the key is gone
    note("first registered=%s" % bool(reg.sync.get(key + "/", prefix=True).kvs))

def broken():
    note("broken")
    raise RuntimeError("hook failed on purpose")

def last():
    note("last")

def hang():
    note("hang")
    time.sleep(60)

async def async_last():
    await asyncio.sleep(0.01)
    note("async_last")

async def async_hang():
    note("async_hang")
    await asyncio.sleep(60)

def ready_once_wait_handles_sigterm():  # wait() installs the handler: only then is SIGTERM a graceful stop
    until = time.monotonic() + 30
    while signal.getsignal(signal.SIGTERM) in (signal.SIG_DFL, None) and time.monotonic() < until:
        time.sleep(0.01)
    print("READY", flush=True)

threading.Thread(target=ready_once_wait_handles_sigterm, daemon=True).start()
hooks = {"ok": [first, broken, last], "hang": [first, hang, last]}[mode]
deadline = 3.0 if mode == "hang" else None
if flavor == "sync":
    handle = waypost.serve(grpc.server(futures.ThreadPoolExecutor(4)), key, listen_on="127.0.0.1:0", registry=reg,
                           grace=5, drain_delay=0.1, on_shutdown=hooks, hard_deadline=deadline)
    handle.wait()
else:
    hooks = {"ok": [first, broken, async_last], "hang": [first, async_hang, last]}[mode]
    async def main():
        handle = await waypost.serve_async(grpc.aio.server(), key, listen_on="127.0.0.1:0", registry=reg, grace=5,
                                           drain_delay=0.1, on_shutdown=hooks, hard_deadline=deadline)
        await handle.wait()
    asyncio.run(main())
note("exited normally")
'''


def _run_child(tmp_path: Path, url: str, key: str, flavor: str, mode: str) -> tuple[int, list[str], str, float]:
    script, out = tmp_path / "child.py", tmp_path / "hooks.txt"
    script.write_text(CHILD)
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.Popen([sys.executable, str(script), url, key, str(out), flavor, mode], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.startswith("READY"), (line, proc.stderr.read() if proc.poll() is not None else "")
        t0 = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
        took = time.monotonic() - t0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate(timeout=5)
    lines = out.read_text().splitlines() if out.exists() else []
    return proc.returncode, lines, err, took


@pytest.mark.parametrize("flavor", ["sync", "aio"])
def test_hooks_run_after_deregistration_and_a_failing_one_does_not_stop_the_next(flavor, shared_etcd, unique_key,
                                                                                 tmp_path):
    rc, lines, err, _ = _run_child(tmp_path, shared_etcd.url(), unique_key, flavor, "ok")
    assert rc == 0, err
    last = "last" if flavor == "sync" else "async_last"
    assert lines == ["first registered=False", "broken", last, "exited normally"], (lines, err)
    assert "on_shutdown hook broken failed" in err and "RuntimeError: hook failed on purpose" in err, err


@pytest.mark.parametrize("flavor", ["sync", "aio"])
def test_a_hanging_hook_is_cut_by_the_hard_deadline_with_status_70(flavor, shared_etcd, unique_key, tmp_path):
    rc, lines, err, took = _run_child(tmp_path, shared_etcd.url(), unique_key, flavor, "hang")
    assert rc == HARD_DEADLINE_EXIT_CODE == 70, err
    assert lines[:2] == ["first registered=False", "hang" if flavor == "sync" else "async_hang"], lines
    assert "exited normally" not in lines and "last" not in lines
    assert "ERROR" in err and "hard_deadline" in err and "exiting with status 70" in err, err
    assert took < 20  # the hook would hang for 60 s: the deadline (3 s) cut it


def _server() -> grpc.Server:
    return grpc.server(futures.ThreadPoolExecutor(2))


async def _coro_hook() -> None:
    return None


@pytest.mark.parametrize(("kw", "error", "text"), [
    ({"on_shutdown": print}, TypeError, "on_shutdown takes a list of callables, got "),
    ({"on_shutdown": [print, 3]}, TypeError, "on_shutdown[1] must be a callable taking no argument, got 3"),
    ({"on_shutdown": [_coro_hook]}, ValueError, "is a coroutine function: serve() runs hooks in a thread"),
    ({"hard_deadline": 0}, ValueError, "hard_deadline must be a positive number of seconds"),
    ({"hard_deadline": "5s"}, ValueError, "hard_deadline must be a positive number of seconds"),
])
def test_bad_shutdown_arguments_are_clear_errors(kw, error, text, unique_key):
    with pytest.raises(error) as ei:
        serve(_server(), unique_key, registry=f"memory://{unique_key}", **kw)
    assert text in str(ei.value)


def test_serve_async_takes_coroutine_hooks_and_runs_them_on_stop(unique_key):
    ran: list[str] = []

    async def hook() -> None:
        await asyncio.sleep(0)
        ran.append("async")

    async def main() -> None:
        handle = await waypost.serve_async(grpc.aio.server(), unique_key, listen_on="127.0.0.1:0",
                                           registry=f"memory://{unique_key}", grace=1, drain_delay=0,
                                           on_shutdown=[lambda: ran.append("sync"), hook])
        await handle.stop()

    asyncio.run(main())
    assert ran == ["sync", "async"]

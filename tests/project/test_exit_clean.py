"""A process that read from etcd exits without asyncio noise: no "exception was never retrieved", no
"Task was destroyed but it is pending", no traceback. Real python subprocesses, real etcd, and a
member that accepts connections but never answers (reads still in flight, a fallback cancelled).

Besides the noise: on CPython 3.11 a traceback printed from the control loop's thread while the main
thread compiles (pytest importing a plugin at session end) can crash the compiler ("AST constructor
recursion depth mismatch").
"""

from __future__ import annotations

import socket
import subprocess
import sys
from collections.abc import Iterator

import pytest

import waypost

NOISE = ("exception was never retrieved", "Task was destroyed but it is pending", "Traceback")

SCRIPT = r"""
import gc, sys, time
import waypost
from waypost import _loop

case, url, key = sys.argv[1:4]
reg = waypost.connect(url)
target = f"etcd:///{url.split('//', 1)[1].split('?')[0]}?key={key}"
if case == "subscriber":
    with waypost.Subscriber(reg, key) as sub:
        print(sorted(sub.values()))
elif case == "dial":
    with waypost.dial(target) as ch:
        print(ch)
elif case == "subscriber-fails":  # the read never answers: the stale fallback's reads are cut by the close
    try:
        waypost.Subscriber(reg, key, timeout=3)
    except waypost.RegistryUnavailable as e:
        print("unavailable:", e)
elif case == "read-in-flight":  # exit while reads wait on the silent member
    _loop.submit(reg.get_values(key, prefix=True))
    waypost.dial(target, block=False)
    time.sleep(0.5)
gc.collect()
time.sleep(0.3)  # the loop thread logs what the collector found
gc.collect()
print("done")
"""


@pytest.fixture
def silent_member() -> Iterator[str]:
    """``host:port`` of a listening socket that accepts and never answers."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(16)
    try:
        yield f"127.0.0.1:{s.getsockname()[1]}"
    finally:
        s.close()


def _run(case: str, url: str, key: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", SCRIPT, case, url, key], capture_output=True, text=True,
                          timeout=60, check=False)


def _assert_clean(p: subprocess.CompletedProcess[str]) -> None:
    assert p.returncode == 0, p.stderr
    assert "done" in p.stdout, (p.stdout, p.stderr)
    found = [n for n in NOISE if n in p.stderr]
    assert not found, p.stderr


@pytest.mark.parametrize("case", ["subscriber", "dial"])
def test_a_process_that_read_a_key_exits_clean(shared_etcd, unique_key, case):
    waypost.connect(shared_etcd.url()).sync.put(f"{unique_key}/1", "10.0.0.1:1")
    p = _run(case, shared_etcd.url(), unique_key)
    _assert_clean(p)
    assert "10.0.0.1:1" in p.stdout or case == "dial", p.stdout


def test_a_subscriber_that_gave_up_on_a_silent_etcd_leaves_no_unretrieved_read(silent_member, unique_key):
    p = _run("subscriber-fails", f"etcd://{silent_member}?dial_timeout=10&request_timeout=10", unique_key)
    _assert_clean(p)
    assert "unavailable:" in p.stdout, p.stdout


def test_a_process_exits_clean_with_reads_in_flight(shared_etcd, silent_member, unique_key):
    p = _run("read-in-flight", f"etcd://{silent_member},{shared_etcd.endpoint}?request_timeout=10", unique_key)
    _assert_clean(p)
    p = _run("read-in-flight", f"etcd://{silent_member}?dial_timeout=10&request_timeout=10", unique_key)
    _assert_clean(p)

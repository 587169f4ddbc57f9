"""Every snippet of README.md and docs/*.md marked runnable runs as written.

A snippet is marked by a line ``<!-- runnable -->`` right before its ```python or ```sh block, optionally
with tags: ``<!-- runnable: etcd background -->``.

- ``etcd``: the snippet talks to an etcd at 127.0.0.1:2379 (as the docs say to start one); each test gets a
  fresh real etcd and the address is rewritten to it. A greeter backend from examples/ is registered under
  ``greet.rpc`` there first, so a client snippet has someone to call.
- ``background``: the snippet serves until it is stopped: it must print ``serving`` within 30 s, then it is
  sent SIGTERM and must exit 0 (the graceful stop the docs promise).

Python snippets run in a fresh interpreter with examples/ as the working directory (its generated
``greet_pb2`` and ``greeter`` import as the README's quick start expects), shell snippets with the venv's
``bin`` first on PATH. A docs page that marks nothing is fine; a marker on anything but a code block fails.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from harness.waiting import wait_until
from waypost.etcd.local import LocalEtcd

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
MARKER = re.compile(r"^<!-- runnable(?::\s*([a-z ]+))?\s*-->$")
TAGS = {"etcd", "background"}
DEV_ETCD = "127.0.0.1:2379"


@dataclass(frozen=True)
class Snippet:
    path: Path
    line: int
    lang: str
    tags: frozenset[str]
    code: str

    @property
    def id(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"


def find_snippets() -> list[Snippet]:
    out: list[Snippet] = []
    for path in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        lines = path.read_text().splitlines()
        for i, text in enumerate(lines):
            m = MARKER.match(text.strip())
            if not m:
                continue
            tags = frozenset((m.group(1) or "").split())
            fence = lines[i + 1] if i + 1 < len(lines) else ""
            if fence not in ("```python", "```sh") or not tags <= TAGS:
                raise AssertionError(f"{path.name}:{i + 1}: a runnable marker must precede a ```python or ```sh "
                                     f"block and use the tags {sorted(TAGS)} (got {fence!r}, {sorted(tags)})")
            end = lines.index("```", i + 2)
            out.append(Snippet(path, i + 2, fence[3:], tags, "\n".join(lines[i + 2:end]) + "\n"))
    return out


SNIPPETS = find_snippets()


def test_the_docs_mark_snippets_runnable():
    assert len(SNIPPETS) >= 8, [s.id for s in SNIPPETS]
    assert any(s.path.name == "README.md" for s in SNIPPETS)


@pytest.fixture
def dev_etcd(tmp_path):
    node = LocalEtcd(1, base_dir=tmp_path / "etcd").start()
    try:
        yield node
    finally:
        node.close()


def _env() -> dict[str, str]:
    bin_dir = str(Path(sys.executable).parent)
    return {**os.environ, "PATH": bin_dir + os.pathsep + os.environ.get("PATH", ""), "PYTHONPATH": str(EXAMPLES),
            "POD_IP": "127.0.0.1"}  # servers advertise loopback, as the tests stay on it


def _command(snippet: Snippet, code: str) -> list[str]:
    return [sys.executable, "-c", code] if snippet.lang == "python" else ["bash", "-euo", "pipefail", "-c", code]


def _greeter(endpoint: str) -> subprocess.Popen[str]:
    proc = subprocess.Popen([sys.executable, str(EXAMPLES / "server.py"), "--registry", f"etcd://{endpoint}",
                             "--key", "greet.rpc"], cwd=EXAMPLES, env=_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    line = proc.stdout.readline() if proc.stdout else ""
    assert line.startswith("serving"), (line, proc.stderr.read() if proc.poll() is not None and proc.stderr else "")
    return proc


def _catches_sigterm(pid: int) -> bool:
    """True once the process has a SIGTERM handler (``SigCgt`` in /proc): a server snippet prints "serving"
    just before ``handle.wait()``, which installs it; a SIGTERM sent in between would kill it outright."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("SigCgt:"):
                    return bool(int(line.split()[1], 16) & (1 << (signal.SIGTERM - 1)))
    except OSError:
        pass
    return False


def _stop(proc: subprocess.Popen[str]) -> int:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    try:
        return proc.wait(30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(10)
        raise


@pytest.mark.parametrize("snippet", SNIPPETS, ids=[s.id for s in SNIPPETS])
def test_snippet_runs(snippet: Snippet, request):
    code = snippet.code
    helpers: list[subprocess.Popen[str]] = []
    try:
        if "etcd" in snippet.tags:
            endpoint = request.getfixturevalue("dev_etcd").endpoint
            code = code.replace(DEV_ETCD, endpoint)
            helpers.append(_greeter(endpoint))
        if "background" in snippet.tags:
            proc = subprocess.Popen(_command(snippet, code), cwd=EXAMPLES, env=_env(), stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, text=True)
            helpers.append(proc)
            line = proc.stdout.readline() if proc.stdout else ""
            assert "serving" in line, (snippet.id, line, proc.stderr.read() if proc.poll() is not None and
                                       proc.stderr else "")
            wait_until(lambda: _catches_sigterm(proc.pid) or proc.poll() is not None, 30, "the SIGTERM handler")
            helpers.remove(proc)
            code_ = _stop(proc)
            assert code_ == 0, (snippet.id, code_, proc.stderr.read() if proc.stderr else "")
        else:
            done = subprocess.run(_command(snippet, code), cwd=EXAMPLES, env=_env(), capture_output=True, text=True,
                                  timeout=90, check=False)
            assert done.returncode == 0, (snippet.id, done.stdout[-2000:], done.stderr[-3000:])
    finally:
        for p in helpers:
            _stop(p)

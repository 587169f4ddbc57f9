"""Every snippet of README.md and docs/*.md marked runnable runs as written.

A snippet is marked by a line ``<!-- runnable -->`` right before its ```python or ```sh block, optionally
with tags: ``<!-- runnable: etcd background -->``.

- ``etcd``: the snippet talks to an etcd at 127.0.0.1:2379 (as the docs say to start one); each test gets a
  fresh real etcd and the address is rewritten to it. A greeter backend from examples/ is registered under
  ``greet.rpc`` there first, so a client snippet has someone to call.
- ``background``: the snippet serves until it is stopped: it must print ``serving`` within 30 s, then it is
  sent SIGTERM and must exit 0 (the graceful stop the docs promise).
- ``session``: the page's ``session`` snippets (shell) are the steps of one walk-through, run in order in one
  bash, as a reader types them into one terminal (the tutorial). A line ending in ``&`` (optionally followed
  by ``VAR=$!``) starts a job in the background, and the next line runs once that job has printed its first
  line (a reader waits for ``serving ...``). The ports the page uses (``SESSION_PORTS``: etcd's 2379, the
  servers' 50051 and 50052) are replaced by free ones and ``WAYPOST_REGISTRY`` points at that etcd, so the
  walk-through runs beside anything else; whatever is still running at the end is stopped.

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
TAGS = {"etcd", "background", "session"}
DEV_ETCD = "127.0.0.1:2379"
#: the fixed ports a ``session`` page uses, each replaced by a free port when it runs
SESSION_PORTS = (2379, 50051, 50052)
#: ``CMD &`` or ``CMD & VAR=$!`` (a trailing comment allowed): a background job in a session
BACKGROUND = re.compile(r"^(?P<cmd>[^#]+?)\s+&(?P<var>\s+\w+=\$!)?\s*(?P<comment>#.*)?$")


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
    for path in [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]:
        lines = path.read_text().splitlines()
        for i, text in enumerate(lines):
            m = MARKER.match(text.strip())
            if not m:
                continue
            tags = frozenset((m.group(1) or "").split())
            fence = lines[i + 1] if i + 1 < len(lines) else ""
            if fence not in ("```python", "```sh") or not tags <= TAGS or ("session" in tags and (
                    fence != "```sh" or tags != {"session"})):
                raise AssertionError(f"{path.name}:{i + 1}: a runnable marker must precede a ```python or ```sh "
                                     f"block and use the tags {sorted(TAGS)} (got {fence!r}, {sorted(tags)})")
            end = lines.index("```", i + 2)
            out.append(Snippet(path, i + 2, fence[3:], tags, "\n".join(lines[i + 2:end]) + "\n"))
    return out


SNIPPETS = [s for s in find_snippets() if "session" not in s.tags]
SESSIONS = sorted({s.path for s in find_snippets() if "session" in s.tags})


def test_the_docs_mark_snippets_runnable():
    assert len(SNIPPETS) >= 8, [s.id for s in SNIPPETS]
    assert any(s.path.name == "README.md" for s in SNIPPETS)
    assert ROOT / "docs" / "tutorial.md" in SESSIONS


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


def _session_script(page: Path, ports: dict[int, int], logs: Path) -> str:
    """The page's ``session`` snippets as one bash script: ports replaced, each background job's output also
    kept in a file of its own, and a wait after each for its first line."""
    lines = ["trap '_rc=$?; kill $(jobs -p) 2>/dev/null || true; wait; exit $_rc' EXIT",
             ("_ready() { for _ in $(seq 600); do [ -s \"$1\" ] && return 0; sleep 0.1; done; "
              "echo \"no output from a background job within 60 s: $1\" >&2; return 1; }")]
    jobs = 0
    for snippet in (s for s in find_snippets() if s.path == page and "session" in s.tags):
        lines.append(f"# --- {snippet.id}")
        code = snippet.code
        for fixed, free in ports.items():
            code = re.sub(rf"\b{fixed}\b", str(free), code)
        for line in code.splitlines():
            m = BACKGROUND.match(line)
            if m is None:
                lines.append(line)
                continue
            jobs += 1
            log = logs / f"job{jobs}.log"
            lines.append(f"{m.group('cmd')} > >(tee {log}) 2>&1 &{m.group('var') or ''}")
            lines.append(f"_ready {log}")
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize("page", SESSIONS, ids=[str(p.relative_to(ROOT)) for p in SESSIONS])
def test_session_runs_in_order(page: Path, tmp_path):
    """A walk-through (the tutorial) runs step by step, as a reader types it, and every step succeeds."""
    from waypost.etcd.local import free_port

    ports = {fixed: free_port() for fixed in SESSION_PORTS}
    script = _session_script(page, ports, tmp_path)
    env = {**_env(), "WAYPOST_REGISTRY": f"etcd://127.0.0.1:{ports[2379]}"}
    # a process group of its own: if the walk-through hangs, everything it started is stopped with it
    proc = subprocess.Popen(["bash", "-euo", "pipefail", "-c", script], cwd=EXAMPLES, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
    assert proc.returncode == 0, (str(page), out[-4000:], err[-4000:])

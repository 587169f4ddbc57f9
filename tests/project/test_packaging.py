"""The package as a user installs it: build the sdist and the wheel, install the wheel into a fresh venv.

waypost is not on a package index: the README says how to install it from a clone or a built wheel, and this
test does what it says. Dependencies come from the configured index (pip's own configuration and the
environment, PIP_FIND_LINKS included, are passed through). Bounded: about 30-60 s with a warm pip cache.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# [project] version (read as text: tomllib is Python 3.11+, and this is the file's only top-level "version =")
_VERSION_LINE = re.search(r'^version = "([^"]+)"', (ROOT / "pyproject.toml").read_text(), re.MULTILINE)
assert _VERSION_LINE is not None, "pyproject.toml has no version line"
PROJECT_VERSION = _VERSION_LINE.group(1)
BUDGET = 170.0  # seconds for the whole test, every step bounded within it


def _run(cmd: list[str], deadline: float, **kw: object) -> subprocess.CompletedProcess[str]:
    left = deadline - time.monotonic()
    assert left > 0, f"out of time before {cmd[:3]}"
    proc = subprocess.run(cmd, check=False, capture_output=True, text=True, timeout=left, **kw)  # type: ignore[call-overload]
    assert proc.returncode == 0, f"{' '.join(cmd)}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc  # type: ignore[no-any-return]


@pytest.mark.slow
@pytest.mark.timeout(BUDGET + 10)
def test_built_wheel_installs_into_a_fresh_venv(tmp_path):
    pytest.importorskip("build", reason="the build frontend comes with the dev extra (pip install build)")
    pytest.importorskip("twine", reason="twine comes with the dev extra (pip install twine)")
    deadline = time.monotonic() + BUDGET
    t0 = time.monotonic()
    dist = tmp_path / "dist"
    # the sdist, then the wheel built from the unpacked sdist: a file missing from the sdist breaks the wheel
    _run([sys.executable, "-m", "build", "--outdir", str(dist), str(ROOT)], deadline, cwd=tmp_path)
    wheels = list(dist.glob("waypost-*.whl"))
    sdists = list(dist.glob("waypost-*.tar.gz"))
    assert len(wheels) == 1 and len(sdists) == 1, list(dist.iterdir())
    # what a package index would check on upload: the metadata renders (README as the long description), and
    # --strict turns its warnings (a missing description content type, ...) into failures
    checked = _run([sys.executable, "-m", "twine", "check", "--strict", str(wheels[0]), str(sdists[0])], deadline)
    assert checked.stdout.count("PASSED") == 2, checked.stdout
    with zipfile.ZipFile(wheels[0]) as whl:
        names = set(whl.namelist())
    for needed in ("waypost/py.typed", "waypost/etcd/_generated/waypost_etcd_pb2.py",
                   "waypost/etcd/_generated/waypost_etcd_pb2.pyi", "waypost/orca/_generated/waypost_load_pb2.py",
                   "waypost/cli/__init__.py", "waypost/cli/__main__.py"):
        assert needed in names, needed
    assert not [n for n in names if n.startswith(("tests/", "harness/", "bench/", "examples/"))]
    built = time.monotonic() - t0

    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", str(venv)], deadline)
    py, pip = venv / "bin" / "python", [str(venv / "bin" / "python"), "-m", "pip", "--disable-pip-version-check"]
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    # waypost itself only from the wheel directory, never from an index ...
    _run([*pip, "install", "-q", "--no-index", "--no-deps", "--find-links", str(dist), "waypost"], deadline, env=env)
    # ... then, as the README says, the wheel with extras: the dependencies come from the configured index
    _run([*pip, "install", "-q", f"{wheels[0]}[cli,dns,metrics]"], deadline, env=env)

    code = ("import waypost, waypost.aio, waypost.channel, waypost.server, importlib.metadata as md, pathlib\n"
            "import click, rich, dns.asyncresolver, prometheus_client\n"
            "print(waypost.__version__, md.version('waypost'), pathlib.Path(waypost.__file__).parent)\n")
    out = _run([str(py), "-c", code], deadline, env=env, cwd=tmp_path).stdout.split()
    assert out[0] == out[1] == PROJECT_VERSION  # __version__ is the installed metadata's
    installed = Path(out[2])
    assert venv in installed.parents, installed  # the installed copy, not the source tree
    assert (installed / "py.typed").exists()
    help_text = _run([str(venv / "bin" / "waypost"), "--help"], deadline, env=env, cwd=tmp_path).stdout
    assert "resolve" in help_text and "etcd" in help_text
    total = time.monotonic() - t0
    print(f"build {built:.1f}s, build + venv + install + checks {total:.1f}s")

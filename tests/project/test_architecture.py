"""The architecture is checked, not only described (docs/architecture.md): the import-linter contracts in
pyproject.toml (the layers, and no cycle between any two modules of a package, imports inside functions included)
and the size limit of a module."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "src" / "waypost"
MAX_LINES = 600


def test_import_contracts_are_kept() -> None:
    pytest.importorskip("importlinter", reason="import-linter comes with the dev extra")
    lint = Path(sys.executable).parent / "lint-imports"
    proc = subprocess.run([str(lint), "--no-cache", "--no-logo"], check=False, cwd=ROOT, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, f"an import contract is broken:\n{proc.stdout}\n{proc.stderr}"
    assert "0 broken" in proc.stdout and " kept" in proc.stdout, proc.stdout


def test_no_module_is_over_the_size_limit() -> None:
    generated = SRC / "etcd" / "_proto"
    too_big = {
        str(p.relative_to(SRC)): n
        for p in SRC.rglob("*.py")
        if generated not in p.parents and (n := len(p.read_text().splitlines())) > MAX_LINES
    }
    assert not too_big, f"modules over {MAX_LINES} lines (split them by job): {too_big}"

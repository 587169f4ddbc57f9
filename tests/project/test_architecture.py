"""The architecture is checked, not only described (docs/architecture.md): the import-linter contracts in
pyproject.toml (the layers, and no cycle between any two modules of a package, imports inside functions included)
and the size limit of a module; and that the harness shared by tests/ and bench/ is not tied to tests/."""

from __future__ import annotations

import ast
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


def _imported_modules(path: Path) -> set[str]:
    """Every module ``path`` imports, at the top or inside functions."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
    return found


def test_bench_and_the_harness_import_nothing_from_tests() -> None:
    # what bench/ runs against lives in harness/; a bench reaching into tests/ would tie it to the test suite
    files = [*sorted((ROOT / "bench").glob("*.py")), *sorted((ROOT / "harness").rglob("*.py"))]
    assert files
    reaching = {}
    for p in files:
        into_tests = sorted(m for m in _imported_modules(p) if m == "tests" or m.startswith("tests."))
        if into_tests:
            reaching[str(p.relative_to(ROOT))] = into_tests
    assert not reaching, f"bench/ and harness/ must not import from tests/: {reaching}"


def test_no_test_helper_is_over_the_size_limit() -> None:
    helpers = [p for folder in ("tests", "harness") for p in (ROOT / folder).rglob("*.py")
               if not p.name.startswith("test_") and not p.name.endswith(("_pb2.py", "_pb2_grpc.py"))]
    assert helpers
    too_big = {str(p.relative_to(ROOT)): n for p in helpers if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert not too_big, f"helper modules over {MAX_LINES} lines (split them by job): {too_big}"

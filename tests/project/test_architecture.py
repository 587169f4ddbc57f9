"""The architecture is checked, not only described (docs/architecture.md): the import-linter contracts in
pyproject.toml (the layers, and no cycle between any two modules of a package, imports inside functions included),
the size limit of a module, private names kept private (imports, and attributes of another module's objects);
and that the harness shared by tests/ and bench/ is not tied to tests/."""

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
    too_big = {  # generated code (every package's _generated/, scripts/gen_proto.sh) is not split by hand
        str(p.relative_to(SRC)): n
        for p in SRC.rglob("*.py")
        if p.parent.name != "_generated" and (n := len(p.read_text().splitlines())) > MAX_LINES
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


def _module_of(path: Path) -> tuple[str, bool]:
    """The dotted name of a source file, and whether it is a package's ``__init__``."""
    parts = list(path.relative_to(SRC.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        return ".".join(parts[:-1]), True
    return ".".join(parts), False


def _is_module(dotted: str) -> bool:
    base = SRC.parent.joinpath(*dotted.split("."))
    return base.with_suffix(".py").is_file() or (base / "__init__.py").is_file()


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _reach_ins(path: Path) -> list[str]:
    """``from A import _name`` (not a module), private modules imported from outside their package, and
    ``module._name`` on an imported waypost module: the places one module uses another one's private names."""
    me, is_pkg = _module_of(path)
    package = me if is_pkg else me.rpartition(".")[0]
    found: list[str] = []
    modules: dict[str, str] = {}  # local name -> the waypost module it is bound to

    def private_module_ok(dotted: str) -> bool:  # a package's private module, used inside that package
        parent = dotted.rpartition(".")[0]
        return me == parent or me.startswith(parent + ".")

    tree = ast.parse(path.read_text(), str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                target = f"{base}.{node.module}" if node.module else base
            else:
                target = node.module or ""
            if target != "waypost" and not target.startswith("waypost."):
                continue
            for alias in node.names:
                dotted = f"{target}.{alias.name}"
                if _is_module(dotted):
                    modules[alias.asname or alias.name] = dotted
                    if _private(alias.name) and not private_module_ok(dotted):
                        found.append(f"{me}:{node.lineno} imports the private module {dotted}")
                elif _private(alias.name):
                    found.append(f"{me}:{node.lineno} imports {alias.name} from {target}")
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if not alias.name.startswith("waypost"):
                    continue
                parts = alias.name.split(".")
                for i, part in enumerate(parts):
                    if _private(part) and not private_module_ok(".".join(parts[:i + 1])):
                        found.append(f"{me}:{node.lineno} imports the private module {alias.name}")
                if alias.asname:
                    modules[alias.asname] = alias.name
    for node in ast.walk(tree):
        if (isinstance(node, ast.Attribute) and _private(node.attr) and isinstance(node.value, ast.Name)
                and node.value.id in modules):
            dotted = f"{modules[node.value.id]}.{node.attr}"
            if not (_is_module(dotted) and private_module_ok(dotted)):
                found.append(f"{me}:{node.lineno} uses {dotted}")
    return found


def test_no_module_reaches_into_another_modules_private_names() -> None:
    found = [hit for p in sorted(SRC.rglob("*.py")) if not p.name.endswith("_pb2.py") for hit in _reach_ins(p)]
    assert not found, ("private names used from another module (make them public, or move the code that needs "
                       "them):\n" + "\n".join(found))


# ---- private attributes: ``x._name`` is read or written only on the module's own objects -----------------------

#: the one module whose job is to reach into grpcio's internals (each one named there, with its fallback)
PRIVATE_REACH_MODULES = {"_grpc_private.py"}

#: underscore names that are public API where they are defined: namedtuple's documented methods and fields
PUBLIC_UNDERSCORE_NAMES = {"_replace", "_asdict", "_fields", "_field_defaults", "_make"}

#: (module, the expression as ast.unparse writes it) -> why it may reach in. Each entry must still match: shrink it.
PRIVATE_REACH_ALLOWED = {
    ("errors.py", "sys._getframe"): "documented in sys (CPython): the caller's frame names the keyword's function",
    ("xds/tls_probe.py", "ctx._msg_callback"): "CPython's SSL message callback (checked to be a property first): "
                                               "the only way to see whether a server asks for a client certificate",
}


def _own_names(tree: ast.AST) -> tuple[set[str], set[str]]:
    """The private attribute names a module defines (assigned on ``self``/``cls``, or defined as a function, class
    or module-level name), and the names of the functions and classes it defines (its own objects)."""
    private_names: set[str] = set()
    own_objects: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            own_objects.add(node.name)
            if _private(node.name):
                private_names.add(node.name)
        elif (isinstance(node, ast.Attribute) and isinstance(node.ctx, (ast.Store, ast.Del)) and _private(node.attr)
              and isinstance(node.value, ast.Name) and node.value.id in ("self", "cls")):
            private_names.add(node.attr)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store) and _private(node.id):
            private_names.add(node.id)
    return private_names, own_objects


def _private_attribute_reaches(path: Path) -> list[tuple[str, str, int]]:
    return _reaches_in(path.read_text(), str(path.relative_to(SRC)))


def _reaches_in(source: str, rel: str) -> list[tuple[str, str, int]]:
    """Every ``x._name`` (read, written or deleted) in module ``rel`` where ``x`` is not ``self``, ``cls``,
    ``super()`` or a function or class of this module, and ``_name`` is not one this module defines: (module,
    expression, line)."""
    tree = ast.parse(source, rel)
    private_names, own_objects = _own_names(tree)
    found = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Attribute) and _private(node.attr)):
            continue
        base = node.value
        if isinstance(base, ast.Name) and (base.id in ("self", "cls") or base.id in own_objects):
            continue
        if isinstance(base, ast.Call) and isinstance(base.func, ast.Name) and base.func.id == "super":
            continue
        if node.attr in private_names or node.attr in PUBLIC_UNDERSCORE_NAMES:
            continue
        found.append((rel, ast.unparse(node), node.lineno))
    return found


def _source_files() -> list[Path]:
    return [p for p in sorted(SRC.rglob("*.py")) if p.parent.name != "_generated" and p.name not in PRIVATE_REACH_MODULES]


def test_no_module_reaches_into_another_objects_private_attributes() -> None:
    found = [hit for p in _source_files() for hit in _private_attribute_reaches(p)]
    unexplained = [f"{rel}:{line}: {expr}" for rel, expr, line in found if (rel, expr) not in PRIVATE_REACH_ALLOWED]
    assert not unexplained, ("private attributes of another module's objects (give the owner a public attribute or "
                             "method, or put the access in _grpc_private.py with a fallback):\n" + "\n".join(unexplained))


def test_every_allowed_private_reach_still_exists() -> None:
    found = {(rel, expr) for p in _source_files() for rel, expr, _ in _private_attribute_reaches(p)}
    stale = sorted(set(PRIVATE_REACH_ALLOWED) - found)
    assert not stale, f"allowed private reaches that no longer occur (remove them from PRIVATE_REACH_ALLOWED): {stale}"


def test_the_private_attribute_check_sees_a_reach_in() -> None:
    # the check itself: another object's private attribute is caught (read or written), the module's own are not
    source = ("class A:\n    def __init__(self):\n        self._mine = 1\n"
              "    def same(self, other):\n        return other._mine + self._inherited + super()._base\n"
              "def f(policy, handle):\n    handle._force = False\n    f._marker = True\n    return policy._lock\n")
    assert [expr for _, expr, _ in _reaches_in(source, "sample.py")] == ["handle._force", "policy._lock"]

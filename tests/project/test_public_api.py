"""The public API as a user sees it: real types for mypy and pyright, a cheap ``import waypost``, ``__all__``."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import waypost

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent

# A small user program: the public API, typed as a user would write it. It is only type-checked, never run.
PROGRAM = textwrap.dedent('''
    from __future__ import annotations

    import asyncio
    from collections.abc import Sequence
    from concurrent import futures

    import grpc
    import grpc.aio

    import waypost
    import waypost.aio
    from waypost import Outcome, Picker, PickInfo, PickResult, Policy, dial, register_policy


    class FirstPicker(Picker):
        def __init__(self, backends: Sequence[waypost.Backend]) -> None:
            self.backends = tuple(backends)

        def pick(self, info: PickInfo) -> PickResult:
            if not self.backends:
                raise waypost.NoBackendAvailable("no backend")
            def done(outcome: Outcome) -> None:
                print(outcome.code, outcome.latency)
            return PickResult(self.backends[0], done)


    class FirstPolicy(Policy):
        name = "user_first"

        def build(self, backends: Sequence[waypost.Backend]) -> Picker:
            return FirstPicker(backends)


    register_policy(FirstPolicy)


    def client() -> None:
        channel = dial("etcd:///127.0.0.1:2379?key=greet.rpc", balancer="user_first")
        reveal_type(dial)
        reveal_type(channel)
        with waypost.hash_key("user-42"):
            pass
        reveal_type(waypost.hash_key)
        channel.close()


    async def aio_client() -> None:
        channel = waypost.aio.dial("etcd:///127.0.0.1:2379?key=greet.rpc")
        reveal_type(waypost.aio.dial)
        reveal_type(channel)
        await channel.close()


    def server() -> None:
        handle = waypost.serve(grpc.server(futures.ThreadPoolExecutor(4)), "greet.rpc", metadata={"weight": 20})
        reveal_type(waypost.serve)
        reveal_type(handle)
        print(handle.address)
        handle.stop()


    async def aio_server() -> None:
        handle = await waypost.serve_async(grpc.aio.server(), "greet.rpc")
        reveal_type(waypost.serve_async)
        reveal_type(handle)
        await handle.stop()


    async def aio_server_from_the_aio_module() -> None:
        handle = await waypost.aio.serve(grpc.aio.server(), "greet.rpc")
        reveal_type(handle)
        await handle.stop()


    def discovery() -> None:
        registry = waypost.connect("etcd://127.0.0.1:2379")
        reveal_type(waypost.connect)
        reveal_type(registry)
        publisher = waypost.Publisher(registry, "greet.rpc", "10.0.0.5:8080", metadata={"zone": "a"})
        reveal_type(publisher)
        publisher.start()
        subscriber = waypost.Subscriber(registry, "greet.rpc")
        reveal_type(subscriber)
        for backend in subscriber.backends():
            reveal_type(backend)
            print(backend.address, dict(backend.metadata))
        subscriber.close()
        publisher.stop()


    def errors() -> None:
        try:
            discovery()
        except waypost.RegistryUnavailable as exc:
            reveal_type(exc)
        except waypost.InvalidTarget as exc:
            reveal_type(exc)
        except waypost.WaypostError as exc:
            reveal_type(exc)


    asyncio.run(aio_client())
''')

# (what is revealed, a part of what mypy says, a part of what pyright says), in the order of the program
EXPECTED = [
    # the keywords are DialKeywords (typed once for both dials; tests/test_options.py checks each one)
    ("dial", ("def (target: str | typing.Sequence[str] | waypost.discovery.store.Registry, "
             "**options: **TypedDict(waypost.client.dial_options.DialKeywords"),
     "(target: str | Sequence[str] | Registry, **options: **DialKeywords)"),
    ("channel", "", "Channel"),
    ("waypost.hash_key", "def (key: str | bytes | int | None)", "(key: str | bytes | int | None)"),
    ("waypost.aio.dial", "-> waypost.aio.Channel", "-> Channel"),
    ("channel", "waypost.aio.Channel", "Channel"),
    ("waypost.serve", "-> waypost.server.lifecycle.ServeHandle", "-> ServeHandle"),
    ("handle", "waypost.server.lifecycle.ServeHandle", "ServeHandle"),
    ("waypost.serve_async", "-> typing.Coroutine[Any, Any, waypost.server.lifecycle.AsyncServeHandle]",
     "CoroutineType[Any, Any, AsyncServeHandle]"),
    ("handle", "waypost.server.lifecycle.AsyncServeHandle", "AsyncServeHandle"),
    ("handle", "waypost.server.lifecycle.AsyncServeHandle", "AsyncServeHandle"),
    ("waypost.connect", "def (url: str) -> waypost.discovery.store.Registry", "(url: str) -> Registry"),
    ("registry", "waypost.discovery.store.Registry", "Registry"),
    ("publisher", "waypost.registries.etcd.registrar.Publisher", "Publisher"),
    ("subscriber", "waypost.discovery.subscriber.Subscriber", "Subscriber"),
    ("backend", "waypost.types.Backend", "Backend"),
    ("exc", "waypost.errors.RegistryUnavailable", "RegistryUnavailable"),
    ("exc", "waypost.errors.InvalidTarget", "InvalidTarget"),
    ("exc", "waypost.errors.WaypostError", "WaypostError"),
]

# grpcio ships no type information (its stubs are a separate package, types-grpcio): a user without them
# tells mypy so for grpc alone, and everything of waypost is still checked strictly.
MYPY_CONFIG = "[mypy]\nstrict = True\n\n[mypy-grpc.*]\nignore_missing_imports = True\n"


def _program(tmp_path: Path) -> Path:
    path = tmp_path / "user_program.py"
    path.write_text(PROGRAM)
    return path


def test_mypy_strict_sees_the_real_types(tmp_path):
    prog = _program(tmp_path)
    (tmp_path / "mypy.ini").write_text(MYPY_CONFIG)
    proc = subprocess.run(
        [sys.executable, "-m", "mypy", "--config-file", str(tmp_path / "mypy.ini"), "--cache-dir",
         str(tmp_path / ".mypy_cache"), "--no-error-summary", str(prog)],
        check=False, capture_output=True, text=True, timeout=300, cwd=tmp_path,
    )
    lines = proc.stdout.splitlines()
    problems = [line for line in lines if ": error:" in line]
    assert not problems, proc.stdout
    revealed = [line.split('Revealed type is "', 1)[1].rstrip('"') for line in lines if "Revealed type is" in line]
    assert len(revealed) == len(EXPECTED), proc.stdout
    for (what, mypy_part, _), got in zip(EXPECTED, revealed):
        assert "object" != got and mypy_part in got, (what, got)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_pyright_sees_the_real_types(tmp_path):
    pyright = BIN / "pyright"
    if not pyright.exists():
        pytest.skip("pyright is not installed in this environment (it comes with the dev extra)")
    prog = _program(tmp_path)
    env = {**os.environ, "PYRIGHT_PYTHON_IGNORE_WARNINGS": "1"}
    proc = subprocess.run(
        [str(pyright), "--outputjson", "--pythonpath", sys.executable, str(prog)],
        check=False, capture_output=True, text=True, timeout=300, cwd=tmp_path, env=env,
    )
    assert "{" in proc.stdout, f"pyright gave no report (status {proc.returncode}): {proc.stderr[-2000:]}"
    report = json.loads(proc.stdout[proc.stdout.index("{"):])
    diagnostics = report["generalDiagnostics"]
    errors = [d for d in diagnostics if d["severity"] == "error"]
    assert not errors, errors
    revealed = [d["message"] for d in diagnostics if d["severity"] == "information" and "Type of" in d["message"]]
    assert len(revealed) == len(EXPECTED), revealed
    for (what, _, pyright_part), got in zip(EXPECTED, revealed):
        assert f'Type of "{what}" is ' in got, (what, got)
        shown = got.split(" is ", 1)[1]
        assert shown not in ('"object"', '"Unknown"') and pyright_part in shown, (what, got)


def _init_source() -> ast.Module:
    return ast.parse(Path(waypost.__file__).read_text())


def test_every_public_name_is_typed_and_lazy_alike():
    """``__all__``, the TYPE_CHECKING imports and the lazy table name the same things from the same modules."""
    tree = _init_source()
    typed: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING":
            for imp in node.body:
                assert isinstance(imp, ast.ImportFrom), ast.dump(imp)
                for alias in imp.names:
                    assert alias.asname == alias.name, f"{alias.name}: re-export as itself (X as X)"
                    module = "waypost" + ("." + imp.module if imp.module else "")
                    typed[alias.name] = module if imp.module else f"waypost.{alias.name}"
    lazy = {name: module for name, (module, _attr) in waypost._LAZY.items()}
    assert set(typed) == set(lazy)
    for name, module in lazy.items():
        if waypost._LAZY[name][1] is None:
            assert typed[name] == module, name
        else:
            # the typed import may come from the package that re-exports the name
            assert module == typed[name] or module.startswith(typed[name] + "."), (name, module, typed[name])
    eager = {"__version__", *(n for n in waypost.__all__ if n in vars(waypost) and n not in lazy)}
    assert set(waypost.__all__) == eager | set(lazy)
    for name in waypost.__all__:  # every name resolves, and dir() (so help()) lists it
        assert getattr(waypost, name) is not None
        assert name in dir(waypost)


def test_import_waypost_stays_cheap():
    """``import waypost`` loads the exceptions only: no grpc, no protobuf, no other waypost module (measured:
    waypost, waypost.errors and a few stdlib modules such as difflib and logging)."""
    code = ("import sys, logging\n"
            "before = set(sys.modules)\n"
            "import waypost\n"
            "print('\\n'.join(sorted(set(sys.modules) - before)))\n"
            "print('handlers', [type(h).__name__ for h in logging.getLogger('waypost').handlers])\n")
    proc = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True, timeout=60)
    *modules, handlers = proc.stdout.splitlines()
    assert {m for m in modules if m.startswith("waypost")} == {"waypost", "waypost.errors"}
    heavy = [m for m in modules if m.split(".")[0] in ("grpc", "google", "mmh3", "click", "rich")]
    assert not heavy, heavy
    assert handlers == "handlers ['NullHandler']"


def test_aio_star_import_is_its_public_api():
    namespace: dict[str, object] = {}
    exec("from waypost.aio import *", namespace)  # noqa: S102 -- what a user's star import brings
    assert sorted(k for k in namespace if k != "__builtins__") == ["Channel", "dial", "serve"]
    assert namespace["serve"] is waypost.serve_async


def test_failing_dial_prints_nothing_without_logging_configured():
    """A library is quiet: with no logging configured, a dial to a registry that refuses raises and prints
    nothing (without the NullHandler, Python's last-resort handler printed 'initial load ... failed,
    retrying every ~1s')."""
    from waypost.etcd.local import free_port

    code = textwrap.dedent(f"""
        import time, waypost
        try:
            waypost.dial("etcd:///127.0.0.1:{free_port()}?key=quiet.rpc&dial_timeout=0.5")
        except waypost.RegistryUnavailable as e:
            print("failed", type(e).__name__)
        time.sleep(1.5)  # the background retries of the initial load go on meanwhile
    """)
    proc = subprocess.run([sys.executable, "-c", code], check=False, capture_output=True, text=True, timeout=60,
                          cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("failed "), proc.stdout
    assert proc.stderr == ""


def test_version_is_the_installed_metadata_and_a_release_number():
    import importlib.metadata
    import re

    assert waypost.__version__ == importlib.metadata.version("waypost")
    assert re.fullmatch(r"\d+\.\d+\.\d+", waypost.__version__), waypost.__version__  # what CHANGELOG.md lists

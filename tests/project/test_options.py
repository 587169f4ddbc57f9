"""``ServeOptions`` and ``DialOptions``: one declaration of each keyword (default, type, check) for both flavours.

The keyword TypedDicts that type ``serve`` / ``serve_async`` and ``dial`` / ``aio.dial`` must name the same
fields with the same types as the dataclasses; the docs tables show the dataclasses' defaults; a bad value is
refused when the options are made, naming its field; type checkers flag a wrongly typed keyword.
"""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
import json
import os
import re
import subprocess
import sys
import textwrap
from concurrent import futures
from pathlib import Path

import grpc
import pytest

import waypost
import waypost.aio
from waypost.client.channel_config import build_config
from waypost.client.dial_options import DialKeywords, DialOptions
from waypost.server import ServeKeywords, ServeOptions

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent


@pytest.mark.parametrize(("options", "keywords"), [(ServeOptions, ServeKeywords), (DialOptions, DialKeywords)])
def test_the_keywords_are_the_fields_with_their_types(options, keywords):
    fields = {f.name: f.type for f in dataclasses.fields(options)}
    # (the TypedDict keeps each postponed annotation as a ForwardRef, the dataclass as its text)
    typed = {name: getattr(t, "__forward_arg__", t) for name, t in keywords.__annotations__.items()}
    assert typed == fields  # same names in the same order, the same spelling of each type
    assert list(typed) == list(fields)
    assert not keywords.__required_keys__  # every keyword may be left out: its default is the field's


@pytest.mark.parametrize("fn", [waypost.serve, waypost.serve_async, waypost.dial, waypost.aio.dial])
def test_the_functions_hold_no_option_default(fn):
    """The options' defaults live in the dataclasses only: the signatures end in ``**options``."""
    params = list(inspect.signature(fn).parameters.values())
    assert params[-1].kind is inspect.Parameter.VAR_KEYWORD
    positional = [p.name for p in params[:-1]]
    assert positional in (["server", "key", "listen_on"], ["target"])


def _docs_defaults(page: str) -> dict[str, str]:
    """``| `name` | `default` | ...`` rows of a docs page's argument table."""
    rows = re.findall(r"^\| `(\w+)` \| `?([^`|]+?)`? \|", (ROOT / "docs" / page).read_text(), re.MULTILINE)
    return dict(rows)


@pytest.mark.parametrize(("options", "page"), [(ServeOptions, "lifecycle.md"), (DialOptions, "discovery.md")])
def test_the_docs_tables_show_the_defaults(options, page):
    shown = _docs_defaults(page)
    for f in dataclasses.fields(options):
        want = "None" if f.default is None else json.dumps(f.default) if isinstance(f.default, str) else repr(f.default)
        assert shown.get(f.name) == want, (f.name, shown.get(f.name), want)


def test_defaults_are_what_serve_uses():
    opts = ServeOptions()
    assert (opts.registry, opts.grace, opts.ttl, opts.format, opts.register_timeout, opts.drain_delay) == (
        "etcd://127.0.0.1:2379", 10.0, 10, "gozero", 5.0, 1.0)
    assert opts.on_shutdown == () and opts.health is True
    assert opts.publisher_args() == {"ttl": 10, "id": None, "metadata": None, "format": "gozero", "timeout": 5.0,
                                     "max_unregistered": None, "on_unregistered": None}


def _hook() -> None:
    pass


async def _coro_hook() -> None:
    pass


@pytest.mark.parametrize(("kw", "error", "field"), [
    ({"grace": -1}, ValueError, "grace"),
    ({"hard_deadline": 0}, ValueError, "hard_deadline"),
    ({"on_shutdown": _hook}, TypeError, "on_shutdown"),
    ({"on_shutdown": [1]}, TypeError, "on_shutdown[0]"),
    ({"max_unregistered": -5}, ValueError, "max_unregistered"),
    ({"max_unregistered": 5, "on_unregistered": "stop"}, ValueError, "on_unregistered"),
    ({"on_unregistered": "exit"}, ValueError, "on_unregistered"),
    ({"registry": None, "max_unregistered": 5}, ValueError, "max_unregistered"),
])
def test_a_bad_serve_option_names_its_field(kw, error, field):
    with pytest.raises(error, match=re.escape(field)):
        ServeOptions(**kw)


def test_serve_refuses_coroutine_hooks_and_serve_async_takes_them():
    with pytest.raises(ValueError, match=r"on_shutdown\[0\] .*coroutine function"):
        ServeOptions(on_shutdown=[_coro_hook]).for_threads()
    assert ServeOptions(on_shutdown=[_coro_hook]).on_shutdown == (_coro_hook,)


def test_serve_options_are_frozen_and_keep_the_hooks_as_given_once():
    opts = ServeOptions(on_shutdown=iter([_hook]))  # an iterator: read once, by the check
    assert opts.on_shutdown == (_hook,)
    with pytest.raises(dataclasses.FrozenInstanceError):
        opts.ttl = 3  # type: ignore[misc]
    assert dataclasses.replace(opts, ttl=3).ttl == 3


def test_an_unknown_keyword_is_refused_before_anything_binds():
    server = grpc.server(futures.ThreadPoolExecutor(1))
    with pytest.raises(TypeError, match="tll"):
        waypost.serve(server, "opts.rpc", "127.0.0.1:0", registry=None, tll=3)  # type: ignore[call-arg]
    with pytest.raises(TypeError, match="balancr"):
        waypost.dial("direct:///127.0.0.1:1", balancr="round_robin")  # type: ignore[call-arg]


async def test_serve_async_checks_its_options_before_binding():
    with pytest.raises(ValueError, match="grace"):
        await waypost.serve_async(grpc.aio.server(), "opts.rpc", registry=None, grace=-1)


def test_block_defaults_to_each_dial_flavour():
    assert DialOptions().blocks(True) is True and DialOptions().blocks(False) is False
    assert DialOptions(block=False).blocks(True) is False
    with pytest.raises(TypeError, match="block must be True or False"):
        DialOptions(block="yes")  # type: ignore[arg-type]


def test_both_dials_check_block():
    with pytest.raises(TypeError, match="block"):
        waypost.dial("direct:///127.0.0.1:1", block=1)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="block"):
        waypost.aio.dial("direct:///127.0.0.1:1", block="no")  # type: ignore[arg-type]


def test_build_config_reads_the_dial_options():
    config = build_config("direct:///10.0.0.1:80,10.0.0.2:80", DialOptions(balancer="round_robin", subset_size=1))
    assert config.service_config.lb_policy == "round_robin"
    assert config.subsetter is not None and config.subsetter.size == 1


def test_the_aio_dial_options_are_the_sync_ones():
    async def dial() -> object:
        channel = waypost.aio.dial("direct:///127.0.0.1:1", balancer="round_robin")
        try:
            return channel.config.service_config.lb_policy
        finally:
            await channel.close()

    assert asyncio.run(dial()) == "round_robin"


# A typed user program: a wrongly typed keyword is flagged, a right one is not (line numbers matter).
TYPED = textwrap.dedent('''
    from concurrent import futures

    import grpc
    import grpc.aio

    import waypost
    import waypost.aio

    server = grpc.server(futures.ThreadPoolExecutor(1))
    waypost.serve(server, "x", ttl=3)
    waypost.serve(server, "x", ttl="3")
    waypost.dial("direct:///h:1", block=True, subset_size=4)
    waypost.dial("direct:///h:1", subset_size="4")

    async def aio() -> None:
        await waypost.serve_async(grpc.aio.server(), "x", "127.0.0.1:0", grace=1.0)
        await waypost.serve_async(grpc.aio.server(), "x", grace="1")
        waypost.aio.dial("direct:///h:1", retries=2)
        waypost.aio.dial("direct:///h:1", retries="2")
''')
FLAGGED = {12: "ttl", 14: "subset_size", 18: "grace", 20: "retries"}


def test_pyright_flags_a_wrongly_typed_keyword(tmp_path):
    pyright = BIN / "pyright"
    if not pyright.exists():
        pytest.skip("pyright is not installed in this environment (it comes with the dev extra)")
    prog = tmp_path / "typed_options.py"
    prog.write_text(TYPED)
    proc = subprocess.run([str(pyright), "--outputjson", "--pythonpath", sys.executable, str(prog)],
                          check=False, capture_output=True, text=True, timeout=300, cwd=tmp_path,
                          env={**os.environ, "PYRIGHT_PYTHON_IGNORE_WARNINGS": "1"})
    assert "{" in proc.stdout, f"pyright gave no report (status {proc.returncode}): {proc.stderr[-2000:]}"
    report = json.loads(proc.stdout[proc.stdout.index("{"):])
    errors = {d["range"]["start"]["line"] + 1: d["message"] for d in report["generalDiagnostics"]
              if d["severity"] == "error"}
    assert set(errors) == set(FLAGGED), errors
    for line, name in FLAGGED.items():
        assert f'"{name}"' in errors[line], errors[line]


def test_mypy_flags_a_wrongly_typed_keyword(tmp_path):
    prog = tmp_path / "typed_options.py"
    prog.write_text(TYPED)
    (tmp_path / "mypy.ini").write_text("[mypy]\n\n[mypy-grpc.*]\nignore_missing_imports = True\n")
    proc = subprocess.run([sys.executable, "-m", "mypy", "--config-file", str(tmp_path / "mypy.ini"), "--cache-dir",
                           str(tmp_path / ".mypy_cache"), "--no-error-summary", str(prog)],
                          check=False, capture_output=True, text=True, timeout=300, cwd=tmp_path)
    errors = {int(m.group(1)): m.group(2) for m in re.finditer(r":(\d+): error: (.*)", proc.stdout)}
    assert set(errors) == set(FLAGGED), proc.stdout
    for line, name in FLAGGED.items():
        assert f'"{name}"' in errors[line], errors[line]

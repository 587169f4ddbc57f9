"""``waypost demo`` (the live demo) and ``waypost bench`` (the benchmarks in bench/): the commands that run programs.

Registered on the ``waypost`` command group by ``waypost.cli.commands`` (``register``); this module does not import it.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

if TYPE_CHECKING:
    from types import FrameType


@contextmanager
def _sigterm_as_interrupt() -> Iterator[None]:
    """SIGTERM raises KeyboardInterrupt, so ``finally`` blocks clean up the processes we started."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, _frame: FrameType | None) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _bench_dir() -> Path | None:
    for base in (Path.cwd(), Path(__file__).resolve().parents[2]):
        d = base / "bench"
        if d.is_dir() and any(d.glob("*.py")):
            return d
    return None


def register(app: click.Group, global_options: Callable[..., Any], pass_ctx: Callable[..., Any]) -> None:
    """Add ``demo`` and ``bench`` to the ``waypost`` group."""

    @app.command("demo", short_help="Live demo (about 40 s): 7 policies, a kill and an add under load.")
    @click.option("--quick", is_flag=True, help="A short run (CI), about 20 s: fewer calls per policy.")
    @click.option("--out", "out_dir", type=click.Path(file_okay=False, path_type=Path), default=None,
                  help="Where to write the chart (default: the current directory).")
    @click.option("--no-chart", is_flag=True, help="Skip the PNG chart.")
    @click.option("--summary-json", type=click.Path(dir_okay=False, path_type=Path), default=None, hidden=True,
                  help="Write the figures as JSON (for tests and scripts).")
    @global_options
    @pass_ctx
    def demo_cmd(c: Any, quick: bool, out_dir: Path | None, no_chart: bool, summary_json: Path | None) -> None:
        """Live demo: local etcd, 4 backends (one slow), 7 of the policies (it names the
        others and why), a backend killed and one added under load.

        A run takes about 40 s on 2 cores (--quick: about 20 s) and ends every process it started. Reuses the etcd at --registry when it answers, else starts its own (or, without an etcd binary, runs
        everything in this process on the memory registry)."""
        from ..demo import run_demo

        with _sigterm_as_interrupt():
            rc = run_demo(quick=quick, out_dir=out_dir, chart=not no_chart, console=c.out,
                          registry_url=c.registry_url, summary_path=summary_json)
        if rc:
            raise click.exceptions.Exit(rc)

    @app.command("bench", short_help="Run (or list) the benchmarks in bench/.",
                 context_settings={"allow_interspersed_args": False, "ignore_unknown_options": True})
    @click.argument("name", required=False)
    @click.argument("args", nargs=-1, type=click.UNPROCESSED)
    @global_options
    @pass_ctx
    def bench_cmd(c: Any, name: str | None, args: tuple[str, ...]) -> None:
        """Run the benchmark NAME from bench/ (without NAME: list them).

        Everything after NAME goes to the script: waypost bench NAME --help shows the benchmark's own help."""
        d = _bench_dir()
        if d is None:
            raise click.ClickException("no bench/ directory found: run from a waypost source checkout")
        scripts = sorted(p for p in d.glob("*.py") if not p.name.startswith("_"))
        names = [p.stem for p in scripts]
        if not name:
            if c.as_json:
                c.emit({"benchmarks": names, "dir": str(d)})
            else:
                c.out.print(f"benchmarks in {d}: " + ", ".join(names))
                c.out.print("run one: waypost bench NAME [ARGS...]   (results go to bench/results/)")
            return
        stem = name.removesuffix(".py")
        if stem not in names:
            raise click.ClickException(f"unknown benchmark {name!r}; known: {', '.join(names)}")
        env = dict(os.environ)
        proc = subprocess.run([sys.executable, str(d / f"{stem}.py"), *args], check=False, cwd=d.parent, env=env)
        if proc.returncode:  # the command exits with the script's status
            failed = click.ClickException(f"benchmark {stem} exited with status {proc.returncode}")
            failed.exit_code = proc.returncode if 0 < proc.returncode < 256 else 1  # type: ignore[misc]
            raise failed

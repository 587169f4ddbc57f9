"""The ``waypost`` command: entry point.

The commands themselves live in ``waypost.cli.commands`` and need the ``cli`` extra (click, rich); this module
stays importable without them so a missing extra is one clear line, not a traceback.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``waypost`` command; returns (and, as a script, exits with) its status."""
    missing = [m for m in ("click", "rich") if not _importable(m)]
    if missing:
        sys.stderr.write(
            f"waypost: the command line needs {' and '.join(missing)}: pip install 'waypost[cli]'\n"
        )
        return 2
    from . import commands

    commands.CONFIGURE_LOGGING = True

    try:
        rc = commands.app.main(args=list(argv) if argv is not None else None, prog_name="waypost", standalone_mode=False)
    except KeyboardInterrupt:
        return 130
    except Exception as e:  # click's own errors (usage, abort) carry their exit codes
        import click

        if isinstance(e, click.exceptions.Abort):
            sys.stderr.write("Aborted.\n")
            return 130
        if isinstance(e, click.ClickException):
            e.show()
            return e.exit_code
        if isinstance(e, click.exceptions.Exit):
            return e.exit_code
        raise
    return rc if isinstance(rc, int) else 0


def _importable(name: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(name) is not None

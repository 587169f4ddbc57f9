"""How a ``waypost`` command ends on an error its user caused: one ``Error: ...`` line on stderr and status 1.

Two kinds of error, told apart by when they happen:

- a malformed command line (an unknown option, a missing argument, a value of the wrong type), found by click
  while it parses: click's usage banner and status 2, as every click (and getopt) command does;
- everything found once the command runs: options that do not go together, a file that is not what it should
  be, a bad target, an unreachable registry: one line, status 1 (waypost's own errors through ``user_error``).

A command's body may say ``raise click.UsageError(...)`` for the first kind of words ("--tls-cert and --tls-key go
together"): ``one_line_errors`` wraps every command's body so that it still ends in one line. It is applied once,
to the whole command tree, so a command added later needs nothing of its own.
"""

from __future__ import annotations

import concurrent.futures
import functools
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import click

from ..errors import RegistryUnavailable, WaypostError

if TYPE_CHECKING:
    from ..discovery.store import Registry

log = logging.getLogger("waypost.cli")


def one_line(e: BaseException) -> str:
    """The first line of ``e``'s message (its type's name when it has none)."""
    text = (e.format_message() if isinstance(e, click.ClickException) else str(e)).strip().splitlines()
    return text[0] if text else type(e).__name__


#: what a command adds when an etcd does not answer
ETCD_HINT = "is etcd running there? `waypost etcd` starts one"


def user_error(e: BaseException) -> click.ClickException | None:
    """The one-line error a command ends with for ``e``, one of waypost's or the library's errors; None for an
    error no user input explains (a bug: its traceback stays). click's own errors are not its business."""
    if isinstance(e, RegistryUnavailable) and str(e).startswith("etcd ") and ETCD_HINT not in str(e):
        # an etcd that is not running is the usual first mistake: every command says how to start one
        return click.ClickException(f"{one_line(e)} ({ETCD_HINT})")
    if isinstance(e, WaypostError):
        return click.ClickException(one_line(e))
    if isinstance(e, (TimeoutError, concurrent.futures.TimeoutError)):  # a registry call that did not answer in time
        return click.ClickException(f"timed out: {e or 'the registry did not answer'}")
    if isinstance(e, ValueError):  # bad input caught by the library (a key, an id, metadata, ...)
        log.debug("invalid input", exc_info=e)
        return click.ClickException(one_line(e))
    return None


def one_line_errors(command: click.Command) -> None:
    """Make ``command`` and every command under it end a ``click.UsageError`` raised by its body in one line with
    status 1; click's own parse errors (raised before the body runs) keep their usage banner and status 2."""
    if command.callback is not None and not getattr(command.callback, "_waypost_one_line", False):
        command.callback = _wrapped(command.callback)
    if isinstance(command, click.Group):
        for sub in command.commands.values():
            one_line_errors(sub)


def _wrapped(body: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(body)
    def run(*args: Any, **kwargs: Any) -> Any:
        try:
            return body(*args, **kwargs)
        except click.UsageError as e:
            raise click.ClickException(one_line(e)) from None

    run._waypost_one_line = True  # type: ignore[attr-defined]
    return run


# ---- the registry's errors, in the command's words ----------------------------------------------------------------


def not_a_key_registry(url: str, command: str) -> str | None:
    """Why ``waypost COMMAND`` (``ls``, ``register``, ...: the commands that read or write keys) cannot use the
    registry ``url`` of a kind that holds no keys, and what to run instead; None for the keyed kinds and unknown
    schemes (``waypost.connect`` names those problems itself)."""
    from ..kind_table import keyed as keyed_schemes
    from ..kind_table import kind_of
    from ..redaction import redact_url

    kind = kind_of(url)
    if kind is None or kind.keyed:
        return None
    KEYED = keyed_schemes()
    keyed = " and ".join(KEYED)
    # watch and resolve take a dial target instead of a KEY: the same command, with the kind's own target grammar
    shows = command if command in ("watch", "resolve") else "resolve"
    if command in ("watch", "resolve"):
        head = f"a bare KEY of `waypost {command}` is a key in an {' or '.join(KEYED)} registry"
    else:
        head = f"`waypost {command}` works on {keyed} registries (keys)"
    if kind.url_example is None:  # read only, as a dial target (k8s, dns, direct)
        return (f"{head}; {kind.scheme}:// is no registry URL but a dial target: `waypost {shows} "
                f"{kind.target_example}` shows its addresses")
    return (f"{head}; --registry {redact_url(url)} is a {kind.title} registry, which holds service instances: "
            f"`waypost {shows} {kind.target_example}` shows the instances of one service")


def unreachable(registry: Registry, what: str, timeout: float) -> str:
    """A registry that did not answer ``what`` (``list 'greet.rpc'``) within ``timeout`` s, cause first: its own
    account of why (``etcd at 127.0.0.1:2379 unreachable: connection refused``), then the hint to start one."""
    from .. import _loop

    try:
        why = _loop.run(registry.unreachable(), 3.0)
    except Exception:  # noqa: BLE001 -- a diagnosis only
        why = None
    hint = ETCD_HINT if registry.url.startswith("etcd://") else ""
    head = why or f"{registry.url} did not answer"
    return f"{head} (could not {what} within {timeout:g}s{'; ' + hint if hint else ''})"

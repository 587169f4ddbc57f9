"""Exception hierarchy of waypost.

Every error a user can cause carries a message that names what was wrong.
"""

from __future__ import annotations

import difflib
import functools
import inspect
import os
import sys
import warnings
from collections.abc import Callable, Collection, Iterable, Mapping
from typing import ParamSpec, TypeVar

_P = ParamSpec("_P")
_R = TypeVar("_R")


class WaypostError(Exception):
    """Base class of every waypost error."""


class RegistryUnavailable(WaypostError):
    """The registry (etcd) could not be reached, or did not answer in time."""


class RegistryError(WaypostError):
    """The registry answered with an error that is not about reachability."""


class PermissionDenied(RegistryError):
    """The registry refused an operation for lack of permission (etcd auth)."""


class LeaseNotFound(RegistryError):
    """The lease does not exist (expired or revoked)."""


class Compacted(RegistryError):
    """A watch asked for a revision that has been compacted away."""

    def __init__(self, compact_revision: int, message: str | None = None) -> None:
        super().__init__(message or f"revision compacted; oldest available revision is {compact_revision}")
        self.compact_revision = compact_revision


class StoreReset(Compacted):
    """The store went back in time (etcd restored from a backup or restarted with an empty data
    directory): the revisions a watch had seen are gone, as after a compaction, so reload.
    ``compact_revision`` is the store's revision when this was found."""


class InvalidTarget(WaypostError, ValueError):
    """A dial target or registry URL is malformed."""


class InvalidServiceConfig(WaypostError, ValueError):
    """A service config is invalid; the message carries the JSON path of the field."""


class NoBackendAvailable(WaypostError):
    """No backend can take a call."""


class ConfigWarning(UserWarning):
    """A setting of the program's own configuration that is valid but almost certainly not what was meant
    (a service-config ``methodConfig`` name that matches no method, a retry policy that cannot move a call
    off a dead backend, ...). Raised through :mod:`warnings`: shown once per place by default, and turned into
    an error by ``-W error::waypost.ConfigWarning`` (a test suite's filters). Conditions of the running
    system (a backend down, the registry unreachable) are logged instead."""


_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep


def warn_config(message: str) -> None:
    """``warnings.warn(message, ConfigWarning)`` attributed to the first caller outside waypost (and outside
    generated ``*_pb2_grpc.py`` stubs): the user's ``dial(...)`` or stub construction, so the warning names
    that line and the default filter shows it once per line."""
    level = 1
    frame = sys._getframe(1)
    while frame is not None:
        name = frame.f_code.co_filename
        if not (os.path.abspath(name).startswith(_PACKAGE_DIR) or name.endswith("_pb2_grpc.py")):
            break
        frame = frame.f_back  # type: ignore[assignment]
        level += 1
    warnings.warn(message, ConfigWarning, stacklevel=level + 1)


# Helpers that word the messages of the errors above, shared by every parser of user input (service
# configs, durations, targets) so that the same mistake reads the same way everywhere.


def describe_value(value: object) -> str:
    """A short description of a JSON-like value for an error message (never the whole value)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        text = repr(value)
        return text if len(text) <= 40 else text[:37] + "..."
    if isinstance(value, str):
        text = repr(value)
        return f"string {text}" if len(text) <= 60 else f"string {text[:57]}..."
    if isinstance(value, (list, tuple)):
        return "a list"
    if isinstance(value, dict):
        return "an object"
    return type(value).__name__


def did_you_mean(name: str, choices: Iterable[str]) -> str:
    """`` (did you mean 'x'?)`` for the closest of ``choices`` to a misspelt ``name``, else ""."""
    close = difflib.get_close_matches(name, list(choices), n=1, cutoff=0.7)
    return f" (did you mean {close[0]!r}?)" if close else ""


#: registration metadata keys a caller may give as keywords of their own (``serve(..., weight=3)``)
METADATA_WORDS = ("weight", "zone", "version")


def unexpected_keyword(what: str, name: str, value: object, known: Iterable[str], *,
                       metadata: bool = False) -> TypeError:
    """Python's own words for a misspelt keyword, under the name the caller used, and the closest one known:
    ``waypost.dial() got an unexpected keyword argument 'balncer'; did you mean 'balancer'?``. ``metadata``: the
    function takes ``metadata=``, so ``weight=3`` (or ``wieght=3``) means ``metadata={'weight': 3}``."""
    known = list(known)
    close = difflib.get_close_matches(name, known, n=1, cutoff=0.6)
    meant = f"{close[0]!r}" if close else ""
    if metadata and not close:
        word = difflib.get_close_matches(name, METADATA_WORDS, n=1, cutoff=0.6)
        if word:
            meant = f"metadata={{{word[0]!r}: {value!r}}}"
    return TypeError(f"{what}() got an unexpected keyword argument {name!r}" + (f"; did you mean {meant}?" if meant
                                                                                   else ""))


def check_keywords(what: str, given: Mapping[str, object], known: Collection[str], *, metadata: bool = False) -> None:
    """Raise ``unexpected_keyword`` for the first of ``given`` that is not in ``known`` (an options dataclass's
    fields: its own TypeError would name the dataclass, not the function the caller called)."""
    for name, value in given.items():
        if name not in known:
            raise unexpected_keyword(what, name, value, known, metadata=metadata)


def suggests_keywords(what: str) -> Callable[[Callable[_P, _R]], Callable[_P, _R]]:
    """Decorate a function (or a class's ``__init__``) so that a misspelt keyword says ``what`` and the closest
    keyword it takes (``unexpected_keyword``); the signature, for type checkers and ``inspect``, stays its own."""

    def decorate(f: Callable[_P, _R]) -> Callable[_P, _R]:
        params = inspect.signature(f).parameters
        known = [n for n, p in params.items()
                 if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) and n != "self"]
        metadata = "metadata" in known

        @functools.wraps(f)
        def call(*args: _P.args, **kwargs: _P.kwargs) -> _R:
            check_keywords(what, kwargs, known, metadata=metadata)
            return f(*args, **kwargs)

        return call

    return decorate


#: the longest piece of a key an error message shows (a 2 MB key must not fill a log)
KEY_ECHO_MAX = 100


def shown_key(key: bytes | str) -> str:
    """A registry key for an error message: its repr, cut to ``KEY_ECHO_MAX`` characters (then with
    its size in bytes)."""
    text = key.decode("utf-8", "backslashreplace") if isinstance(key, bytes) else str(key)
    if len(text) <= KEY_ECHO_MAX:
        return repr(text)
    size = len(key) if isinstance(key, bytes) else len(text.encode("utf-8", "surrogateescape"))
    return f"{text[:KEY_ECHO_MAX]!r}... ({size} bytes)"

"""Exception hierarchy of waypost.

Every error a user can cause carries a message that names what was wrong.
"""

from __future__ import annotations

import difflib
import os
import sys
import warnings
from collections.abc import Iterable


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

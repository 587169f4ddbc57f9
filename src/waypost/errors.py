"""Exception hierarchy of waypost.

Every error a user can cause carries a message that names what was wrong.
"""

from __future__ import annotations

import difflib
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

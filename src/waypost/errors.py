"""Exception hierarchy of waypost.

Every error a user can cause carries a message that names what was wrong.
"""

from __future__ import annotations


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

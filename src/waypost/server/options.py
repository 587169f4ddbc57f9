"""What ``serve`` and ``serve_async`` take besides the server, its key and ``listen_on``: ``ServeOptions``.

Both build a ``ServeOptions`` from their keywords (``ServeKeywords`` types them: written once, shared by the two
signatures), so each default and each check is written here once; ``lifecycle.py`` runs the lifecycle with them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any, TypedDict, Union

import grpc

from ..errors import check_keywords
from .flavours import check_shutdown_args

if TYPE_CHECKING:
    from ..discovery.store import Registry
    from ..registration.contract import Registration

#: how long a stopping server keeps serving after deregistering: a watch event reaches clients in
#: milliseconds on a healthy etcd; one second also covers a loaded client
DEFAULT_DRAIN_DELAY = 1.0

DEFAULT_REGISTRY = "etcd://127.0.0.1:2379"

#: ``listen_on``'s default: every interface, a port the OS picks (the real port is the one registered)
LISTEN_ANY = "0.0.0.0:0"

#: what ``registry=`` takes: a registry URL, a Registry, a list of them, or None (``ServeOptions.registry``)
RegistrySpec = Union[str, "Registry", Sequence[Union[str, "Registry"]], None]


class ServeKeywords(TypedDict, total=False):
    """The keyword arguments of ``serve`` / ``serve_async`` after ``listen_on``: each is the ``ServeOptions`` field
    of the same name and type (its default and meaning are documented there)."""

    registry: RegistrySpec
    metadata: Mapping[str, object] | None
    grace: float
    advertise: str | None
    ttl: int
    id: int | str | None
    format: str
    allow_loopback: bool | None
    health: bool
    credentials: grpc.ServerCredentials | None
    register_timeout: float
    drain_delay: float
    max_unregistered: float | None
    on_unregistered: Callable[[Registration], object] | str | None
    on_shutdown: Iterable[Callable[[], object]] | None
    hard_deadline: float | None


@dataclass(frozen=True, kw_only=True)
class ServeOptions:
    """How ``serve`` / ``serve_async`` register, keep and stop a server: everything but the server, its ``key`` and
    ``listen_on``. Checked when made: a bad value raises ``ValueError`` / ``TypeError`` naming its field (what
    the registry decides, such as ``ttl`` or ``format``, is checked when the server registers)."""

    registry: RegistrySpec = DEFAULT_REGISTRY
    """A registry URL (``etcd://``, ``consul://``, ``zk://``, ``eureka://``, ``memory://``), a Registry
    (``waypost.connect``), a list of them (registered in each; ``waypost.registration.factory``), or None
    (nothing registered: inside Kubernetes, readiness through the health service)."""
    metadata: Mapping[str, object] | None = None
    """A JSON object carried with the registration (``{"weight": 20}``)."""
    grace: float = 10.0
    """Seconds in-flight calls get to finish when stopping."""
    advertise: str | None = None
    """The address clients should dial (``host`` or ``host:port``), when the detected one is not what you want
    (``waypost.netutil``)."""
    ttl: int = 10
    """Lease TTL in seconds: a crashed server disappears after at most this."""
    id: int | str | None = None
    """The instance id in the key (``<key>/<id>``); None: the lease id."""
    format: str = "gozero"
    """The registration's wire format: ``gozero``, ``etcd-naming``, ``kratos``."""
    allow_loopback: bool | None = None
    """True: advertise 127.0.0.1 when the registry is on loopback; False: never; None: only for ``memory://`` or a
    host with no other interface."""
    health: bool = True
    """Add grpc.health.v1 to the server (NOT_SERVING until registered, SERVING after, NOT_SERVING when draining)."""
    credentials: grpc.ServerCredentials | None = None
    """Bind with ``add_secure_port`` and these credentials; None: insecure."""
    register_timeout: float = 5.0
    """How long start-up may take to register (retrying meanwhile) before ``RegistryUnavailable``."""
    drain_delay: float = DEFAULT_DRAIN_DELAY
    """Seconds a stopping server keeps serving after deregistering (at most ``grace``), so that clients drop it
    before it refuses calls."""
    max_unregistered: float | None = None
    """Seconds the registration may stay lost (lease not renewed) before ``on_unregistered``; None: no alert."""
    on_unregistered: Callable[[Registration], object] | str | None = None
    """What to do then: ``f(publisher)`` (in a thread of its own), or ``"exit"`` (the graceful stop, then exit
    status 75); None: the ERROR logged is all."""
    on_shutdown: Iterable[Callable[[], object]] | None = None
    """Callables ``f()`` run one by one during the graceful stop, after deregistration and ``drain_delay``, while
    in-flight calls drain (each one's exception is logged, the next still runs); ``serve_async`` also takes
    coroutine functions. Kept as a tuple: an iterator given here is read once."""
    hard_deadline: float | None = None
    """Seconds after the stop began when the process exits with status 70 even if hooks or calls still run;
    None: never."""

    def __post_init__(self) -> None:
        from ..registration.outage import check_unregistered_args

        if self.grace < 0:
            raise ValueError(f"serve: grace must be >= 0 seconds, got {self.grace!r}")
        unregistered: Any = self.on_unregistered  # typed str for callers: which strings pass is checked here
        check_unregistered_args(self.max_unregistered, unregistered)
        if self.registry is None and self.max_unregistered is not None:
            raise ValueError("serve: max_unregistered / on_unregistered need a registry (registry=None registers "
                             "nothing)")
        hooks = check_shutdown_args(self.on_shutdown, self.hard_deadline, allow_async=True)
        object.__setattr__(self, "on_shutdown", hooks)  # frozen, but the checked tuple replaces what was given

    @classmethod
    def from_keywords(cls, what: str, keywords: ServeKeywords) -> ServeOptions:
        """The options of ``serve``'s keywords; a misspelt one is a TypeError naming the function (``what``) and
        the keyword meant (``waypost.serve() got an unexpected keyword argument 'wieght'; did you mean metadata={'weight': 3}?``)."""
        check_keywords(what, keywords, _FIELDS, metadata=True)
        return cls(**keywords)

    def for_threads(self) -> ServeOptions:
        """These options, for a ``grpc.server``: its hooks run in a thread, so none may be a coroutine function."""
        check_shutdown_args(self.on_shutdown, None, allow_async=False)
        return self

    def publisher_args(self) -> dict[str, Any]:
        """The keywords of ``make_publisher``: the registration's part of these options."""
        return {"ttl": self.ttl, "id": self.id, "metadata": self.metadata, "format": self.format,
                "timeout": self.register_timeout, "max_unregistered": self.max_unregistered,
                "on_unregistered": self.on_unregistered}


#: the keywords ``serve`` takes after ``listen_on``
_FIELDS = frozenset(f.name for f in fields(ServeOptions))

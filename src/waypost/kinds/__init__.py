"""The public contract of a registry kind: everything a kind (waypost's own or a plug-in) writes against.

A kind gives waypost two objects, and waypost builds the rest once, over any kind (the resolver loop of
``dial``, the registration state machine of ``serve``, the console, ``waypost drain``):

- a ``Registrar`` (``serve(registry=URL)``): ``register`` one ``Instance`` (also called again to rewrite it, e.g.
  new metadata), ``deregister`` it, and -- where the registry keeps an instance alive by heartbeat, lease or
  session -- ``renew`` it (raising ``InstanceGone`` when the registry no longer has it); ``close``.
- a ``Discovery`` (``dial(TARGET)``): ``instances(service)`` (one read) and ``watch(service)`` (an async
  iterator of lists); a kind with no native watch subclasses ``PollingDiscovery`` and writes only ``instances``.

It describes itself with a ``RegistryKind`` (its scheme, URL and target grammar, the two factories above, its
``Words``) given to ``waypost.register_kind`` or declared as an entry point in the ``waypost.registries`` group.
Optionally it gives an ``OverrideStore`` (what ``waypost drain`` writes) and a ``ConsoleSource``
(``waypost console --registry URL``). ``docs/registry-kinds.md`` shows a complete kind.

Errors a kind raises, and what waypost does with them:

- ``RegistryUnavailable``, ``OSError``, ``asyncio.TimeoutError``: the registry is not reachable (now): retried
  with backoff; ``serve`` raises ``RegistryUnavailable`` naming the last one if none worked within its timeout;
- ``PermissionDenied``: refused: raised at once (a blocking ``dial`` fails at once naming it);
- ``RegistryError``: the registry answered and another attempt gets the same answer: raised at once;
- ``LookupFailed`` (from a read): the registry's answer for now (DNS: no such name): a blocking ``dial`` returns
  at once, calls fail naming it, the reads go on;
- ``InstanceGone`` (from ``renew``): the registry no longer has the instance: registered again at once;
- ``InvalidTarget``: a bad URL or dial target (from the parsers).
"""

from __future__ import annotations

import abc
import asyncio
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Protocol, runtime_checkable

from ..backoff import Backoff
from ..discovery.override import parse_override, split_override_key
from ..durations import parse_positive_duration
from ..errors import InvalidTarget, PermissionDenied, RegistryError, RegistryUnavailable
from ..kind_table import RegistryKind, Words, register_kind
from ..kind_table import part as load_part
from ..resolver.target import Target
from ..types import Backend

__all__ = [
    "Backend",
    "Backoff",
    "ConsoleSource",
    "Discovery",
    "Instance",
    "InstanceGone",
    "InvalidTarget",
    "LookupFailed",
    "OverrideStore",
    "PermissionDenied",
    "PollingDiscovery",
    "Registrar",
    "RegistryError",
    "RegistryKind",
    "RegistryUnavailable",
    "Target",
    "Words",
    "load_part",
    "parse_override",
    "parse_positive_duration",
    "register_kind",
    "split_override_key",
]


class LookupFailed(RegistryError):
    """A read the registry answered with a failure that is the answer for now (DNS: the name does not exist, has
    no records, or the lookup timed out): unlike other failures it ends a blocking dial's wait at once (calls then
    fail naming it) and the reads go on."""


class InstanceGone(RegistryError):
    """Raised by ``Registrar.renew`` (or ``deregister``) when the registry no longer has the instance: it expired, or
    someone deleted it. A renewal that raises it makes waypost register the instance again at once; a
    deregistration that raises it is done."""


@dataclass(frozen=True)
class Instance:
    """One service instance as a ``Registrar`` writes it."""

    #: the service's name (``serve(server, SERVICE, ...)``)
    service: str
    #: ``host:port`` clients dial
    address: str
    #: the instance's name in the registry: ``serve(id=...)``, else ``Words.id_format`` filled in (stable across
    #: restarts, so a restarted server replaces its own stale instance)
    id: str
    #: the registration's metadata (JSON values; ``{}`` when none)
    metadata: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))
    #: seconds the registry keeps it without a renewal (``renew`` is called every ttl/3 s)
    ttl: int = 10

    @property
    def host(self) -> str:
        return self.address.rpartition(":")[0].strip("[]")

    @property
    def port(self) -> int:
        return int(self.address.rpartition(":")[2])


class Registrar(abc.ABC):
    """Writes one server's instance in the registry: ``serve(registry=URL)``. Built by ``RegistryKind.registrar``:
    ``registrar(settings, timeout)``, ``settings`` being what ``RegistryKind.parse_url`` made of the URL (the URL
    itself when the kind has no ``parse_url``) and ``timeout`` the bound, in seconds, of one call to the registry.

    waypost calls it from one task at a time (never two calls at once for one instance), on its control loop.

    A factory that takes more of ``serve``'s / ``waypost.Publisher``'s keywords names them in its attribute
    ``options`` (etcd: ``("format", "exclusive")``) and is given them: ``registrar(settings, timeout, **options)``."""

    #: the lease the instance is kept under, for registries with named leases (etcd: 0 while there is none);
    #: None: no named lease (the renewals play its role)
    lease_id: int | None = None

    @abc.abstractmethod
    async def register(self, instance: Instance) -> None:
        """Write ``instance`` (new, or in place of the one there: also how new metadata is written). One attempt
        that leaves nothing behind when it fails; waypost retries it."""

    @abc.abstractmethod
    async def deregister(self, instance: Instance) -> None:
        """Remove ``instance`` (bounded by waypost; an instance already gone is fine: return, or raise
        ``InstanceGone``)."""

    async def renew(self, instance: Instance) -> None:
        """One renewal (a heartbeat, a lease keep-alive, a session check), every ``instance.ttl / 3`` s. Raise
        ``InstanceGone`` when the registry no longer has the instance (waypost registers it again at once); any
        other failure is retried, and the instance counts as lost after ``ttl`` s without a renewal. The default
        does nothing: a registry that keeps instances on its own."""

    async def guard(self, instance: Instance) -> None:
        """Optional: follow the registered ``instance`` in the registry (a long poll) and raise ``InstanceGone``
        as soon as it is gone or changed from outside: waypost registers it again at once instead of at the next
        ``renew``. Runs beside the renewals while registered (cancelled when it is not); returning ends it
        (e.g. not allowed to read). The default returns at once: nothing followed."""

    def registered_name(self, instance: Instance) -> str:
        """The name the registry has the written ``instance`` under (``waypost.Publisher.key``): by default its id;
        etcd: the record's key, whose last part is the lease when ``instance.id`` is empty (``Words.id_format``
        ``""``: the registry names it)."""
        return instance.id

    def override_store(self) -> OverrideStore | None:
        """Optional: where this registrar's registry keeps operator overrides, for a registration made with a
        registry object rather than a URL (``RegistryKind.override_store(url)`` needs the URL; etcd: its own keys).
        A store with ``watch`` is followed as the kind's is. The default: none."""
        return None

    def check_metadata(self, metadata: Mapping[str, Any]) -> None:
        """Raise ``TypeError``/``ValueError`` naming what this registry cannot carry of ``metadata`` (JSON values,
        already checked; e.g. Consul's key and value limits). Called at ``serve`` and at every
        ``update_metadata``, before anything is written. The default takes anything JSON."""

    async def close(self) -> None:
        """Free what the registrar holds open (at stop)."""


class Discovery(abc.ABC):
    """Reads the instances of a service: ``dial(TARGET)``. Built by ``RegistryKind.discovery``:
    ``discovery(target)``, the parsed dial target (``target.key`` the service, ``target.endpoints`` the
    registry's ``host:port``s, ``target.options`` its query parameters).

    A failure raised from ``instances`` or from the ``watch`` iterator is reported once (the channel keeps its last
    list) and the watch is started again after ``backoff``'s pause."""

    #: the pauses after failed reads in a row (None: 0.5 s doubling up to 10 s, +-20%)
    backoff: Backoff | None = None
    #: the bound of one read, seconds (at most the dial's timeout, which lowers it): a blocking dial waits at
    #: least this (and a second) for the first answer
    read_timeout: float = 0.0
    #: set by waypost before the first read: the dial's bound, in seconds, on the first list (its ``timeout``); a
    #: kind may bound its first reads within it, so that the dial's error names why a read did not answer
    dial_timeout: float | None = None

    @abc.abstractmethod
    async def instances(self, service: str) -> Sequence[Backend]:
        """The instances of ``service`` now: one read."""

    @abc.abstractmethod
    def watch(self, service: str) -> AsyncIterator[Sequence[Backend]]:
        """Lists of ``service``'s instances: the first as soon as it is known, then one per change. Ending is
        fine (waypost calls ``watch`` again)."""

    def configure(self, channel_options: Mapping[str, Any]) -> None:
        """The dial's channel options (``dial(options=...)``), for a kind that takes settings from them (DNS: its
        refresh intervals); raise ``ValueError`` naming a bad one. Called once, before the first read; the default
        ignores them."""

    def describe(self, service: str) -> str:
        """What is followed, in messages (default ``service 'NAME'``; e.g. ``service default/greet (port 80)``)."""
        return f"service {service!r}"

    def resolve_now(self) -> None:
        """A hint that a connection to an instance failed: a polling kind reads again soon. Called from any
        thread. The default does nothing (a watch sees changes anyway)."""

    async def diagnose(self, service: str) -> str | None:
        """Why reads of ``service`` do not answer, in the registry's own words (``etcd at h:2379 unreachable:
        connection refused``), bounded; None when it cannot say. Asked once when the first list of a dial that
        reports early (an aio dial) has not come within 0.3 s: calls then fail naming it while the
        read goes on. The default cannot say."""
        return None

    async def close(self) -> None:
        """Free what the discovery holds open (when the channel closes)."""


class PollingDiscovery(Discovery):
    """A ``Discovery`` for a registry with no watch: ``watch`` reads every ``next_interval()`` s (default
    ``interval``), sooner after ``resolve_now`` but never sooner than ``min_interval`` after the last read. A
    subclass writes only ``instances`` (and sets ``interval``)."""

    #: seconds between reads
    interval: float = 5.0
    #: the least seconds between two reads, however many ``resolve_now`` calls come
    min_interval: float = 0.0
    _wake: asyncio.Event | None = None
    _loop: asyncio.AbstractEventLoop | None = None

    async def watch(self, service: str) -> AsyncIterator[Sequence[Backend]]:
        loop = self._loop = asyncio.get_running_loop()
        wake = self._wake = asyncio.Event()
        while True:
            wake.clear()  # a request during the read below still wakes the wait after it
            started = loop.time()
            yield await self.instances(service)
            delay = self.next_interval()
            try:
                await asyncio.wait_for(wake.wait(), delay)
            except asyncio.TimeoutError:
                continue
            rest = started + min(self.min_interval, delay) - loop.time()
            if rest > 0:
                await asyncio.sleep(rest)

    def next_interval(self) -> float:
        """Seconds until the next read (default ``interval``; e.g. DNS: the records' TTL)."""
        return self.interval

    def resolve_now(self) -> None:
        loop, wake = self._loop, self._wake
        if loop is not None and wake is not None and not loop.is_closed():
            loop.call_soon_threadsafe(wake.set)


@runtime_checkable
class OverrideStore(Protocol):
    """Where ``waypost drain|undrain|weight --registry URL`` and the console write an operator's override of an
    instance (``RegistryKind.override_store(url)``). The records are those etcd keeps (``waypost.discovery.override``:
    ``key`` the override's key, ``value`` its JSON; ``split_override_key(key)`` gives its service and address,
    ``parse_override(value)`` its record); a store that writes something of the registry's own instead
    (Eureka's status override) sets its attribute ``written`` to what, in words, after each put or delete:
    ``waypost drain`` prints it instead of the record's key.

    Optionally it has ``watch(key) -> AsyncIterator[bytes | None]``: the record's value now (None: no record), then
    at each change. With it, a server registered in the kind follows its own record (``KindRegistration``): its
    registration carries the override's ``weight`` while the record is there, its own metadata again once it is
    deleted."""

    #: the registry, for messages (no secrets)
    url: str

    async def put(self, key: str, value: bytes, *, prev_kv: bool = False) -> Any: ...
    async def delete(self, key: str, *, prev_kv: bool = False) -> Any: ...
    async def registered(self, key: str, address: str) -> bool: ...
    async def close(self) -> None: ...


@runtime_checkable
class ConsoleSource(Protocol):
    """What ``waypost console --registry URL`` follows (``RegistryKind.console_source(url, board, timeout)``):
    started once, it keeps the board's view of the registry's services current."""

    #: the source's name on the console
    name: str
    #: where the console's drain and weight buttons write (an ``OverrideStore``; None: read only)
    writer: Any

    async def start(self) -> None: ...
    async def close(self) -> None: ...


"""The kinds of registry waypost knows, in one table: what each URL scheme means, and where its parts live.

A kind is a URL scheme (``etcd``, ``memory``, ``consul``, ``zk``, ``k8s``, ``dns``, ``direct``, or one a plug-in
adds). Two families:

- *keyed* kinds hold keys under leases: the ``Registry`` contract of ``discovery/store.py``. ``waypost.connect``
  takes their URLs (each kind's ``parse_url``, its ``registry`` makes the store) and every wire format works on
  them.
- the other kinds hold something else: service instances (registered through a ``Registrar`` or their own
  publishers), or addresses that are only read (dial targets, no registry URL).

A kind names its parts by *reference*: ``"package.module:attribute"`` strings (or the objects themselves), loaded
on first use (``load``). That is how the generic layers (``serve()``'s registrations, the resolvers, the
console, ``waypost ls``) reach a kind without naming it, and why importing waypost loads no kind's client
library: a ``zk://`` target imports kazoo when it is dialed, not before.

Kinds outside waypost register themselves, as grpc-go's ``resolver.Register`` does: ``register_kind(kind)`` in
their module, or an entry point in the ``waypost.registries`` group whose object is a ``RegistryKind`` (read
once, the first time a scheme is looked up that no kind loaded so far has; a plug-in that fails to load is
logged and skipped). ``docs/registry-kinds.md`` shows a complete one.
"""

from __future__ import annotations

import functools
import importlib
import logging
import re
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from importlib import metadata
from typing import Any

log = logging.getLogger("waypost.registry")

#: the entry-point group third-party kinds are found in
ENTRY_POINT_GROUP = "waypost.registries"

#: a part of a kind: ``"package.module:attribute"`` (imported on first use) or the object itself
Ref = str | Callable[..., Any]

_SCHEME_RE = re.compile(r"[a-z][a-z0-9+.-]*")


@dataclass(frozen=True)
class Words:
    """What a kind's messages call its things (``RegistryKind.words``): the generic registration and resolver say
    them in their errors and log lines. Each text may use the fields named in its comment."""

    #: what one instance is called ("instance"; Kubernetes: "endpoint")
    instance: str = "instance"
    #: what a list holds, in log lines ("keeping the last instances")
    instances: str = "instances"
    #: what the first list is called in a blocking dial's error ("no instance list of service 'greet' ...")
    list_name: str = "instance list"
    #: what one renewal is called ("a heartbeat", "a TTL check pass", "a lease keep-alive")
    renewal: str = "a renewal"
    #: the instance id when ``serve`` gives none; fields ``service``, ``host``, ``port`` (``""``: the registrar names
    #: it when it writes it, e.g. etcd's lease id; ``Registrar.registered_name`` says what it became)
    id_format: str = "{service}-{host}-{port}"
    #: why the registration counts as lost; fields ``renewal``, ``overdue`` (seconds), ``ttl``, ``error``
    lost: str = "no {renewal} worked for {overdue:.0f}s (ttl {ttl}s), the registry has dropped it: {error}"
    #: a read that failed (the registry down, ...); fields ``title``, ``what``, ``error``
    read_failed: str = "{title}: reading {what} failed: {error}"
    #: a blocking dial's error when no first list came within its timeout after a read failed; fields ``scheme``,
    #: ``list_name``, ``what``, ``within`` (seconds), ``why`` (the last failure, as ``read_failed`` said it)
    no_list: str = "{scheme}: no {list_name} of {what} within {within:g}s ({why})"
    #: a deregistration that failed; fields ``instance``, ``id``, ``ttl``
    left_behind: str = "could not remove {instance} {id!r} (the registry drops it within {ttl}s)"
    #: a direct target's backend that answers like this kind's server (``RegistryKind.misdial``); fields ``title``,
    #: ``target`` (the target probably meant)
    misdialed: str = "this looks like a {title} endpoint: did you mean {target}?"


@dataclass(frozen=True)
class RegistryKind:
    """One kind of registry: its scheme and URL grammar, and where its parts are.

    A kind written against the public contract (``waypost.kinds``) gives:

    - ``registrar`` -> ``registrar(settings, timeout)``, a ``waypost.kinds.Registrar``
      (``serve(..., registry="SCHEME://...")``); ``settings`` is ``parse_url(url)``'s (the URL without
      ``parse_url``);
    - ``discovery`` -> ``discovery(target)``, a ``waypost.kinds.Discovery`` (``dial("SCHEME://...")``);
    - ``words``: what its messages call its things (``Words``); ``title``: the registry's name in messages;
    - optionally ``override_store(url)`` -> a ``waypost.kinds.OverrideStore`` (``waypost drain``) and
      ``console_source(url, board, timeout)`` -> a ``waypost.kinds.ConsoleSource`` (``waypost console``).

    waypost builds the resolver (one for every kind: ``waypost.kinds.resolver.KindResolver``) and the registration
    over them. Each part is a ``Ref``.

    The grammar: ``parse_url(url)`` -> the settings of a registry URL (raises ``waypost.InvalidTarget`` naming what
    is wrong); ``parse_target(scheme, authority, path, params, raw)`` -> a ``Target`` for a kind whose dial
    targets are not ``SCHEME://HOST:PORT[,HOST:PORT]/SERVICE?PARAMS`` (that grammar is the default:
    ``target_params`` says which parameters it takes, ``max_hosts`` how many hosts, ``default_port`` the port of a
    host without one).
    """

    scheme: str
    #: the port of a host named without one, in its URLs and dial targets (None: they name no host:port)
    default_port: int | None
    #: a dial target of this kind
    target_example: str
    #: a registry URL of this kind (None: no registry URL: a kind that is only read)
    url_example: str | None = None
    #: the URL -> settings parser (a keyed kind's settings have ``cache_key()`` and ``redacted``)
    parse_url: Ref | None = None
    #: a keyed kind's store (keys under leases, the ``Registry`` contract): ``registry(settings)`` -> a ``Registry``
    #: (``waypost.connect`` takes its URLs)
    registry: Ref | None = None
    #: a keyed kind's ``Target`` -> the registry URL ``waypost.connect`` takes for it (``Target.registry_url``)
    target_registry_url: Ref | None = None
    #: what ``waypost console --registry URL`` follows
    console_source: Ref | None = None
    #: where ``waypost drain|weight|undrain --registry URL`` writes (None: a keyed registry's own keys)
    override_store: Ref | None = None
    #: the parser of its dial targets (None: the built-in grammar of its scheme, or ``HOSTS/SERVICE?PARAMS``)
    parse_target: Ref | None = None
    #: the query parameters its dial targets take (the ``HOSTS/SERVICE`` grammar)
    target_params: tuple[str, ...] = ()
    #: its dial targets may carry ``user:password@`` (its ``parse_target`` reads them)
    credentials: bool = False
    #: the most hosts one dial target names (None: any number)
    max_hosts: int | None = None
    #: the pip extra the kind needs (``pip install 'waypost[EXTRA]'``); None: nothing beyond waypost itself
    extra: str | None = None
    #: other schemes of dial targets that mean this kind
    aliases: tuple[str, ...] = ()
    #: what the registry is called in messages ("Consul"; default: the scheme)
    title: str = ""
    #: the ``waypost.kinds.Registrar`` factory: ``registrar(settings, timeout)``
    registrar: Ref | None = None
    #: the ``waypost.kinds.Discovery`` factory: ``discovery(target)``
    discovery: Ref | None = None
    #: ``misdial(address, probe)`` -> the target probably meant when a direct target's backend at ``address`` is
    #: this kind's server (None: it is not; ``probe``: it may ask the address, blocking and bounded)
    misdial: Ref | None = None
    #: what its messages call its things
    words: Words = Words()

    def __post_init__(self) -> None:
        for s in (self.scheme, *self.aliases):
            if not isinstance(s, str) or not _SCHEME_RE.fullmatch(s):
                raise ValueError(f"registry kind: {s!r} is not a URL scheme (lower-case letters, digits, '+', '-', "
                                 "'.', starting with a letter)")
        if not self.title:
            object.__setattr__(self, "title", self.scheme)

    @property
    def install_hint(self) -> str:
        """How to get what the kind needs, e.g. ``pip install 'waypost[zk]'`` ("" when nothing)."""
        return f"pip install 'waypost[{self.extra}]'" if self.extra else ""

    @property
    def keyed(self) -> bool:
        """A kind of keys under leases (etcd, memory): it gives ``registry``, and ``waypost.connect`` takes its URLs."""
        return self.registry is not None

    @property
    def holds_instances(self) -> bool:
        """True for a kind that ``serve()`` registers in through its registrar."""
        return self.registrar is not None and not self.keyed


def load(ref: Ref, what: str = "") -> Any:
    """The object a ``Ref`` names, imported on first use (an object is returned as it is). ``ImportError``
    names the reference, and ``what`` (e.g. "the consul resolver"), when the module or attribute is missing."""
    if not isinstance(ref, str):
        return ref
    module, sep, attr = ref.partition(":")
    if not sep or not module or not attr:
        raise ValueError(f"{what or 'registry kind part'}: {ref!r} is not 'package.module:attribute'")
    obj: Any = importlib.import_module(module)
    try:
        for part in attr.split("."):
            obj = getattr(obj, part)
    except AttributeError:
        raise ImportError(f"{what or 'registry kind part'}: {module} has no {attr!r} ({ref})") from None
    return obj


# ---- the table ---------------------------------------------------------------------------------------------

#: the modules of waypost's kinds (``waypost.registries``), each declaring its ``KIND``: loaded, in this order, the
#: first time a scheme is looked up
BUILTIN_MODULES = (
    "waypost.registries.direct.kind",
    "waypost.registries.etcd.kind",
    "waypost.registries.memory.kind",
    "waypost.registries.dns.kind",
    "waypost.registries.kubernetes.kind",
    "waypost.registries.consul.kind",
    "waypost.registries.zookeeper.kind",
    "waypost.registries.eureka.kind",
)

#: every kind by scheme, in the order messages list them (plug-ins after waypost's own)
KINDS: dict[str, RegistryKind] = {}
#: every scheme that names a kind, its aliases included, in the order messages list them
SCHEMES: dict[str, RegistryKind] = {}

_lock = threading.RLock()
_plugins_loaded = False
#: the schemes of BUILTIN_MODULES' kinds, once loaded (``register_kind`` does not replace them)
_OWN_SCHEMES: set[str] = set()


def register_kind(kind: RegistryKind, *, replace: bool = False) -> RegistryKind:
    """Add ``kind`` to the table, so that its scheme works in ``dial``, ``serve(registry=...)``, the console and
    the command line. A scheme (or alias) already taken is a ``ValueError`` naming its kind, unless
    ``replace`` (a plug-in's own scheme only: waypost's kinds cannot be replaced). Returns ``kind``."""
    if not isinstance(kind, RegistryKind):
        raise TypeError(f"register_kind: expected a waypost.RegistryKind, got {type(kind).__name__}")
    if kind.keyed:
        raise ValueError(f"register_kind: {kind.scheme}: keyed kinds are waypost's own ({', '.join(keyed())}); a "
                         "plug-in kind holds service instances (registrar + discovery)")
    return _add(kind, replace=replace)


def _add(kind: RegistryKind, *, replace: bool = False) -> RegistryKind:
    if kind.discovery is None and kind.registrar is None:
        raise ValueError(f"register_kind: {kind.scheme}: a kind needs a discovery (dial targets), a registrar "
                         "(serve(registry=...)), or both")
    load_plugins()  # waypost's own kinds first, so their schemes are taken even before the first look-up
    with _lock:
        for s in (kind.scheme, *kind.aliases):
            taken = SCHEMES.get(s)
            if taken is None or taken == kind:
                continue
            if s in _OWN_SCHEMES or not replace:
                raise ValueError(f"register_kind: scheme {s!r} is taken by the {taken.title} kind "
                                 f"({taken.target_example})")
        old = KINDS.get(kind.scheme)
        if old is not None:
            for s in (old.scheme, *old.aliases):
                SCHEMES.pop(s, None)
        KINDS[kind.scheme] = kind
        for s in (kind.scheme, *kind.aliases):
            SCHEMES[s] = kind
    return kind


def load_plugins() -> None:
    """Register waypost's own kinds (``BUILTIN_MODULES``), then those of the ``waypost.registries`` entry points
    (once per process). A plug-in that fails to load, or whose object is no ``RegistryKind`` of its entry point's
    name, is logged and skipped: a broken package never breaks dialing the others."""
    global _plugins_loaded
    with _lock:
        if _plugins_loaded:
            return
        _plugins_loaded = True
        for name in BUILTIN_MODULES:
            own: RegistryKind = importlib.import_module(name).KIND
            _add(own)
            _OWN_SCHEMES.update((own.scheme, *own.aliases))
        for ep in metadata.entry_points(group=ENTRY_POINT_GROUP):
            try:
                obj = ep.load()
                kind = obj() if callable(obj) and not isinstance(obj, RegistryKind) else obj
                if kind.scheme != ep.name:
                    raise ValueError(f"its kind's scheme is {kind.scheme!r}, not the entry point's name")
                register_kind(kind)
            except Exception as e:  # noqa: BLE001 -- any failure of a third party's code: log, skip, go on
                log.warning("waypost: registry plug-in %r (%s) not loaded: %s", ep.name, ep.value, e)


def lookup(scheme: str) -> RegistryKind | None:
    """The kind of a scheme (an alias too; case-insensitive), the plug-ins looked at when no loaded kind has it."""
    scheme = scheme.lower()
    kind = SCHEMES.get(scheme)
    if kind is None and not _plugins_loaded:
        load_plugins()
        kind = SCHEMES.get(scheme)
    return kind


def all_kinds() -> Mapping[str, RegistryKind]:
    """Every kind, plug-ins included, by scheme, in the order messages list them."""
    load_plugins()
    return KINDS


def misdialed(address: str, probe: bool, quote: bool = False) -> str | None:
    """What a direct target's backend at ``address`` probably was meant as, in its kind's words
    (``Words.misdialed``; ``quote``: the target in quotes), when a kind recognises its own server there."""
    for kind in all_kinds().values():
        if kind.misdial is not None:
            meant = part(kind, "misdial")(address, probe)
            if meant:
                return kind.words.misdialed.format(title=kind.title, target=repr(meant) if quote else meant)
    return None


def keyed() -> tuple[str, ...]:
    """The schemes whose URLs ``waypost.connect`` takes (the keyed kinds: waypost's own)."""
    return tuple(k.scheme for k in all_kinds().values() if k.keyed)


def instance_registries() -> tuple[str, ...]:
    """The schemes of the kinds ``serve()`` registers in through their own publisher (consul, zk, plug-ins)."""
    return tuple(k.scheme for k in all_kinds().values() if k.holds_instances)


def scheme_of(url: str) -> str:
    """The scheme of a URL, lower case ("" when it has no ``://``)."""
    scheme, sep, _ = url.strip().partition("://")
    return scheme.lower() if sep else ""


def kind_of(url: str) -> RegistryKind | None:
    """The kind a URL or dial target names by its scheme (an alias too); None for any other."""
    scheme = scheme_of(url)
    return lookup(scheme) if scheme else None


#: the generic resolver and registration, built over a kind's ``discovery`` and ``registrar``
_GENERIC = {"resolver": ("discovery", "waypost.kinds.resolver:KindResolver"),
            "publisher": ("registrar", "waypost.kinds.registration:KindRegistration")}


def part(kind: RegistryKind, name: str) -> Any:
    """A kind's part (``resolver``, ``publisher``, ``parse_url``, ``console_source``, ``parse_target``,
    ``registrar``, ``discovery``), loaded; a missing client library is an ``ImportError`` saying what to install.
    The ``resolver`` of a kind is the generic one over its ``discovery``, bound to the kind (so is the
    ``publisher`` of a kind that gives a ``registrar``)."""
    ref = getattr(kind, name, None)
    if ref is None and name in _GENERIC and getattr(kind, _GENERIC[name][0]) is not None:
        return functools.partial(load(_GENERIC[name][1]), kind)
    if ref is None:
        raise LookupError(f"the {kind.title} kind has no {name}")
    try:
        return load(ref, f"the {kind.title} kind's {name}")
    except ImportError as e:
        hint = f" ({kind.install_hint})" if kind.install_hint else ""
        raise ImportError(f"{e}{hint}") from e

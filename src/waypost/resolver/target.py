"""Dial targets -> validated ``Target``.

Accepted forms (the scheme is case-insensitive):

- ``direct:///10.0.0.1:8080,10.0.0.2:8080``: fixed addresses (``host:port``, IPv6 in brackets, port
  required). gRPC's ``ipv4:a:1,b:2`` / ``ipv6:[::1]:1`` and a plain ``host:port[,host:port]`` are
  the same thing and come out with scheme ``direct``.
- ``SCHEME://...`` of a registry kind (``kind_table.py``; each kind's package under ``waypost.registries`` has
  its grammar): ``SCHEME://HOST:PORT,.../SERVICE?PARAMS`` (``parse_service_target``), or the kind's own parser's
  (``parse_target``), e.g. go-zero's ``etcd:///h1:2379?key=greet.rpc``. The parameters a kind's targets take are
  its ``target_params``; unknown parameters are errors.

Passwords never appear in ``repr(target)``, ``str(target)`` or error messages.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import NoReturn
from urllib.parse import unquote

from .. import kind_table as _kinds
from ..discovery.formats import DEFAULT_FORMAT
from ..errors import InvalidTarget, did_you_mean
from ..kind_table import SCHEMES, RegistryKind, all_kinds, keyed, lookup
from ..netutil import AddressError, join_host_port, parse_host_port
from ..redaction import redact_url as redact

# gRPC's forms of direct addresses (``ipv4:a:1,b:2``, ``ipv6:[::1]:1``); they come out with scheme direct
_ADDRESS_SCHEMES = ("ipv4", "ipv6")
#: gRPC's port of a name or address given without one
#: gRPC's port of an address given without one (``ipv4:``, ``ipv6:``)
GRPC_DEFAULT_PORT = 443

#: examples of the target forms that are no kind's scheme
_OTHER_EXAMPLES = {
    "ipv4": "ipv4:127.0.0.1:8080,127.0.0.2:8080",
    "ipv6": "ipv6:[::1]:8080",
}


def known_schemes() -> tuple[str, ...]:
    """Every scheme a target may have, in the order messages list them (plug-in kinds included)."""
    all_kinds()
    return (*SCHEMES, *_ADDRESS_SCHEMES)


def example(scheme: str) -> str | None:
    """A dial target of ``scheme`` (an alias or gRPC's address forms too), or None."""
    kind = lookup(scheme) if scheme not in _OTHER_EXAMPLES else None
    if kind is not None:  # an alias: the kind's example in its words (discov:///... for etcd:///...)
        return kind.target_example.replace(f"{kind.scheme}:", f"{scheme}:", 1)
    return _OTHER_EXAMPLES.get(scheme)


def _first_example() -> str | None:
    """The target shown when a text names no kind: the first keyed kind's."""
    schemes = keyed()
    return example(schemes[0]) if schemes else None


_TRUE = ("1", "true")
_FALSE = ("0", "false")
# names people carry over from registry URLs
_RENAMED = {"ca": "cacert", "cert": "certfile", "username": "user", "pass": "password"}
# gRPC/go-zero schemes we know of but do not implement, for a precise message
_UNSUPPORTED = ("unix", "unix-abstract", "vsock", "xds", "passthrough")

_SCHEME_RE = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*")
#: whitespace and control characters: refused in a target, a key, a service name
BAD_CHARS_RE = re.compile(r"[\x00-\x20\x7f]")
_BAD_ESCAPE_RE = re.compile(r"%(?![0-9A-Fa-f]{2})")


@dataclass(frozen=True)
class Target:
    """A parsed dial target. ``endpoints`` are ``host:port`` strings: the backends for ``direct``, else what the
    kind's grammar says (the registry's hosts, the name to resolve, none). ``key`` is the service (or key) to
    read, ``format`` a keyed kind's wire format, ``authority`` what a kind's grammar keeps from it (a store's
    name, a DNS server)."""

    scheme: str
    endpoints: tuple[str, ...]
    key: str | None = None
    format: str = DEFAULT_FORMAT
    options: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    raw: str = field(default="", repr=False)
    authority: str = ""
    #: a target of several sources (``parse_targets``, scheme ``multi``): each source's own Target
    sources: tuple[Target, ...] = ()

    @property
    def uses_registry(self) -> bool:
        """True for targets resolved through a keyed registry (``waypost.connect``'s kinds)."""
        return self.scheme in keyed()

    @property
    def exact(self) -> bool:
        """go-zero's exact match: subscribe to the key itself instead of the ``key/`` prefix."""
        return self.options.get("exact") == "1"

    @property
    def cache_file(self) -> str | None:
        """``?cache=PATH``: where the subscriber keeps its last list (None: no cache file)."""
        return self.options.get("cache")

    @property
    def redacted(self) -> str:
        """The target text with any password replaced by ``***`` (safe to log)."""
        return redact(self.raw)

    def registry_url(self) -> str:
        """The URL ``waypost.connect`` takes for this target's registry (a keyed kind's: its
        ``target_registry_url``). This string carries the password, if any: do not log it."""
        kind = lookup(self.scheme)
        if kind is None or kind.target_registry_url is None:
            raise InvalidTarget(f"{self.scheme} targets have no registry: {self.redacted}")
        url: str = _kinds.part(kind, "target_registry_url")(self)
        return url

    def __repr__(self) -> str:
        options = {k: ("***" if k == "password" else v) for k, v in self.options.items()}
        return (
            f"Target(scheme={self.scheme!r}, endpoints={self.endpoints!r}, key={self.key!r}, "
            f"format={self.format!r}, options={options!r}, authority={self.authority!r}, "
            f"raw={self.redacted!r})"
        )

    def __str__(self) -> str:
        return self.redacted

    def __hash__(self) -> int:
        return hash(self.raw)


def parse_targets(targets: Sequence[str]) -> Target:
    """Several targets as one (scheme ``multi``): the union of their backends, e.g. the same service in two
    registries that back each other up. Each is parsed by ``parse_target``; a single one is returned as it is."""
    if isinstance(targets, str) or not isinstance(targets, Sequence):
        raise InvalidTarget(f"expected a list of targets, got {type(targets).__name__}")
    parsed: list[Target] = []
    for i, text in enumerate(targets):
        try:
            t = parse_target(text)
        except InvalidTarget as e:
            raise InvalidTarget(f"target {i + 1} of {len(targets)}: {e}") from None
        if t.raw not in [p.raw for p in parsed]:
            parsed.append(t)
    if not parsed:
        shown = [t for t in (_first_example(), *(example(s) for s in _kinds.instance_registries()[:1])) if t]
        raise InvalidTarget(f"an empty list of targets; for example {shown!r}")
    if len(parsed) == 1:
        return parsed[0]
    raw = " + ".join(t.raw for t in parsed)
    return Target(scheme="multi", endpoints=(), raw=raw, sources=tuple(parsed))


def parse_target(target: str) -> Target:
    """Parse and validate a dial target; raise ``InvalidTarget`` saying what is wrong, with an example."""
    if not isinstance(target, str):
        raise InvalidTarget(f"a target must be a string, got {type(target).__name__}")
    if not target:
        raise InvalidTarget(f"empty target; for example {_first_example()} or {example('direct')}")
    if BAD_CHARS_RE.search(target):
        raise InvalidTarget(f"target {redact(target)!r} contains whitespace or control characters")
    if "://" in target:
        scheme, _, rest = target.partition("://")
        if not _SCHEME_RE.fullmatch(scheme):
            if _looks_like_addresses(scheme):
                # e.g. "127.0.0.1:80://x" -- not a scheme at all
                fail("", target, f"{scheme!r} is not a scheme")
            fail("", target, f"{scheme!r} is not a valid scheme name")
        scheme = scheme.lower()
        return _parse_hierarchical(scheme, rest, target)
    head, colon, rest = target.partition(":")
    lowered = head.lower()
    if colon and lowered in (*_ADDRESS_SCHEMES, "dns"):
        return _parse_opaque(lowered, rest, target)
    if colon and (lookup(lowered) is not None or lowered in _ADDRESS_SCHEMES):
        fail(
            lowered,
            target,
            f"{lowered} targets are written {lowered}:///...; for a server named {head!r} write "
            f"direct:///{target}",
        )
    if colon and lowered in _UNSUPPORTED:
        _unknown_scheme(lowered, target)
    # gRPC-style plain "host:port" (comma-separated list accepted): direct addresses
    endpoints = endpoints_of(target, "direct", target, what="address")
    return Target(scheme="direct", endpoints=endpoints, raw=target)


# ---------------------------------------------------------------------------------------------


def _parse_hierarchical(scheme: str, rest: str, raw: str) -> Target:
    if "#" in rest:
        fail(scheme, raw, "a target cannot have a '#fragment'")
    before_query, has_query, query = rest.partition("?")
    authority, slash, path = before_query.partition("/")
    path = slash + path
    found = lookup(scheme)
    if found is None or scheme in _ADDRESS_SCHEMES:
        if scheme in _ADDRESS_SCHEMES and not authority:
            return _parse_opaque(scheme, rest, raw)
        _unknown_scheme(scheme, raw)
    kind = found.scheme
    # An '@' past the authority is almost always a password with an unescaped '/', '?' or '#':
    # refuse without quoting pieces of it.
    if "@" in path or "@" in query:
        fail(scheme, raw, "unexpected '@' after the host list; percent-escape '@' in keys (%40) and "
              "'/', '?', '#', '@' in passwords (%2F, %3F, %23, %40)")
    if "@" in authority and not found.credentials:
        fail(scheme, raw, f"{scheme} targets take no credentials")
    params = _query(query, scheme, raw) if has_query else {}
    allowed = found.target_params
    for name in params:
        if name not in allowed:
            _unknown_param(scheme, raw, name, allowed)

    if kind == "direct":
        if authority:
            fail(scheme, raw, f"direct targets have no authority ({authority!r}): use three slashes")
        return Target(scheme="direct", endpoints=endpoints_of(path[1:], scheme, raw, what="address"), raw=raw)
    if found.parse_target is not None:
        # the scheme as written: an alias's messages name it (discov:///... for etcd's)
        parsed: Target = _kinds.part(found, "parse_target")(scheme, authority, path, params, raw)
        return parsed
    return parse_service_target(found, authority, path, params, raw)


def _parse_opaque(scheme: str, rest: str, raw: str) -> Target:
    """gRPC's ``ipv4:a:1,b:2``, ``ipv6:[::1]:1`` (port default 443) and ``dns:host:port``."""
    if "?" in rest or "#" in rest:
        fail(scheme, raw, f"{scheme} targets take no parameters")
    rest = rest.lstrip("/")
    if scheme == "dns":  # gRPC's dns:host:port: the dns kind's dns:///host:port
        dns = lookup("dns")
        assert dns is not None
        parsed: Target = _kinds.part(dns, "parse_target")("dns", "", "/" + rest, {}, raw)
        return parsed
    endpoints = endpoints_of(rest, scheme, raw, what="address", default_port=GRPC_DEFAULT_PORT)
    for endpoint in endpoints:
        host = parse_host_port(endpoint)[0]
        if (scheme == "ipv6") != (":" in host) or (scheme == "ipv4" and not _is_ipv4(host)):
            fail(scheme, raw, f"{endpoint!r} is not an {scheme.upper()} address")
    return Target(scheme="direct", endpoints=endpoints, raw=raw)


def parse_service_target(kind: RegistryKind, authority: str, path: str, params: dict[str, str], raw: str) -> Target:
    """The grammar of the kinds that hold service instances (``consul://HOST:PORT/SERVICE?...``,
    ``zk://H1:P1,H2:P2/SERVICE``, plug-ins): the registry's hosts in the authority (at most ``kind.max_hosts``;
    ``kind.default_port`` when a host has none), the service in the path, the parameters checked against
    ``kind.target_params`` already. ``tls=`` is normalised to 1/0; ``tag=`` is a list without empty tags."""
    scheme = kind.scheme
    default_port = kind.default_port
    if not authority:
        fail(scheme, raw, f"the {kind.title} hosts go in the authority: {kind.target_example}")
    hosts = endpoints_of(authority, scheme, raw, what=f"{scheme} host", default_port=default_port)
    if kind.max_hosts is not None and len(hosts) > kind.max_hosts:
        many = "one host" if kind.max_hosts == 1 else f"at most {kind.max_hosts} hosts"
        fail(scheme, raw, f"a {scheme} target names {many} (the {kind.title} registry knows its peers)")
    service = unquote_strict(path, scheme, raw).strip("/")
    if not service:
        fail(scheme, raw, f"missing the service name after the hosts: {kind.target_example}")
    if "/" in service or BAD_CHARS_RE.search(service):
        fail(scheme, raw, f"the service name {service!r} cannot contain '/' or control characters")
    options: dict[str, str] = {}
    for name, value in params.items():
        if name == "tls":
            lowered = value.lower()
            if lowered not in _TRUE + _FALSE:
                fail(scheme, raw, f"tls= expects 1, 0, true or false, got {value!r}")
            value = "1" if lowered in _TRUE else "0"
        elif not value:
            fail(scheme, raw, f"empty {name}=")
        elif name == "tag" and any(not t for t in value.split(",")):
            fail(scheme, raw, "empty tag in tag=")
        options[name] = value
    if ("certfile" in options) != ("keyfile" in options):
        fail(scheme, raw, "certfile= and keyfile= go together")
    return Target(scheme=scheme, endpoints=hosts, key=service, options=MappingProxyType(options), raw=raw)


def _query(query: str, scheme: str, raw: str) -> dict[str, str]:
    """Go's url.ParseQuery semantics ('+' is a space, bad escapes are errors), duplicates refused."""
    params: dict[str, str] = {}
    for part in query.split("&"):
        if not part:
            continue
        name, _, value = part.partition("=")
        name = unquote_strict(name.replace("+", " "), scheme, raw)
        value = unquote_strict(value.replace("+", " "), scheme, raw)
        if not name:
            fail(scheme, raw, f"query parameter without a name: {redact(part)!r}")
        if name in params:
            fail(scheme, raw, f"query parameter {name!r} is given twice")
        params[name] = value
    return params


def unquote_strict(text: str, scheme: str, raw: str) -> str:
    """Percent-decode ``text`` as UTF-8, refusing malformed escapes."""
    if _BAD_ESCAPE_RE.search(text):
        fail(scheme, raw, "malformed %-escape (expected % followed by two hex digits)")
    try:
        decoded = unquote(text, errors="strict")
    except UnicodeDecodeError:
        fail(scheme, raw, "%-escapes that are not UTF-8")
    return decoded


def endpoints_of(
    text: str, scheme: str, raw: str, *, what: str, default_port: int | None = None
) -> tuple[str, ...]:
    if not text:
        plural = "addresses" if what == "address" else what + "s"
        fail(scheme, raw, f"no {plural} given: {example(scheme) or example('direct')}")
    out: list[str] = []
    for i, part in enumerate(text.split(",")):
        if not part:
            fail(scheme, raw, f"empty {what} at position {i + 1} of the comma-separated list")
        endpoint = join_host_port(*_hostport(part, scheme, raw, default_port=default_port, what=what))
        if endpoint not in out:
            out.append(endpoint)
    return tuple(out)


def _hostport(text: str, scheme: str, raw: str, *, default_port: int | None, what: str) -> tuple[str, int]:
    """One ``host:port`` (``[v6]:port``) by netutil's rules: the host (IPv6 without brackets) and the port."""
    try:
        return parse_host_port(text, what=what, default_port=default_port)
    except AddressError as e:
        fail(scheme, raw, str(e))


def _is_ipv4(host: str) -> bool:
    try:
        ipaddress.IPv4Address(host)
    except ValueError:
        return False
    return True


def _looks_like_addresses(text: str) -> bool:
    return bool(re.fullmatch(r"[0-9.:\[\],]+", text))


def _unknown_param(scheme: str, raw: str, name: str, allowed: tuple[str, ...]) -> NoReturn:
    if not allowed:
        fail(scheme, raw, f"unknown query parameter {name!r}: {scheme} targets take no parameters")
    hint = f" (did you mean {_RENAMED[name]!r}?)" if name in _RENAMED and _RENAMED[name] in allowed else ""
    hint = hint or did_you_mean(name, allowed)
    fail(scheme, raw, f"unknown query parameter {name!r}{hint}; expected one of: {', '.join(allowed)}")


def _unknown_scheme(scheme: str, raw: str) -> NoReturn:
    note = " (not supported by waypost)" if scheme in _UNSUPPORTED else did_you_mean(scheme, known_schemes())
    raise InvalidTarget(
        f"unknown target scheme {scheme!r}{note} in {redact(raw)!r}; known schemes: {', '.join(known_schemes())}"
        f" (e.g. {_first_example()})"
    )


def fail(scheme: str, raw: str, message: str) -> NoReturn:
    """Raise ``InvalidTarget`` for ``raw``, a target of ``scheme``: ``message`` and an example of the scheme."""
    shown = example(scheme)
    tail = f" (example: {shown})" if shown and shown not in message else ""
    label = f"invalid {scheme} target" if scheme else "invalid target"
    raise InvalidTarget(f"{label} {redact(raw)!r}: {message}{tail}")


def target_for_registry(registry: object, key: str) -> str:
    """The target string that dials ``key`` in ``registry`` (a ``waypost.connect`` result: go-zero's
    ``EtcdConf{Hosts, Key}`` as one object and a key), with its user, password and TLS files; ``connect`` of
    the same settings returns the same shared registry, so the channel reads through the same connection."""
    if not isinstance(key, str) or not key or key.endswith("/") or key.startswith("/"):
        raise InvalidTarget(f"dial: key= must be a service key such as 'greet.rpc', got {key!r}")
    dial_target = getattr(registry, "dial_target", None)
    if not callable(dial_target):
        raise InvalidTarget(f"dial: expected a target string or a registry from waypost.connect(), got "
                            f"{type(registry).__name__}")
    target: str = dial_target(key)
    return target

"""Dial targets -> validated ``Target``.

Accepted forms (the scheme is case-insensitive):

- ``direct:///10.0.0.1:8080,10.0.0.2:8080``: fixed addresses (``host:port``, IPv6 in brackets, port
  required). gRPC's ``ipv4:a:1,b:2`` / ``ipv6:[::1]:1`` and a plain ``host:port[,host:port]`` are
  the same thing and come out with scheme ``direct``.
- ``etcd:///h1:2379,h2:2379?key=greet.rpc`` (go-zero's current form; the key is URL-escaped) and
  ``discov:///...`` (the same; comes out with scheme ``etcd``).
- ``etcd://h1:2379/greet.rpc`` (go-zero's legacy form): the etcd hosts are the authority and the key is
  the path with its slashes trimmed, as go-zero does, so a key's leading ``/`` cannot be written in
  this form (``etcd://h:2379//svc`` means key ``svc``); use ``?key=%2Fsvc`` for such keys. Older
  go-zero versions wrote several comma-separated hosts in the authority; that is accepted too.
- ``memory:///?key=K`` or ``memory://NAME/?key=K``: the in-process registry NAME.
- ``dns:///host:port`` or ``dns://DNS_IP:DNS_PORT/host:port`` (port default 443, DNS port default 53).
- ``consul://HOST:PORT/SERVICE`` (grpc-consul-resolver's form; port default 8500): the passing instances of a
  service in Consul's catalog. Parameters: ``tag=T`` (several: ``tag=a,b``, all required), ``dc=NAME``,
  ``token=ACL_TOKEN`` (else ``$CONSUL_HTTP_TOKEN``), and ``tls=1``, ``cacert``, ``certfile``, ``keyfile``.
- ``zk://H1:2181,H2:2181/SERVICE`` (port default 2181): the instances a Kratos service (or waypost) keeps as
  ephemeral nodes under ``/microservices/SERVICE``. Parameters: ``namespace=/PATH`` (Kratos' ``WithRootPath``),
  ``session_timeout=SECONDS``.
- ``k8s://NAMESPACE/SERVICE:PORT`` and the other forms of ``resolver/k8s_target.py`` (Kubernetes' grammar).
- a plug-in kind's (``registry/kinds.py``): ``SCHEME://HOST:PORT,.../SERVICE?PARAMS``, or its own parser's.

Query parameters of etcd targets: ``key``, ``format=gozero|etcd-naming|kratos`` (default gozero),
``exact=1`` (go-zero's exact key match), ``cache=PATH`` (the on-disk cache of the last list, read only
when etcd cannot be read at start: ``waypost.discovery.cache``), and registry options ``user``, ``password``, ``tls=1``,
``cacert``, ``certfile``, ``keyfile``, ``dial_timeout``, ``request_timeout`` (seconds). An etcd host
without a port means port 2379, as in registry URLs. The TLS files have these names (not ``ca``/``cert``/``key`` as
in a registry URL) because ``key`` is the service key in go-zero's targets. Credentials may also be
written as ``etcd://user:pass@/h1:2379?key=K`` or ``etcd://user:pass@h:2379/K``. Memory targets take
``key``, ``format`` and ``exact``; direct and dns targets take none. Unknown parameters are errors.

Passwords never appear in ``repr(target)``, ``str(target)`` or error messages.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import NoReturn
from urllib.parse import quote, unquote, urlencode

from ..errors import InvalidTarget, did_you_mean
from ..netutil import AddressError, join_host_port, parse_host_port
from ..redaction import redact_url as redact
from ..registry import kinds as _kinds
from ..registry.formats import DEFAULT_FORMAT, FORMAT_NAMES
from ..registry.kinds import KEYED, KINDS, SCHEMES, RegistryKind, all_kinds, lookup

# gRPC's forms of direct addresses (``ipv4:a:1,b:2``, ``ipv6:[::1]:1``); they come out with scheme direct
_ADDRESS_SCHEMES = ("ipv4", "ipv6")
#: gRPC's port of a name or address given without one
#: gRPC's port of an address given without one (``ipv4:``, ``ipv6:``)
GRPC_DEFAULT_PORT = 443

#: examples of the target forms that are no kind's own scheme
_OTHER_EXAMPLES = {
    "discov": KINDS["etcd"].target_example.replace("etcd:", "discov:", 1),
    "ipv4": "ipv4:127.0.0.1:8080,127.0.0.2:8080",
    "ipv6": "ipv6:[::1]:8080",
}


def known_schemes() -> tuple[str, ...]:
    """Every scheme a target may have, in the order messages list them (plug-in kinds included)."""
    all_kinds()
    return (*SCHEMES, *_ADDRESS_SCHEMES)


def example(scheme: str) -> str | None:
    """A dial target of ``scheme`` (an alias or gRPC's address forms too), or None."""
    kind = SCHEMES.get(scheme)
    if kind is not None and kind.scheme == scheme:
        return kind.target_example
    return _OTHER_EXAMPLES.get(scheme)


_REGISTRY_OPTIONS = ("user", "password", "tls", "cacert", "certfile", "keyfile", "dial_timeout", "request_timeout")
_SECONDS_PARAMS = ("dial_timeout", "request_timeout")
# the built-in grammars' parameters; every other kind's are its ``target_params``
_BUILTIN_PARAMS = {
    "etcd": ("key", "format", "exact", "cache", *_REGISTRY_OPTIONS),
    "memory": ("key", "format", "exact"),
    "direct": (),
}
_BOOL_PARAMS = ("exact", "tls")
_TRUE = ("1", "true")
_FALSE = ("0", "false")
# names people carry over from registry URLs
_RENAMED = {"ca": "cacert", "cert": "certfile", "username": "user", "pass": "password"}
# gRPC/go-zero schemes we know of but do not implement, for a precise message
_UNSUPPORTED = ("unix", "unix-abstract", "vsock", "xds", "passthrough")

_SCHEME_RE = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*")
_BAD_CHARS_RE = re.compile(r"[\x00-\x20\x7f]")
_BAD_ESCAPE_RE = re.compile(r"%(?![0-9A-Fa-f]{2})")


@dataclass(frozen=True)
class Target:
    """A parsed dial target. ``endpoints`` are ``host:port`` strings: the backends for ``direct``,
    the etcd hosts for ``etcd``, the name to resolve for ``dns``, none for ``memory``.
    ``authority`` is the memory registry name or the DNS server (``ip:port``), else empty."""

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
        """True for targets resolved through a registry (etcd, memory)."""
        return self.scheme in KEYED

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
        """The URL ``waypost.connect`` takes for this target's registry.

        ``etcd://[user:pass@]h1:2379,h2:2379[?tls=1&ca=...&cert=...&key=...]`` or ``memory://NAME``.
        This string carries the password, if any: do not log it.
        """
        if self.scheme == "memory":
            return f"memory://{self.authority}"
        if self.scheme != "etcd":
            raise InvalidTarget(f"{self.scheme} targets have no registry: {self.redacted}")
        userinfo = ""
        if "user" in self.options:
            userinfo = quote(self.options["user"], safe="")
            if "password" in self.options:
                userinfo += ":" + quote(self.options["password"], safe="")
            userinfo += "@"
        renames = (("tls", "tls"), ("cacert", "ca"), ("certfile", "cert"), ("keyfile", "key"),
                   ("dial_timeout", "dial_timeout"), ("request_timeout", "request_timeout"))
        query = [(url_name, self.options[name]) for name, url_name in renames if name in self.options]
        suffix = "?" + urlencode(query, quote_via=quote, safe="/") if query else ""
        return f"etcd://{userinfo}{','.join(self.endpoints)}{suffix}"

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
        raise InvalidTarget(f"an empty list of targets; for example [{example('etcd')!r}, {example('consul')!r}]")
    if len(parsed) == 1:
        return parsed[0]
    raw = " + ".join(t.raw for t in parsed)
    return Target(scheme="multi", endpoints=(), raw=raw, sources=tuple(parsed))


def parse_target(target: str) -> Target:
    """Parse and validate a dial target; raise ``InvalidTarget`` saying what is wrong, with an example."""
    if not isinstance(target, str):
        raise InvalidTarget(f"a target must be a string, got {type(target).__name__}")
    if not target:
        raise InvalidTarget(f"empty target; for example {example('etcd')} or {example('direct')}")
    if _BAD_CHARS_RE.search(target):
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
    endpoints = _endpoints(target, "direct", target, what="address")
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
    if "@" in authority and kind != "etcd":
        fail(scheme, raw, f"{scheme} targets take no credentials")
    params = _query(query, scheme, raw) if has_query else {}
    allowed = _BUILTIN_PARAMS.get(kind, found.target_params)
    for name in params:
        if name not in allowed:
            _unknown_param(scheme, raw, name, allowed)

    if kind == "direct":
        if authority:
            fail(scheme, raw, f"direct targets have no authority ({authority!r}): use three slashes")
        return Target(scheme="direct", endpoints=_endpoints(path[1:], scheme, raw, what="address"), raw=raw)
    if kind == "memory":
        return _parse_memory(authority, path, params, raw)
    if kind == "etcd":
        return _parse_etcd(scheme, authority, path, params, raw)
    if found.parse_target is not None:
        parsed: Target = _kinds.part(found, "parse_target")(kind, authority, path, params, raw)
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
    endpoints = _endpoints(rest, scheme, raw, what="address", default_port=GRPC_DEFAULT_PORT)
    for endpoint in endpoints:
        host = parse_host_port(endpoint)[0]
        if (scheme == "ipv6") != (":" in host) or (scheme == "ipv4" and not _is_ipv4(host)):
            fail(scheme, raw, f"{endpoint!r} is not an {scheme.upper()} address")
    return Target(scheme="direct", endpoints=endpoints, raw=raw)


def _parse_memory(authority: str, path: str, params: dict[str, str], raw: str) -> Target:
    if path not in ("", "/"):
        fail("memory", raw, f"unexpected path {path!r}: the key goes in ?key=")
    key = _key(params, "memory", raw)
    fmt, options = _common_options(params, "memory", raw)
    return Target(scheme="memory", endpoints=(), key=key, format=fmt, options=options, raw=raw,
                  authority=authority)


def parse_service_target(kind: RegistryKind, authority: str, path: str, params: dict[str, str], raw: str) -> Target:
    """The grammar of the kinds that hold service instances (``consul://HOST:PORT/SERVICE?...``,
    ``zk://H1:P1,H2:P2/SERVICE``, plug-ins): the registry's hosts in the authority (at most ``kind.max_hosts``;
    ``kind.default_port`` when a host has none), the service in the path, the parameters checked against
    ``kind.target_params`` already. ``tls=`` is normalised to 1/0; ``tag=`` is a list without empty tags."""
    scheme = kind.scheme
    default_port = kind.default_port
    if not authority:
        fail(scheme, raw, f"the {kind.title} hosts go in the authority: {kind.target_example}")
    hosts = _endpoints(authority, scheme, raw, what=f"{scheme} host", default_port=default_port)
    if kind.max_hosts is not None and len(hosts) > kind.max_hosts:
        many = "one host" if kind.max_hosts == 1 else f"at most {kind.max_hosts} hosts"
        fail(scheme, raw, f"a {scheme} target names {many} (the {kind.title} registry knows its peers)")
    service = unquote_strict(path, scheme, raw).strip("/")
    if not service:
        fail(scheme, raw, f"missing the service name after the hosts: {kind.target_example}")
    if "/" in service or _BAD_CHARS_RE.search(service):
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


def _parse_etcd(scheme: str, authority: str, path: str, params: dict[str, str], raw: str) -> Target:
    userinfo = ""
    if "@" in authority:
        userinfo, _, authority = authority.rpartition("@")
    if authority:
        # legacy form: hosts in the authority, key in the path (go-zero trims the slashes)
        hosts = _endpoints(authority, scheme, raw, what="etcd host", default_port=KINDS["etcd"].default_port)
        key = unquote_strict(path, scheme, raw).strip("/")
        if key and "key" in params:
            fail(scheme, raw, "the key is given twice (in the path and as ?key=); use one: "
                  f"{example(scheme)}")
        if not key:
            key = _key(params, scheme, raw)
    else:
        hosts = _endpoints(path[1:], scheme, raw, what="etcd host", default_port=KINDS["etcd"].default_port)
        key = _key(params, scheme, raw)
    fmt, options = _common_options(params, scheme, raw)
    if userinfo:
        if "user" in options or "password" in options:
            fail(scheme, raw, "credentials are given twice (user:pass@ and ?user=/?password=)")
        user, colon, password = userinfo.partition(":")
        user = unquote_strict(user, scheme, raw)
        if not user:
            fail(scheme, raw, "empty user name before '@'")
        options["user"] = user
        if colon:
            options["password"] = unquote_strict(password, scheme, raw)
    if "password" in options and "user" not in options:
        fail(scheme, raw, "a password needs a user")
    for name in ("user", "cacert", "certfile", "keyfile", "cache"):
        if name in options and not options[name]:
            fail(scheme, raw, f"empty {name}=")
    if ("certfile" in options) != ("keyfile" in options):
        hint = ""
        if "keyfile" not in options and key.endswith((".pem", ".key", ".crt")):
            hint = " (key= is the service key; the TLS private key file is keyfile=)"
        fail(scheme, raw, f"certfile= and keyfile= go together{hint}")
    return Target(scheme="etcd", endpoints=hosts, key=key, format=fmt,
                  options=MappingProxyType(options), raw=raw)


def _key(params: dict[str, str], scheme: str, raw: str) -> str:
    key = params.get("key")
    if key is None:
        fail(scheme, raw, f"{scheme} target needs ?key=: {example(scheme)}")
    if not key:
        fail(scheme, raw, f"empty ?key=: {example(scheme)}")
    if _BAD_CHARS_RE.search(key.replace(" ", "")):
        fail(scheme, raw, "the key contains control characters")
    return key


def _common_options(params: dict[str, str], scheme: str, raw: str) -> tuple[str, dict[str, str]]:
    fmt = params.get("format", DEFAULT_FORMAT)
    if fmt not in FORMAT_NAMES:
        close = did_you_mean(fmt, FORMAT_NAMES)
        fail(scheme, raw, f"unknown format {fmt!r}{close}; expected one of: {', '.join(FORMAT_NAMES)}")
    options: dict[str, str] = {}
    for name, value in params.items():
        if name in ("key", "format"):
            continue
        if name in _BOOL_PARAMS:
            lowered = value.lower()
            if lowered not in _TRUE + _FALSE:
                fail(scheme, raw, f"{name}= expects 1, 0, true or false, got {value!r}")
            value = "1" if lowered in _TRUE else "0"
        elif name in _SECONDS_PARAMS and not _is_positive_number(value):
            fail(scheme, raw, f"{name}= expects a number of seconds > 0, got {value!r}")
        options[name] = value
    return fmt, options


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


def _endpoints(
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


def _is_positive_number(text: str) -> bool:
    try:
        value = float(text)
    except ValueError:
        return False
    return 0 < value < float("inf")


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
        f" (e.g. {example('etcd')})"
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
    from ..etcd.config import EtcdConfig, default  # the URL grammar's defaults: only what differs is written

    config = getattr(registry, "config", None)
    url = getattr(registry, "url", "")
    if config is None and isinstance(url, str) and url.startswith("memory://"):
        return f"{url}/?{urlencode({'key': key})}"
    if not isinstance(config, EtcdConfig):
        raise InvalidTarget(f"dial: expected a target string or a registry from waypost.connect(), got "
                            f"{type(registry).__name__}")
    endpoints = config.endpoints
    options: list[tuple[str, str]] = [("key", key)]
    if config.username:
        options.append(("user", config.username))
        if config.password:
            options.append(("password", config.password))
    if config.tls:
        options.append(("tls", "1"))
    for name, value in (("cacert", config.ca_file), ("certfile", config.cert_file), ("keyfile", config.key_file)):
        if value:
            options.append((name, value))
    for name in ("dial_timeout", "request_timeout"):
        value = getattr(config, name)
        if value != default(name):
            options.append((name, f"{value:g}"))
    return f"etcd:///{','.join(endpoints)}?{urlencode(options, quote_via=quote, safe='/')}"

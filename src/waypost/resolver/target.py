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
- ``eureka://H1:8761,H2:8761/APP`` (port default 8761): the UP instances of an Eureka application (peers of one
  cluster: one is read, the next when it fails). Parameters: ``path=/eureka`` (the REST API's base path),
  ``interval=5s`` (how often the registry is fetched, a gRPC JSON duration), ``tls=1``.
- ``k8s://NAMESPACE/SERVICE:PORT`` (go-zero's form), ``k8s:///NAMESPACE/SERVICE:PORT`` or ``k8s:///SERVICE:PORT``
  (no namespace: the pod's own, or the kubeconfig context's): the ready endpoints of a Kubernetes Service's
  EndpointSlices. PORT is a number or the name of an EndpointSlice port. Parameters: ``kubeconfig=PATH`` and
  ``context=NAME``. The namespace is ``Target.authority`` ("" when not given) and the service ``Target.key``.

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

from ..durations import DurationError, parse_positive_duration
from ..errors import InvalidTarget, did_you_mean
from ..netutil import AddressError, join_host_port, parse_host_port
from ..redaction import redact_url as redact
from ..registry.formats import DEFAULT_FORMAT, FORMAT_NAMES
from ..registry.kinds import KEYED, KINDS, SCHEMES

# gRPC's forms of direct addresses (``ipv4:a:1,b:2``, ``ipv6:[::1]:1``); they come out with scheme direct
_ADDRESS_SCHEMES = ("ipv4", "ipv6")
KNOWN_SCHEMES = (*SCHEMES, *_ADDRESS_SCHEMES)
#: gRPC's port of a name or address given without one
GRPC_DEFAULT_PORT = KINDS["dns"].default_port
DNS_SERVER_DEFAULT_PORT = 53

EXAMPLES = {
    **{kind.scheme: kind.target_example for kind in KINDS.values()},
    "discov": KINDS["etcd"].target_example.replace("etcd:", "discov:", 1),
    "ipv4": "ipv4:127.0.0.1:8080,127.0.0.2:8080",
    "ipv6": "ipv6:[::1]:8080",
}

_REGISTRY_OPTIONS = ("user", "password", "tls", "cacert", "certfile", "keyfile", "dial_timeout", "request_timeout")
_SECONDS_PARAMS = ("dial_timeout", "request_timeout")
_ALLOWED_PARAMS = {
    "etcd": ("key", "format", "exact", "cache", *_REGISTRY_OPTIONS),
    "memory": ("key", "format", "exact"),
    "direct": (),
    "dns": (),
    "k8s": ("kubeconfig", "context"),
    "consul": ("tag", "dc", "token", "tls", "cacert", "certfile", "keyfile"),
    "zk": ("namespace", "session_timeout"),
    "eureka": ("path", "interval", "tls"),
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
        raise InvalidTarget(f"an empty list of targets; for example [{EXAMPLES['etcd']!r}, {EXAMPLES['consul']!r}]")
    if len(parsed) == 1:
        return parsed[0]
    raw = " + ".join(t.raw for t in parsed)
    return Target(scheme="multi", endpoints=(), raw=raw, sources=tuple(parsed))


def parse_target(target: str) -> Target:
    """Parse and validate a dial target; raise ``InvalidTarget`` saying what is wrong, with an example."""
    if not isinstance(target, str):
        raise InvalidTarget(f"a target must be a string, got {type(target).__name__}")
    if not target:
        raise InvalidTarget(f"empty target; for example {EXAMPLES['etcd']} or {EXAMPLES['direct']}")
    if _BAD_CHARS_RE.search(target):
        raise InvalidTarget(f"target {redact(target)!r} contains whitespace or control characters")
    if "://" in target:
        scheme, _, rest = target.partition("://")
        if not _SCHEME_RE.fullmatch(scheme):
            if _looks_like_addresses(scheme):
                # e.g. "127.0.0.1:80://x" -- not a scheme at all
                _fail("", target, f"{scheme!r} is not a scheme")
            _fail("", target, f"{scheme!r} is not a valid scheme name")
        scheme = scheme.lower()
        return _parse_hierarchical(scheme, rest, target)
    head, colon, rest = target.partition(":")
    lowered = head.lower()
    if colon and lowered in (*_ADDRESS_SCHEMES, "dns"):
        return _parse_opaque(lowered, rest, target)
    if colon and lowered in KNOWN_SCHEMES:
        _fail(
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
        _fail(scheme, raw, "a target cannot have a '#fragment'")
    before_query, has_query, query = rest.partition("?")
    authority, slash, path = before_query.partition("/")
    path = slash + path
    if scheme not in KNOWN_SCHEMES or scheme in _ADDRESS_SCHEMES:
        if scheme in _ADDRESS_SCHEMES and not authority:
            return _parse_opaque(scheme, rest, raw)
        _unknown_scheme(scheme, raw)
    kind = SCHEMES[scheme].scheme
    # An '@' past the authority is almost always a password with an unescaped '/', '?' or '#':
    # refuse without quoting pieces of it.
    if "@" in path or "@" in query:
        _fail(scheme, raw, "unexpected '@' after the host list; percent-escape '@' in keys (%40) and "
              "'/', '?', '#', '@' in passwords (%2F, %3F, %23, %40)")
    if "@" in authority and kind != "etcd":
        _fail(scheme, raw, f"{scheme} targets take no credentials")
    params = _query(query, scheme, raw) if has_query else {}
    allowed = _ALLOWED_PARAMS[kind]
    for name in params:
        if name not in allowed:
            _unknown_param(scheme, raw, name, allowed)

    if kind == "direct":
        if authority:
            _fail(scheme, raw, f"direct targets have no authority ({authority!r}): use three slashes")
        return Target(scheme="direct", endpoints=_endpoints(path[1:], scheme, raw, what="address"), raw=raw)
    if kind == "dns":
        return _parse_dns(scheme, authority, path, raw)
    if kind == "memory":
        return _parse_memory(authority, path, params, raw)
    if kind == "k8s":
        return _parse_k8s(authority, path, params, raw)
    if kind in ("consul", "zk", "eureka"):
        return _parse_service_registry(kind, authority, path, params, raw)
    return _parse_etcd(scheme, authority, path, params, raw)


def _parse_opaque(scheme: str, rest: str, raw: str) -> Target:
    """gRPC's ``ipv4:a:1,b:2``, ``ipv6:[::1]:1`` (port default 443) and ``dns:host:port``."""
    if "?" in rest or "#" in rest:
        _fail(scheme, raw, f"{scheme} targets take no parameters")
    rest = rest.lstrip("/")
    if scheme == "dns":
        return _parse_dns(scheme, "", "/" + rest, raw)
    endpoints = _endpoints(rest, scheme, raw, what="address", default_port=GRPC_DEFAULT_PORT)
    for endpoint in endpoints:
        host = parse_host_port(endpoint)[0]
        if (scheme == "ipv6") != (":" in host) or (scheme == "ipv4" and not _is_ipv4(host)):
            _fail(scheme, raw, f"{endpoint!r} is not an {scheme.upper()} address")
    return Target(scheme="direct", endpoints=endpoints, raw=raw)


def _parse_dns(scheme: str, authority: str, path: str, raw: str) -> Target:
    server = ""
    if authority:
        host, port = _hostport(authority, scheme, raw, default_port=DNS_SERVER_DEFAULT_PORT, what="DNS server")
        server = join_host_port(host, port)
        if ":" not in host and not _is_ipv4(host):
            _fail(scheme, raw, f"the DNS server {server!r} must be an IP address")
    name = path[1:]
    if not name:
        _fail(scheme, raw, "missing the name to resolve")
    if "," in name:
        _fail(scheme, raw, "a dns target names exactly one host:port")
    endpoint = join_host_port(*_hostport(name, scheme, raw, default_port=GRPC_DEFAULT_PORT, what="name"))
    return Target(scheme="dns", endpoints=(endpoint,), raw=raw, authority=server)


def _parse_memory(authority: str, path: str, params: dict[str, str], raw: str) -> Target:
    if path not in ("", "/"):
        _fail("memory", raw, f"unexpected path {path!r}: the key goes in ?key=")
    key = _key(params, "memory", raw)
    fmt, options = _common_options(params, "memory", raw)
    return Target(scheme="memory", endpoints=(), key=key, format=fmt, options=options, raw=raw,
                  authority=authority)


# Kubernetes names: a namespace and a service are DNS-1123 labels; a port name is one too (EndpointSlice ports)
_DNS_LABEL_RE = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")


def _dns_label(text: str, what: str, raw: str) -> str:
    if len(text) > 63 or not _DNS_LABEL_RE.fullmatch(text):
        _fail("k8s", raw, f"{what} {text!r} is not a Kubernetes name (lower-case letters, digits and '-', "
              "starting and ending with a letter or digit, at most 63 characters)")
    return text


def _parse_k8s(authority: str, path: str, params: dict[str, str], raw: str) -> Target:
    """``k8s://ns/svc:port``, ``k8s:///ns/svc:port``, ``k8s:///svc:port``."""
    rest = unquote_strict(path[1:], "k8s", raw)
    if authority:
        namespace, service_port = unquote_strict(authority, "k8s", raw), rest
        if "/" in service_port:
            _fail("k8s", raw, "the namespace is given twice (authority and path): write k8s://NAMESPACE/SERVICE:PORT")
    else:
        namespace, slash, service_port = rest.rpartition("/")
        if slash and not namespace:
            _fail("k8s", raw, "empty namespace before '/'")
        if "/" in namespace:
            _fail("k8s", raw, f"unexpected path {path!r}: write k8s:///NAMESPACE/SERVICE:PORT")
    if not service_port:
        _fail("k8s", raw, "missing SERVICE:PORT")
    if "," in service_port:
        _fail("k8s", raw, "a k8s target names exactly one service")
    service, colon, port = service_port.partition(":")
    if not colon or not port:
        _fail("k8s", raw, f"missing the port after {service!r}: a number or the EndpointSlice port's name, "
              f"e.g. k8s://{namespace or 'default'}/{service or 'greet'}:50051")
    if namespace:
        _dns_label(namespace, "namespace", raw)
    _dns_label(service, "service", raw)
    if port.isdigit():
        if not 0 < int(port) < 65536:
            _fail("k8s", raw, f"port {port} is out of range (1-65535)")
        port = str(int(port))
    else:
        _dns_label(port, "port name", raw)
    options = {"port": port}
    for name in ("kubeconfig", "context"):
        if name in params:
            if not params[name]:
                _fail("k8s", raw, f"empty {name}=")
            options[name] = params[name]
    return Target(scheme="k8s", endpoints=(), key=service, options=MappingProxyType(options), raw=raw,
                  authority=namespace)


def _parse_service_registry(scheme: str, authority: str, path: str, params: dict[str, str], raw: str) -> Target:
    """``consul://HOST:PORT/SERVICE?...`` and ``zk://H1:P1,H2:P2/SERVICE``: the registry's hosts in the
    authority, the service in the path."""
    default_port = KINDS[scheme].default_port
    if not authority:
        _fail(scheme, raw, f"the {scheme} hosts go in the authority: {EXAMPLES[scheme]}")
    hosts = _endpoints(authority, scheme, raw, what=f"{scheme} host", default_port=default_port)
    if scheme == "consul" and len(hosts) > 1:
        _fail(scheme, raw, "one Consul agent per target (the agent knows the cluster)")
    service = unquote_strict(path, scheme, raw).strip("/")
    if not service:
        _fail(scheme, raw, f"missing the service name after the hosts: {EXAMPLES[scheme]}")
    if "/" in service or _BAD_CHARS_RE.search(service):
        _fail(scheme, raw, f"the service name {service!r} cannot contain '/' or control characters")
    options: dict[str, str] = {}
    for name, value in params.items():
        if name == "tls":
            lowered = value.lower()
            if lowered not in _TRUE + _FALSE:
                _fail(scheme, raw, f"tls= expects 1, 0, true or false, got {value!r}")
            value = "1" if lowered in _TRUE else "0"
        elif not value:
            _fail(scheme, raw, f"empty {name}=")
        elif name == "tag" and any(not t for t in value.split(",")):
            _fail(scheme, raw, "empty tag in tag=")
        elif name == "interval":
            try:
                parse_positive_duration(value)
            except DurationError as e:
                _fail(scheme, raw, f"interval={value!r}: {e}")
        elif name == "path" and (not value.startswith("/") or any(c in value for c in "?#% ")):
            _fail(scheme, raw, f"path={value!r} must be a URL path starting with '/' (e.g. path=/eureka)")
        options[name] = value
    if ("certfile" in options) != ("keyfile" in options):
        _fail(scheme, raw, "certfile= and keyfile= go together")
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
            _fail(scheme, raw, "the key is given twice (in the path and as ?key=); use one: "
                  f"{EXAMPLES[scheme]}")
        if not key:
            key = _key(params, scheme, raw)
    else:
        hosts = _endpoints(path[1:], scheme, raw, what="etcd host", default_port=KINDS["etcd"].default_port)
        key = _key(params, scheme, raw)
    fmt, options = _common_options(params, scheme, raw)
    if userinfo:
        if "user" in options or "password" in options:
            _fail(scheme, raw, "credentials are given twice (user:pass@ and ?user=/?password=)")
        user, colon, password = userinfo.partition(":")
        user = unquote_strict(user, scheme, raw)
        if not user:
            _fail(scheme, raw, "empty user name before '@'")
        options["user"] = user
        if colon:
            options["password"] = unquote_strict(password, scheme, raw)
    if "password" in options and "user" not in options:
        _fail(scheme, raw, "a password needs a user")
    for name in ("user", "cacert", "certfile", "keyfile", "cache"):
        if name in options and not options[name]:
            _fail(scheme, raw, f"empty {name}=")
    if ("certfile" in options) != ("keyfile" in options):
        hint = ""
        if "keyfile" not in options and key.endswith((".pem", ".key", ".crt")):
            hint = " (key= is the service key; the TLS private key file is keyfile=)"
        _fail(scheme, raw, f"certfile= and keyfile= go together{hint}")
    return Target(scheme="etcd", endpoints=hosts, key=key, format=fmt,
                  options=MappingProxyType(options), raw=raw)


def _key(params: dict[str, str], scheme: str, raw: str) -> str:
    key = params.get("key")
    if key is None:
        _fail(scheme, raw, f"{scheme} target needs ?key=: {EXAMPLES[scheme]}")
    if not key:
        _fail(scheme, raw, f"empty ?key=: {EXAMPLES[scheme]}")
    if _BAD_CHARS_RE.search(key.replace(" ", "")):
        _fail(scheme, raw, "the key contains control characters")
    return key


def _common_options(params: dict[str, str], scheme: str, raw: str) -> tuple[str, dict[str, str]]:
    fmt = params.get("format", DEFAULT_FORMAT)
    if fmt not in FORMAT_NAMES:
        close = did_you_mean(fmt, FORMAT_NAMES)
        _fail(scheme, raw, f"unknown format {fmt!r}{close}; expected one of: {', '.join(FORMAT_NAMES)}")
    options: dict[str, str] = {}
    for name, value in params.items():
        if name in ("key", "format"):
            continue
        if name in _BOOL_PARAMS:
            lowered = value.lower()
            if lowered not in _TRUE + _FALSE:
                _fail(scheme, raw, f"{name}= expects 1, 0, true or false, got {value!r}")
            value = "1" if lowered in _TRUE else "0"
        elif name in _SECONDS_PARAMS and not _is_positive_number(value):
            _fail(scheme, raw, f"{name}= expects a number of seconds > 0, got {value!r}")
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
            _fail(scheme, raw, f"query parameter without a name: {redact(part)!r}")
        if name in params:
            _fail(scheme, raw, f"query parameter {name!r} is given twice")
        params[name] = value
    return params


def unquote_strict(text: str, scheme: str, raw: str) -> str:
    """Percent-decode ``text`` as UTF-8, refusing malformed escapes."""
    if _BAD_ESCAPE_RE.search(text):
        _fail(scheme, raw, "malformed %-escape (expected % followed by two hex digits)")
    try:
        decoded = unquote(text, errors="strict")
    except UnicodeDecodeError:
        _fail(scheme, raw, "%-escapes that are not UTF-8")
    return decoded


def _endpoints(
    text: str, scheme: str, raw: str, *, what: str, default_port: int | None = None
) -> tuple[str, ...]:
    if not text:
        plural = "addresses" if what == "address" else what + "s"
        _fail(scheme, raw, f"no {plural} given: {EXAMPLES.get(scheme, EXAMPLES['direct'])}")
    out: list[str] = []
    for i, part in enumerate(text.split(",")):
        if not part:
            _fail(scheme, raw, f"empty {what} at position {i + 1} of the comma-separated list")
        endpoint = join_host_port(*_hostport(part, scheme, raw, default_port=default_port, what=what))
        if endpoint not in out:
            out.append(endpoint)
    return tuple(out)


def _hostport(text: str, scheme: str, raw: str, *, default_port: int | None, what: str) -> tuple[str, int]:
    """One ``host:port`` (``[v6]:port``) by netutil's rules: the host (IPv6 without brackets) and the port."""
    try:
        return parse_host_port(text, what=what, default_port=default_port)
    except AddressError as e:
        _fail(scheme, raw, str(e))


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
        _fail(scheme, raw, f"unknown query parameter {name!r}: {scheme} targets take no parameters")
    hint = f" (did you mean {_RENAMED[name]!r}?)" if name in _RENAMED and _RENAMED[name] in allowed else ""
    hint = hint or did_you_mean(name, allowed)
    _fail(scheme, raw, f"unknown query parameter {name!r}{hint}; expected one of: {', '.join(allowed)}")


def _unknown_scheme(scheme: str, raw: str) -> NoReturn:
    note = " (not supported by waypost)" if scheme in _UNSUPPORTED else ""
    raise InvalidTarget(
        f"unknown target scheme {scheme!r}{note} in {redact(raw)!r}; known schemes: {', '.join(KNOWN_SCHEMES)}"
        f" (e.g. {EXAMPLES['etcd']})"
    )


def _fail(scheme: str, raw: str, message: str) -> NoReturn:
    example = EXAMPLES.get(scheme)
    tail = f" (example: {example})" if example and example not in message else ""
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

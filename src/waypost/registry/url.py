"""Registry URLs: ``etcd://[user:pass@]h1:2379,h2:2379[?tls=1&ca=...&cert=...&key=...&dial_timeout=3]``
and ``memory://[name]``.
"""

from __future__ import annotations

import os
import urllib.parse
from dataclasses import dataclass, field

from ..errors import InvalidTarget
from ..netutil import AddressError, normalize_host_port

ETCD_EXAMPLE = "etcd://user:secret@127.0.0.1:2379,10.0.0.2:2379?tls=1&ca=/etc/etcd/ca.pem&dial_timeout=3"
MEMORY_EXAMPLE = "memory://default"
ETCD_DEFAULT_PORT = 2379

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}
_KNOWN = {"tls", "ca", "cert", "key", "dial_timeout", "request_timeout"}


@dataclass(frozen=True)
class RegistryURL:
    """A parsed registry URL. ``password`` is hidden from ``repr``; ``redacted`` is safe to log."""

    scheme: str
    endpoints: tuple[str, ...] = ()
    name: str = ""
    username: str | None = None
    password: str | None = field(default=None, repr=False)
    tls: bool = False
    ca_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None
    dial_timeout: float = 3.0
    request_timeout: float = 5.0

    @property
    def redacted(self) -> str:
        """The URL without the password (endpoints normalized)."""
        if self.scheme == "memory":
            return f"memory://{self.name}"
        auth = f"{urllib.parse.quote(self.username, safe='')}:***@" if self.username else ""
        q = []
        if self.tls:
            q.append("tls=1")
        for k, v in (("ca", self.ca_file), ("cert", self.cert_file), ("key", self.key_file)):
            if v:
                q.append(f"{k}={urllib.parse.quote(v, safe='/')}")
        if self.dial_timeout != 3.0:
            q.append(f"dial_timeout={self.dial_timeout:g}")
        if self.request_timeout != 5.0:
            q.append(f"request_timeout={self.request_timeout:g}")
        return f"etcd://{auth}{','.join(self.endpoints)}" + (f"?{'&'.join(q)}" if q else "")

    def cache_key(self) -> tuple[object, ...]:
        """What makes two URLs share one registry: endpoints (order-insensitive), user, TLS, timeouts."""
        return (self.scheme, tuple(sorted(self.endpoints)), self.name, self.username, self.password, self.tls,
                self.ca_file, self.cert_file, self.key_file, self.dial_timeout, self.request_timeout)


def _bad(url: str, problem: str, example: str = ETCD_EXAMPLE) -> InvalidTarget:
    return InvalidTarget(f"invalid registry URL {_redact_raw(url)!r}: {problem} (example: {example})")


def _redact_raw(url: str) -> str:
    """Hide a password in a URL we could not parse (never echo secrets). Over-redacting a malformed URL
    is fine: everything up to the last '@' may be userinfo (a password may hold '/', '?' or '#')."""
    scheme, sep, rest = url.partition("://")
    if not sep or "@" in scheme:  # no scheme, or the userinfo was written before/inside it
        return url if "@" not in url else "***@" + url.rpartition("@")[2]
    if "@" in rest:
        userinfo, _, host = rest.rpartition("@")
        user, colon, _pw = userinfo.partition(":")
        rest = f"{user}:***@{host}" if colon else f"***@{host}"
    return f"{scheme}://{rest}"


def _endpoint(url: str, raw: str) -> str:
    """One etcd endpoint by netutil's ``host:port`` rules, canonical; port 2379 when absent."""
    try:
        return normalize_host_port(raw, what="etcd endpoint", default_port=ETCD_DEFAULT_PORT)
    except AddressError as e:
        raise _bad(url, str(e)) from None


def _flag(url: str, name: str, value: str) -> bool:
    v = value.strip().lower()
    if v in _TRUE:
        return True
    if v in _FALSE:
        return False
    raise _bad(url, f"{name}={value!r} is not a boolean (use 1 or 0)")


def _seconds(url: str, name: str, value: str) -> float:
    try:
        f = float(value)
    except ValueError:
        raise _bad(url, f"{name}={value!r} is not a number of seconds") from None
    if not 0 < f <= 3600:
        raise _bad(url, f"{name}={value!r} must be between 0 and 3600 seconds")
    return f


def _file(url: str, name: str, value: str) -> str:
    path = os.path.expanduser(value)
    if not os.path.isfile(path):
        raise _bad(url, f"TLS {name} file {value!r} does not exist")
    if not os.access(path, os.R_OK):
        raise _bad(url, f"TLS {name} file {value!r} is not readable")
    return os.path.abspath(path)


def parse_registry_url(url: str) -> RegistryURL:
    """Parse and validate a registry URL; raises ``waypost.InvalidTarget`` naming the problem."""
    if not isinstance(url, str) or not url.strip():
        raise InvalidTarget(f"empty registry URL (example: {ETCD_EXAMPLE} or {MEMORY_EXAMPLE})")
    url = url.strip()
    scheme, sep, rest = url.partition("://")
    scheme = scheme.lower()
    if not sep:
        raise _bad(url, "missing scheme (etcd:// or memory://)")
    if scheme == "memory":
        name = rest.strip("/").partition("?")[0] or "default"
        return RegistryURL(scheme="memory", name=name)
    if scheme != "etcd":
        shown = scheme if "@" not in scheme else "***@" + scheme.rpartition("@")[2]
        raise _bad(url, f"unknown scheme {shown!r} (known: etcd, memory)")
    ends = [i for i in (rest.find(c) for c in "/?#") if i >= 0]
    if ends and "@" in rest[min(ends):]:
        # an '@' past the host part: almost always a password holding an unescaped '/', '?' or '#'
        # (never echo the pieces: they are probably parts of it)
        raise _bad(url, "'@' after the host: escape '/', '?', '#' and '@' in user names and passwords "
                        "(%2F, %3F, %23, %40)")
    try:
        parts = urllib.parse.urlsplit("etcd://" + rest)
    except ValueError:  # e.g. an unbalanced '[' (urllib's message would not say where)
        raise _bad(url, "malformed host part (unbalanced '[' or ']'; in passwords write %5B and %5D)") from None
    netloc = parts.netloc
    if parts.path not in ("", "/"):
        raise _bad(url, f"unexpected path {parts.path!r} (a registry URL names only endpoints)")
    username = password = None
    if "@" in netloc:
        userinfo, _, netloc = netloc.rpartition("@")
        u, has_pw, p = userinfo.partition(":")
        username = urllib.parse.unquote(u)
        password = urllib.parse.unquote(p) if has_pw else ""
        if not username:
            raise _bad(url, "empty user name before '@'")
    if not netloc:
        raise _bad(url, "no host")
    endpoints = tuple(dict.fromkeys(_endpoint(url, e) for e in netloc.split(",")))
    opts: dict[str, object] = {}
    for k, v in urllib.parse.parse_qsl(parts.query, keep_blank_values=True):
        if k not in _KNOWN:
            raise _bad(url, f"unknown option {k!r} (known: {', '.join(sorted(_KNOWN))})")
        if k == "tls":
            opts["tls"] = _flag(url, k, v)
        elif k in ("dial_timeout", "request_timeout"):
            opts[k] = _seconds(url, k, v)
        else:
            opts[f"{k}_file"] = _file(url, {"ca": "CA", "cert": "certificate"}.get(k, k), v)
    if ("cert_file" in opts) != ("key_file" in opts):
        raise _bad(url, "cert and key must be given together")
    if any(k in opts for k in ("ca_file", "cert_file")):
        if opts.get("tls") is False:
            raise _bad(url, "ca/cert/key given with tls=0")
        opts["tls"] = True
    return RegistryURL(scheme="etcd", endpoints=endpoints, username=username, password=password,
                       **opts)  # type: ignore[arg-type]

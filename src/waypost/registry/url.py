"""Registry URLs: ``etcd://[user:pass@]h1:2379,h2:2379[?tls=1&ca=...&cert=...&key=...&dial_timeout=3]``
and ``memory://[name]``.
"""

from __future__ import annotations

import os
import urllib.parse
from dataclasses import dataclass
from typing import Any

from ..errors import InvalidTarget
from ..etcd.config import URL_FIELDS, URL_OPTION_ALIASES, URL_OPTIONS, EtcdConfig, default
from ..netutil import AddressError, normalize_host_port
from ..redaction import redact_url

ETCD_EXAMPLE = "etcd://user:secret@127.0.0.1:2379,10.0.0.2:2379?tls=1&ca=/etc/etcd/ca.pem&dial_timeout=3"
MEMORY_EXAMPLE = "memory://default"
ETCD_DEFAULT_PORT = 2379

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


@dataclass(frozen=True)
class RegistryURL:
    """A parsed registry URL. ``redacted`` is safe to log.

    An etcd URL's connection settings are its ``config`` (an ``EtcdConfig``, whose ``repr`` hides
    the password); they also read as attributes (``url.username``, ``url.tls``, ``url.dial_timeout``:
    every name of ``etcd.config.URL_FIELDS``), with EtcdConfig's defaults for a memory URL.
    """

    scheme: str
    endpoints: tuple[str, ...] = ()
    name: str = ""
    config: EtcdConfig | None = None

    def __getattr__(self, name: str) -> Any:
        if name in URL_FIELDS:
            cfg = self.__dict__.get("config")
            return getattr(cfg, name) if cfg is not None else default(name)
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    @property
    def redacted(self) -> str:
        """The URL without the password (endpoints normalized)."""
        if self.scheme == "memory":
            return f"memory://{self.name}"
        auth = f"{urllib.parse.quote(self.username, safe='')}:***@" if self.username else ""
        q = []
        for option, (fname, kind) in URL_OPTIONS.items():
            v = getattr(self, fname)
            if kind == "flag" and v:
                q.append(f"{option}=1")
            elif kind == "file" and v:
                q.append(f"{option}={urllib.parse.quote(v, safe='/')}")
            elif kind == "seconds" and v != default(fname):
                q.append(f"{option}={v:g}")
        return f"etcd://{auth}{','.join(self.endpoints)}" + (f"?{'&'.join(q)}" if q else "")

    def cache_key(self) -> tuple[object, ...]:
        """What makes two URLs share one registry: endpoints (order-insensitive), user, TLS, timeouts."""
        return (self.scheme, tuple(sorted(self.endpoints)), self.name, *(getattr(self, f) for f in URL_FIELDS))


def _bad(url: str, problem: str, example: str = ETCD_EXAMPLE) -> InvalidTarget:
    return InvalidTarget(f"invalid registry URL {redact_url(url)!r}: {problem} (example: {example})")


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
    if scheme in ("consul", "zk"):
        kind = "Consul" if scheme == "consul" else "Zk"
        raise _bad(url, f"{scheme}:// registries hold service instances, not keys: register with "
                        f"serve(..., registry={redact_url(url)!r}) or waypost.{kind}Publisher, and dial "
                        f"{scheme}://HOST/SERVICE targets; connect() takes etcd and memory URLs")
    if scheme != "etcd":
        shown = scheme if "@" not in scheme else "***@" + scheme.rpartition("@")[2]
        raise _bad(url, f"unknown scheme {shown!r} (known: etcd, memory; serve() and the publishers also take "
                        "consul:// and zk://)")
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
    opts: dict[str, Any] = {}
    given: dict[str, str] = {}  # option -> the name it was given under
    for given_name, v in urllib.parse.parse_qsl(parts.query, keep_blank_values=True):
        k = URL_OPTION_ALIASES.get(given_name, given_name)  # cacert/certfile/keyfile: the dial-target names
        if k not in URL_OPTIONS:
            known = sorted([*URL_OPTIONS, *URL_OPTION_ALIASES])
            raise _bad(url, f"unknown option {given_name!r} (known: {', '.join(known)})")
        if k in given:
            same = "" if given[k] == given_name else f" ({given[k]!r} and {given_name!r} are the same option)"
            raise _bad(url, f"option {given_name!r} given twice{same}")
        given[k] = given_name
        fname, kind = URL_OPTIONS[k]
        if kind == "flag":
            opts[fname] = _flag(url, k, v)
        elif kind == "seconds":
            opts[fname] = _seconds(url, k, v)
        else:
            opts[fname] = _file(url, {"ca": "CA", "cert": "certificate"}.get(k, k), v)
    if ("cert_file" in opts) != ("key_file" in opts):
        raise _bad(url, "cert and key must be given together")
    if any(k in opts for k in ("ca_file", "cert_file")):
        if opts.get("tls") is False:
            raise _bad(url, "ca/cert/key given with tls=0")
        opts["tls"] = True
    config = EtcdConfig(endpoints=endpoints, username=username, password=password, **opts)
    return RegistryURL(scheme="etcd", endpoints=endpoints, config=config)

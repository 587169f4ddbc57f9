"""Registry URLs: ``etcd://[user:pass@]h1:2379,h2:2379[?tls=1&ca=...&cert=...&key=...&dial_timeout=3]``
and ``memory://[name]`` (the keyed kinds ``waypost.connect`` takes), and ``parse_any`` for a URL of any kind
(``registry/kinds.py``).
"""

from __future__ import annotations

import functools
import urllib.parse
from dataclasses import dataclass
from typing import Any

from .. import urlparams
from ..errors import InvalidTarget, did_you_mean
from ..etcd.config import URL_FIELDS, URL_OPTION_ALIASES, URL_OPTIONS, EtcdConfig, default
from ..netutil import AddressError, normalize_host_port
from ..redaction import redact_url
from .kinds import KEYED, KINDS, instance_registries, lookup, part, scheme_of

ETCD_EXAMPLE = KINDS["etcd"].url_example or ""
MEMORY_EXAMPLE = KINDS["memory"].url_example or ""
ETCD_DEFAULT_PORT = KINDS["etcd"].default_port


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


def _bad(url: str, problem: str) -> InvalidTarget:
    return urlparams.url_error(url, problem, example=ETCD_EXAMPLE)


def _endpoint(url: str, raw: str) -> str:
    """One etcd endpoint by netutil's ``host:port`` rules, canonical; the etcd port when absent."""
    try:
        return normalize_host_port(raw, what="etcd endpoint", default_port=ETCD_DEFAULT_PORT)
    except AddressError as e:
        raise _bad(url, str(e)) from None


def _not_keyed(url: str, scheme: str) -> InvalidTarget:
    """Why ``connect`` does not take a URL of another kind (or of none)."""
    kind = lookup(scheme) if scheme else None
    if kind is not None and kind.holds_instances:
        return _bad(url, f"{scheme}:// registries hold service instances, not keys: register with "
                         f"serve(..., registry={redact_url(url)!r})"
                         f"{' or ' + kind.publisher_name if kind.publisher_name else ''}, and dial its targets "
                         f"({kind.target_example}); connect() takes {' and '.join(KEYED)} URLs")
    others = instance_registries()
    shown = urlparams.shown_scheme(scheme)
    return _bad(url, f"unknown scheme {shown!r}{did_you_mean(shown, (*KEYED, *others))} (known: {', '.join(KEYED)}; "
                     f"serve() and the publishers also take {' and '.join(f'{s}://' for s in others)})")


def parse_registry_url(url: str) -> RegistryURL:
    """Parse and validate a registry URL; raises ``waypost.InvalidTarget`` naming the problem."""
    if not isinstance(url, str) or not url.strip():
        raise InvalidTarget(f"empty registry URL (example: {' or '.join(KINDS[s].url_example or s for s in KEYED)})")
    url = url.strip()
    scheme, sep, rest = url.partition("://")
    scheme = scheme.lower()
    if not sep:
        raise _bad(url, f"missing scheme ({' or '.join(f'{s}://' for s in KEYED)})")
    if scheme == "memory":
        name = rest.strip("/").partition("?")[0] or "default"
        return RegistryURL(scheme="memory", name=name)
    if scheme != "etcd":
        raise _not_keyed(url, scheme)
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
    fail = functools.partial(_bad, url)
    for k, v in urlparams.options(parts.query, fail, known=URL_OPTIONS, aliases=URL_OPTION_ALIASES):
        fname, kind = URL_OPTIONS[k]
        if kind == "flag":
            opts[fname] = urlparams.flag(k, v, fail)
        elif kind == "seconds":
            opts[fname] = urlparams.seconds(k, v, fail)
        else:
            opts[fname] = urlparams.tls_file(urlparams.TLS_FILE_WORDS.get(k, k), v, fail)
    if ("cert_file" in opts) != ("key_file" in opts):
        raise _bad(url, "cert and key must be given together")
    if any(k in opts for k in ("ca_file", "cert_file")):
        if opts.get("tls") is False:
            raise _bad(url, "ca/cert/key given with tls=0")
        opts["tls"] = True
    config = EtcdConfig(endpoints=endpoints, username=username, password=password, **opts)
    return RegistryURL(scheme="etcd", endpoints=endpoints, config=config)


def parse_any(url: str) -> object:
    """The settings of a registry URL of any kind: a ``RegistryURL`` (etcd, memory), a ``ConsulConfig`` or a
    ``ZkConfig``; ``InvalidTarget`` naming the problem, for a scheme that is no registry too."""
    scheme = scheme_of(url) if isinstance(url, str) else ""
    kind = lookup(scheme) if scheme else None
    if kind is None or kind.keyed or kind.parse_url is None:
        return parse_registry_url(url)  # its errors name the kinds
    return part(kind, "parse_url")(url)

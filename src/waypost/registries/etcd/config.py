"""etcd registry URLs: ``etcd://[user:pass@]h1:2379,h2:2379[?tls=1&ca=...&cert=...&key=...&dial_timeout=3]``
(the kind's ``parse_url``: what ``waypost.connect`` takes)."""

from __future__ import annotations

import functools
import urllib.parse
from dataclasses import dataclass
from typing import Any

from ... import urlparams
from ...errors import InvalidTarget
from ...etcd.config import URL_FIELDS, URL_OPTION_ALIASES, URL_OPTIONS, EtcdConfig, default
from ...netutil import AddressError, normalize_host_port

EXAMPLE = "etcd://user:secret@127.0.0.1:2379,10.0.0.2:2379?tls=1&ca=/etc/etcd/ca.pem&dial_timeout=3"
DEFAULT_PORT = 2379


@dataclass(frozen=True)
class EtcdURL:
    """A parsed etcd registry URL. ``redacted`` is safe to log.

    Its connection settings are its ``config`` (an ``EtcdConfig``, whose ``repr`` hides the password); they also
    read as attributes (``url.username``, ``url.tls``, ``url.dial_timeout``: every name of
    ``etcd.config.URL_FIELDS``).
    """

    endpoints: tuple[str, ...]
    config: EtcdConfig
    scheme: str = "etcd"

    def __getattr__(self, name: str) -> Any:
        if name in URL_FIELDS:
            return getattr(self.__dict__["config"], name)
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    @property
    def redacted(self) -> str:
        """The URL without the password (endpoints normalized)."""
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
        return (self.scheme, tuple(sorted(self.endpoints)), *(getattr(self, f) for f in URL_FIELDS))


def _bad(url: str, problem: str) -> InvalidTarget:
    return urlparams.url_error(url, problem, example=EXAMPLE)


def _endpoint(url: str, raw: str) -> str:
    """One etcd endpoint by netutil's ``host:port`` rules, canonical; the etcd port when absent."""
    try:
        return normalize_host_port(raw, what="etcd endpoint", default_port=DEFAULT_PORT)
    except AddressError as e:
        raise _bad(url, str(e)) from None


def parse_etcd_url(url: str) -> EtcdURL:
    """Parse and validate an ``etcd://`` URL; raises ``waypost.InvalidTarget`` naming the problem."""
    url = url.strip()
    _, _, rest = url.partition("://")
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
    return EtcdURL(endpoints=endpoints, config=config)

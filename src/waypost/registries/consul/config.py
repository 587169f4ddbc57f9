"""Where and how to reach a Consul agent: ``ConsulConfig``, from a registry URL
(``consul://HOST[:PORT][?token=T&tls=1&ca=CA.pem&cert=C.pem&key=K.pem&dc=NAME]``: docs/consul.md, "Registry URLs")
or a dial target. The token (else ``$CONSUL_HTTP_TOKEN``, read per request) never shows in ``repr`` or ``redacted``.
"""

from __future__ import annotations

import functools
import os
import urllib.parse
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from ... import urlparams
from ...errors import InvalidTarget
from ...netutil import AddressError, normalize_host_port
from ...urlparams import TargetLike
from ..url_form import URLForm

CONSUL_DEFAULT_PORT = 8500
CONSUL_EXAMPLE = "consul://127.0.0.1:8500?token=SECRET&tls=1&ca=/etc/consul/ca.pem&dc=dc1"
#: the environment variable Consul's own CLI and libraries read the ACL token from
TOKEN_ENV = "CONSUL_HTTP_TOKEN"

#: registry URL option -> ConsulConfig field
_URL_OPTIONS = {"token": "token", "tls": "tls", "ca": "ca_file", "cert": "cert_file", "key": "key_file",
                "dc": "datacenter"}
#: the dial-target names of the TLS files, accepted in registry URLs too
_ALIASES = {"cacert": "ca", "certfile": "cert", "keyfile": "key"}


@dataclass(frozen=True)
class ConsulConfig:
    """How to reach one Consul agent over its HTTP API. ``address`` is ``host:port`` (IPv6 in brackets)."""

    address: str = f"127.0.0.1:{CONSUL_DEFAULT_PORT}"
    token: str | None = field(default=None, repr=False)
    tls: bool = False
    ca_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None
    datacenter: str | None = None

    def __post_init__(self) -> None:
        try:
            object.__setattr__(self, "address", normalize_host_port(
                self.address, what="consul address", default_port=CONSUL_DEFAULT_PORT))
        except AddressError as e:
            raise InvalidTarget(str(e)) from None
        if (self.cert_file is None) != (self.key_file is None):
            raise ValueError("ConsulConfig: cert_file and key_file go together")
        if self.ca_file or self.cert_file:
            object.__setattr__(self, "tls", True)

    @property
    def base_url(self) -> str:
        """``http://host:port`` or ``https://host:port``."""
        return f"{'https' if self.tls else 'http'}://{self.address}"

    @property
    def url(self) -> str:
        """The registry URL of these settings, WITH the token if one was given (do not log it)."""
        return self._url(self.token)

    @property
    def redacted(self) -> str:
        """The registry URL with the token hidden (``token=***``): safe to log."""
        return self._url("***" if self.token else None)

    def _url(self, token: str | None, service: str = "") -> str:
        """The registry URL, or with ``service`` the dial target of it (the TLS files under the target's names)."""
        names = ("cacert", "certfile", "keyfile") if service else ("ca", "cert", "key")
        q = [("token", token)] if token else []
        if self.tls and (service or not (self.ca_file or self.cert_file)):
            q.append(("tls", "1"))
        for name, value in (*zip(names, (self.ca_file, self.cert_file, self.key_file)), ("dc", self.datacenter)):
            if value:
                q.append((name, value))
        query = urllib.parse.urlencode(q, quote_via=urllib.parse.quote, safe="/*")
        path = "/" + urllib.parse.quote(service, safe="") if service else ""
        return f"consul://{self.address}{path}" + (f"?{query}" if query else "")

    def target(self, service: str) -> str:
        """The dial target of ``service`` through this agent (its token, TLS and datacenter)."""
        return self._url(self.token, service)

    def effective_token(self) -> str | None:
        """The token to send: ``token``, else ``$CONSUL_HTTP_TOKEN`` (read now), else None."""
        return self.token or os.environ.get(TOKEN_ENV) or None

    def __str__(self) -> str:
        return self.redacted


URL_FORM = URLForm("consul", "consul registry URL", CONSUL_EXAMPLE)


def parse_registry_url(url: str) -> ConsulConfig:
    """Parse and validate ``consul://host:port?...``; raises ``InvalidTarget`` naming the bad part."""
    url, netloc, query = URL_FORM.host_part(
        url, no_userinfo="is not used by Consul: give the ACL token as ?token=",
        no_path=" (a registry URL names only the agent; the service is the key given to serve()/ConsulPublisher)")
    if "," in netloc:
        raise URL_FORM.error(url, "one Consul agent per URL (the local agent knows the cluster)")
    address = URL_FORM.host(url, urllib.parse.unquote(netloc), what="consul address",
                            default_port=CONSUL_DEFAULT_PORT)
    fail = functools.partial(URL_FORM.error, url)
    return _config(address, urlparams.options(query, fail, known=_URL_OPTIONS, aliases=_ALIASES), fail)


def from_target(target: TargetLike) -> ConsulConfig:
    """The agent settings of a ``consul://HOST:PORT/SERVICE?...`` dial target (already parsed and validated
    by ``parse_target``; its TLS files are named ``cacert``, ``certfile``, ``keyfile``)."""
    if target.scheme != "consul" or len(target.endpoints) != 1:
        raise InvalidTarget(f"not a consul target (one agent): scheme {target.scheme!r}, "
                            f"endpoints {list(target.endpoints)}")
    options = [(name, value) for name, value in target.options.items()
               if _ALIASES.get(name, name) in _URL_OPTIONS]  # not tag=: the discovery's
    return _config(target.endpoints[0], options, lambda problem: InvalidTarget(f"consul target: {problem}"))


def _config(address: str, options: Iterable[tuple[str, str]], fail: Callable[[str], Exception]) -> ConsulConfig:
    """The agent at ``address`` with ``options``, each checked (named as written, so errors name them)."""
    opts: dict[str, Any] = {}
    for written, value in options:
        name = _ALIASES.get(written, written)
        if name == "tls":
            opts["tls"] = urlparams.flag(name, value, fail)
        elif name in urlparams.TLS_FILE_WORDS:
            what = f"{urlparams.TLS_FILE_WORDS[name]} ({written}=)"
            opts[_URL_OPTIONS[name]] = urlparams.tls_file(what, value, fail)
        elif not value:
            raise fail(f"empty {name}=")
        else:
            opts[_URL_OPTIONS[name]] = value
    if ("cert_file" in opts) != ("key_file" in opts):
        raise fail("cert and key must be given together")
    if ("ca_file" in opts or "cert_file" in opts) and opts.get("tls") is False:
        raise fail("ca/cert/key given with tls=0")
    return ConsulConfig(address, **opts)

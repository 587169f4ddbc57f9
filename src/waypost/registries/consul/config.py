"""Where and how to reach a Consul agent: ``ConsulConfig``, from a registry URL or a dial target.

Registry URL (what ``serve(registry=...)`` and ``ConsulPublisher`` take)::

    consul://HOST[:PORT][?token=T&tls=1&ca=CA.pem&cert=C.pem&key=K.pem&dc=NAME]

- the port defaults to 8500 (Consul's HTTP port; 8501 is the usual HTTPS one: give it);
- ``token``: the ACL token sent as ``X-Consul-Token`` (none given: ``$CONSUL_HTTP_TOKEN``, read per request);
- ``tls=1``: HTTPS; ``ca``, ``cert``/``key`` (together) imply it; ``cacert``, ``certfile``, ``keyfile`` are
  accepted too (the names dial targets use);
- ``dc``: the datacenter for reads (``?dc=`` on catalog/health queries); registration always goes to the
  local agent, which belongs to one datacenter.

One agent per URL: the local agent is how Consul clients reach the cluster. The token never appears in
``repr`` or ``redacted``.
"""

from __future__ import annotations

import functools
import os
import urllib.parse
from dataclasses import dataclass, field
from typing import Any

from ... import urlparams
from ...errors import InvalidTarget
from ...netutil import AddressError, normalize_host_port, split_host_port
from ...registry.url_form import URLForm
from ...urlparams import TargetLike

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
    def host(self) -> str:
        return split_host_port(self.address)[0]

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

    def _url(self, token: str | None) -> str:
        q: list[tuple[str, str]] = []
        if token:
            q.append(("token", token))
        if self.tls and not (self.ca_file or self.cert_file):
            q.append(("tls", "1"))
        for name, value in (("ca", self.ca_file), ("cert", self.cert_file), ("key", self.key_file),
                            ("dc", self.datacenter)):
            if value:
                q.append((name, value))
        query = urllib.parse.urlencode(q, quote_via=urllib.parse.quote, safe="/*")
        return f"consul://{self.address}" + (f"?{query}" if query else "")

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
    opts: dict[str, Any] = {}
    fail = functools.partial(URL_FORM.error, url)
    for name, value in urlparams.options(query, fail, known=_URL_OPTIONS, aliases=_ALIASES):
        fname = _URL_OPTIONS[name]
        if name == "tls":
            opts[fname] = urlparams.flag(name, value, fail)
        elif name in urlparams.TLS_FILE_WORDS:
            opts[fname] = urlparams.tls_file(urlparams.TLS_FILE_WORDS[name], value, fail)
        else:
            if not value:
                raise fail(f"empty {name}=")
            opts[fname] = value
    return _config({"address": address, **opts}, fail)


def from_target(target: TargetLike) -> ConsulConfig:
    """The agent settings of a ``consul://HOST:PORT/SERVICE?...`` dial target (already parsed and validated
    by ``parse_target``; its TLS files are named ``cacert``, ``certfile``, ``keyfile``)."""
    if target.scheme != "consul" or len(target.endpoints) != 1:
        raise InvalidTarget(f"not a consul target (one agent): scheme {target.scheme!r}, "
                            f"endpoints {list(target.endpoints)}")
    o = target.options
    opts: dict[str, Any] = {}
    if o.get("token"):
        opts["token"] = o["token"]
    if "tls" in o:
        opts["tls"] = o["tls"] == "1"
    for name, fname, what in (("cacert", "ca_file", "CA"), ("certfile", "cert_file", "certificate"),
                              ("keyfile", "key_file", "key")):
        value = o.get(name)
        if value:
            path = os.path.expanduser(value)
            if not os.path.isfile(path):
                raise InvalidTarget(f"consul target: TLS {what} file {value!r} ({name}=) does not exist")
            opts[fname] = os.path.abspath(path)
    if o.get("dc"):
        opts["datacenter"] = o["dc"]
    return _config({"address": target.endpoints[0], **opts}, lambda problem: InvalidTarget(f"consul target: {problem}"))


def _config(opts: dict[str, Any], bad: Any) -> ConsulConfig:
    if ("cert_file" in opts) != ("key_file" in opts):
        raise bad("cert and key must be given together")
    if ("ca_file" in opts or "cert_file" in opts) and opts.get("tls") is False:
        raise bad("ca/cert/key given with tls=0")
    return ConsulConfig(**opts)


def resolve_config(registry: ConsulConfig | str) -> ConsulConfig:
    """A ``ConsulConfig`` as given, or parsed from a registry URL."""
    return URL_FORM.settings(registry, ConsulConfig, parse_registry_url)

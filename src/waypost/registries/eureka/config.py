"""Where Eureka is: ``EurekaConfig``, from a registry URL or a dial target (docs/eureka.md).

- registry URL: ``eureka://HOST[:PORT][,HOST2[:PORT]...][?path=/eureka&tls=1]``: the port defaults to 8761
  (Spring Cloud's); several servers are peers of one cluster, tried in turn as Eureka's own client does; ``path``
  is the REST API's base path (Spring Cloud's ``/eureka`` by default); ``tls=1``: HTTPS (the system's CAs);
- dial target: ``eureka://HOSTS/APP[?path=/eureka&interval=5s&tls=1]``: ``APP`` the application (Eureka
  upper-cases it); ``interval`` how often the registry is fetched (a gRPC JSON duration, ``DEFAULT_INTERVAL``).
"""

from __future__ import annotations

import functools
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass

from ... import urlparams
from ...durations import DurationError, format_duration, parse_positive_duration
from ...errors import InvalidTarget
from ...netutil import AddressError, normalize_host_port
from ..url_form import URLForm

DEFAULT_PORT = 8761
DEFAULT_PATH = "/eureka"
#: how often a client fetches the registry when the target says nothing (Eureka's own client: 30 s, which is
#: why its fleets are slow to notice changes)
DEFAULT_INTERVAL = 3.0
EXAMPLE = "eureka://10.0.0.1:8761,10.0.0.2:8761?path=/eureka"
TARGET_EXAMPLE = "eureka://127.0.0.1:8761/greeter"
URL_OPTIONS = ("path", "tls")
TARGET_OPTIONS = ("path", "interval", "tls")


@dataclass(frozen=True)
class EurekaConfig:
    """The servers of one Eureka cluster (``host:port``, normalized, in the order given) and its base path."""

    servers: tuple[str, ...] = (f"127.0.0.1:{DEFAULT_PORT}",)
    path: str = DEFAULT_PATH
    tls: bool = False

    def __post_init__(self) -> None:
        if not self.servers:
            raise InvalidTarget(f"an Eureka configuration names at least one server (example: {EXAMPLE})")
        try:
            servers = tuple(dict.fromkeys(
                normalize_host_port(s, what="eureka server", default_port=DEFAULT_PORT) for s in self.servers))
        except AddressError as e:
            raise InvalidTarget(str(e)) from None
        object.__setattr__(self, "servers", servers)
        object.__setattr__(self, "path", check_path(self.path, lambda p: InvalidTarget(f"eureka: {p}")))

    def base_url(self, server: str) -> str:
        """``http://host:port/eureka`` of one of the servers."""
        return f"{'https' if self.tls else 'http'}://{server}{self.path}"

    @property
    def url(self) -> str:
        """The registry URL of these settings (no secrets: Eureka's URLs carry none here)."""
        return target_for(self, "")

    redacted = url

    def __str__(self) -> str:
        return self.url


def target_for(config: EurekaConfig, app: str, interval: float | None = None) -> str:
    """The dial target of ``app`` in the cluster of ``config`` (its registry URL when ``app`` is "")."""
    q = [("path", config.path)] if config.path != DEFAULT_PATH else []
    if config.tls:
        q.append(("tls", "1"))
    if interval is not None and interval != DEFAULT_INTERVAL:
        q.append(("interval", format_duration(interval)))
    query = urllib.parse.urlencode(q, safe="/")
    return f"eureka://{','.join(config.servers)}" + (f"/{app}" if app else "") + (f"?{query}" if query else "")


def check_path(path: str, fail: Callable[[str], Exception]) -> str:
    """A base path: ``/`` then segments, no query, no trailing slash (``/`` alone means the root)."""
    if not isinstance(path, str) or not path.startswith("/"):
        raise fail(f"path={path!r} must start with '/' (Spring Cloud's is {DEFAULT_PATH})")
    if any(c in path for c in "?#% ") or "//" in path:
        raise fail(f"path={path!r} is not a plain URL path (no '?', '#', '%', spaces or '//')")
    return path.rstrip("/")


def parse_interval(value: str, fail: Callable[[str], Exception]) -> float:
    """``interval=``: a gRPC JSON duration > 0 (``"2s"``, ``"0.5s"``)."""
    try:
        return parse_positive_duration(value)
    except DurationError as e:
        raise fail(f"interval={value!r}: {e}") from None


URL_FORM = URLForm("eureka", "eureka registry URL", EXAMPLE)


def parse_registry_url(url: str) -> EurekaConfig:
    """Parse and validate ``eureka://host:port[,host:port]?...``; raises ``InvalidTarget`` naming the bad part."""
    url, netloc, query = URL_FORM.host_part(
        url, no_userinfo="is not supported: waypost talks to Eureka without credentials",
        no_path=": a registry URL names the servers only (the app is the key given to serve()), and Eureka's base "
                "path goes in ?path=")
    fail = functools.partial(URL_FORM.error, url)
    servers = URL_FORM.hosts(url, urllib.parse.unquote(netloc), what="eureka server", default_port=DEFAULT_PORT)
    opts: dict[str, object] = {}
    for name, value in urlparams.options(query, fail, known=URL_OPTIONS):
        opts[name] = urlparams.flag(name, value, fail) if name == "tls" else check_path(value, fail)
    return EurekaConfig(servers=tuple(servers), **opts)  # type: ignore[arg-type]


def app_name(key: str, fail: Callable[[str], Exception] = ValueError) -> str:
    """The Eureka application name of a service key: upper case, as the server stores it."""
    if not isinstance(key, str) or not key.strip():
        raise fail(f"an Eureka application name must be a non-empty string, got {key!r}")
    if any(c in key for c in "/?#%") or any(ord(c) < 33 for c in key):
        raise fail(f"Eureka application name {key!r} cannot contain '/', '?', '#', '%', spaces or control "
                   "characters (it is a path segment of Eureka's REST API)")
    return key.upper()

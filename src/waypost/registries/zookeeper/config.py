"""Connection settings of a ZooKeeper client (``ZkConfig``), from a registry URL
``zk://H1:2181,H2:2181[?session_timeout=S&namespace=/P]`` (no path: the service is the registration's) or a dial
target ``zk://H1:2181,H2:2181/SERVICE[?...]``; a host without a port means 2181, IPv6 hosts go in brackets."""

from __future__ import annotations

import functools
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ... import urlparams
from ...errors import InvalidTarget
from ...netutil import normalize_host_port
from ...urlparams import TargetLike, seconds_ok
from ..url_form import URLForm
from .layout import DEFAULT_NAMESPACE, LayoutError, check_namespace

DEFAULT_PORT = 2181
#: what a discovery asks for when the URL says nothing (kazoo's default too)
DEFAULT_SESSION_TIMEOUT = 10.0
#: the longest pause between two reconnection attempts (kazoo's own default grows to an hour; go-zookeeper, which
#: Kratos uses, pauses 1 s after trying every host)
MAX_RECONNECT_DELAY = 1.0
EXAMPLE = "zk://10.0.0.1:2181,10.0.0.2:2181?session_timeout=10"
OPTIONS = ("session_timeout", "namespace")


@dataclass(frozen=True)
class ZkConfig:
    """Where ZooKeeper is and how to hold a session with it. ``hosts``: ``host:port`` strings (normalized: port
    filled in, IPv6 in brackets, duplicates dropped); ``session_timeout`` None: the user's default (above)."""

    hosts: tuple[str, ...]
    session_timeout: float | None = None
    namespace: str = DEFAULT_NAMESPACE
    #: upper bound of the pause between reconnection attempts (exponential from 0.1 s, jittered)
    max_reconnect_delay: float = MAX_RECONNECT_DELAY

    def __post_init__(self) -> None:
        hosts = (self.hosts,) if isinstance(self.hosts, str) else tuple(self.hosts)
        if not hosts:
            raise ValueError("ZkConfig needs at least one host (e.g. ('127.0.0.1:2181',))")
        normalized = (normalize_host_port(h, what="ZooKeeper host", default_port=DEFAULT_PORT) for h in hosts)
        object.__setattr__(self, "hosts", tuple(dict.fromkeys(normalized)))  # (AddressError: a ValueError)
        for name in ("session_timeout", "max_reconnect_delay"):
            if (value := getattr(self, name)) is not None and not seconds_ok(value):
                raise ValueError(f"ZkConfig: {name} must be a number of seconds in (0, 3600], got {value!r}")
        try:
            object.__setattr__(self, "namespace", check_namespace(self.namespace))
        except LayoutError as e:
            raise ValueError(f"ZkConfig: {e}") from None

    @property
    def connect_string(self) -> str:
        """The hosts as kazoo (and every ZooKeeper client) takes them: ``h1:2181,h2:2181``."""
        return ",".join(self.hosts)

    @property
    def url(self) -> str:
        """The registry URL of this configuration (no secrets: it holds none)."""
        q = [f"session_timeout={self.session_timeout:g}"] if self.session_timeout is not None else []
        if self.namespace != DEFAULT_NAMESPACE:
            q.append(f"namespace={urllib.parse.quote(self.namespace, safe='/')}")
        return f"zk://{self.connect_string}" + (f"?{'&'.join(q)}" if q else "")

    redacted = url

    def session_timeout_or(self, default: float) -> float:
        return float(self.session_timeout) if self.session_timeout is not None else float(default)


URL_FORM = URLForm("zk", "ZooKeeper registry URL", EXAMPLE)


def _options(given: Mapping[str, str], fail: urlparams.Fail) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, value in given.items():
        if name == "session_timeout":
            out["session_timeout"] = urlparams.seconds(name, value, fail)
        elif name == "namespace":
            try:
                out["namespace"] = check_namespace(value)
            except LayoutError as e:
                raise fail(str(e)) from None
        else:
            raise fail(f"unknown option {name!r} (known: {', '.join(OPTIONS)})")
    return out


def parse_registry_url(url: str) -> ZkConfig:
    """``zk://H1:2181,H2:2181[?session_timeout=S&namespace=/P]`` -> ZkConfig; InvalidTarget naming the problem."""
    url, rest = URL_FORM.rest(url, wrong_scheme="a ZooKeeper registry URL starts with zk://")
    if "#" in rest:
        raise URL_FORM.error(url, "a registry URL has no '#fragment'")
    url, netloc, query = URL_FORM.host_part(
        url, no_userinfo="is refused: ZooKeeper registry URLs take no credentials (digest ACLs are not supported)",
        no_path=": a registry URL names the ZooKeeper hosts only, the service is the publisher's key (dial targets "
                "are zk://HOSTS/SERVICE)")
    hosts = URL_FORM.hosts(url, netloc, what="ZooKeeper host", default_port=DEFAULT_PORT)
    fail = functools.partial(URL_FORM.error, url)
    given = dict(urlparams.options(query, fail))  # the names are checked with a target's, by _options
    return ZkConfig(hosts=tuple(hosts), **_options(given, fail))


def from_target(target: TargetLike) -> ZkConfig:
    """The ZkConfig of a parsed ``zk://H1:2181,H2:2181/SERVICE`` dial target (hosts already normalized by the
    target parser; options ``session_timeout`` and ``namespace`` when present)."""
    if target.scheme != "zk" or not target.endpoints:
        raise InvalidTarget(f"not a zk target with ZooKeeper hosts: {target.redacted} (zk://127.0.0.1:2181/greet)")

    def fail(problem: str) -> InvalidTarget:
        return InvalidTarget(f"invalid zk target {target.redacted!r}: {problem}")

    options = _options(dict(target.options), fail)
    try:
        return ZkConfig(hosts=tuple(target.endpoints), **options)
    except ValueError as e:
        raise fail(str(e)) from None

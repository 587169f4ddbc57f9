"""Connection settings of an etcd client."""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any, Literal


@dataclass(frozen=True)
class EtcdConfig:
    """Where and how to reach etcd.

    ``endpoints`` are ``host:port`` strings (hostnames allowed, IPv6 as ``[::1]:2379``).
    The password never appears in ``repr``.
    """

    endpoints: tuple[str, ...]
    username: str | None = None
    password: str | None = field(default=None, repr=False)
    tls: bool = False
    ca_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None
    #: how long a call waits for any endpoint to become connected before RegistryUnavailable
    dial_timeout: float = 3.0
    #: deadline of one unary call (all failover attempts included)
    request_timeout: float = 5.0
    #: grpc keepalive: etcd's server refuses pings more often than every 5 s (too_many_pings),
    #: so ping every 5.5 s and give up 2.5 s later: a frozen member is noticed within ~8 s.
    keepalive_time_ms: int = 5500
    keepalive_timeout_ms: int = 2500
    #: an endpoint that failed is tried after healthy ones for this long (never locked out)
    failure_cooldown: float = 10.0

    def __post_init__(self) -> None:
        if not self.endpoints:
            raise ValueError("EtcdConfig needs at least one endpoint")
        if (self.cert_file is None) != (self.key_file is None):
            raise ValueError("EtcdConfig: cert_file and key_file go together")


OptionKind = Literal["flag", "seconds", "file"]

#: the settings a registry URL may carry as query options: option name -> (EtcdConfig field, kind).
#: ``flag``: 1/0, true/false...; ``seconds``: a number of seconds in (0, 3600]; ``file``: a readable
#: file (a CA or client certificate/key file implies TLS). The URL parser derives its options from this.
URL_OPTIONS: dict[str, tuple[str, OptionKind]] = {
    "tls": ("tls", "flag"),
    "ca": ("ca_file", "file"),
    "cert": ("cert_file", "file"),
    "key": ("key_file", "file"),
    "dial_timeout": ("dial_timeout", "seconds"),
    "request_timeout": ("request_timeout", "seconds"),
}

#: the names dial targets use for the TLS files (``key=`` is a target's service key there), accepted by registry
#: URLs too, so one set of names works everywhere: option name in a target -> registry URL option
URL_OPTION_ALIASES: dict[str, str] = {"cacert": "ca", "certfile": "cert", "keyfile": "key"}

#: the EtcdConfig fields a registry URL sets: the user info, then the query options
URL_FIELDS: tuple[str, ...] = ("username", "password", *(name for name, _ in URL_OPTIONS.values()))


def default(name: str) -> Any:
    """The default value of an EtcdConfig field."""
    for f in fields(EtcdConfig):
        if f.name == name:
            return f.default
    raise KeyError(f"EtcdConfig has no field {name!r}")

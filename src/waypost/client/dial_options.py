"""What ``waypost.dial`` and ``waypost.aio.dial`` take besides the target: ``DialOptions``, one field per keyword.

Both dials build a ``DialOptions`` from their keywords (``DialKeywords`` types them: written once, shared by
the two signatures), so each default and each check is written here once. ``client.channel_config.dial_config`` then
checks the options together with the target (service config, routing, subsetting) and decides the channel's
config.
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any, TypeAlias, TypedDict

import grpc
import grpc.aio

from ..errors import check_keywords

#: what ``interceptors=`` holds: grpc's client interceptors (``waypost.dial``) or grpc.aio's (``waypost.aio.dial``)
ClientInterceptor: TypeAlias = (grpc.UnaryUnaryClientInterceptor | grpc.UnaryStreamClientInterceptor
                     | grpc.StreamUnaryClientInterceptor | grpc.StreamStreamClientInterceptor
                     | grpc.aio.ClientInterceptor)


class DialKeywords(TypedDict, total=False):
    """The keyword arguments of ``waypost.dial`` / ``waypost.aio.dial``: each is the ``DialOptions`` field of the
    same name and type (its default and meaning are documented there)."""

    balancer: str | None
    service_config: Mapping[str, Any] | str | None
    options: Sequence[tuple[str, Any]] | None
    credentials: grpc.ChannelCredentials | None
    interceptors: Iterable[ClientInterceptor] | None
    subset_size: int | None
    client_id: str | None
    rng: random.Random | None
    block: bool | None
    retries: int | None
    metadata_filter: Mapping[str, object] | None
    prefer: Mapping[str, object] | None
    min_preferred: int | None
    key: str | None


@dataclass(frozen=True, kw_only=True)
class DialOptions:
    """Everything a dial is given besides its target (``waypost.dial(target, **options)``). The target-dependent
    checks (service config, routing, subsetting) happen in ``dial``, which raises ``InvalidServiceConfig`` /
    ``ValueError`` naming the argument."""

    balancer: str | None = None
    """The policy's name (a shortcut for ``loadBalancingConfig``; it must agree with the service config when both
    name one); with neither, ``waypost.service_config.DEFAULT_POLICY`` (peak_ewma)."""
    service_config: Mapping[str, Any] | str | None = None
    """gRPC's service config JSON (dict or text), validated by dial."""
    options: Sequence[tuple[str, Any]] | None = None
    """grpc channel options (``[("grpc.max_receive_message_length", ...)]``), given to every backend's channel."""
    credentials: grpc.ChannelCredentials | None = None
    """TLS for the backends' channels (``grpc.ssl_channel_credentials(...)``); None: insecure."""
    interceptors: Iterable[ClientInterceptor] | None = None
    """Client interceptors: ``grpc`` interceptors applied as ``grpc.intercept_channel`` does (``waypost.dial``), or
    ``grpc.aio`` interceptors applied to every attempt on its backend (``waypost.aio.dial``)."""
    subset_size: int | None = None
    """Registry targets: use at most this many backends (deterministic subsetting); None: 32."""
    client_id: str | None = None
    """Registry targets: this client's id for subsetting (the same id picks the same subset)."""
    rng: random.Random | None = None
    """The randomness of the policy and the subsetting (tests pass a seeded one)."""
    block: bool | None = None
    """Registry targets: wait for the first address list. None: the dial's own default -- ``waypost.dial`` waits in
    the call (True), ``waypost.aio.dial`` never blocks the event loop (False: calls wait instead)."""
    retries: int | None = None
    """N retries on UNAVAILABLE for every method (a retryPolicy; an error next to a service config with one)."""
    metadata_filter: Mapping[str, object] | None = None
    """Use only the backends whose registration metadata matches (``{"group": "canary"}``)."""
    prefer: Mapping[str, object] | None = None
    """Use only the matching backends while at least ``min_preferred`` of them are READY, else all of them."""
    min_preferred: int | None = None
    """With ``prefer``: how many matching READY backends are enough; None: 1."""
    key: str | None = None
    """The service key, when the target is a registry object from ``waypost.connect`` (a target string carries
    its key itself)."""

    def __post_init__(self) -> None:
        if self.block is not None and not isinstance(self.block, bool):
            raise TypeError(f"dial: block must be True or False, got {self.block!r}")

    @classmethod
    def from_keywords(cls, what: str, keywords: DialKeywords) -> DialOptions:
        """The options of a dial's keywords; a misspelt one is a TypeError naming the dial (``what``) and the
        keyword meant (``waypost.dial() got an unexpected keyword argument 'balncer'; did you mean 'balancer'?``)."""
        check_keywords(what, keywords, _FIELDS)
        return cls(**keywords)

    def blocks(self, default: bool) -> bool:
        """``block``, with the dial's own default for None."""
        return default if self.block is None else self.block


#: the keywords a dial takes
_FIELDS = frozenset(f.name for f in fields(DialOptions))

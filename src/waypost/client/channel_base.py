"""What the sync and aio balanced channels (``waypost.channel.Channel``, ``waypost.aio.Channel``) share: the
redacted target, what ``dial`` decided (``ChannelConfig``), the backend channels' arguments and credentials, the
health service this process may watch, and the three properties a multicallable reads (``BalancedChannel``).
Each channel builds its own resolver and ``BalancerWrapper`` (how updates reach it differs: a thread, or one
event loop) and sets ``_balancer``."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import grpc

from .. import _fork
from .balancer_wrapper import BalancerWrapper
from .channel_args import merge_options
from .channel_config import ChannelConfig
from .method import MulticallableFactory
from .picker_wrapper import PickerWrapper


class ChannelBase(MulticallableFactory):
    """The part of a balanced channel that does not depend on threads or an event loop."""

    _balancer: BalancerWrapper

    def __init__(self, config: ChannelConfig, options: Sequence[tuple[str, Any]] | None,
                 credentials: grpc.ChannelCredentials | None) -> None:
        # Only the redacted form is kept: it appears in repr, logs and error details (no password).
        self.target: str = config.target.redacted
        self._config = config
        self._options = merge_options(options)
        self._credentials = credentials
        #: the health service to watch, None when off (not configured, or this process was forked after gRPC ran)
        self._health_service = _fork.health_checks_allowed(config.health_service, self.target)

    @property
    def balancer(self) -> BalancerWrapper:
        """The backend set behind this channel (introspection and tests)."""
        return self._balancer

    @property
    def pickers(self) -> PickerWrapper:
        """The current picker and the pick (what calls use)."""
        return self._balancer.pickers

    @property
    def config(self) -> ChannelConfig:
        """Everything dial decided for this channel (policy, method configs, retry throttling)."""
        return self._config

"""gRPC's retry token bucket (``retryThrottling``): the per-channel state behind a validated
``RetryThrottling`` from the service config (which only describes it)."""

from __future__ import annotations

import threading

from ..service_config import RetryThrottling


class RetryThrottle:
    """gRPC's retry token bucket for one channel (thread-safe).

    Tokens start at ``max_tokens``; a failed attempt takes one token (not below 0), a successful
    call gives back ``token_ratio`` (not above ``max_tokens``); retries are allowed while
    ``tokens > max_tokens / 2``. Counted in thousandths of a token, as gRPC core does, so the
    arithmetic is exact.
    """

    def __init__(self, config: RetryThrottling) -> None:
        self.config = config
        self._max_milli = max(1, round(config.max_tokens * 1000))
        self._ratio_milli = max(1, round(config.token_ratio * 1000))
        self._milli = self._max_milli
        self._lock = threading.Lock()

    @property
    def tokens(self) -> float:
        """The current token count."""
        with self._lock:
            return self._milli / 1000

    def allows_retry(self) -> bool:
        """Whether a retry may be attempted now (tokens above half the maximum)."""
        with self._lock:
            return 2 * self._milli > self._max_milli

    def record_success(self) -> None:
        """A call succeeded (or failed with a non-retryable code): add ``token_ratio`` tokens."""
        with self._lock:
            self._milli = min(self._max_milli, self._milli + self._ratio_milli)

    def record_failure(self) -> bool:
        """An attempt failed with a retryable code: take a token; return whether a retry is allowed."""
        with self._lock:
            self._milli = max(0, self._milli - 1000)
            return 2 * self._milli > self._max_milli

    @classmethod
    def for_config(cls, config: RetryThrottling | None) -> RetryThrottle | None:
        """A fresh bucket for one channel, or None when the service config sets no throttling."""
        return cls(config) if config is not None else None

    def __repr__(self) -> str:
        return f"RetryThrottle(tokens={self.tokens}, max_tokens={self.config.max_tokens})"

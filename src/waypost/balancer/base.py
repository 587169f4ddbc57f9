"""The data-plane contract between channels and load-balancing policies.

A ``Policy`` instance lives as long as a channel. Each time the set of READY backends changes the
channel calls ``policy.build(backends)`` and swaps in the returned ``Picker``; the policy keeps
per-address statistics across builds, so backends that stay keep their history. A pick never blocks
and never does I/O: ``picker.pick(info)`` returns the backend and a ``done`` hook the channel calls
exactly once with the call's ``Outcome`` when the call ends.
"""

from __future__ import annotations

import abc
import random
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol

import grpc

from ..metrics import BackendLoad
from ..types import Backend
from .config_fields import (
    parse_config_object,  # noqa: F401  # importable from here too (custom policies)
    policy_config,
)

Clock = Callable[[], float]  # monotonic seconds


@dataclass(frozen=True, slots=True)
class PickInfo:
    """What a picker may look at for one call."""

    method: str = ""
    hash_key: str | None = None  # from waypost.hash_key(...) or a configured header, see normalize_hash_key
    metadata: Sequence[tuple[str, str | bytes]] = ()


@dataclass(frozen=True, slots=True)
class Outcome:
    """How a call ended: its status code (OK on success) and latency in seconds.

    ``trailing_metadata``: the call's trailing metadata pairs, only when the pick asked for them
    (``PickResult.wants_trailers``; otherwise None: reading them costs every call a little).
    ``pushback``: a failed call's ``grpc-retry-pushback-ms`` trailer in seconds (``failure.pushback_of``: None when
    absent, ``failure.PUSHBACK_STOP`` when negative or malformed); read on failures only.

    CANCELLED is the caller's end (it cancelled, or a retry dropped the pick); DEADLINE_EXCEEDED's latency is what the
    caller's deadline allowed: ``failure.BackendFailures.verdict`` tells them from the backend's failures.
    """

    code: grpc.StatusCode = grpc.StatusCode.OK
    latency: float = 0.0
    trailing_metadata: Sequence[tuple[str, str | bytes]] | None = None
    pushback: float | None = None


DoneHook = Callable[[Outcome], None]


def noop_done(outcome: Outcome) -> None:
    """The default ``PickResult.done``: a picker that keeps no per-call state (the channel then builds no
    ``Outcome`` for the call)."""
    return


@dataclass(frozen=True, slots=True)
class PickResult:
    """The picked backend and the ``done`` hook; ``wants_trailers``: give ``done`` the call's trailing metadata
    (``Outcome.trailing_metadata``), e.g. to read a server's per-call load report."""

    backend: Backend
    done: DoneHook = noop_done
    wants_trailers: bool = False


class PickError(Exception):
    """A pick failed with a gRPC status (e.g. INVALID_ARGUMENT for a missing hash key)."""

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


class Picker(abc.ABC):
    """Chooses a backend per call from an immutable snapshot of READY backends."""

    @abc.abstractmethod
    def pick(self, info: PickInfo) -> PickResult:
        """Pick a backend; raise PickError when the call must fail, NoBackendAvailable when empty."""


class LoadProber(Protocol):
    """What the channel gives a policy that balances on server load reports (``Policy.wants_load_reports``).

    ``probe(address)`` asks that backend's load-report service, asynchronously: it returns at once (False when
    the probe could not be sent: the address is not a usable backend now, or the channel is closing) and the
    answer reaches the policy later, from another thread or the channel's event loop, as
    ``policy.on_probe(address, in_flight, latency)`` or ``policy.on_probe_failed(address, unsupported)``.
    The policy layer never sees a grpc channel: the client core implements this.
    """

    def probe(self, address: str) -> bool: ...

    def open_stream(self, address: str, method: str, request: bytes, on_message: Callable[[bytes], None]) -> bool:
        """Keep a server-streaming call ``method`` (raw bytes both ways) open to ``address`` on its connection,
        reopened after a failure (with backoff) until ``close_stream``; each message goes to ``on_message``
        (from another thread or the channel's event loop). False when it cannot be opened now."""
        ...

    def close_stream(self, address: str, method: str) -> None:
        """End the stream ``open_stream`` keeps to ``address`` (nothing when there is none)."""
        ...


class Policy(abc.ABC):
    """A load-balancing policy; one instance per channel, keeping statistics across builds."""

    #: the name used in service configs (loadBalancingConfig keys)
    name: ClassVar[str]
    #: True: the channel calls ``attach_prober`` once, before the first build
    wants_load_reports: ClassVar[bool] = False
    #: seconds: the deadline of a load-report probe (policies with ``wants_load_reports``)
    probe_timeout: float = 0.25
    #: the channel's target (the channel sets it), for the metrics a policy reports (``waypost.metrics``)
    target: str = ""

    def __init__(
        self,
        config: Mapping[str, Any] | None = None,
        *,
        clock: Clock = time.monotonic,
        rng: random.Random | None = None,
    ) -> None:
        self.config: Mapping[str, Any] = dict(config or {})
        self.clock = clock
        self.rng = rng if rng is not None else random.Random()

    @classmethod
    def parse_config(cls, raw: object, path: str) -> dict[str, Any]:
        """Validate this policy's ``loadBalancingConfig`` entry; raise InvalidServiceConfig naming ``path``.

        This default is for policies that take no fields: ``{}`` or nothing; any field is an error (a typo
        must not pass silently). A policy with settings overrides it, checking its fields with
        ``config_fields.policy_config``."""
        return policy_config(raw, path, cls.name)

    @abc.abstractmethod
    def build(self, backends: Sequence[Backend]) -> Picker:
        """A picker over ``backends`` (READY ones, in resolver order). May be empty."""

    def connections(self, backends: Sequence[Backend], states: Mapping[str, int]) -> Collection[str] | None:
        """The addresses of ``backends`` (the resolver's list, in its order) the channel should hold a connection
        to; None (this default): all of them.

        ``states`` holds the connectivity of each address the channel holds a connection to now
        (``types.READY``: usable, i.e. connected and, with health checking, SERVING; ``types.CONNECTING``: not
        yet usable, first attempt or health answer pending; ``types.TRANSIENT_FAILURE``: the attempt failed, the
        connection was lost or the backend is NOT_SERVING; a held connection keeps retrying with backoff); an
        address without a connection is absent. The channel asks after every change of the list and of a held
        connection's state, under its lock (so calls are serialised with ``build``; no blocking, no I/O), then
        opens the connections asked for and closes the others once their calls have ended. Only the backends
        with a connection can be READY, so only they reach ``build``."""
        return None

    def connections_timer(self) -> float | None:
        """Seconds after which the channel should ask ``connections`` again although nothing changed (e.g.
        pick_first's connection attempt delay); None (this default): only after a change. Read right after each
        ``connections`` call, under the same lock; the channel asks on its first connectivity poll (every few
        tens of ms) once the time has passed."""
        return None

    def attach_waker(self, wake: Callable[[], None]) -> None:
        """Receive the channel's wake-up (once, before the first build). A picker may refuse a call for now with
        ``concurrency_limit.AtLimit`` (every backend at its concurrency limit): the call then waits, and the
        policy calls ``wake()`` (from a call's ``done`` hook, on whatever thread ends the call) when a backend can
        take one again. This default ignores it (its pickers never refuse for now)."""

    # ---- load reports (only policies with ``wants_load_reports`` get these calls) ----------------------

    def attach_prober(self, prober: LoadProber) -> None:
        """Receive the channel's prober (once, before the first build)."""

    def on_probe(self, address: str, in_flight: int, latency: float | None) -> None:
        """A load report of ``address``: its requests in flight and latency estimate (seconds; None: none yet)."""

    def on_probe_failed(self, address: str, unsupported: bool) -> None:
        """A probe of ``address`` failed; ``unsupported``: the backend has no load reports (UNIMPLEMENTED)."""

    def signals(self) -> list[BackendLoad]:
        """Per-backend load signals for metrics and logs; empty for policies that keep none."""
        return []


def normalize_hash_key(key: str | bytes | int | None) -> str | None:
    """The key as a str: ints and other values through ``str()``; bytes are kept byte-exact by
    decoding with ``surrogateescape`` (``key_bytes`` turns it back into the very same bytes)."""
    if key is None:
        return None
    if isinstance(key, str):
        return key
    if isinstance(key, (bytes, bytearray, memoryview)):
        return bytes(key).decode("utf-8", "surrogateescape")
    if isinstance(key, bool):
        raise TypeError("hash key must be str, bytes or int, not bool")
    if isinstance(key, int):
        return str(key)
    raise TypeError(f"hash key must be str, bytes or int, not {type(key).__name__}")


def key_bytes(key: str) -> bytes:
    """The bytes hashed for ``key`` (UTF-8; bytes keys round-trip exactly)."""
    return key.encode("utf-8", "surrogateescape")

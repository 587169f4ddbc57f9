"""Helpers for channel tests: server groups, a policy that records outcomes (bounded waits: harness.waiting)."""

from __future__ import annotations

import itertools
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import pytest

from harness.backends.server import EchoServer
from waypost.balancer.base import Outcome, Picker, PickInfo, PickResult, Policy
from waypost.balancer.policies import POLICIES, register_policy
from waypost.errors import NoBackendAvailable
from waypost.types import Backend


@contextmanager
def echo_servers(*names: str, **kw: Any) -> Iterator[list[EchoServer]]:
    """In-process Echo servers on free ports, stopped afterwards."""
    started: list[EchoServer] = []
    try:
        for n in names:
            started.append(EchoServer(n, **kw).start())
        yield started
    finally:
        for s in started:
            s.stop(0)


def direct(servers: Sequence[Any]) -> str:
    return "direct:///" + ",".join(s.address for s in servers)


class Recorder:
    """Shared log of what the recording policy saw."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.picks: list[str] = []
        self.outcomes: list[tuple[str, Outcome]] = []
        self.builds: list[list[str]] = []

    def clear(self) -> None:
        with self.lock:
            self.picks.clear()
            self.outcomes.clear()


RECORDER = Recorder()


class _RecordingPicker(Picker):
    def __init__(self, backends: Sequence[Backend]) -> None:
        self._backends = tuple(backends)
        self._n = itertools.count()

    def pick(self, info: PickInfo) -> PickResult:
        if not self._backends:
            raise NoBackendAvailable("empty")
        b = self._backends[next(self._n) % len(self._backends)]
        with RECORDER.lock:
            RECORDER.picks.append(b.address)
        done_once = []

        def done(o: Outcome) -> None:
            assert not done_once, f"done called twice for {b.address}"
            done_once.append(o)
            with RECORDER.lock:
                RECORDER.outcomes.append((b.address, o))

        return PickResult(b, done)


class RecordingPolicy(Policy):
    """round robin (from the first backend) that records every pick, outcome and build."""

    name = "test_recording"

    def build(self, backends: Sequence[Backend]) -> Picker:
        with RECORDER.lock:
            RECORDER.builds.append([b.address for b in backends])
        return _RecordingPicker(backends)


@pytest.fixture
def recording() -> Iterator[Recorder]:
    """Make the ``test_recording`` policy available for one test (removed afterwards, so the policy
    registry other tests inspect stays as the library defines it)."""
    register_policy(RecordingPolicy)
    RECORDER.clear()
    try:
        yield RECORDER
    finally:
        POLICIES.pop(RecordingPolicy.name, None)

"""The resolver of every registry kind (``KindResolver``: etcd, consul, zk, k8s, dns) honours the same
``ResolverOptions``.

- ``blocking``: a blocking start returns once the first list is known, and raises RegistryUnavailable naming what
  could not be read when there is none in time; a non-blocking start returns at once.
- ``report_early``: until the first list, a failure reaches ``on_error`` at once with it; without it, only at the
  first list's deadline (``timeout``).

Each source here refuses connections (nothing listens on its port) or never answers, so no server is needed.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from harness.waiting import wait_until
from waypost import RegistryUnavailable
from waypost.etcd.local import free_port
from waypost.kinds.resolver import KindResolver
from waypost.resolver import ResolverOptions, parse_target


class Calls:
    """on_update / on_error recorder, with when each error came (monotonic seconds)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.updates: list[list[str]] = []
        self.errors: list[tuple[float, str]] = []

    def on_update(self, backends: Any) -> None:
        with self.lock:
            self.updates.append([b.address for b in backends])

    def on_error(self, message: str) -> None:
        with self.lock:
            self.errors.append((time.monotonic(), message))


def _kubeconfig(tmp_path: Path, port: int) -> Path:
    path = tmp_path / "kubeconfig"
    path.write_text(f"""apiVersion: v1
kind: Config
clusters: [{{name: c, cluster: {{server: "http://127.0.0.1:{port}"}}}}]
users: [{{name: u, user: {{token: t}}}}]
contexts: [{{name: x, context: {{cluster: c, user: u, namespace: default}}}}]
current-context: x
""")
    return path


def _etcd(tmp_path: Path, options: ResolverOptions, timeout: float) -> KindResolver:
    from waypost.resolver import resolver_factory

    resolver: KindResolver = resolver_factory("etcd")(  # type: ignore[call-arg]
        parse_target(f"etcd:///127.0.0.1:{free_port()}?key=greet"), options, timeout=timeout)
    return resolver


def _consul(tmp_path: Path, options: ResolverOptions, timeout: float) -> KindResolver:
    pytest.importorskip("aiohttp")
    from waypost.registries.consul.kind import KIND

    return KindResolver(KIND, parse_target(f"consul://127.0.0.1:{free_port()}/greet"), options, timeout=timeout)


def _zk(tmp_path: Path, options: ResolverOptions, timeout: float) -> KindResolver:
    pytest.importorskip("kazoo")
    from waypost.resolver import resolver_factory

    resolver: KindResolver = resolver_factory("zk")(  # type: ignore[call-arg]
        parse_target(f"zk://127.0.0.1:{free_port()}/greet"), options, timeout=timeout)
    return resolver


def _k8s(tmp_path: Path, options: ResolverOptions, timeout: float) -> KindResolver:
    pytest.importorskip("kubernetes_asyncio")
    from waypost.resolver import resolver_factory

    target = parse_target(f"k8s://default/greet:80?kubeconfig={_kubeconfig(tmp_path, free_port())}")
    resolver: KindResolver = resolver_factory("k8s")(target, options, timeout=timeout)  # type: ignore[call-arg]
    return resolver


#: each registry resolver against a port where nothing listens, and what its errors name
REFUSED: dict[str, tuple[Callable[[Path, ResolverOptions, float], KindResolver], str]] = {
    "etcd": (_etcd, "unreachable: connection refused"),
    "consul": (_consul, "instances of service 'greet'"),
    "zk": (_zk, "connection refused"),
    "k8s": (_k8s, "EndpointSlices of service default/greet (port 80)"),
}


@pytest.fixture
def started() -> Iterator[list[KindResolver]]:
    resolvers: list[KindResolver] = []
    yield resolvers
    for r in resolvers:
        r.close()


@pytest.mark.parametrize("kind", sorted(REFUSED))
def test_report_early_reports_a_refused_registry_at_once(kind: str, tmp_path: Path, started) -> None:
    make, names = REFUSED[kind]
    r = make(tmp_path, ResolverOptions(blocking=False, report_early=True), 5.0)
    calls = Calls()
    t0 = time.monotonic()
    r.start(calls.on_update, calls.on_error)
    started.append(r)
    assert time.monotonic() - t0 < 0.5  # non-blocking: returns at once
    wait_until(lambda: calls.errors, 3, what=f"{kind}: an early error")
    assert calls.errors[0][0] - t0 < 3 and names in calls.errors[0][1]
    assert calls.updates == []


@pytest.mark.parametrize("kind", sorted(REFUSED))
def test_without_report_early_the_failure_waits_for_the_first_list_deadline(kind: str, tmp_path: Path,
                                                                           started) -> None:
    make, names = REFUSED[kind]
    timeout = 2.0
    r = make(tmp_path, ResolverOptions(blocking=False, report_early=False), timeout)
    calls = Calls()
    t0 = time.monotonic()
    r.start(calls.on_update, calls.on_error)
    started.append(r)
    wait_until(lambda: calls.errors, timeout + 5, what=f"{kind}: the error at the deadline")
    assert calls.errors[0][0] - t0 >= timeout - 0.1, calls.errors  # nothing reported before the deadline
    assert names in calls.errors[0][1]


@pytest.mark.parametrize("kind", sorted(REFUSED))
def test_blocking_start_fails_naming_what_could_not_be_read(kind: str, tmp_path: Path) -> None:
    make, names = REFUSED[kind]
    r = make(tmp_path, ResolverOptions(blocking=True), 1.5)
    t0 = time.monotonic()
    with pytest.raises(RegistryUnavailable, match="within 1.5s") as err:
        r.start(Calls().on_update, Calls().on_error)
    assert time.monotonic() - t0 < 1.5 + 1.5
    assert names in str(err.value)


# ---- dns: a blocking start waits for the first lookup's answer -----------------------------------------------


def test_dns_blocking_start_returns_with_the_first_list() -> None:
    from waypost.resolver import make_resolver

    calls = Calls()
    r = make_resolver(parse_target("dns:///localhost:80"), ResolverOptions(blocking=True))
    try:
        r.start(calls.on_update, calls.on_error)
        with calls.lock:
            assert calls.updates and all(a.endswith(":80") for a in calls.updates[0])  # known before start returned
    finally:
        r.close()


@pytest.fixture
def silent_dns_server() -> Iterator[str]:
    """A UDP port that takes DNS queries and never answers."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", 0))
        yield f"127.0.0.1:{s.getsockname()[1]}"


@pytest.mark.parametrize("blocking", [True, False])
def test_dns_start_blocks_only_when_asked(blocking: bool, silent_dns_server: str) -> None:
    pytest.importorskip("dns.asyncresolver")
    from waypost.resolver import make_resolver

    calls = Calls()
    # the DNS kind's lookup timeout, from the channel option a dial passes
    r = make_resolver(parse_target(f"dns://{silent_dns_server}/svc.test:80"),
                      ResolverOptions(blocking=blocking, channel_options=[("grpc.dns_ares_query_timeout", 1000)]))
    try:
        t0 = time.monotonic()
        r.start(calls.on_update, calls.on_error)  # never raises: a name that does not resolve is no dial error
        took = time.monotonic() - t0
        if blocking:
            # the first lookup answered (timed out) before start returned, and the channel already knows why
            assert 0.9 <= took < 3.0
            with calls.lock:
                assert calls.errors and "svc.test" in calls.errors[0][1] and "timed out" in calls.errors[0][1]
        else:
            assert took < 0.5
            with calls.lock:
                assert calls.errors == []  # the lookup is still waiting for its answer
            wait_until(lambda: calls.errors, 5, what="the lookup's failure")
        assert calls.updates == []
    finally:
        r.close()

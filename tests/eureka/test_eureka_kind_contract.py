"""The kind contract suite (``tests/registry/kind_contract.py``) run for the Eureka kind against a real Spring Cloud
Eureka server of its own (the outage test stops it; it comes back empty, and the instances register again). That
server answers reads from its registry, not from its read-only response cache (refreshed every second): the suite
checks what a read sees right after a write."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import pytest

from tests.eureka import support as eureka_support
from tests.eureka.support import EurekaServer
from tests.registry.kind_contract import SERVICE, KindContract
from waypost.etcd.local import free_port
from waypost.kinds import Backend
from waypost.registries.eureka.apps import GRPC_PORT_KEY
from waypost.registries.eureka.kind import KIND

pytestmark = [eureka_support.timeout_mark()]


@pytest.fixture(scope="module")
def own_eureka() -> Iterator[EurekaServer]:
    if why := eureka_support.skip_reason():
        pytest.skip(why)
    with EurekaServer(properties={"eureka.server.use-read-only-response-cache": "false"}) as server:
        yield server


class TestEurekaKind(KindContract):
    kind = KIND

    @pytest.fixture(autouse=True)
    def _eureka(self, own_eureka: EurekaServer) -> None:
        self.eureka = own_eureka

    def registry_url(self) -> str:
        return self.eureka.url

    def target(self, service: str) -> str:
        return f"eureka://{self.eureka.address}/{service}?interval=0.2s"

    def unreachable_url(self) -> tuple[str, str]:
        return f"eureka://127.0.0.1:{free_port()}", "cannot reach Eureka at .*: connection refused"

    def listed(self, service: str = SERVICE) -> dict[str, Backend]:
        """The contract's reads, without the ``gRPC_port`` entry every Eureka registration adds to its metadata (the
        port Spring's gRPC clients dial: grpc-spring-boot-starter's convention)."""
        return {a: Backend(a, {k: v for k, v in b.metadata.items() if k != GRPC_PORT_KEY})
                for a, b in super().listed(service).items()}

    def delete_instance(self, service: str, address: str) -> None:
        host, _, port = address.rpartition(":")
        assert self.eureka.delete(service, KIND.words.id_format.format(host=host, service=service, port=port)) == 200

    @contextlib.contextmanager
    def registry_down(self) -> Iterator[None]:
        """Eureka stopped; started again (empty: it keeps its registry in memory) on the way out."""
        self.eureka.stop()
        try:
            yield
        finally:
            self.eureka.start()

"""The per-backend load gauges (in flight, latency estimate, probe age) of peak_ewma and prequal channels, read
at scrape time from live channels over real servers."""

from __future__ import annotations

from concurrent import futures

import grpc
import pytest
from prometheus_client import CollectorRegistry

import waypost
from harness.backends import echo_pb2, echo_pb2_grpc
from harness.backends.server import EchoServicer
from harness.waiting import wait_until
from waypost import metrics
from waypost.server import serve

REQ = echo_pb2.EchoRequest(message="x")


@pytest.fixture
def prom():
    obs = metrics.enable(CollectorRegistry())
    yield obs
    metrics.disable()


def gauge(obs, name: str, **labels) -> float | None:
    return obs.registry.get_sample_value(name, labels)


@pytest.mark.parametrize("policy", ["peak_ewma", "prequal"])
def test_backend_load_gauges(prom, unique_key, policy):
    server = grpc.server(futures.ThreadPoolExecutor(8))
    echo_pb2_grpc.add_EchoServicer_to_server(EchoServicer("s0", delay_ms=5), server)
    with serve(server, unique_key, listen_on="127.0.0.1:0", registry=f"memory://{unique_key}", grace=0) as h:
        target = f"direct:///{h.address}"
        with waypost.dial(target, balancer=policy) as ch:
            stub = echo_pb2_grpc.EchoStub(ch)
            labels = {"target": target, "backend": h.address}
            if policy == "prequal":  # calls until a load report with a latency estimate has come back
                wait_until(lambda: stub.Unary(REQ, timeout=10) and gauge(
                    prom, "waypost_client_backend_probe_age_seconds", **labels) is not None,
                    what="a probe age")
                assert gauge(prom, "waypost_client_backend_probe_age_seconds", **labels) >= 0
            else:
                stub.Unary(REQ, timeout=10)
                assert gauge(prom, "waypost_client_backend_probe_age_seconds", **labels) is None
            assert gauge(prom, "waypost_client_backend_load_in_flight", **labels) == 0
            assert gauge(prom, "waypost_client_backend_latency_estimate_seconds", **labels) > 0
        # a closed channel is no longer reported
        assert gauge(prom, "waypost_client_backend_load_in_flight", **labels) is None


def test_policies_without_signals_export_no_load_gauges(prom, unique_key):
    server = grpc.server(futures.ThreadPoolExecutor(4))
    echo_pb2_grpc.add_EchoServicer_to_server(EchoServicer("s0"), server)
    with serve(server, unique_key, listen_on="127.0.0.1:0", registry=f"memory://{unique_key}", grace=0) as h:
        target = f"direct:///{h.address}"
        with waypost.dial(target, balancer="round_robin") as ch:
            echo_pb2_grpc.EchoStub(ch).Unary(REQ, timeout=10)
            assert gauge(prom, "waypost_client_in_flight", target=target, backend=h.address) == 0
            assert gauge(prom, "waypost_client_backend_load_in_flight", target=target, backend=h.address) is None

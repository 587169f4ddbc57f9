"""How pushes reach streams: only the streams whose subscriptions changed, paced (a burst folds into one push
per interval, a lone change goes out at once), and a stream that stops reading holds at most one response per
type while the others keep getting theirs."""

from __future__ import annotations

import asyncio
import queue
import threading
from collections.abc import Iterator

import pytest

pytest.importorskip("envoy.service.discovery.v3.ads_pb2", reason="the xds extra (xds-protos) is not installed")

import grpc
from envoy.config.core.v3 import address_pb2
from envoy.config.endpoint.v3 import endpoint_components_pb2, endpoint_pb2
from envoy.service.discovery.v3 import discovery_pb2

from harness.waiting import wait_until
from waypost import _loop
from waypost.xds import ControlPlane, parse_export
from waypost.xds.control import _changed_names
from waypost.xds.request import Request
from waypost.xds.resources import CLUSTER, ENDPOINT, LISTENER, TYPES
from waypost.xds.server import Stream
from waypost.xds.snapshot import Resource, Snapshot
from waypost.xds.stream import StreamState


def _cla(name: str, n: int, port: int = 80) -> endpoint_pb2.ClusterLoadAssignment:
    eps = [endpoint_components_pb2.LbEndpoint(endpoint=endpoint_components_pb2.Endpoint(address=address_pb2.Address(
        socket_address=address_pb2.SocketAddress(address=f"10.0.{i // 250}.{i % 250 + 1}", port_value=port))))
        for i in range(n)]
    return endpoint_pb2.ClusterLoadAssignment(cluster_name=name, endpoints=[
        endpoint_components_pb2.LocalityLbEndpoints(lb_endpoints=eps, load_balancing_weight={"value": 1})])


def _snap(eds: dict[str, Resource]) -> Snapshot:
    return Snapshot({t: (dict(eds) if t == ENDPOINT else {}) for t in TYPES})


def test_changed_names_are_the_resources_that_differ() -> None:
    a, b = Resource.of("a", _cla("a", 2)), Resource.of("b", _cla("b", 2))
    old = _snap({"a": a, "b": b})
    assert _changed_names(old, _snap({"a": a, "b": b})) == {t: set() for t in TYPES}
    same_bytes = Resource.of("b", _cla("b", 2))  # rebuilt, same content: not a change
    assert _changed_names(old, _snap({"a": a, "b": same_bytes}))[ENDPOINT] == set()
    changed = _changed_names(old, _snap({"a": a, "b": Resource.of("b", _cla("b", 3)), "c": a}))
    assert changed[ENDPOINT] == {"b", "c"}
    assert _changed_names(old, _snap({"a": a}))[ENDPOINT] == {"b"}  # removed


def test_a_push_skips_streams_that_subscribed_to_nothing_changed() -> None:
    a, b = Resource.of("a", _cla("a", 2)), Resource.of("b", _cla("b", 2))
    old = _snap({"a": a, "b": b})
    state = StreamState()
    first = state.on_request(Request.of(discovery_pb2.DiscoveryRequest(type_url=ENDPOINT, resource_names=["a"])), old)
    assert len(first.responses) == 1
    new = _snap({"a": a, "b": Resource.of("b", _cla("b", 3))})
    assert state.on_snapshot(new, _changed_names(old, new)) == []  # only b changed: nothing for a's stream
    newer = _snap({"a": Resource.of("a", _cla("a", 5)), "b": b})
    assert [t for t, _ in state.on_snapshot(newer, _changed_names(new, newer))] == [ENDPOINT]


def test_a_newer_response_replaces_one_not_written_yet() -> None:
    stream = Stream("peer")
    stream.send([(LISTENER, b"l1"), (ENDPOINT, b"e1")])
    stream.send([(ENDPOINT, b"e2"), (CLUSTER, b"c1")])
    stream.send([(ENDPOINT, b"e3")])
    assert stream.replaced == 2 and len(stream.pending) == 3
    assert [stream.next_response() for _ in range(4)] == [b"l1", b"e3", b"c1", None]


def test_a_burst_of_changes_is_one_push_per_interval_and_a_lone_change_goes_at_once() -> None:
    now = [1000.0]
    control = ControlPlane([], push_interval=0.2, clock=lambda: now[0])
    pushes: list[float] = []
    control.ads.push = lambda snap, changed=None: pushes.append(now[0]) or 0  # type: ignore[method-assign]

    async def scenario() -> None:
        control._mark()  # quiet until now: at once (next loop turn)
        await asyncio.sleep(0)
        assert pushes == [1000.0]
        now[0] = 1000.05
        for _ in range(50):  # a burst within the interval: one push, when the interval is over
            control._mark()
        await asyncio.sleep(0.02)
        assert pushes == [1000.0]
        await asyncio.sleep(0.3)
        assert len(pushes) == 2
        now[0] = 1010.0  # quiet for longer than the interval: at once again
        control._mark()
        await asyncio.sleep(0)
        assert len(pushes) == 3

    asyncio.run(scenario())


def _raw_ads(port: int) -> tuple[grpc.Channel, queue.Queue, Iterator[discovery_pb2.DiscoveryResponse]]:
    # no BDP probing: the client's HTTP/2 window stays at its initial 64 KiB, so a client that does not read
    # blocks the server's writes after a couple of responses (as a slow client over a real network does)
    channel = grpc.insecure_channel(f"127.0.0.1:{port}", options=[("grpc.max_receive_message_length", 64 << 20),
                                                                 ("grpc.http2.bdp_probe", 0)])
    requests: queue.Queue = queue.Queue()

    def gen():
        while (item := requests.get()) is not None:
            yield item

    call = channel.stream_stream("/envoy.service.discovery.v3.AggregatedDiscoveryService/StreamAggregatedResources",
                                 request_serializer=discovery_pb2.DiscoveryRequest.SerializeToString,
                                 response_deserializer=discovery_pb2.DiscoveryResponse.FromString)(gen(), timeout=60)
    return channel, requests, call


def test_a_stream_that_stops_reading_holds_one_response_per_type_and_delays_nobody() -> None:
    control = ControlPlane([parse_export("big=direct:///127.0.0.1:1")], push_interval=0.0)
    port = control.start()
    channels = []
    try:
        streams = {}
        for who in ("slow", "fast"):
            channel, requests, call = _raw_ads(port)
            channels.append((channel, requests))
            requests.put(discovery_pb2.DiscoveryRequest(type_url=ENDPOINT, resource_names=["big"],
                                                        node={"id": who}))
            first = next(call)
            requests.put(discovery_pb2.DiscoveryRequest(type_url=ENDPOINT, resource_names=["big"],
                                                        version_info=first.version_info,
                                                        response_nonce=first.nonce))
            streams[who] = (requests, call)

        def state_of(who: str) -> Stream:
            return next(s for s in control.ads.streams if s.state.node_id == who)

        wait_until(lambda: len(control.ads.streams) == 2 and state_of("slow") and state_of("fast"), 10, "2 streams")
        fast_versions: list[str] = []

        def read_fast() -> None:  # the fast client reads and ACKs everything
            requests, call = streams["fast"]
            try:
                for resp in call:
                    fast_versions.append(resp.version_info)
                    requests.put(discovery_pb2.DiscoveryRequest(type_url=ENDPOINT, resource_names=["big"],
                                                                version_info=resp.version_info,
                                                                response_nonce=resp.nonce))
            except grpc.RpcError:  # the test closed the channel
                pass

        reader = threading.Thread(target=read_fast, daemon=True)
        reader.start()
        slow = state_of("slow")
        most_pending = 0
        last = None
        for i in range(60):  # 60 changes of a 2,000-endpoint assignment (~40 KB each): the slow stream's
            last = Resource.of("big", _cla("big", 2000, port=1000 + i))  # window fills after a couple
            _loop.run(_push(control, last), 10)
            most_pending = max(most_pending, len(slow.pending))
        final = control.snapshot.body(ENDPOINT, frozenset({"big"}))
        assert final is not None
        wait_until(lambda: fast_versions and fast_versions[-1] == final.version, 20, "the fast client has the last")
        assert most_pending <= 1 and slow.replaced > 0, (most_pending, slow.replaced)
        # the slow client reads again: what it gets is a handful of responses ending with the last version,
        # not the 60 changes
        _, slow_call = streams["slow"]
        got = []
        while not got or got[-1] != final.version:
            got.append(next(slow_call).version_info)
        assert len(got) < 10, len(got)
    finally:
        for channel, requests in channels:
            requests.put(None)
            channel.close()
        control.stop()


async def _push(control: ControlPlane, resource: Resource) -> None:
    control._eds["big"] = resource
    control._rebuild()

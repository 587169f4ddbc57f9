"""The ``waypost-server-load`` trailer (``call_load``): what a served call carries, sync and aio, with and without
ORCA, and how malformed values are read (as no report)."""

from __future__ import annotations

from concurrent import futures

import grpc
import pytest

import waypost
from waypost.orca import call_load

SERVICE = "callload.test.T"


def _handlers() -> grpc.GenericRpcHandler:
    def unary(req: bytes, ctx: grpc.ServicerContext) -> bytes:  # type: ignore[misc]
        ctx.set_trailing_metadata((("x-app", "kept"),))
        return req

    return grpc.method_handlers_generic_handler(SERVICE, {"U": grpc.unary_unary_rpc_method_handler(unary)})


def test_a_served_call_carries_the_servers_load_as_it_ended():
    server = grpc.server(futures.ThreadPoolExecutor(4))
    server.add_generic_rpc_handlers((_handlers(),))
    handle = waypost.serve(server, "callload.test", listen_on="127.0.0.1:0", registry=None)
    try:
        with grpc.insecure_channel(handle.address) as ch:
            loads = []
            for _ in range(3):
                _, call = ch.unary_unary(f"/{SERVICE}/U").with_call(b"x", timeout=10)
                md = [tuple(m) for m in call.trailing_metadata()]
                assert ("x-app", "kept") in md  # the application's trailers stay
                loads.append(call_load.decode(md))
        # our call has left the count; from the second call on, the server has a latency estimate
        assert loads[0] is not None and loads[0][0] == 0
        assert all(load is not None and load[0] == 0 and load[1] is not None and load[1] >= 0 for load in loads[1:])
    finally:
        handle.stop(0)


@pytest.mark.parametrize("value, expected", [
    ("3 0.012", (3, 0.012)), (b"0 -", (0, None)), ("7 1e-05", (7, 1e-05)),
    ("x 0.1", None), ("-1 0.1", None), ("2 nan", None), ("2 -0.1", None), ("2", None), (b"\xff 1", None),
])
def test_decode_reads_a_good_value_and_takes_a_bad_one_as_no_report(value, expected):
    assert call_load.decode((("other", "1 1"), (call_load.KEY, value))) == expected
    assert call_load.decode(None) is None and call_load.decode((("other", "1 1"),)) is None
    assert call_load.decode(((call_load.KEY, call_load.encode(4, 0.25)),)) == (4, 0.25)

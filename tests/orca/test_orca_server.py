"""ORCA out of real grpcio servers: the per-call trailer and the out-of-band StreamCoreMetrics service that
serve() mounts (sync and aio), the recorders, the standalone interceptor, and serve() without xds-protos."""

from __future__ import annotations

import logging
import math
from concurrent import futures

import grpc
import pytest

import waypost
from waypost import orca
from waypost.orca import LoadAccount, _protos, report_stub, set_load
from waypost.orca import waypost_load_pb as pb
from waypost.orca.reporter import CACHE_SECONDS, RateMeter
from waypost.orca.service import _interval

SERVICE = "orca.test.T"


def _handlers(aio: bool = False) -> grpc.GenericRpcHandler:
    if aio:
        async def unary(req: bytes, ctx: grpc.aio.ServicerContext) -> bytes:
            orca.call_recorder(ctx).set_request_cost("db", 3)
            return req

        async def stream(req: bytes, ctx: grpc.aio.ServicerContext):  # type: ignore[no-untyped-def]
            yield req
    else:
        def unary(req: bytes, ctx: grpc.ServicerContext) -> bytes:  # type: ignore[misc]
            if req == b"cost":
                rec = orca.call_recorder(ctx)
                rec.set_request_cost("db", 3)
                rec.set_named_metric("rows", 12)
                rec.set_cpu_utilization(0.75)
            ctx.set_trailing_metadata((("x-app", "kept"),))
            return req

        def stream(req: bytes, ctx: grpc.ServicerContext):  # type: ignore[misc,no-untyped-def]
            yield req
            yield req
    return grpc.method_handlers_generic_handler(SERVICE, {
        "U": grpc.unary_unary_rpc_method_handler(unary),
        "S": grpc.unary_stream_rpc_method_handler(stream),
    })


@pytest.fixture
def served():
    orca.configure(min_interval=0.05)
    server = grpc.server(futures.ThreadPoolExecutor(8))
    server.add_generic_rpc_handlers((_handlers(),))
    handle = waypost.serve(server, "orca.test", listen_on="127.0.0.1:0", registry=None)
    yield handle
    handle.stop(0)
    orca.configure(min_interval=1.0)


def _report_of(md) -> orca.LoadReport:  # type: ignore[no-untyped-def]
    d = dict(md)
    assert orca.TRAILER_KEY not in d  # grpcio's C-core keeps gRPC's key from Python code: hence the mirror
    report = orca.parse_report(d[orca.MIRROR_KEY])
    assert report is not None
    return report


def test_serve_sends_the_trailer_with_the_recorders_values(served):
    rec = orca.server_recorder(served)
    assert rec is served.orca_recorder is orca.server_recorder(served.server)
    rec.set_application_utilization(0.4)
    rec.set_qps(50)
    rec.set_named_utilization("queue", 0.5)
    with grpc.insecure_channel(served.address) as ch:
        _, call = ch.unary_unary(f"/{SERVICE}/U").with_call(b"x", timeout=10)
        md = call.trailing_metadata()
        assert ("x-app", "kept") in [tuple(m) for m in md]  # the application's trailers stay
        r = _report_of(md)
        assert (r.application_utilization, r.rps_fractional, r.utilization) == (0.4, 50.0, {"queue": 0.5})
        # a call whose handler used its recorder gets its own report (the server's values under the call's)
        _, call = ch.unary_unary(f"/{SERVICE}/U").with_call(b"cost", timeout=10)
        data = dict(call.trailing_metadata())[orca.MIRROR_KEY]
        msg = _protos.protos()[0].OrcaLoadReport.FromString(data)  # type: ignore[index]
        assert dict(msg.request_cost) == {"db": 3.0} and dict(msg.named_metrics) == {"rows": 12.0}
        assert msg.cpu_utilization == 0.75 and msg.application_utilization == 0.4
        # a streaming response gets it at its end
        it = ch.unary_stream(f"/{SERVICE}/S")(b"s", timeout=10)
        assert list(it) == [b"s", b"s"]
        assert _report_of(it.trailing_metadata()).application_utilization == 0.4
        # waypost.load.v1 is still answered, by the same interceptor
        assert report_stub(ch)(pb.ReportRequest(), timeout=10).calls_completed >= 3


def test_oob_stream_honours_the_interval_and_the_floor(served):
    served.orca_recorder.set_cpu_utilization(0.3)
    with grpc.insecure_channel(served.address) as ch:
        stream = ch.unary_stream(orca.OOB_METHOD)(orca.oob_request(0.05), timeout=10)
        got = []
        for msg in stream:
            got.append(orca.parse_report(msg))
            if len(got) == 3:
                stream.cancel()
                break
    assert [r.cpu_utilization for r in got if r is not None] == [0.3, 0.3, 0.3]
    req = _protos.protos()[1].OrcaLoadReportRequest  # type: ignore[index]
    assert _interval(req.FromString(orca.oob_request(0.05)), 1.0) == 1.0  # raised to the floor
    assert _interval(req.FromString(orca.oob_request(2.5)), 1.0) == 2.5
    assert _interval(req(), 0.2) == 0.2  # absent: the floor


def test_oob_streams_are_capped():
    reporter = orca.OrcaReporter(None)
    svc = orca.OobService(reporter, min_interval=0.05, max_streams=1)
    server = grpc.server(futures.ThreadPoolExecutor(4))
    server.add_generic_rpc_handlers((svc.generic_handler(),))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as ch:
            first = ch.unary_stream(orca.OOB_METHOD)(orca.oob_request(0.05), timeout=10)
            next(first)
            second = ch.unary_stream(orca.OOB_METHOD)(orca.oob_request(0.05), timeout=10)
            with pytest.raises(grpc.RpcError) as e:
                next(second)
            assert e.value.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
            first.cancel()
    finally:
        server.stop(0)


def test_standalone_interceptor_on_a_plain_grpc_server():
    icpt = orca.interceptor()
    icpt.recorder.set_cpu_utilization(0.2)
    server = grpc.server(futures.ThreadPoolExecutor(4), interceptors=[icpt])
    server.add_generic_rpc_handlers((_handlers(),))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as ch:
            _, call = ch.unary_unary(f"/{SERVICE}/U").with_call(b"x", timeout=10)
            assert _report_of(call.trailing_metadata()).cpu_utilization == 0.2
            first = next(iter(ch.unary_stream(orca.OOB_METHOD)(orca.oob_request(1), timeout=5)))
            assert orca.parse_report(first).cpu_utilization == 0.2  # type: ignore[union-attr]
        assert orca.server_recorder(icpt) is icpt.recorder
    finally:
        server.stop(0)


async def test_aio_server_with_the_interceptor_and_serve_async():
    icpt = orca.interceptor(aio=True)
    icpt.recorder.set_application_utilization(0.6)
    server = grpc.aio.server(interceptors=[icpt])
    server.add_generic_rpc_handlers((_handlers(aio=True),))
    handle = await waypost.serve_async(server, "orca.aio", listen_on="127.0.0.1:0", registry=None)
    try:
        async with grpc.aio.insecure_channel(handle.address) as ch:
            call = ch.unary_unary(f"/{SERVICE}/U")(b"x", timeout=10)
            assert await call == b"x"
            assert _report_of(await call.trailing_metadata()).application_utilization == 0.6
            stream = ch.unary_stream(orca.OOB_METHOD)(orca.oob_request(0.05), timeout=10)
            msg = await stream.read()
            assert orca.parse_report(msg).application_utilization == 0.6  # type: ignore[union-attr]
            stream.cancel()
    finally:
        await handle.stop(0)


def test_rates_come_from_the_account():
    now = [0.0]
    account = LoadAccount(clock=lambda: now[0])
    meter = RateMeter(account, clock=lambda: now[0], interval=1.0)
    assert meter.read() is None
    for i in range(30):
        account.end(account.begin(), failed=i < 3)
    now[0] = 1.5
    assert meter.read() == (20.0, 2.0)
    reporter = orca.OrcaReporter(account, clock=lambda: now[0])
    for _ in range(10):
        account.end(account.begin())
    now[0] = 3.0
    r = reporter.report()
    assert math.isclose(r.rps_fractional, 10 / 1.5) and r.eps == 0
    assert reporter.serialized() == reporter.serialized()  # cached for CACHE_SECONDS
    reporter.recorder.set_qps(7)
    assert orca.parse_report(reporter.serialized()).rps_fractional == 7  # type: ignore[union-attr]
    assert CACHE_SECONDS > 0


def test_recorders_refuse_bad_values():
    rec = orca.ServerMetricsRecorder()
    for bad in (float("nan"), -1.0, float("inf")):
        with pytest.raises(ValueError):
            rec.set_cpu_utilization(bad)
    with pytest.raises(ValueError):
        rec.set_mem_utilization(1.5)
    with pytest.raises(TypeError):
        rec.set_qps("3")  # type: ignore[arg-type]
    rec.set_cpu_utilization(1.5)  # ORCA allows more than the nominal share
    with pytest.raises(RuntimeError, match="not inside a call"):
        orca.call_recorder(None)


def test_set_load_is_the_application_utilization_unless_recorded():
    reporter = orca.OrcaReporter(None)
    set_load(0.25)
    try:
        assert reporter.report().application_utilization == 0.25
        reporter.recorder.set_application_utilization(0.5)
        assert reporter.report().application_utilization == 0.5
    finally:
        set_load(None)


def test_serve_without_xds_protos_mounts_waypost_load_only(monkeypatch, caplog):
    monkeypatch.setattr(_protos, "_loaded", None)
    monkeypatch.setattr(_protos, "_missing", False)

    def no_xds(*a, **k):  # type: ignore[no-untyped-def]
        raise ImportError("No module named 'xds'")

    import builtins
    real_import = builtins.__import__
    monkeypatch.setattr(builtins, "__import__",
                        lambda name, *a, **k: no_xds() if name.startswith("xds.") else real_import(name, *a, **k))
    caplog.set_level(logging.INFO, logger="waypost.orca")
    server = grpc.server(futures.ThreadPoolExecutor(4))
    server.add_generic_rpc_handlers((_handlers(),))
    handle = waypost.serve(server, "orca.noxds", listen_on="127.0.0.1:0", registry=None)
    try:
        assert handle.orca_recorder is None
        with grpc.insecure_channel(handle.address) as ch:
            _, call = ch.unary_unary(f"/{SERVICE}/U").with_call(b"x", timeout=10)
            assert orca.MIRROR_KEY not in dict(call.trailing_metadata())
            assert report_stub(ch)(pb.ReportRequest(), timeout=10).HasField("in_flight")
            with pytest.raises(grpc.RpcError) as e:
                next(iter(ch.unary_stream(orca.OOB_METHOD)(b"", timeout=5)))
            assert e.value.code() is grpc.StatusCode.UNIMPLEMENTED
    finally:
        handle.stop(0)
    assert sum("xds-protos package is not installed" in r.message for r in caplog.records) == 1
    monkeypatch.undo()
    _protos._missing = False
    assert orca.available()  # installed again: the next mount has ORCA


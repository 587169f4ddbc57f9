"""Client-streaming retries in waypost.aio: requests from an async iterator (AsyncReplay) and from the write API
(WriteReplay), replayed into the next attempt on another backend, against real grpc.aio servers."""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import grpc
import grpc.aio
import pytest

import waypost.aio
from harness.backends import echo_pb2, echo_pb2_grpc
from waypost.client.aio_replay import AsyncReplay, WriteReplay
from waypost.client.replay import REPLAY_LIMIT

Req = echo_pb2.EchoRequest
Reply = echo_pb2.EchoReply
SERVICE = "waypost.test.Echo"
UNAVAILABLE = grpc.StatusCode.UNAVAILABLE
CFG = {
    "loadBalancingConfig": [{"round_robin": {}}],
    "methodConfig": [{"name": [{"service": SERVICE}], "retryPolicy": {
        "maxAttempts": 3, "initialBackoff": "0.01s", "maxBackoff": "0.05s", "backoffMultiplier": 2,
        "retryableStatusCodes": ["UNAVAILABLE"]}}],
}
T = 60  # per-call deadline: generous, only a bound


async def until(cond: Callable[[], Any], timeout: float = 20.0, what: str = "") -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout} s: {what}")
        await asyncio.sleep(0.005)


# ---- AsyncReplay on its own (plain asyncio) ------------------------------------------------------------


class Source:
    """An async generator of 0..n-1 that counts how often it is resumed; ``gate`` holds back item ``hold_at``."""

    def __init__(self, n: int, hold_at: int = -1, fail_at: int = -1) -> None:
        self.n, self.hold_at, self.fail_at = n, hold_at, fail_at
        self.gate = asyncio.Event()
        self.yielded = 0
        self.closed = False

    async def __call__(self) -> AsyncIterator[int]:
        try:
            for i in range(self.n):
                if i == self.hold_at:
                    await self.gate.wait()
                if i == self.fail_at:
                    raise ValueError(f"source failed at {i}")
                self.yielded += 1
                yield i
        finally:
            self.closed = True


async def take(it: AsyncIterator[Any], k: int | None = None) -> list[Any]:
    out: list[Any] = []
    async for x in it:
        out.append(x)
        if k is not None and len(out) == k:
            break
    return out


async def test_replay_gives_each_attempt_recorded_items_then_the_rest_once():
    src = Source(6)
    r = AsyncReplay(src())
    first = r.attempt()
    assert await take(first, 3) == [0, 1, 2]
    second = r.attempt()
    assert await take(second) == [0, 1, 2, 3, 4, 5]
    assert await take(first) == []  # stale: a later attempt took over
    assert src.yielded == 6 and r.replayable
    assert await take(r.attempt()) == [0, 1, 2, 3, 4, 5]  # everything is still replayable (6 <= limit)


async def test_replay_shares_the_item_an_abandoned_attempt_is_waiting_for():
    src = Source(6, hold_at=3)
    r = AsyncReplay(src())
    first = r.attempt()
    got_first: list[int] = []

    async def consume_first() -> None:
        async for x in first:
            got_first.append(x)

    t1 = asyncio.ensure_future(consume_first())
    await until(lambda: got_first == [0, 1, 2], 5)
    second = r.attempt()  # the first attempt is now inside the source, waiting for item 3
    t2 = asyncio.ensure_future(take(second))
    await asyncio.sleep(0.01)
    assert not t2.done()
    src.gate.set()
    assert await asyncio.wait_for(t2, 10) == [0, 1, 2, 3, 4, 5]
    await asyncio.wait_for(t1, 10)
    assert got_first == [0, 1, 2]  # the abandoned attempt got nothing more
    assert src.yielded == 6  # the source ran once (an async generator would fail if entered twice at once)


async def test_replay_limit_commits_like_the_sync_replay():
    r = AsyncReplay(Source(3)(), limit=3)
    assert await take(r.attempt()) == [0, 1, 2] and r.replayable  # exactly the limit: still replayable
    r = AsyncReplay(Source(5)(), limit=3)
    it = r.attempt()
    assert await take(it, 3) == [0, 1, 2] and r.replayable
    assert await take(it) == [3, 4] and not r.replayable


async def test_replay_source_error_reaches_every_attempt():
    r = AsyncReplay(Source(5, fail_at=2)())
    with pytest.raises(ValueError, match="failed at 2"):
        await take(r.attempt())
    it = r.attempt()
    assert [await it.__anext__(), await it.__anext__()] == [0, 1]
    with pytest.raises(ValueError, match="failed at 2"):
        await it.__anext__()


async def test_replay_abort_interrupts_a_parked_pull_and_never_ends_a_stream_short():
    src = Source(4, hold_at=1)
    r = AsyncReplay(src())
    t1 = asyncio.ensure_future(take(r.attempt()))
    await until(lambda: src.yielded == 1, 5)
    await asyncio.sleep(0.01)  # t1 is now parked in the source, waiting for item 1
    later = r.attempt()
    r.abort(stale_only=True)
    with pytest.raises(asyncio.CancelledError):
        await t1
    assert src.closed
    assert await later.__anext__() == 0
    with pytest.raises(RuntimeError, match="interrupted"):  # not a clean (short) end of the stream
        await later.__anext__()


def test_may_retry_reads_the_policy_without_counting():
    from waypost.client.retry import RetryState
    from waypost.service_config import RetryPolicy

    policy = RetryPolicy(max_attempts=2, initial_backoff=0.01, max_backoff=0.01, backoff_multiplier=1.0,
                         retryable_status_codes=frozenset({UNAVAILABLE}))
    st = RetryState(policy, None, random.Random(1), None)
    assert st.may_retry(UNAVAILABLE, "x") and st.may_retry(UNAVAILABLE, "x")  # asking counts nothing
    assert st.may_retry(grpc.StatusCode.INVALID_ARGUMENT, "x") is False
    assert st.after_failure(UNAVAILABLE, "x") is not None  # attempt 1 failed: attempt 2 is the last
    assert not st.may_retry(UNAVAILABLE, "x")
    assert st.may_retry(UNAVAILABLE, "failed to connect to all addresses")  # never sent: transparent re-pick
    assert not RetryState(None, None, random.Random(1), None).may_retry(UNAVAILABLE, "x")


def test_write_replay_records_up_to_the_limit():
    w = WriteReplay(limit=2)
    assert w.record("a") and w.record("b") and w.replayable
    assert not w.record("c") and not w.replayable
    assert not w.record("d")  # committed for good


# ---- real grpc.aio servers -----------------------------------------------------------------------------


@dataclass
class Seen:
    """One call as a backend saw it: the attempt number, the request messages in order, how it ended."""

    server: str
    attempt: int
    messages: list[str] = field(default_factory=list)
    ended: str = ""


class Log:
    def __init__(self) -> None:
        self.calls: list[Seen] = []
        self.fail_attempts = {0}  # a message with error_code fails the call on these attempts only
        self.replies_at_end = True  # bidi: reply after the request stream ends (else one reply per message)


class AioEcho(echo_pb2_grpc.EchoServicer):
    """A grpc.aio Echo servicer logging every request message of every call, in order."""

    def __init__(self, name: str, log: Log) -> None:
        self.name = name
        self.log = log

    def _seen(self, context: grpc.aio.ServicerContext) -> Seen:
        md = dict(context.invocation_metadata() or ())
        seen = Seen(self.name, int(md.get("grpc-previous-rpc-attempts", "0")))
        self.log.calls.append(seen)
        return seen

    async def _take(self, req: Any, seen: Seen, context: grpc.aio.ServicerContext) -> None:
        seen.messages.append(req.message)
        if req.error_code and seen.attempt in self.log.fail_attempts:
            code = next(c for c in grpc.StatusCode if c.value[0] == req.error_code)
            seen.ended = code.name
            await context.abort(code, f"{self.name} fails attempt {seen.attempt} at {req.message}")

    async def Unary(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        return Reply(message=request.message, server=self.name)

    async def ClientStream(self, request_iterator: Any, context: grpc.aio.ServicerContext) -> Any:
        seen = self._seen(context)
        async for req in request_iterator:
            await self._take(req, seen, context)
        seen.ended = "OK"
        return Reply(message=",".join(seen.messages), server=self.name, received=len(seen.messages),
                     previous_attempts=str(seen.attempt))

    async def BidiStream(self, request_iterator: Any, context: grpc.aio.ServicerContext) -> Any:
        seen = self._seen(context)
        async for req in request_iterator:
            await self._take(req, seen, context)
            if not self.log.replies_at_end:
                yield Reply(message=req.message, server=self.name, index=len(seen.messages) - 1)
        if self.log.replies_at_end:
            for i, m in enumerate(seen.messages):
                yield Reply(message=m, server=self.name, index=i)
        seen.ended = "OK"


@dataclass
class Env:
    log: Log
    stub: Any
    channel: Any


@pytest.fixture
async def env() -> AsyncIterator[Env]:
    log = Log()
    servers, addresses = [], []
    try:
        for name in ("a", "b"):
            srv = grpc.aio.server()
            echo_pb2_grpc.add_EchoServicer_to_server(AioEcho(name, log), srv)
            port = srv.add_insecure_port("127.0.0.1:0")
            await srv.start()
            servers.append(srv)
            addresses.append(f"127.0.0.1:{port}")
        ch = waypost.aio.dial("direct:///" + ",".join(addresses), service_config=CFG)
        try:
            stub = echo_pb2_grpc.EchoStub(ch)
            await stub.Unary(Req(), timeout=T)
            await until(lambda: len(ch.balancer.ready_addresses()) == 2, 30, "both backends READY")
            yield Env(log, stub, ch)
        finally:
            await ch.close()
    finally:
        await asyncio.gather(*(s.stop(0) for s in servers))


def msgs(n: int, fail_at: int = -1, code: grpc.StatusCode = UNAVAILABLE) -> list[Any]:
    return [Req(message=f"m{i}", error_code=code.value[0] if i == fail_at else 0) for i in range(n)]


def names(n: int) -> list[str]:
    return [f"m{i}" for i in range(n)]


async def agen(items: list[Any], gate: asyncio.Event | None = None, hold_at: int = -1,
               pulled: list[int] | None = None) -> AsyncIterator[Any]:
    for i, item in enumerate(items):
        if i == hold_at and gate is not None:
            await gate.wait()
        if pulled is not None:
            pulled.append(i)
        yield item


def assert_retried(log: Log, n_first: int, n_total: int) -> None:
    """Two calls: the first attempt (fails after n_first messages) and the retry on the OTHER backend, which
    received every message, in order, exactly once."""
    first, second = log.calls
    assert (first.attempt, first.ended) == (0, "UNAVAILABLE") and first.messages == names(n_first)
    assert second.attempt == 1 and second.server != first.server
    assert second.messages == names(n_total) and second.ended == "OK"


async def test_async_iterator_stream_unary_retried_on_another_backend(env: Env):
    gate = asyncio.Event()
    pulled: list[int] = []
    call = env.stub.ClientStream(agen(msgs(6, fail_at=3), gate, hold_at=4, pulled=pulled), timeout=T)
    # The first attempt fails at m3 while its request consumer waits in the source for m4; the retry replays
    # m0..m3 on the other backend and then shares the pending item.
    await until(lambda: len(env.log.calls) == 2 and len(env.log.calls[1].messages) == 4, 30, "replayed m0..m3")
    gate.set()
    reply = await call
    assert reply.received == 6 and reply.message == ",".join(names(6)) and reply.previous_attempts == "1"
    assert_retried(env.log, 4, 6)
    assert pulled == list(range(6))  # the source was consumed once
    assert await call.code() == grpc.StatusCode.OK


async def test_async_iterator_stream_stream_retried_on_another_backend(env: Env):
    pulled: list[int] = []
    call = env.stub.BidiStream(agen(msgs(5, fail_at=2), pulled=pulled), timeout=T)
    replies = [r async for r in call]
    assert [(r.message, r.index) for r in replies] == [(f"m{i}", i) for i in range(5)]
    assert len({r.server for r in replies}) == 1
    assert_retried(env.log, 3, 5)
    assert replies[0].server == env.log.calls[1].server and pulled == list(range(5))


async def test_write_api_stream_unary_retried_on_another_backend(env: Env):
    # Writes wait for nothing: the retry replays what was written into the new attempt.
    call = env.stub.ClientStream(timeout=T)
    for m in msgs(6, fail_at=2):
        await call.write(m)
    await call.done_writing()
    reply = await call
    assert reply.received == 6 and reply.previous_attempts == "1"
    assert_retried(env.log, 3, 6)

    # The retry happens between two writes: the replay alone brings the new attempt to m0..m3.
    env.log.calls.clear()
    call = env.stub.ClientStream(timeout=T)
    for m in msgs(4, fail_at=3):
        await call.write(m)
    await until(lambda: len(env.log.calls) == 2 and len(env.log.calls[1].messages) == 4, 30, "replayed m0..m3")
    for m in msgs(6)[4:]:
        await call.write(m)
    await call.done_writing()
    assert (await call).message == ",".join(names(6))
    assert_retried(env.log, 4, 6)


async def test_write_api_stream_stream_retried_on_another_backend(env: Env):
    call = env.stub.BidiStream(timeout=T)
    for m in msgs(5, fail_at=1):
        await call.write(m)
    await call.done_writing()  # all written before reading: the first read drives the retry
    replies = [r async for r in call]
    assert [r.message for r in replies] == names(5)
    assert_retried(env.log, 2, 5)


async def test_write_api_half_close_reaches_the_retry_after_its_replay(env: Env):
    # done_writing happened while the first attempt was already over: the retry half-closes after the replay.
    call = env.stub.ClientStream(timeout=T)
    for m in msgs(3, fail_at=2):
        await call.write(m)
    await until(lambda: env.log.calls and env.log.calls[0].ended == "UNAVAILABLE", 30)
    await call.done_writing()
    await call.done_writing()  # idempotent
    assert (await call).received == 3
    assert_retried(env.log, 3, 3)
    with pytest.raises(asyncio.InvalidStateError):
        await call.write(Req(message="late"))


async def test_no_retry_after_a_response_message(env: Env):
    env.log.replies_at_end = False  # bidi replies to each message: m0 gets a reply before m1 fails
    # m2 is held until the call is over: sent as the server's status arrives, grpc.aio's failed send can set the
    # call's status to INTERNAL ("Failed execute_batch") before the server's UNAVAILABLE is read (a race of grpcio's)
    never = asyncio.Event()
    call = env.stub.BidiStream(agen(msgs(3, fail_at=1), gate=never, hold_at=2), timeout=T)
    got = []
    with pytest.raises(grpc.aio.AioRpcError) as ei:
        async for r in call:
            got.append(r.message)
    assert got == ["m0"] and ei.value.code() == UNAVAILABLE
    assert [(c.attempt, c.ended) for c in env.log.calls] == [(0, "UNAVAILABLE")]

    env.log.calls.clear()
    call = env.stub.BidiStream(timeout=T)
    await call.write(msgs(1)[0])
    assert (await call.read()).message == "m0"
    try:
        await call.write(msgs(2, fail_at=1)[1])
        await call.done_writing()
    except (grpc.aio.AioRpcError, asyncio.InvalidStateError):
        pass  # the attempt may already be over: as grpc.aio, a write then fails
    with pytest.raises(grpc.aio.AioRpcError) as ei:
        await call.read()
    assert ei.value.code() == UNAVAILABLE and await call.code() == UNAVAILABLE
    assert [(c.attempt, c.ended) for c in env.log.calls] == [(0, "UNAVAILABLE")]


async def test_no_retry_past_the_replay_limit(env: Env):
    # Exactly REPLAY_LIMIT requests are still replayable: retried.
    reply = await env.stub.ClientStream(agen(msgs(REPLAY_LIMIT, fail_at=REPLAY_LIMIT - 1)), timeout=T)
    assert reply.received == REPLAY_LIMIT
    assert_retried(env.log, REPLAY_LIMIT, REPLAY_LIMIT)

    # One more and the call is committed to its attempt: the original error surfaces.
    for make in ("iterator", "writes"):
        env.log.calls.clear()
        items = msgs(REPLAY_LIMIT + 1, fail_at=REPLAY_LIMIT)
        with pytest.raises(grpc.aio.AioRpcError) as ei:
            if make == "iterator":
                await env.stub.ClientStream(agen(items), timeout=T)
            else:
                call = env.stub.ClientStream(timeout=T)
                try:
                    for m in items:
                        await call.write(m)
                    await call.done_writing()
                except (grpc.aio.AioRpcError, asyncio.InvalidStateError):
                    pass  # the last write may see the end of the (committed) attempt
                await call
        assert ei.value.code() == UNAVAILABLE and "fails attempt 0" in (ei.value.details() or ""), make
        assert [(c.attempt, c.ended, len(c.messages)) for c in env.log.calls] == \
            [(0, "UNAVAILABLE", REPLAY_LIMIT + 1)], make


async def test_non_retryable_code_not_retried(env: Env):
    invalid = grpc.StatusCode.INVALID_ARGUMENT

    async def by_iterator() -> Any:
        return await env.stub.ClientStream(agen(msgs(3, fail_at=1, code=invalid)), timeout=T)

    async def by_writes() -> Any:
        call = env.stub.ClientStream(timeout=T)
        try:
            for m in msgs(3, fail_at=1, code=invalid):
                await call.write(m)
            await call.done_writing()
        except asyncio.InvalidStateError:
            pass  # a write after the call's end, as in grpc.aio
        except grpc.aio.AioRpcError as e:
            assert e.code() == invalid  # a write as the call ends: its real status, not grpc.aio's stand-in
        return await call

    async def bidi() -> Any:
        return [r async for r in env.stub.BidiStream(agen(msgs(3, fail_at=1, code=invalid)), timeout=T)]

    async def bidi_writes() -> Any:
        call = env.stub.BidiStream(timeout=T)
        for m in msgs(2, fail_at=1, code=invalid):
            await call.write(m)
        await until(lambda: env.log.calls and env.log.calls[0].ended == "INVALID_ARGUMENT", 30)
        # Once the client has the status, a write fails as in grpc.aio (the error is not retried).
        deadline = time.monotonic() + 30
        with pytest.raises((asyncio.InvalidStateError, grpc.aio.AioRpcError)):
            while time.monotonic() < deadline:
                await call.write(Req(message="more"))
                await asyncio.sleep(0.005)
        return [r async for r in call]

    runs: list[Callable[[], Awaitable[Any]]] = [by_iterator, by_writes, bidi, bidi_writes]
    for run in runs:
        env.log.calls.clear()
        with pytest.raises(grpc.aio.AioRpcError) as ei:
            await run()
        assert ei.value.code() == invalid, run.__name__
        assert [(c.attempt, c.ended) for c in env.log.calls] == [(0, "INVALID_ARGUMENT")], run.__name__


def extra_tasks(baseline: set[asyncio.Task[Any]]) -> set[asyncio.Task[Any]]:
    """Tasks started since ``baseline``, except each grpc.aio server's idle task waiting for its next RPC (the
    servers share this loop; that task is replaced whenever an RPC arrives)."""
    return {t for t in asyncio.all_tasks() if t not in baseline and t is not asyncio.current_task()
            and "_request_registered_call" not in getattr(t.get_coro(), "__qualname__", "")}


async def test_cancelled_calls_leak_no_tasks(env: Env):
    baseline = set(asyncio.all_tasks())
    # stream_unary from an async iterator: the first attempt fails at m0 while its consumer is parked in the
    # source (waiting for m1, which never comes); the retry replays m0 and waits for the same item. Cancel.
    src = Source(3, hold_at=1)

    async def requests() -> AsyncIterator[Any]:
        async for i in src():
            yield msgs(3, fail_at=0)[i]

    call = env.stub.ClientStream(requests(), timeout=T)
    await until(lambda: len(env.log.calls) == 2 and env.log.calls[1].messages == ["m0"], 30, "retry replayed m0")
    assert call.cancel()
    with pytest.raises(asyncio.CancelledError):
        await call
    assert await call.code() == grpc.StatusCode.CANCELLED
    await until(lambda: not extra_tasks(baseline), 20, "every task of the call ended")
    assert src.closed and src.yielded == 1

    # stream_stream through the write API, abandoned by cancelling a read that drove a retry.
    env.log.calls.clear()
    call = env.stub.BidiStream(timeout=T)
    await call.write(msgs(1, fail_at=0)[0])
    reader = asyncio.ensure_future(call.read())
    await until(lambda: len(env.log.calls) == 2 and env.log.calls[1].messages == ["m0"], 30, "retry replayed m0")
    reader.cancel()
    with pytest.raises(asyncio.CancelledError):
        await reader
    assert await call.code() == grpc.StatusCode.CANCELLED
    await until(lambda: not extra_tasks(baseline), 20, "every task of the call ended")


class _PassStreamUnary(grpc.aio.StreamUnaryClientInterceptor):
    def __init__(self) -> None:
        self.seen = 0

    async def intercept_stream_unary(self, continuation, details, request_iterator):
        self.seen += 1
        return await continuation(details, request_iterator)


class _PassStreamStream(grpc.aio.StreamStreamClientInterceptor):
    def __init__(self) -> None:
        self.seen = 0

    async def intercept_stream_stream(self, continuation, details, request_iterator):
        self.seen += 1
        return await continuation(details, request_iterator)


@pytest.mark.parametrize("make", [_PassStreamUnary, _PassStreamStream])
async def test_retries_through_client_interceptors(env: Env, make: type):
    # grpc.aio files an interceptor under one call kind: one interceptor per run, the other kind unintercepted.
    icp = make()
    async with waypost.aio.dial(env.channel.target, service_config=CFG, interceptors=[icp]) as ch:
        stub = echo_pb2_grpc.EchoStub(ch)
        await stub.Unary(Req(), timeout=T)
        await until(lambda: len(ch.balancer.ready_addresses()) == 2, 30, "both backends READY")
        env.log.calls.clear()
        assert (await stub.ClientStream(agen(msgs(4, fail_at=2)), timeout=T)).received == 4
        assert_retried(env.log, 3, 4)

        env.log.calls.clear()
        call = stub.ClientStream(timeout=T)
        for m in msgs(4, fail_at=1):
            await call.write(m)
        await call.done_writing()
        assert (await call).received == 4
        assert_retried(env.log, 2, 4)

        env.log.calls.clear()
        call = stub.BidiStream(timeout=T)
        for m in msgs(4, fail_at=3):
            await call.write(m)
        await call.done_writing()
        assert [r.message async for r in call] == names(4)
        assert_retried(env.log, 4, 4)
    assert icp.seen == (2 if make is _PassStreamUnary else 1) * 2  # once per attempt

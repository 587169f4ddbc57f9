"""The channel's ``LoadProber``: asks one backend's load-report service, asynchronously, on its own grpc channel.

A policy that balances on server load reports (``Policy.wants_load_reports``) gets one at channel construction
(``BalancerWrapper``). ``probe(address)`` returns at once; the answer reaches the policy as
``policy.on_probe(address, in_flight, latency)`` or ``policy.on_probe_failed(address, unsupported)``:

- sync channels (``grpc.Channel``): the report multicallable's ``.future()`` with ``timeout``; its done callback
  (on grpc's completion thread) delivers the answer;
- aio channels (``grpc.aio.Channel``): a task on the event loop the probe was asked from (the channel's: picks of
  an aio channel run there), scheduled with ``call_soon_threadsafe`` so that the pick itself only queues a
  callback; ``close()`` cancels the tasks still running.

``open_stream(address, method, request, on_message)`` keeps a server-streaming call open to a backend (the ORCA
out-of-band reports of ``weighted_round_robin``): a daemon thread per stream on sync channels, a task on the
channel's event loop on aio ones; after a failure or the end of the stream it is opened again after a backoff
(0.5 s doubling to 30 s, reset by a message) until ``close_stream`` or ``close``. A server answering
UNIMPLEMENTED is logged once per address and retried at the longest backoff.

UNIMPLEMENTED (a server without the service), or a report without an in-flight count (a server that cannot
account its calls), is reported as ``unsupported``; every other failure as a plain failure. Probes go only to
backends that are usable now (READY, healthy, not removed): a dead or removed backend is not probed.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable
from contextlib import suppress
from typing import Any

import grpc

from ..balancer.base import Policy
from ..orca.waypost_report import pb, report_stub
from .subconn import SubConn

log = logging.getLogger("waypost.client.prober")

_REQUEST = pb.ReportRequest()
_STUB_KEY = ("load_report",)  # the report multicallable's key in the subconn's multicallable cache
_UNIMPLEMENTED = grpc.StatusCode.UNIMPLEMENTED


class SubConnProber:
    """Sends load-report probes on the subconns' channels and delivers the answers to ``policy``."""

    def __init__(self, lookup: Callable[[str], SubConn | None], policy: Policy, timeout: float) -> None:
        self._lookup = lookup
        self._policy = policy
        self._timeout = timeout
        self._loop: asyncio.AbstractEventLoop | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._closed = False
        self._streams: dict[tuple[str, str], _Stream] = {}

    def probe(self, address: str) -> bool:
        sc = self._lookup(address)
        if self._closed or sc is None or not sc.usable:
            return False
        stub = sc.mcs.get(_STUB_KEY)
        if stub is None:
            stub = sc.mcs[_STUB_KEY] = report_stub(sc.channel)
        if isinstance(sc.channel, grpc.aio.Channel):
            return self._probe_aio(address, stub)
        try:
            fut = stub.future(_REQUEST, timeout=self._timeout)
        except Exception:  # the channel is closing under us: no probe, never an error to the call
            log.debug("prequal: probe of %s could not be sent", address, exc_info=True)
            return False
        fut.add_done_callback(lambda f: self._deliver_future(address, f))
        return True

    def _probe_aio(self, address: str, stub: Any) -> bool:
        with suppress(RuntimeError):  # asked from another thread: use the loop of the earlier probes
            self._loop = asyncio.get_running_loop()
        loop = self._loop
        if loop is None:
            return False
        try:
            loop.call_soon_threadsafe(self._start_task, address, stub)
        except RuntimeError:  # the loop was closed: no probe, never an error to the call
            return False
        return True

    def _start_task(self, address: str, stub: Any) -> None:
        if self._closed:
            self._policy.on_probe_failed(address, False)
            return
        task = asyncio.ensure_future(self._run_aio(address, stub))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _run_aio(self, address: str, stub: Any) -> None:
        try:
            report = await stub(_REQUEST, timeout=self._timeout)
        except asyncio.CancelledError:
            self._policy.on_probe_failed(address, False)
            raise
        except grpc.RpcError as e:
            self._failed(address, e)
            return
        except Exception:  # noqa: BLE001  # e.g. the channel was closed: a failed probe, nothing more
            self._policy.on_probe_failed(address, False)
            return
        self._deliver(address, report)

    def _deliver_future(self, address: str, fut: Any) -> None:
        try:
            exc = fut.exception()
            if exc is None:
                self._deliver(address, fut.result())
            else:
                self._failed(address, exc)
        except Exception:  # a policy bug must not kill grpc's completion thread
            log.exception("prequal: delivering the probe of %s", address)

    def _deliver(self, address: str, report: Any) -> None:
        if not report.HasField("in_flight"):
            self._policy.on_probe_failed(address, True)
            return
        latency = report.latency_estimate_seconds if report.HasField("latency_estimate_seconds") else None
        self._policy.on_probe(address, report.in_flight, latency)

    def _failed(self, address: str, exc: BaseException) -> None:
        code = exc.code() if isinstance(exc, grpc.RpcError) and hasattr(exc, "code") else None
        self._policy.on_probe_failed(address, code is _UNIMPLEMENTED)

    # ---- streams -------------------------------------------------------------------------------------------

    def open_stream(self, address: str, method: str, request: bytes, on_message: Callable[[bytes], None]) -> bool:
        key = (address, method)
        if self._closed or key in self._streams:
            return not self._closed
        sc = self._lookup(address)
        if sc is None:
            return False
        st = _Stream(self, address, method, request, on_message)
        if isinstance(sc.channel, grpc.aio.Channel):
            loop: asyncio.AbstractEventLoop | None
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:
                loop = self._loop
            if loop is None:
                return False
            self._loop = loop
            self._streams[key] = st
            loop.call_soon_threadsafe(st.start_task)
            return True
        self._streams[key] = st
        threading.Thread(target=st.run_sync, name=f"waypost-stream-{address}", daemon=True).start()
        return True

    def close_stream(self, address: str, method: str) -> None:
        st = self._streams.pop((address, method), None)
        if st is not None:
            st.close()

    def close(self) -> None:
        """No more probes; cancel the aio probes still running (call it from the channel's loop for aio)."""
        self._closed = True
        for task in list(self._tasks):
            task.cancel()
        for key in list(self._streams):
            self.close_stream(*key)


_BACKOFF_MIN, _BACKOFF_MAX = 0.5, 30.0
_unimplemented_logged: set[tuple[str, str]] = set()


class _Stream:
    """One kept-open server stream of ``SubConnProber.open_stream``."""

    def __init__(self, prober: SubConnProber, address: str, method: str, request: bytes,
                 on_message: Callable[[bytes], None]) -> None:
        self.prober, self.address, self.method = prober, address, method
        self.request, self.on_message = request, on_message
        self.closed = threading.Event()
        self.call: Any = None
        self.task: asyncio.Task[None] | None = None
        self.backoff = _BACKOFF_MIN

    def _callable(self) -> Any:
        sc = self.prober._lookup(self.address)
        if sc is None or not sc.usable:
            return None
        return sc.channel.unary_stream(self.method)  # raw bytes both ways

    def _failed(self, exc: BaseException | None) -> None:
        code = exc.code() if isinstance(exc, grpc.RpcError) and hasattr(exc, "code") else None
        if code is _UNIMPLEMENTED:
            if (self.address, self.method) not in _unimplemented_logged:
                _unimplemented_logged.add((self.address, self.method))
                log.info("%s does not serve %s (UNIMPLEMENTED): its load is not streamed", self.address, self.method)
            self.backoff = _BACKOFF_MAX
        else:
            self.backoff = min(self.backoff * 2, _BACKOFF_MAX)

    def _deliver(self, msg: bytes) -> None:
        self.backoff = _BACKOFF_MIN
        try:
            self.on_message(msg)
        except Exception:  # a policy bug must not end the stream
            log.exception("stream %s of %s: delivering a message", self.method, self.address)

    def run_sync(self) -> None:
        while not self.closed.is_set():
            wait = self.backoff
            mc = self._callable()
            if mc is not None:
                try:
                    self.call = call = mc(self.request)
                    if self.closed.is_set():
                        call.cancel()
                    for msg in call:
                        self._deliver(msg)
                    self._failed(None)
                except grpc.RpcError as e:
                    self._failed(e)
                except Exception:  # noqa: BLE001  # the channel closed under us: try again later, or stop
                    self._failed(None)
                wait = self.backoff
            self.closed.wait(wait)

    def start_task(self) -> None:
        if not self.closed.is_set():
            self.task = asyncio.ensure_future(self.run_aio())

    async def run_aio(self) -> None:
        while not self.closed.is_set():
            mc = self._callable()
            if mc is not None:
                try:
                    self.call = call = mc(self.request)
                    async for msg in call:
                        self._deliver(msg)
                    self._failed(None)
                except asyncio.CancelledError:
                    return
                except grpc.RpcError as e:
                    self._failed(e)
                except Exception:  # noqa: BLE001
                    self._failed(None)
            await asyncio.sleep(self.backoff)

    def close(self) -> None:
        self.closed.set()
        call, task = self.call, self.task
        if call is not None:
            try:
                call.cancel()
            except Exception:  # cancelled from a thread other than the aio loop's: the task's cancel ends it
                log.debug("stream %s of %s: cancel", self.method, self.address, exc_info=True)
        if task is not None:
            loop = task.get_loop()
            with suppress(RuntimeError):  # the loop is closed: the task ended with it
                loop.call_soon_threadsafe(task.cancel)

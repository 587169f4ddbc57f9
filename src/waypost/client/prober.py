"""The channel's ``LoadProber``: asks one backend's load-report service, asynchronously, on its own grpc channel.

A policy that balances on server load reports (``Policy.wants_load_reports``) gets one at channel construction
(``BalancerWrapper``). ``probe(address)`` returns at once; the answer reaches the policy as
``policy.on_probe(address, in_flight, latency)`` or ``policy.on_probe_failed(address, unsupported)``:

- sync channels (``grpc.Channel``): the report multicallable's ``.future()`` with ``timeout``; its done callback
  (on grpc's completion thread) delivers the answer;
- aio channels (``grpc.aio.Channel``): a task on the event loop the probe was asked from (the channel's: picks of
  an aio channel run there), scheduled with ``call_soon_threadsafe`` so that the pick itself only queues a
  callback; ``close()`` cancels the tasks still running.

UNIMPLEMENTED (a server without the service), or a report without an in-flight count (a server that cannot
account its calls), is reported as ``unsupported``; every other failure as a plain failure. Probes go only to
backends that are usable now (READY, healthy, not removed): a dead or removed backend is not probed.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

import grpc

from ..balancer.base import Policy
from ..loadreport import pb, report_stub
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
        try:
            self._loop = asyncio.get_running_loop()
        except RuntimeError:
            pass  # asked from another thread: use the loop of the earlier probes
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

    def close(self) -> None:
        """No more probes; cancel the aio probes still running (call it from the channel's loop for aio)."""
        self._closed = True
        for task in list(self._tasks):
            task.cancel()

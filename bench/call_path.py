"""Which waypost modules one call goes through, and how often it moves between them.

Runs one Echo server (a subprocess), dials it with ``waypost.dial("direct:///...")`` (and ``waypost.aio.dial``),
with round_robin and with the default policy, warms the channel up, then traces a single unary call with ``sys.setprofile``: every Python
function entered whose code lives under ``src/waypost``. Prints the modules in the order first entered, their count,
and the number of hops (a call or return that lands in another waypost module than the one before it).
This is a map of the code a call runs, not a timing: ``bench/channel_overhead.py`` measures the cost.
JSON: bench/results/call_path.json.
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from types import FrameType
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "src"))

import waypost
import waypost.aio
from harness.backends import echo_pb2, echo_pb2_grpc
from harness.backends.procs import spawn_many

SRC = str(Path(waypost.__file__).resolve().parent)
REQ = echo_pb2.EchoRequest(message="x")


class Trace:
    """The waypost modules entered (in first-entry order) and the hops between them."""

    def __init__(self) -> None:
        self.modules: list[str] = []
        self.hops = 0
        self._last: str | None = None

    def __call__(self, frame: FrameType, event: str, arg: Any) -> None:
        if event not in ("call", "return"):
            return
        path = frame.f_code.co_filename
        if not path.startswith(SRC):
            return
        module = "waypost" + path[len(SRC):-3].replace("/", ".").removesuffix(".__init__")
        if module not in self.modules:
            self.modules.append(module)
        if module != self._last:
            if self._last is not None:
                self.hops += 1
            self._last = module


def trace_sync(addr: str, balancer: str | None) -> Trace:
    with waypost.dial(f"direct:///{addr}", balancer=balancer) as ch:
        stub = echo_pb2_grpc.EchoStub(ch)
        for _ in range(20):
            stub.Unary(REQ, timeout=30)
        t = Trace()
        sys.setprofile(t)
        try:
            stub.Unary(REQ, timeout=30)
        finally:
            sys.setprofile(None)
    return t


async def trace_aio(addr: str, balancer: str | None) -> Trace:
    async with waypost.aio.dial(f"direct:///{addr}", balancer=balancer) as ch:
        stub = echo_pb2_grpc.EchoStub(ch)
        for _ in range(20):
            await stub.Unary(REQ, timeout=30)
        t = Trace()
        sys.setprofile(t)
        try:
            await stub.Unary(REQ, timeout=30)
        finally:
            sys.setprofile(None)
    return t


def main() -> None:
    (server,) = spawn_many(["a"])
    try:
        addr = server.address
        results = {}
        for balancer in ("round_robin", None):  # None: the default policy
            name = balancer or "default policy"
            results[f"sync unary, {name}"] = trace_sync(addr, balancer)
            results[f"aio unary, {name}"] = asyncio.run(trace_aio(addr, balancer))
    finally:
        server.close()
    out: dict[str, Any] = {}
    for name, t in results.items():
        print(f"{name}: {len(t.modules)} modules, {t.hops} hops")
        for m in t.modules:
            print(f"  {m}")
        out[name] = {"modules": t.modules, "module_count": len(t.modules), "hops": t.hops}
    path = ROOT / "bench" / "results" / "call_path.json"
    path.parent.mkdir(exist_ok=True)
    path.write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()

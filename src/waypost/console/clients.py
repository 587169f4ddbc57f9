"""What clients see: the console reads client processes' ``waypost.metrics.serve`` endpoints (``--metrics URL``).

Every ``INTERVAL`` seconds each URL is fetched once (a ``TIMEOUT`` bound; shared by every browser) and, per
dial target and backend, the board gets: the share of the calls finished since the previous scrape
(``waypost_client_requests_total``), the calls in flight (``waypost_client_in_flight``) and a latency estimate
(the balancing policy's ``waypost_client_backend_latency_estimate_seconds`` when it keeps one, else the mean of
``waypost_client_latency_seconds`` over the interval). The last ``POINTS`` points are kept for the charts.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

import aiohttp

from ..redaction import redact_url
from .board import Board

log = logging.getLogger("waypost.console")

INTERVAL = 2.0
TIMEOUT = 2.0
POINTS = 60
MAX_BODY = 4 * 1024 * 1024


def parse(text: str) -> dict[str, dict[str, dict[str, float]]]:
    """target -> backend -> {requests, in_flight, estimate, lat_sum, lat_count} from a Prometheus text page."""
    from prometheus_client.parser import text_string_to_metric_families

    names = {"waypost_client_requests_total": "requests", "waypost_client_in_flight": "in_flight",
             "waypost_client_backend_latency_estimate_seconds": "estimate",
             "waypost_client_latency_seconds_sum": "lat_sum", "waypost_client_latency_seconds_count": "lat_count"}
    out: dict[str, dict[str, dict[str, float]]] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            field = names.get(s.name)
            target, backend = s.labels.get("target"), s.labels.get("backend")
            if field is None or target is None or backend is None:
                continue
            row = out.setdefault(target, {}).setdefault(backend, {})
            row[field] = row.get(field, 0.0) + float(s.value)
    return out


def point(prev: dict[str, dict[str, float]] | None, now: dict[str, dict[str, float]], t: float) -> dict[str, Any]:
    """One chart point for a target: share of calls, in flight and latency per backend."""
    deltas = {b: max(0.0, v.get("requests", 0.0) - ((prev or {}).get(b) or {}).get("requests", 0.0))
              for b, v in now.items()}
    total = sum(deltas.values())
    latency: dict[str, float | None] = {}
    for b, v in now.items():
        if "estimate" in v:
            latency[b] = v["estimate"]
            continue
        p = (prev or {}).get(b) or {}
        n = v.get("lat_count", 0.0) - p.get("lat_count", 0.0)
        latency[b] = (v.get("lat_sum", 0.0) - p.get("lat_sum", 0.0)) / n if n > 0 else None
    return {"t": round(t, 3), "calls": {b: int(d) for b, d in deltas.items()},
            "share": {b: (d / total if total else 0.0) for b, d in deltas.items()},
            "in_flight": {b: v.get("in_flight", 0.0) for b, v in now.items()}, "latency": latency}


class ClientMetrics:
    def __init__(self, board: Board, urls: list[str], *, interval: float = INTERVAL) -> None:
        self.board = board
        self.urls = urls
        self.interval = interval
        self._last: dict[str, dict[str, dict[str, dict[str, float]]]] = {}
        self._task: asyncio.Task[None] | None = None
        self._session: aiohttp.ClientSession | None = None

    def start(self) -> None:
        if self.urls:
            self._task = asyncio.create_task(self._run(), name="waypost-console-metrics")

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
        if self._session is not None:
            await self._session.close()

    async def _run(self) -> None:
        self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=TIMEOUT))
        while True:
            await asyncio.gather(*(self.scrape(u) for u in self.urls))
            self.board.touch()
            await asyncio.sleep(self.interval)

    async def scrape(self, url: str) -> None:
        shown = redact_url(url)
        entry = self.board.clients.setdefault(shown, {"error": None, "targets": {}})
        try:
            assert self._session is not None
            async with self._session.get(url) as resp:
                if resp.status != 200:
                    raise ValueError(f"HTTP {resp.status}")
                body = await resp.content.read(MAX_BODY)
            now = parse(body.decode("utf-8", "replace"))
        except asyncio.CancelledError:
            raise
        except Exception as e:  # noqa: BLE001 (shown on the page)
            why = str(e) or type(e).__name__
            if entry["error"] != why:
                log.warning("console: metrics %s: %s", shown, why)
            entry["error"] = why
            return
        entry["error"] = None
        t = time.time()
        prev = self._last.get(url, {})
        for target, backends in now.items():
            tgt = entry["targets"].setdefault(target, {"series": []})
            if target in prev:  # the first scrape only sets the baseline
                tgt["series"].append(point(prev[target], backends, t))
                del tgt["series"][:-POINTS]
            tgt["backends"] = sorted(backends)
        self._last[url] = now

"""What the kinds whose registry is an HTTP API (Consul, Eureka) share, beside the client's plumbing
(``http_api.py``), written once so that both say and do it alike:

- ``exchange`` makes one request; one that times out raises ``NoAnswer`` saying how far it got (``did not accept
  a connection``, ``accepted the connection but did not answer``, ``started answering but did not finish``: a host
  down, a server that hangs, a slow link), when the session has ``connected_trace()``;
- ``json_answer``: a 2xx body as JSON (None when empty); anything else is ``MalformedAnswer``;
- ``answer_text``: what a refusal says (the ``error`` or ``message`` of a JSON body, else its text);
- ``ProblemsSaid``: which problems of malformed entries were logged, so that each is said once;
- ``logged_hold``: the hold of an empty answer (``EmptyListHold``), its start and end logged;
- ``RereadCatalog``: a console source that reads its registry again and again, each answer shown.
"""

from __future__ import annotations

import abc
import asyncio
import json
import logging
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, ClassVar

from ..console.catalog_source import CatalogSource
from ..console.sources import RETRY_INTERVAL, on_control
from ..errors import RegistryError
from ..resolver.empty_hold import EmptyListHold

#: the longest part of an answer an error message shows
SHOWN = 400


class MalformedAnswer(RegistryError):
    """A 200 that is not the registry's answer (not JSON, not the type asked for, no entry well-formed): a proxy or
    another server at the registry's address. A resolver keeps its last list."""


class NoAnswer(Exception):
    """A request without a whole answer within its bound; the message says how far it got."""


def connected_trace() -> Any:
    """An aiohttp trace (for a session's ``trace_configs``) marking a request's ``trace_request_ctx`` once
    connected: what ``NoAnswer`` tells from."""
    import aiohttp

    async def connected(_session: Any, ctx: Any, _params: Any) -> None:
        if isinstance(ctx.trace_request_ctx, dict):
            ctx.trace_request_ctx["connected"] = True

    trace = aiohttp.TraceConfig()
    trace.on_connection_create_end.append(connected)
    trace.on_connection_reuseconn.append(connected)
    return trace


async def exchange(session: Any, method: str, url: str, *, body: Any = None, **kw: Any
                   ) -> tuple[int, Mapping[str, str], bytes]:
    """One request of an aiohttp ``session`` (``body``: sent as compact JSON; ``kw``: ``session.request``'s): the
    answer's status, headers and body. A timeout raises ``NoAnswer``; the other errors pass."""
    progress: dict[str, bool] = {}
    data = None if body is None else json.dumps(body, separators=(",", ":"))
    try:
        async with session.request(method, url, data=data, trace_request_ctx=progress, **kw) as resp:
            progress["answered"] = True
            return resp.status, resp.headers, await resp.read()
    except asyncio.TimeoutError:
        raise NoAnswer("started answering but did not finish" if progress.get("answered") else
                       "accepted the connection but did not answer" if progress.get("connected") else
                       "did not accept a connection") from None


def json_answer(raw: bytes, where: str, what: str) -> Any:
    """The JSON of a 2xx answer (None when empty) from the registry ``where`` (``consul at URL``) to the request
    ``what``; ``MalformedAnswer`` when it is not JSON."""
    text = raw.strip()
    if not text:
        return None
    try:
        return json.loads(text)
    except ValueError:
        raise MalformedAnswer(f"malformed answer from {where}: {what}: not JSON: {text[:200]!r}") from None


def answer_text(raw: bytes) -> str:
    """What an answer that refused a request says: the ``error`` (else ``message``) of a JSON object, else the
    text; "" when empty."""
    text = raw.decode(errors="replace").strip()
    try:
        doc = json.loads(text)
    except ValueError:
        return text[:SHOWN]
    if isinstance(doc, Mapping):
        return str(doc.get("error") or doc.get("message") or text)[:SHOWN]
    return text[:SHOWN]


class ProblemsSaid:
    """The problems of malformed entries a resolver logged: each distinct one is said once (after ``LIMIT``
    different ones the memory starts over, so that it does not grow without bound)."""

    LIMIT = 64

    def __init__(self) -> None:
        self._said: set[str] = set()

    def new(self, problems: Iterable[str]) -> list[str]:
        """The problems not said yet (each once, in their order), now counted as said."""
        fresh = []
        for problem in dict.fromkeys(problems):
            if problem not in self._said:
                if len(self._said) >= self.LIMIT:
                    self._said.clear()
                self._said.add(problem)
                fresh.append(problem)
        return fresh


def logged_hold(settle: float, log: logging.Logger, subject: Callable[[], str],
                kept: Callable[[], int]) -> EmptyListHold:
    """An ``EmptyListHold`` of ``settle`` s (on ``time.monotonic``) whose start and end are logged: ``subject()``
    says what was answered and when (``consul: service 'greet' answered no passing instance right after a
    reconnect``), ``kept()`` how many instances the list kept meanwhile has."""
    def started() -> None:
        log.info("waypost: %s; keeping the last %d for up to %gs unless they come back", subject(), kept(),
                 hold.settle)

    def expired(held: float) -> None:
        log.warning("waypost: %s, and none came back within %gs: applying the empty list", subject(), held)

    hold = EmptyListHold(settle, time.monotonic, on_start=started, on_expired=expired)
    return hold


class RereadCatalog(CatalogSource):
    """A console source that reads its registry again and again (``_read``, on the control loop): ``start`` shows
    the first answer, then each one until ``close``. A registry that cannot be read is shown as down, not raised,
    and read again after a pause."""

    #: seconds between two reads (0: ``_read`` waits for a change itself, a blocking query)
    interval: ClassVar[float] = 0.0

    @abc.abstractmethod
    async def _read(self) -> tuple[Sequence[str], Mapping[tuple[str, str, str], dict[str, Any]] | None]:
        """The registry's service names, and the overrides in force (None: not shown from this read)."""

    async def start(self) -> None:
        await self._show()
        self._spawn(self._follow(), self.kind)

    async def _follow(self) -> None:
        while not self._closed:
            await asyncio.sleep(self.interval)
            if not await self._show():
                await asyncio.sleep(RETRY_INTERVAL)

    async def _show(self) -> bool:
        """One read shown on the board; whether it worked."""
        try:
            names, overrides = await on_control(self._read())
        except Exception as e:  # noqa: BLE001 (shown on the page; read again)
            self._down(e)
            return False
        self.board.source_up(self.name, self.kind)
        if overrides is not None:
            self._show_overrides(overrides)
        await self._follow_names(names)
        return True

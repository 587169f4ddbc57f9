"""k8s://NAMESPACE/SERVICE:PORT: the ready endpoints of a Service, followed through its EndpointSlices.

The informer pattern of client-go, for one label selector (``kubernetes.io/service-name=SERVICE``), on the
control loop:

1. **list** the service's EndpointSlices; the list's ``resourceVersion`` is where the watch starts;
2. **watch** from there with bookmarks (``allowWatchBookmarks``: the apiserver moves our resourceVersion on
   even when nothing changes, so a resumed watch rarely starts from a version it has forgotten); each event
   updates the slices (``waypost.k8s.slices``) and, when the addresses changed, the channel gets the list;
   the server ends a watch after ``timeoutSeconds`` (5-10 min, random, as client-go) and it resumes at once
   from the last version;
3. **410 Gone** (our version was compacted away): list again and replace, so slices deleted meanwhile
   disappear while unchanged endpoints are never removed and re-added;
4. apiserver unreachable, or any other failure: the channel keeps the last list (``on_error`` says why, once),
   and the watch resumes from the last version with backoff (0.5 s doubling up to 10 s, jittered).

A watch that says nothing for ``READ_TIMEOUT`` s is treated as a dead link and resumed (the apiserver sends
a bookmark about once a minute with its watch cache on).

The client is kubernetes_asyncio (the ``k8s`` extra): its configuration loading and authenticated HTTP
session; the list and watch requests are read here as raw JSON (no model objects per event).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import logging
import random
import time
from collections.abc import Callable, Sequence
from typing import Any

from .. import _loop
from ..errors import InvalidTarget, RegistryUnavailable
from ..k8s import config as k8s_config
from ..k8s.slices import SERVICE_NAME_LABEL, ServiceSlices
from ..types import Backend
from .base import OnError, OnUpdate, ResolverOptions, notify
from .target import Target

log = logging.getLogger("waypost.resolver.k8s")

#: server-side watch duration, seconds (client-go: a random value in [5, 10) minutes)
WATCH_SECONDS = (300, 600)
#: no line (event or bookmark) for this long: the link is dead, resume the watch
READ_TIMEOUT = 90.0
CONNECT_TIMEOUT = 10.0
#: bound on one list request
LIST_TIMEOUT = 30.0
FIRST_BACKOFF = 0.5
MAX_BACKOFF = 10.0


class _Gone(Exception):
    """The watch's resourceVersion is too old (HTTP 410 or an ERROR event with code 410): list again."""


class _Refused(Exception):
    """The apiserver refused us (401/403): retrying may help (a rotated token, a Role granted later), but a
    blocking dial fails at once with this message."""


class K8sResolver:
    """Follows the EndpointSlices of ``target`` (scheme k8s); see the module docstring.

    ``timeout`` bounds a blocking start (sync dial): the first list must arrive within it, else
    RegistryUnavailable names why. ``rng`` and ``clock`` are for tests.
    """

    def __init__(self, target: Target, options: ResolverOptions | None = None, *, timeout: float = 5.0,
                 rng: random.Random | None = None, clock: Callable[[], float] = time.monotonic) -> None:
        k8s_config.require_client()
        options = options if options is not None else ResolverOptions()
        if target.scheme != "k8s" or not target.key:
            raise InvalidTarget(f"not a k8s target: {target.redacted}")
        self.target = target
        self.service: str = target.key
        self.port: str = target.options["port"]
        self.namespace: str = target.authority  # "" until the configuration says which
        self.subsetter = options.subsetter
        self.blocking = options.blocking
        self.timeout = timeout
        self._rng = rng if rng is not None else random.Random()
        self._clock = clock
        self.slices = ServiceSlices(self.service, self.port)
        self._future: concurrent.futures.Future[None] | None = None
        self._first: concurrent.futures.Future[None] = concurrent.futures.Future()
        self._closed = False
        self._last: tuple[Backend, ...] | None = None
        #: where the configuration came from (set once loaded)
        self.source = ""
        # introspection (and tests): what the loop did so far
        self.lists = 0
        self.relists = 0
        self.watches = 0
        self.events = 0
        self.bookmarks = 0
        self.pushes = 0
        self.resource_version: str | None = None
        #: clock time of the last change pushed to the channel
        self.last_push_at: float | None = None

    # ---- Resolver contract --------------------------------------------------------------------------

    def start(self, on_update: OnUpdate, on_error: OnError) -> None:
        """Follow the slices on the control loop. Blocking (sync dial): return once the first list is
        known; raise InvalidTarget (configuration) or RegistryUnavailable (apiserver not answering in time,
        or refusing our credentials)."""
        self._future = _loop.submit(self._run(on_update, on_error))
        if not self.blocking:
            return
        try:
            self._first.result(self.timeout)
        except concurrent.futures.TimeoutError:
            self.close()
            raise RegistryUnavailable(
                f"k8s: no EndpointSlice list of {self._what()} within {self.timeout:g}s"
                f"{f' ({self._last_error})' if self._last_error else ''}") from None
        except BaseException:
            self.close()
            raise

    def resolve_now(self, reason: str) -> None:
        """Nothing to do: the watch pushes every change."""

    def close(self) -> None:
        self._closed = True
        if self._future is not None:
            self._future.cancel()

    async def aclose(self) -> None:
        self.close()

    # ---- the loop -----------------------------------------------------------------------------------

    _last_error = ""

    def _what(self) -> str:
        return f"service {self.namespace or '?'}/{self.service} (port {self.port})"

    async def _run(self, on_update: OnUpdate, on_error: OnError) -> None:
        from kubernetes_asyncio.client import ApiClient

        failures = 0
        api: Any = None
        rv: str | None = None
        try:
            while not self._closed:
                try:
                    if api is None:
                        cfg = await k8s_config.load(self.target.options.get("kubeconfig"),
                                                    self.target.options.get("context"))
                        self.namespace = self.namespace or cfg.namespace
                        self.source = cfg.source
                        api = ApiClient(configuration=cfg.configuration)
                    if rv is None:
                        rv = await self._list(api)
                        self._push(on_update)
                        if not self._first.done():
                            self._first.set_result(None)
                    rv = await self._watch(api, rv, on_update)
                    if failures:
                        log.info("waypost: k8s: watching %s works again", self._what())
                        failures, self._last_error = 0, ""
                except asyncio.CancelledError:
                    raise
                except _Gone:
                    log.info("waypost: k8s: resourceVersion %s of %s is gone (410): listing again", rv, self._what())
                    rv = None
                    self.relists += 1
                except Exception as e:  # noqa: BLE001  # keep the last list, retry with backoff
                    failures += 1
                    msg = self._describe(e)
                    if isinstance(e, InvalidTarget | _Refused) and not self._first.done():
                        self._first.set_exception(e if isinstance(e, InvalidTarget) else RegistryUnavailable(msg))
                    (log.warning if msg != self._last_error else log.debug)(
                        "waypost: %s; %s", msg,
                        "keeping the last endpoints" if self._last is not None else "no endpoints yet")
                    self._last_error = msg
                    self._notify(on_error, msg)
                    delay = min(FIRST_BACKOFF * 2 ** (failures - 1), MAX_BACKOFF)
                    await asyncio.sleep(delay * self._rng.uniform(0.8, 1.2))
        finally:
            if api is not None:
                await api.close()

    def _describe(self, e: Exception) -> str:
        if isinstance(e, InvalidTarget | _Refused):
            return str(e)
        where = f" at {self.source}" if self.source else ""
        text = str(e) or type(e).__name__
        return f"k8s: reading the EndpointSlices of {self._what()}{where} failed: {text}"

    def _path(self) -> str:
        return f"/apis/discovery.k8s.io/v1/namespaces/{self.namespace}/endpointslices"

    async def _request(self, api: Any, params: list[tuple[str, Any]], timeout: Any) -> Any:
        """GET the slices (list or watch) as a raw aiohttp response; HTTP errors raised with their meaning."""
        resp = await api.call_api(
            self._path(), "GET", query_params=params, header_params={"Accept": "application/json"},
            auth_settings=["BearerToken"], _preload_content=False, _request_timeout=timeout)
        if resp.status == 200:
            return resp
        try:
            body = (await resp.read()).decode(errors="replace")
        finally:
            resp.release()
        try:
            message = json.loads(body).get("message", body)
        except (ValueError, AttributeError):
            message = body
        if resp.status == 410:
            raise _Gone(message)
        if resp.status == 401:
            raise _Refused(f"k8s: the apiserver ({api.configuration.host}) refused the credentials of "
                           f"{self.source} (401 Unauthorized): {message}")
        if resp.status == 403:
            raise _Refused(
                f"k8s: forbidden to list/watch EndpointSlices in namespace {self.namespace} (403): {message}; "
                "grant get, list and watch on endpointslices.discovery.k8s.io (a Role and RoleBinding)")
        raise RuntimeError(f"HTTP {resp.status}: {message[:300]}")

    def _selector(self) -> tuple[str, str]:
        return ("labelSelector", f"{SERVICE_NAME_LABEL}={self.service}")

    async def _list(self, api: Any) -> str:
        resp = await self._request(api, [self._selector()], LIST_TIMEOUT)
        try:
            body = json.loads(await resp.read())
        finally:
            resp.release()
        items = body.get("items") or []
        rv = (body.get("metadata") or {}).get("resourceVersion")
        if not isinstance(rv, str) or not rv:
            raise RuntimeError("the EndpointSlice list carries no resourceVersion")
        self.slices.replace(items)
        self.lists += 1
        self.resource_version = rv
        return rv

    async def _watch(self, api: Any, rv: str, on_update: OnUpdate) -> str:
        """One watch request from ``rv``; returns the last version seen when the server ends it."""
        import aiohttp

        seconds = self._rng.randint(*WATCH_SECONDS)
        params = [self._selector(), ("watch", "true"), ("allowWatchBookmarks", "true"),
                  ("resourceVersion", rv), ("timeoutSeconds", str(seconds))]
        timeout = aiohttp.ClientTimeout(connect=CONNECT_TIMEOUT, sock_connect=CONNECT_TIMEOUT, sock_read=READ_TIMEOUT)
        resp = await self._request(api, params, timeout)
        self.watches += 1
        try:
            while True:
                try:
                    line = await resp.content.readline()
                except asyncio.TimeoutError:
                    log.info("waypost: k8s: the watch of %s said nothing for %gs: resuming it", self._what(),
                             READ_TIMEOUT)
                    return rv
                if not line:
                    return rv  # the server ended the watch (timeoutSeconds): resume from rv
                rv = self._event(line, rv, on_update)
        finally:
            resp.release()

    def _event(self, line: bytes, rv: str, on_update: OnUpdate) -> str:
        try:
            event = json.loads(line)
            kind, obj = event["type"], event["object"]
        except (ValueError, KeyError, TypeError):
            log.warning("waypost: k8s: skipping a malformed watch line for %s: %.200r", self._what(), line)
            return rv
        if kind == "ERROR":
            code = obj.get("code") if isinstance(obj, dict) else None
            if code == 410:
                raise _Gone(obj.get("message", ""))
            raise RuntimeError(f"watch error {code}: {obj.get('message') if isinstance(obj, dict) else obj}")
        meta = obj.get("metadata") if isinstance(obj, dict) else None
        new_rv = meta.get("resourceVersion") if isinstance(meta, dict) else None
        if kind == "BOOKMARK":
            self.bookmarks += 1
        else:
            self.events += 1
            self.slices.apply(kind, obj)
            self._push(on_update)
        if isinstance(new_rv, str) and new_rv:
            rv = new_rv
            self.resource_version = rv
        return rv

    def _push(self, on_update: OnUpdate) -> None:
        backends = tuple(
            Backend(ep.address, {k: v for k, v in (("pod", ep.pod), ("node", ep.node), ("zone", ep.zone)) if v})
            for ep in self.slices.endpoints())
        if backends == self._last:
            return
        out: Sequence[Backend] = list(backends)
        if self.subsetter is not None:
            out = self.subsetter.select(out)
        log.debug("waypost: k8s: %s -> %s", self._what(), [b.address for b in backends])
        if self._notify(on_update, out):
            self._last = backends
            self.pushes += 1
            self.last_push_at = self._clock()

    def _notify(self, fn: Callable[[Any], None], arg: Any) -> bool:
        return notify(fn, arg, self.target)

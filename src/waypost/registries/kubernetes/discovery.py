"""k8s://NAMESPACE/SERVICE:PORT: the ready endpoints of a Service, followed through its EndpointSlices.

A ``waypost.kinds.Discovery`` (waypost's generic resolver follows it): the informer pattern of client-go, for one
label selector (``kubernetes.io/service-name=SERVICE``), on the control loop:

1. **list** the service's EndpointSlices; the list's ``resourceVersion`` is where the watch starts;
2. **watch** from there with bookmarks (``allowWatchBookmarks``: the apiserver moves our resourceVersion on
   even when nothing changes, so a resumed watch rarely starts from a version it has forgotten); each event
   updates the slices (``waypost.registries.kubernetes.slices``) and, when they changed, the watch yields the list;
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
import json
import logging
import random
from collections.abc import AsyncIterator
from typing import Any

from ...kinds import Backend, Discovery, InvalidTarget, PermissionDenied, Target
from . import config as k8s_config
from .slices import SERVICE_NAME_LABEL, ServiceSlices

log = logging.getLogger("waypost.resolver.k8s")

#: server-side watch duration, seconds (client-go: a random value in [5, 10) minutes)
WATCH_SECONDS = (300, 600)
#: no line (event or bookmark) for this long: the link is dead, resume the watch
READ_TIMEOUT = 90.0
CONNECT_TIMEOUT = 10.0
#: bound on one list request
LIST_TIMEOUT = 30.0


class _Gone(Exception):
    """The watch's resourceVersion is too old (HTTP 410 or an ERROR event with code 410): list again."""


class K8sDiscovery(Discovery):
    """The ready endpoints of the Service ``target`` names (scheme k8s), listed and watched; see the module
    docstring. ``rng`` (the watch's server-side duration) is for tests."""

    def __init__(self, target: Target, *, rng: random.Random | None = None) -> None:
        k8s_config.require_client()
        if target.scheme != "k8s" or not target.key:
            raise InvalidTarget(f"not a k8s target: {target.redacted}")
        self.target = target
        self.service: str = target.key
        self.port: str = target.options["port"]
        self.namespace: str = target.authority  # "" until the configuration says which
        self.slices = ServiceSlices(self.service, self.port)
        self._rng = rng if rng is not None else random.Random()
        self._api: Any = None
        #: where the configuration came from (set once loaded)
        self.source = ""
        # introspection (and tests): what the discovery did so far
        self.lists = 0
        self.relists = 0
        self.watches = 0
        self.events = 0
        self.bookmarks = 0
        #: the version the next watch starts from (None: list first)
        self.resource_version: str | None = None

    def describe(self, service: str) -> str:
        where = f" at {self.source}" if self.source else ""
        return f"service {self.namespace or '?'}/{service} (port {self.port}){where}"

    async def close(self) -> None:
        if self._api is not None:
            await self._api.close()
            self._api = None

    async def _client(self) -> Any:
        """The API client, once the configuration is loaded (the first call loads it)."""
        if self._api is None:
            from kubernetes_asyncio.client import ApiClient

            cfg = await k8s_config.load(self.target.options.get("kubeconfig"), self.target.options.get("context"))
            self.namespace = self.namespace or cfg.namespace
            self.source = cfg.source
            self._api = ApiClient(configuration=cfg.configuration)
        return self._api

    async def instances(self, service: str) -> tuple[Backend, ...]:
        """A list of the slices (their version is where the next watch starts)."""
        self.resource_version = await self._list(await self._client())
        return self._backends()

    async def watch(self, service: str) -> AsyncIterator[tuple[Backend, ...]]:
        """A list when there is no version to watch from, then watches from the last version seen, one after
        the other (the server ends each after ``timeoutSeconds``); 410 Gone: list again."""
        while True:
            try:
                if self.resource_version is None:
                    yield await self.instances(service)
                async for backends in self._watch(await self._client()):
                    yield backends
            except _Gone:
                log.info("waypost: k8s: resourceVersion %s of %s is gone (410): listing again",
                         self.resource_version, self.describe(service))
                self.resource_version = None
                self.relists += 1

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
            raise PermissionDenied(f"k8s: the apiserver ({api.configuration.host}) refused the credentials of "
                           f"{self.source} (401 Unauthorized): {message}")
        if resp.status == 403:
            raise PermissionDenied(
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

    async def _watch(self, api: Any) -> AsyncIterator[tuple[Backend, ...]]:
        """One watch request from the last version, which follows the events (a list after each change): when the
        server ends the watch (or the link fails) the next one resumes from the last version seen."""
        import aiohttp

        rv = self.resource_version
        assert rv is not None

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
                    log.info("waypost: k8s: the watch of %s said nothing for %gs: resuming it",
                             self.describe(self.service), READ_TIMEOUT)
                    return
                if not line:
                    return  # the server ended the watch (timeoutSeconds): resume from the last version
                changed, rv = self._event(line, rv)
                if changed:
                    yield self._backends()
        finally:
            resp.release()

    def _event(self, line: bytes, rv: str) -> tuple[bool, str]:
        """Apply one watch line: (whether the slices changed, the version to resume from)."""
        changed = False
        try:
            event = json.loads(line)
            kind, obj = event["type"], event["object"]
        except (ValueError, KeyError, TypeError):
            log.warning("waypost: k8s: skipping a malformed watch line for %s: %.200r",
                        self.describe(self.service), line)
            return changed, rv
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
            changed = True
        if isinstance(new_rv, str) and new_rv:
            rv = new_rv
            self.resource_version = rv
        return changed, rv

    def _backends(self) -> tuple[Backend, ...]:
        return tuple(
            Backend(ep.address, {k: v for k, v in (("pod", ep.pod), ("node", ep.node), ("zone", ep.zone)) if v})
            for ep in self.slices.endpoints())

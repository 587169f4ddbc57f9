"""A small asyncio client of Eureka's REST API (what waypost uses), on aiohttp (the ``eureka`` extra): every request
a coroutine on waypost's control loop (py-eureka-client runs threads and timers of its own).

``register`` ``POST /apps/APP``; ``renew`` ``PUT /apps/APP/ID`` (404: ``EurekaNotFound``, an ``InstanceGone``); ``cancel`` ``DELETE``;
``apps``/``delta``/``app`` ``GET /apps``, ``/apps/delta``, ``/apps/APP`` (None when unknown); ``set_status`` and
``clear_status`` the status override (``/apps/APP/ID/status``); ``update_metadata`` ``PUT /apps/APP/ID/metadata``.

Several servers (peers that replicate each other): a request goes to the one that answered last; one that cannot be
reached, times out or answers 5xx is passed over for the next, each at most once (Eureka's
``RetryableEurekaHttpClient``). Only when every server failed does the request fail: ``RegistryUnavailable`` naming
each and what happened (``EurekaUnreachable`` when none could be connected to). Each server gets ``timeout`` s.
Another non-2xx is ``RegistryError`` with Eureka's message; a 200 that is not JSON is ``MalformedAnswer``.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from typing import Any

from ...errors import RegistryError, RegistryUnavailable
from ...kinds import InstanceGone
from ..http_api import HttpApiClient, connect_problem
from ..http_kind import NoAnswer, answer_text, connected_trace, exchange, json_answer
from .config import EurekaConfig

log = logging.getLogger("waypost.eureka")

_JSON = {"Accept": "application/json", "Content-Type": "application/json", "User-Agent": "waypost"}


class EurekaNotFound(InstanceGone):
    """Eureka answered 404: it does not know the app or the instance (deleted, evicted, restarted empty)."""


class EurekaUnreachable(RegistryUnavailable):
    """No server of the cluster could be connected to (refused, no route, an unknown name): ``cannot reach Eureka
    at URL: connection refused; is it running?``."""


class _ServerFailed(Exception):
    """One server could not serve a request (unreachable, timed out, 5xx): the next one is tried. ``refused``:
    why it could not be connected to at all (None: it could, or it did not answer in time)."""

    def __init__(self, text: str, base: str, refused: str | None = None) -> None:
        super().__init__(text)
        self.base = base
        self.refused = refused


class EurekaClient(HttpApiClient):
    """The REST API of one Eureka cluster (``config``); ``timeout`` bounds each server's try, in seconds."""

    install_hint = "eureka:// registries and targets need the eureka extra: pip install 'waypost[eureka]'"

    def __init__(self, config: EurekaConfig, *, timeout: float = 5.0) -> None:
        super().__init__(timeout)
        self.config = config
        #: the index (in ``config.servers``) of the server requests go to first
        self.current = 0
        #: times a request moved on to another server
        self.failovers = 0

    @property
    def server(self) -> str:
        """The server requests go to now."""
        return self.config.servers[self.current]

    def _new_session(self) -> Any:
        import aiohttp

        return aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0), headers=_JSON,
                                     trace_configs=[connected_trace()])

    async def request(self, method: str, path: str, *, params: Iterable[tuple[str, str]] = (), body: Any = None,
                      what: str = "", missing_ok: bool = False) -> Any:
        """One request, failing over between the servers; the decoded JSON body (None when empty; None for a
        404 with ``missing_ok``)."""
        what = what or f"{method} {path}"
        servers = self.config.servers
        failures: list[_ServerFailed] = []
        for step in range(len(servers)):
            index = (self.current + step) % len(servers)
            try:
                result = await self._one(servers[index], method, path, list(params), body, what, missing_ok)
            except _ServerFailed as e:
                failures.append(e)
                if len(servers) > 1:
                    log.debug("eureka: %s; trying the next server", e)
                continue
            if index != self.current:
                self.failovers += 1
                log.info("eureka: %s now goes to %s (%s)", self.config.url, servers[index],
                         "; ".join(map(str, failures)))
                self.current = index
            return result
        raise _all_failed(failures, what)

    async def _one(self, server: str, method: str, path: str, params: list[tuple[str, str]], body: Any, what: str,
                   missing_ok: bool) -> Any:
        import aiohttp

        base = self.config.base_url(server)
        try:
            status, _, raw = await exchange(self._get_session(), method, base + path, params=params, body=body,
                                            timeout=aiohttp.ClientTimeout(total=self.timeout))
        except NoAnswer as e:
            raise _ServerFailed(f"{base} {e} within {self.timeout:g}s", base) from None
        except (aiohttp.ClientError, OSError) as e:
            refused = connect_problem(e)
            raise _ServerFailed(f"{base} is unreachable: {refused or str(e) or type(e).__name__}", base,
                                refused) from None
        if status >= 500:
            raise _ServerFailed(f"{base} answered HTTP {status} {answer_text(raw)}", base)
        if status == 404:
            if missing_ok:
                return None
            raise EurekaNotFound(f"eureka at {base}: {what}: 404 {answer_text(raw)}")
        if not 200 <= status < 300:
            raise RegistryError(f"eureka at {base}: {what}: HTTP {status} {answer_text(raw)}")
        return json_answer(raw, f"eureka at {base}", what)

    # ---- the API --------------------------------------------------------------------------------------

    async def register(self, app: str, instance: Mapping[str, Any]) -> None:
        await self.request("POST", f"/apps/{app}", body={"instance": instance}, what=f"registering in {app}")

    async def renew(self, app: str, instance_id: str) -> None:
        """The heartbeat; ``EurekaNotFound`` when the server no longer has the instance."""
        await self.request("PUT", f"/apps/{app}/{instance_id}", what=f"renewing {app}/{instance_id}")

    async def cancel(self, app: str, instance_id: str) -> None:
        await self.request("DELETE", f"/apps/{app}/{instance_id}", what=f"deleting {app}/{instance_id}")

    async def apps(self) -> Any:
        return await self.request("GET", "/apps", what="fetching the registry")

    async def delta(self) -> Any:
        # named as a full fetch: a failure reads the same whichever fetch met it (one log line per problem)
        return await self.request("GET", "/apps/delta", what="fetching the registry")

    async def app(self, app: str) -> Any:
        return await self.request("GET", f"/apps/{app}", what=f"reading {app}", missing_ok=True)

    async def set_status(self, app: str, instance_id: str, value: str) -> None:
        await self.request("PUT", f"/apps/{app}/{instance_id}/status", params=[("value", value)],
                           what=f"overriding the status of {app}/{instance_id} with {value}")

    async def clear_status(self, app: str, instance_id: str) -> None:
        await self.request("DELETE", f"/apps/{app}/{instance_id}/status", params=[("value", "UP")],
                           what=f"removing the status override of {app}/{instance_id}")

    async def update_metadata(self, app: str, instance_id: str, metadata: Mapping[str, str]) -> None:
        await self.request("PUT", f"/apps/{app}/{instance_id}/metadata", params=list(metadata.items()),
                           what=f"updating the metadata of {app}/{instance_id}")


def _all_failed(failures: list[_ServerFailed], what: str) -> RegistryUnavailable:
    """The error of a request no server could serve: one that no server could even be connected to says so in one
    sentence (``cannot reach Eureka at http://h:8761/eureka: connection refused; is it running?``), the URLs
    once; otherwise each server and what happened, after what was asked."""
    if all(f.refused for f in failures):
        reasons = {f.refused for f in failures}
        if len(reasons) == 1:
            where = f"{', '.join(f.base for f in failures)}: {reasons.pop()}"
        else:
            where = ", ".join(f"{f.base} ({f.refused})" for f in failures)
        return EurekaUnreachable(f"cannot reach Eureka at {where}; is it running?")
    return RegistryUnavailable(f"eureka at {', '.join(f.base for f in failures)}: {what} failed: "
                               f"{'; '.join(map(str, failures))}")

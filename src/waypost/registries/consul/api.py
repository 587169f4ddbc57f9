"""A small asyncio client of Consul's HTTP API (the parts waypost uses), on aiohttp.

Why not py-consul: it is synchronous (requests). A blocking query (``?index=N&wait=55s``, Consul's long
poll: the answer comes when the result changes or the wait ends) would hold a thread for its whole wait, one
per resolver and one per publisher guard; on the control loop (``waypost._loop``) every one of them is a
coroutine holding a socket, next to the etcd watches and the k8s informers. The API surface needed is small:

- ``register_service`` / ``deregister_service``: ``PUT /v1/agent/service/register``, ``.../deregister/<id>``
  (the local agent: it owns the registration and syncs it to the catalog; its checks run there);
- ``pass_check`` / ``update_check``: ``PUT /v1/agent/check/pass/<id>``, ``/v1/agent/check/update/<id>`` (TTL
  checks); an unknown check answers 404, which ``ConsulNotFound`` carries (the agent lost it: restarted,
  or someone deregistered the service);
- ``agent_service``: ``GET /v1/agent/service/<id>`` (blocking on its content hash);
- ``health_service``: ``GET /v1/health/service/<name>?passing=1&index=N&wait=Ws&tag=..&dc=..`` -> the new
  index (``X-Consul-Index``) and the instances;
- ``leader``: ``GET /v1/status/leader``.

Every request has a timeout: ``timeout`` seconds for a plain one, ``wait * 17/16 + timeout`` for a blocking
one (Consul adds up to wait/16 of jitter). Errors: unreachable, timed out, 502/503/504 or "No cluster leader"
-> ``RegistryUnavailable``; 403 -> ``PermissionDenied`` with a hint on the ACL rule needed; 404 ->
``ConsulNotFound``; a failed TLS handshake -> ``ConsulTLSError`` (a RegistryUnavailable); any other non-200 ->
``RegistryError`` with Consul's message; a 200 whose body is not JSON (or, for the health API, not a list) ->
``MalformedAnswer``. A timeout says how far the request got: no connection, a connection and no answer, or
an answer that did not finish. The ACL token goes in ``X-Consul-Token`` and never into a message.

The client makes its aiohttp session on first use, on the running loop (use one client from one loop);
``close()`` closes it (a later request opens a new one): ``waypost.registry.http_api``.
"""

from __future__ import annotations

import asyncio
import json
import re
import ssl
import urllib.parse
from collections.abc import Iterable, Mapping
from typing import Any

from ...durations import format_duration
from ...errors import PermissionDenied, RegistryError, RegistryUnavailable
from ...registry.http_api import HttpApiClient, require_aiohttp
from ...registry.meta_text import decode_value, encode_value
from .config import TOKEN_ENV, ConsulConfig

INSTALL_HINT = "consul:// registries and targets need the consul extra: pip install 'waypost[consul]'"
#: Consul's own cap on a blocking query's wait
MAX_WAIT = 600.0


#: Consul's limits on service Meta (agent/structs: metaKeyFormat, metaMaxKeyPairs, metaValueMaxLength)
META_KEY_RE = re.compile(r"[A-Za-z0-9_-]{1,128}")
MAX_META_PAIRS = 64
MAX_META_VALUE = 512
#: the metadata key whose value (a list of strings) becomes the registration's Tags instead of a Meta entry
TAGS_KEY = "tags"


def encode_meta(metadata: Mapping[str, Any] | None) -> tuple[list[str], dict[str, str]]:
    """waypost metadata -> Consul (Tags, Meta). Consul's Meta values are strings, so:

    - a string that is not JSON text goes as it is (``"eu-1"`` -> ``eu-1``);
    - any other value goes as compact JSON (``20`` -> ``20``, ``True`` -> ``true``, ``{"a": 1}`` -> ``{"a":1}``),
      and so does a string that would read as JSON (``"20"`` -> ``"\"20\""``), so ``decode_meta`` gives every
      value back exactly;
    - ``metadata["tags"]`` (a list of non-empty strings) becomes the Tags, not a Meta entry.

    Raises TypeError/ValueError naming the entry Consul would refuse (key format, 64 entries, 512 characters).
    """
    tags: list[str] = []
    meta: dict[str, str] = {}
    for key, value in (metadata or {}).items():
        if key == TAGS_KEY:
            if not isinstance(value, (list, tuple)) or not all(isinstance(t, str) and t for t in value):
                raise TypeError(f"metadata[{TAGS_KEY!r}] becomes the Consul tags: give a list of non-empty strings, "
                                f"got {value!r:.80}")
            tags = list(dict.fromkeys(value))
            continue
        if not isinstance(key, str) or not META_KEY_RE.fullmatch(key):
            raise ValueError(f"metadata key {key!r:.140} cannot be a Consul Meta key (1-128 letters, digits, '_' "
                             "and '-')")
        if key.lower().startswith("consul-"):
            raise ValueError(f"metadata key {key!r}: Consul reserves Meta keys starting with 'consul-'")
        text = encode_value(key, value)
        if len(text) > MAX_META_VALUE:
            raise ValueError(f"metadata[{key!r}] is {len(text)} characters as a Consul Meta value; Consul's limit "
                             f"is {MAX_META_VALUE}")
        meta[key] = text
    if len(meta) > MAX_META_PAIRS:
        raise ValueError(f"{len(meta)} metadata entries; Consul's limit is {MAX_META_PAIRS} Meta entries")
    return tags, meta


def decode_meta(meta: Mapping[str, Any] | None, tags: Iterable[str] | None = None) -> dict[str, Any]:
    """Consul (Meta, Tags) -> waypost metadata: each Meta value that is JSON text decodes (``20`` -> 20,
    ``true`` -> True, ``"\"20\""`` -> ``"20"``), any other stays the string it is; non-empty Tags come back as
    ``metadata["tags"]`` (a list; they win over a Meta entry ``tags``)."""
    out: dict[str, Any] = {key: decode_value(value) for key, value in (meta or {}).items()}
    tag_list = [t for t in (tags or ()) if isinstance(t, str)]
    if tag_list:
        out[TAGS_KEY] = tag_list
    return out


def result_index(headers: Mapping[str, str]) -> int:
    """A read's ``X-Consul-Index``: what a blocking query waits from next (0 when missing or not a number)."""
    try:
        return int(headers.get("X-Consul-Index", "0"))
    except ValueError:
        return 0


def require_client() -> None:
    """Raise a clear ImportError when aiohttp is missing (at construction, not on first use)."""
    require_aiohttp(INSTALL_HINT)


class ConsulTLSError(RegistryUnavailable):
    """The TLS handshake with the agent failed (an unknown CA, a wrong name, a client certificate refused):
    a configuration problem, reported at once rather than retried until a timeout."""


class ConsulNotFound(RegistryError):
    """Consul answered 404: no such service or check (on the local agent), or no such endpoint."""


class MalformedAnswer(RegistryError):
    """The agent's address answered 200 with something that is not Consul's answer to the request (not JSON,
    not the JSON type asked for, every entry malformed): a proxy or another server in the way, or a broken
    agent. A resolver keeps its last list and retries."""


def _connected_trace() -> Any:
    """An aiohttp trace that marks a request's ``trace_request_ctx`` dict once it has a connection: a timeout
    can then say whether the agent accepted the connection (and did not answer) or never took it."""
    import aiohttp

    async def connected(_session: Any, ctx: Any, _params: Any) -> None:
        if isinstance(ctx.trace_request_ctx, dict):
            ctx.trace_request_ctx["connected"] = True

    trace = aiohttp.TraceConfig()
    trace.on_connection_create_end.append(connected)
    trace.on_connection_reuseconn.append(connected)
    return trace


def _how_far(progress: Mapping[str, bool]) -> str:
    """How far a request that did not finish got (``_connected_trace`` and ``request`` mark its progress)."""
    if progress.get("answered"):
        return "started answering but did not finish"
    if progress.get("connected"):
        return "accepted the connection but did not answer"
    return "did not accept a connection"


def _quote(segment: str) -> str:
    return urllib.parse.quote(segment, safe="")


def _duration(seconds: float) -> str:
    """Go duration text for Consul (``"55s"``, ``"1.5s"``): the gRPC JSON form, which Go's parser reads too."""
    return format_duration(seconds)


class ConsulClient(HttpApiClient):
    """One agent's HTTP API (``config``); ``timeout`` bounds every non-blocking request, in seconds."""

    install_hint = INSTALL_HINT

    def __init__(self, config: ConsulConfig, *, timeout: float = 5.0) -> None:
        super().__init__(timeout)
        self.config = config
        self._ssl: ssl.SSLContext | None = None
        #: whether the last ``health_service`` answer left out instances the token may not read (ACLs on)
        self.filtered_by_acls = False
        #: Consul's ACL default policy as its last answer said (``X-Consul-Default-Acl-Policy``: allow, deny)
        self.default_acl_policy = ""
        #: how far the last request got when its caller's own bound cancelled it (``asyncio.wait_for``): how and
        #: what, for ``no_answer``; None when the last request was not cancelled
        self.stalled: tuple[str, str] | None = None

    def __repr__(self) -> str:
        return f"<ConsulClient {self.config.redacted}>"

    # ---- plumbing -----------------------------------------------------------------------------------

    def _ssl_context(self) -> ssl.SSLContext | None:
        if not self.config.tls:
            return None
        if self._ssl is None:
            ctx = ssl.create_default_context(cafile=self.config.ca_file)
            if self.config.cert_file and self.config.key_file:
                ctx.load_cert_chain(self.config.cert_file, self.config.key_file)
            self._ssl = ctx
        return self._ssl

    def _new_session(self) -> Any:
        import aiohttp

        connector = aiohttp.TCPConnector(ssl=self._ssl_context() or False, limit=0)
        return aiohttp.ClientSession(connector=connector, base_url=self.config.base_url,
                                     headers={"User-Agent": "waypost"}, trace_configs=[_connected_trace()])

    def _headers(self) -> dict[str, str]:
        token = self.config.effective_token()
        return {"X-Consul-Token": token} if token else {}

    def no_answer(self, how: str, within: float, what: str) -> RegistryUnavailable:
        """The one text of a request the agent did not answer in time, whoever timed it out (this client, or a
        caller's bound around it): which agent, how far the request got (``how``: it accepted the connection
        but did not answer, ...), the bound the caller set (``within`` seconds) and the request (``what``)."""
        return RegistryUnavailable(f"consul agent at {self.config.base_url} {how} within {format_duration(within)} "
                                   f"({what})")

    async def request(self, method: str, path: str, *, params: Iterable[tuple[str, str]] = (), body: Any = None,
                      timeout: float | None = None, what: str = "", missing_ok: bool = False,
                      within: float | None = None) -> tuple[Mapping[str, str], Any]:
        """One request; returns the response headers and the decoded JSON body (None when empty).

        ``timeout`` (default ``self.timeout``) bounds the whole request; ``within`` is the bound a timeout's
        error names (default ``timeout``): a caller that gives a request what is left of a longer deadline
        (a dial's first list) names that deadline, not the last request's remainder. ``what`` names the
        request in errors.
        ``missing_ok``: a 404 answers ``(headers, None)`` (a KV read of a missing key still carries the index to
        block on) instead of raising ``ConsulNotFound``.
        """
        import aiohttp

        limit = self.timeout if timeout is None else timeout
        what = what or f"{method} {path}"
        session = self._get_session()
        data = None if body is None else json.dumps(body, separators=(",", ":"))
        client_timeout = aiohttp.ClientTimeout(total=limit, sock_connect=min(limit, self.timeout))
        progress: dict[str, bool] = {}
        self.stalled = None
        try:
            async with session.request(method, path, params=list(params), data=data, headers=self._headers(),
                                       timeout=client_timeout, trace_request_ctx=progress) as resp:
                progress["answered"] = True
                raw = await resp.read()
                status, headers = resp.status, resp.headers
        except asyncio.CancelledError:
            self.stalled = (_how_far(progress), what)  # a caller's wait_for: its error can say the same
            raise
        except asyncio.TimeoutError:
            raise self.no_answer(_how_far(progress), limit if within is None else within, what) from None
        except (aiohttp.ClientSSLError, ssl.SSLError) as e:
            raise ConsulTLSError(f"consul agent at {self.config.base_url}: TLS failed ({what}): "
                                 f"{str(e) or type(e).__name__}") from None
        except (aiohttp.ClientError, OSError) as e:
            raise RegistryUnavailable(f"consul agent at {self.config.base_url} is unreachable ({what}): "
                                      f"{str(e) or type(e).__name__}") from None
        if status == 404 and missing_ok:
            return headers, None
        if status != 200:
            raise self._http_error(status, raw, what)
        text = raw.strip()
        if not text:
            return headers, None
        try:
            return headers, json.loads(text)
        except ValueError:
            raise MalformedAnswer(f"malformed answer from consul at {self.config.base_url}: {what}: not JSON: "
                                  f"{text[:200]!r}") from None

    def _http_error(self, status: int, raw: bytes, what: str) -> Exception:
        message = raw.decode(errors="replace").strip()[:400] or f"HTTP {status}"
        where = f"consul agent at {self.config.base_url}: {what}"
        if status == 403:
            token = ("no token was sent (give ?token= or set $" + TOKEN_ENV + ")"
                     if not self.config.effective_token() else "the token in use")
            return PermissionDenied(
                f"{where} was refused (403 {message}); {token}: registering needs an ACL policy with "
                "service:write on the service (and node:read), discovery needs service:read and node:read")
        if status == 404:
            return ConsulNotFound(f"{where}: 404 {message}")
        if status in (502, 503, 504) or "no cluster leader" in message.lower():
            return RegistryUnavailable(f"{where}: HTTP {status} {message}")
        return RegistryError(f"{where}: HTTP {status} {message}")

    # ---- the API --------------------------------------------------------------------------------------

    async def leader(self) -> str:
        """The leader's server address (``""`` while the cluster has none)."""
        _, body = await self.request("GET", "/v1/status/leader", what="status/leader")
        return body if isinstance(body, str) else ""

    async def register_service(self, definition: Mapping[str, Any]) -> None:
        """``PUT /v1/agent/service/register`` (same ID: updated in place)."""
        await self.request("PUT", "/v1/agent/service/register", body=dict(definition),
                           what=f"registering service {definition.get('ID') or definition.get('Name')!r}")

    async def deregister_service(self, service_id: str) -> None:
        await self.request("PUT", f"/v1/agent/service/deregister/{_quote(service_id)}",
                           what=f"deregistering service {service_id!r}")

    async def pass_check(self, check_id: str, note: str = "") -> None:
        """Mark a TTL check passing (and restart its TTL); ``ConsulNotFound`` when the agent does not know it."""
        params = [("note", note)] if note else []
        await self.request("PUT", f"/v1/agent/check/pass/{_quote(check_id)}", params=params,
                           what=f"passing check {check_id!r}")

    async def update_check(self, check_id: str, status: str, output: str = "") -> None:
        """Set a TTL check's status (``passing``, ``warning``, ``critical``) and output."""
        await self.request("PUT", f"/v1/agent/check/update/{_quote(check_id)}",
                           body={"Status": status, "Output": output}, what=f"updating check {check_id!r}")

    async def agent_service(self, service_id: str, *, hash: str = "", wait: float | None = None
                            ) -> tuple[str, dict[str, Any]]:
        """The local agent's registration ``service_id`` and its content hash; with ``hash`` and ``wait``, a
        blocking query that answers when the registration changes (or after ``wait`` s). ``ConsulNotFound``
        when the agent has no such service."""
        params: list[tuple[str, str]] = []
        if hash and wait:
            params = [("hash", hash), ("wait", _duration(min(wait, MAX_WAIT)))]
        headers, body = await self.request("GET", f"/v1/agent/service/{_quote(service_id)}", params=params,
                                           timeout=self._blocking_timeout(wait if hash else None),
                                           what=f"reading service {service_id!r}")
        if not isinstance(body, dict):
            raise RegistryError(f"consul agent at {self.config.base_url}: service {service_id!r} is not an object")
        return headers.get("X-Consul-ContentHash", "") or str(body.get("ContentHash", "")), body

    async def health_service(self, name: str, *, index: int = 0, wait: float | None = None,
                             tags: Iterable[str] = (), datacenter: str | None = None, passing: bool = True,
                             timeout: float | None = None, within: float | None = None) -> tuple[int, list[Any]]:
        """``GET /v1/health/service/<name>``: the result's index (``X-Consul-Index``) and its entries (each
        ``{"Node": ..., "Service": ..., "Checks": ...}`` from Consul; the entries are not checked here:
        ``waypost.registries.consul.health.read_entries`` does that). With ``index`` > 0 and ``wait``, a blocking query.
        ``tags``: every one required; ``datacenter``: another datacenter than the agent's (default: the
        config's ``datacenter``, else the agent's). ``timeout`` bounds a non-blocking read instead of the
        client's ``timeout``, and ``within`` is the bound its timeout names (``request``). ``MalformedAnswer``
        when the body is not a JSON list."""
        params: list[tuple[str, str]] = []
        if passing:
            params.append(("passing", "1"))
        params.extend(("tag", t) for t in tags)
        dc = datacenter or self.config.datacenter
        if dc:
            params.append(("dc", dc))
        blocking = index > 0 and wait is not None
        if blocking:
            assert wait is not None
            params += [("index", str(index)), ("wait", _duration(min(wait, MAX_WAIT)))]
        limit = self._blocking_timeout(wait) if blocking else (timeout or self.timeout)
        headers, body = await self.request("GET", f"/v1/health/service/{_quote(name)}", params=params,
                                           timeout=limit, within=None if blocking else within,
                                           what=f"reading the instances of {name!r}")
        self.filtered_by_acls = headers.get("X-Consul-Results-Filtered-By-ACLs", "").lower() == "true"
        self.default_acl_policy = headers.get("X-Consul-Default-Acl-Policy", "")
        new_index = result_index(headers)
        if not isinstance(body, list):
            raise MalformedAnswer(f"malformed answer from consul at {self.config.base_url}: the instances of "
                                  f"{name!r} are a {'null' if body is None else type(body).__name__}, not a list: "
                                  f"{str(body)[:120]!r}")
        return new_index, body

    def _blocking_timeout(self, wait: float | None) -> float:
        if not wait:
            return self.timeout
        wait = min(wait, MAX_WAIT)
        return wait + wait / 16 + self.timeout

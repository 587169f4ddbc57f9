"""A small asyncio client of Consul's HTTP API (the parts waypost uses), on aiohttp.

Why not py-consul: it is synchronous (requests). A blocking query (``?index=N&wait=55s``, Consul's long
poll: the answer comes when the result changes or the wait ends) would hold a thread for its whole wait, one
per resolver and one per publisher guard; on the control loop (``waypost._loop``) every one of them is a
coroutine holding a socket, next to the etcd watches and the k8s informers. The API surface needed is small:

- ``request``: any call (the registrar's register, deregister, TTL pass and guard read; the override store's KV
  reads and writes);
- ``health_service``: ``GET /v1/health/service/<name>?passing=1&index=N&wait=Ws&tag=..&dc=..`` -> the new
  index (``X-Consul-Index``) and the instances.

Every request has a timeout: ``timeout`` seconds for a plain one, ``wait * 17/16 + timeout`` for a blocking
one (Consul adds up to wait/16 of jitter). Errors: unreachable, timed out, 502/503/504 or "No cluster leader"
-> ``RegistryUnavailable``; 403 -> ``PermissionDenied`` with a hint on the ACL rule needed; 404 ->
``ConsulNotFound`` (an unknown check or service on the agent); a failed TLS handshake -> ``ConsulTLSError`` (a
RegistryUnavailable); any other non-200 -> ``RegistryError`` with Consul's message; a 200 whose body is not JSON (or, for the health API, not a list) ->
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
#: a registration's requests are bounded a little inside its timeout (and name it): their own error (which agent,
#: how far the request got) comes before the registration's bound ends the attempt, too late for another one
INSIDE = 0.96


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
        try:
            async with session.request(method, path, params=list(params), data=data, headers=self._headers(),
                                       timeout=client_timeout, trace_request_ctx=progress) as resp:
                progress["answered"] = True
                raw = await resp.read()
                status, headers = resp.status, resp.headers
        except asyncio.TimeoutError:
            raise RegistryUnavailable(f"consul agent at {self.config.base_url} {_how_far(progress)} within "
                                      f"{format_duration(limit if within is None else within)} ({what})") from None
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

    async def health_service(self, name: str, *, index: int = 0, wait: float | None = None,
                             tags: Iterable[str] = (), datacenter: str | None = None, passing: bool = True,
                             timeout: float | None = None, within: float | None = None) -> tuple[int, list[Any]]:
        """``GET /v1/health/service/<name>``: the result's index (``X-Consul-Index``) and its entries (each
        ``{"Node": ..., "Service": ..., "Checks": ...}`` from Consul; the entries are not checked here:
        ``ConsulDiscovery.backends`` does that). With ``index`` > 0 and ``wait``, a blocking query.
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
            params += [("index", str(index)), ("wait", format_duration(min(wait, MAX_WAIT)))]
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

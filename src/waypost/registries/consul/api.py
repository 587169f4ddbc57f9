"""A small asyncio client of Consul's HTTP API, on aiohttp (the ``consul`` extra), and Consul's form of metadata.

Why not py-consul: it is synchronous, and a blocking query (Consul's long poll) would hold a thread for its whole
wait; on waypost's control loop it is a coroutine holding a socket. ``ConsulClient.request`` makes any call (the
registrar's, the override store's KV reads and writes) and ``health_service`` reads the instances of a service.
Every request has a timeout; errors: unreachable, timed out (saying how far the request got: ``http_kind``),
502/503/504 or "No cluster leader" -> ``RegistryUnavailable``; 403 -> ``PermissionDenied`` naming the ACL rule
needed; 404 -> ``ConsulNotFound`` (an ``InstanceGone``); a failed TLS handshake -> ``ConsulTLSError``; any other
non-200 -> ``RegistryError``; a 200 that is not the JSON asked for -> ``MalformedAnswer``. The ACL token goes in
``X-Consul-Token``, never in a message.
"""

from __future__ import annotations

import re
import ssl
import urllib.parse
from collections.abc import Iterable, Mapping
from typing import Any

from ...durations import format_duration
from ...errors import PermissionDenied, RegistryError, RegistryUnavailable
from ...kinds import InstanceGone
from ..http_api import HttpApiClient
from ..http_kind import MalformedAnswer, NoAnswer, answer_text, connected_trace, exchange, json_answer
from ..meta_text import decode_value, encode_value
from .config import TOKEN_ENV, ConsulConfig

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
    """waypost metadata -> Consul (Tags, Meta): ``metadata["tags"]`` (non-empty strings) the Tags; Meta values
    are strings, so a string that is not JSON text goes as it is (``"eu-1"``), any other value as compact JSON
    (``20`` -> ``20``, ``"20"`` -> ``"\\"20\\""``): ``decode_meta`` gives every value back. TypeError/ValueError
    naming the entry Consul would refuse (key format, 64 entries, 512 characters)."""
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
    """Consul (Meta, Tags) -> waypost metadata: Meta values that are JSON text decoded, others as they are;
    non-empty Tags as ``metadata["tags"]``."""
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


class ConsulTLSError(RegistryUnavailable):
    """The TLS handshake with the agent failed: a configuration problem (a dial fails at once)."""


class ConsulNotFound(InstanceGone):
    """Consul answered 404: no such service or check on the agent (a renewal's, a deregistration's: gone)."""


def quote(segment: str) -> str:
    return urllib.parse.quote(segment, safe="")


class ConsulClient(HttpApiClient):
    """One agent's HTTP API (``config``); ``timeout`` bounds every non-blocking request, in seconds."""

    install_hint = "consul:// registries and targets need the consul extra: pip install 'waypost[consul]'"

    def __init__(self, config: ConsulConfig, *, timeout: float = 5.0) -> None:
        super().__init__(timeout)
        self.config = config

    def __repr__(self) -> str:
        return f"<ConsulClient {self.config.redacted}>"

    def _token(self) -> dict[str, str]:
        return {"X-Consul-Token": token} if (token := self.config.effective_token()) else {}

    def _new_session(self) -> Any:
        import aiohttp

        tls: ssl.SSLContext | bool = False  # the files read again by each session: a reopened one sees renewed ones
        if self.config.tls:
            tls = ssl.create_default_context(cafile=self.config.ca_file)
            if self.config.cert_file and self.config.key_file:
                tls.load_cert_chain(self.config.cert_file, self.config.key_file)
        connector = aiohttp.TCPConnector(ssl=tls, limit=0)
        return aiohttp.ClientSession(connector=connector, base_url=self.config.base_url,
                                     headers={"User-Agent": "waypost"}, trace_configs=[connected_trace()])

    async def request(self, method: str, path: str, *, params: Iterable[tuple[str, str]] = (), body: Any = None,
                      timeout: float | None = None, what: str = "", missing_ok: bool = False,
                      within: float | None = None) -> tuple[Mapping[str, str], Any]:
        """One request: the response headers and the JSON body (None when empty). ``timeout`` (default
        ``self.timeout``) bounds it; ``within``: the bound a timeout's error names (default ``timeout``: a caller
        giving it part of a longer deadline names that one); ``what`` names the request in errors; ``missing_ok``:
        a 404 answers ``(headers, None)`` (a missing KV key still has an index to block on)."""
        import aiohttp

        limit = self.timeout if timeout is None else timeout
        what = what or f"{method} {path}"
        client_timeout = aiohttp.ClientTimeout(total=limit, sock_connect=min(limit, self.timeout))
        try:
            status, headers, raw = await exchange(self._get_session(), method, path, params=list(params), body=body,
                                                  headers=self._token(), timeout=client_timeout)
        except NoAnswer as e:
            raise RegistryUnavailable(f"consul agent at {self.config.base_url} {e} within "
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
        return headers, json_answer(raw, f"consul at {self.config.base_url}", what)

    def _http_error(self, status: int, raw: bytes, what: str) -> Exception:
        message = answer_text(raw) or f"HTTP {status}"
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

    def blocking(self, since: int | str, wait: float | None) -> tuple[list[tuple[str, str]], float | None]:
        """The query parameters and the bound of a read from ``since`` (an index, or a content hash): a blocking
        query for ``wait`` s (Consul's cap: 10 min) when both are given (bounded by the wait, Consul's jitter of up
        to wait/16, and ``timeout``), else a plain read."""
        if not since or not wait:
            return [], None
        name = "hash" if isinstance(since, str) else "index"
        return [(name, str(since)), ("wait", format_duration(wait))], wait * 17 / 16 + self.timeout

    async def health_service(self, name: str, *, index: int = 0, wait: float | None = None, tags: Iterable[str] = (),
                             passing: bool = True, timeout: float | None = None,
                             within: float | None = None) -> tuple[Mapping[str, str], list[Any]]:
        """``GET /v1/health/service/<name>`` in the config's datacenter (else the agent's): the answer's headers
        (its index, what ACLs left out) and its entries (unchecked), blocking from ``index`` for ``wait`` s when
        both are given. ``tags``: every one required; ``timeout`` and ``within`` bound a plain read (``request``)."""
        params = [("passing", "1")] if passing else []
        params += [("tag", t) for t in tags]
        params += [("dc", self.config.datacenter)] if self.config.datacenter else []
        more, limit = self.blocking(index, wait)
        headers, body = await self.request("GET", f"/v1/health/service/{quote(name)}", params=params + more,
                                           timeout=limit or timeout, within=None if limit else within,
                                           what=f"reading the instances of {name!r}")
        if not isinstance(body, list):
            raise MalformedAnswer(f"malformed answer from consul at {self.config.base_url}: the instances of "
                                  f"{name!r} are a {'null' if body is None else type(body).__name__}, not a list: "
                                  f"{str(body)[:120]!r}")
        return headers, body

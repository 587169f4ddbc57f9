"""The console's HTTP side (aiohttp's web server): the page, its assets, the JSON API and the event stream.

Reads (``GET /``, ``/static/*``, ``/api/services``, ``/api/events``) are open to whoever can reach the port.
``POST /api/token`` answers whether a token is the right one (the same checks as a write's, writing nothing).
Writes (``POST /api/drain|undrain|weight``) pass ``guard_write``: not read-only; a token in a header
(``Authorization: Bearer T`` or ``X-Waypost-Token: T``; never a cookie, so a browser never sends it by itself):
missing 401, wrong 403; a JSON body (``Content-Type: application/json``: an HTML form cannot send one); and no
cross-site request (``Sec-Fetch-Site`` other than ``same-origin``/``none``, or an ``Origin`` other than the
console's own: 403). On a loopback listener, a ``Host`` that is no loopback name is refused (DNS rebinding).
"""

from __future__ import annotations

import asyncio
import hmac
import ipaddress
import json
import logging
import time
from collections.abc import Awaitable, Callable
from importlib import resources
from typing import Any
from urllib.parse import urlsplit

from aiohttp import web
from aiohttp.typedefs import Handler

from .actions import ActionError, apply, audit, make_action
from .board import Board

log = logging.getLogger("waypost.console")

#: the event stream sends at most one snapshot per this many seconds, and a comment after this many idle ones
COALESCE = 0.25
KEEPALIVE = 15.0
MAX_BODY = 16 * 1024
LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1", "[::1]")

BOARD: web.AppKey[Board] = web.AppKey("board", Board)
APP_STATE: web.AppKey[Any] = web.AppKey("console", object)


def is_loopback(host: str) -> bool:
    if host in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def _json(data: Any, status: int = 200) -> web.Response:
    return web.json_response(data, status=status, dumps=lambda d: json.dumps(d, default=str))


def _refuse(status: int, message: str, **extra: Any) -> web.Response:
    return _json({"ok": False, "error": message, **extra}, status)


@web.middleware
async def security_headers(request: web.Request, handler: Handler) -> web.StreamResponse:
    state = request.app[APP_STATE]
    if state.loopback_only:
        host = (request.host or "").rsplit(":", 1)[0] if not (request.host or "").startswith("[") \
            else (request.host or "").split("]")[0] + "]"
        if not is_loopback(host):
            return _refuse(403, f"Host {request.host!r} is not this console's loopback address")
    resp = await handler(request)
    if resp.prepared:  # an event stream has sent its headers (its own) long ago
        return resp
    resp.headers.setdefault("X-Content-Type-Options", "nosniff")
    resp.headers.setdefault("X-Frame-Options", "DENY")
    resp.headers.setdefault("Referrer-Policy", "no-referrer")
    resp.headers.setdefault("Content-Security-Policy",
                            "default-src 'self'; img-src 'self' data:; style-src 'self'; script-src 'self'; "
                            "connect-src 'self'; frame-ancestors 'none'; form-action 'none'; base-uri 'none'")
    return resp


def check_token(request: web.Request) -> web.Response | None:
    """None when the request carries this console's token; else the refusal (401 missing, 403 wrong), whose
    ``token`` field (``missing`` / ``wrong``) lets the page say what to do with its token field."""
    state = request.app[APP_STATE]
    given = request.headers.get("X-Waypost-Token")
    auth = request.headers.get("Authorization", "")
    if given is None and auth.lower().startswith("bearer "):
        given = auth[7:].strip()
    if not given:
        return _refuse(401, "a token is needed: send it as 'Authorization: Bearer TOKEN' or 'X-Waypost-Token'",
                       token="missing")
    if not hmac.compare_digest(given.encode(), state.token.encode()):
        return _refuse(403, "wrong token", token="wrong")
    return None


def check_same_site(request: web.Request) -> web.Response | None:
    """None unless the request comes from another site (``Sec-Fetch-Site``, ``Origin``): then the 403."""
    site = request.headers.get("Sec-Fetch-Site")
    if site is not None and site not in ("same-origin", "none"):
        return _refuse(403, f"cross-site request refused (Sec-Fetch-Site: {site})")
    origin = request.headers.get("Origin")
    if origin is not None:
        o = urlsplit(origin)
        if origin == "null" or o.scheme != request.scheme or o.netloc.lower() != (request.host or "").lower():
            return _refuse(403, f"cross-site request refused (Origin: {origin})")
    return None


def guard_write(request: web.Request) -> web.Response | None:
    """None when this write may go on; else the refusal to send (see the module docstring)."""
    if request.app[APP_STATE].read_only:
        return _refuse(403, "this console is read-only (--read-only)")
    refused = check_token(request) or check_same_site(request)
    if refused is not None:
        return refused
    if request.content_type != "application/json":
        return _refuse(415, "send a JSON body (Content-Type: application/json)")
    return None


def _audit_refusal(verb: str, request: web.Request, refused: web.Response) -> None:
    audit.warning("audit: refused %s from %s at %s: %d %s", verb, request.remote or "?",
                  time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), refused.status,
                  json.loads(refused.body)["error"] if isinstance(refused.body, bytes) else "")


async def token_check(request: web.Request) -> web.Response:
    """``POST /api/token``: whether the token sent is this console's (200, else 401/403 as a write would get),
    writing nothing: the page's token badge shows what the server said, not merely that a field was filled."""
    refused = check_token(request) or check_same_site(request)
    if refused is not None:
        _audit_refusal("token check", request, refused)
        return refused
    return _json({"ok": True, "read_only": request.app[APP_STATE].read_only})


async def index(request: web.Request) -> web.StreamResponse:
    html = resources.files("waypost.console").joinpath("static/index.html").read_bytes()
    return web.Response(body=html, content_type="text/html", charset="utf-8",
                        headers={"Cache-Control": "no-store"})


async def favicon(request: web.Request) -> web.StreamResponse:
    """``/favicon.ico``, which browsers ask for by themselves: the page's SVG icon."""
    icon = resources.files("waypost.console").joinpath("static/favicon.svg").read_bytes()
    return web.Response(body=icon, content_type="image/svg+xml", headers={"Cache-Control": "max-age=86400"})


async def services(request: web.Request) -> web.Response:
    return _json(request.app[BOARD].snapshot())


async def config(request: web.Request) -> web.Response:
    state = request.app[APP_STATE]
    return _json({"read_only": state.read_only, "sources": state.source_names(),
                  "writable": [n for n, _ in state.writable()], "metrics": state.metrics_urls(),
                  "xds": state.config.xds})


async def xds(request: web.Request) -> web.Response:
    """``GET /api/xds``: each exported service's xDS clients (``xds_clients.py``); 404 without ``--xds``."""
    clients = request.app[APP_STATE].xds_clients
    if clients is None:
        return _refuse(404, "no xDS control plane given to this console (waypost console --xds HOST:PORT)")
    return _json(clients.snapshot())


async def events(request: web.Request) -> web.StreamResponse:
    """Server-sent events: the whole snapshot at once, then after each change (coalesced)."""
    board = request.app[BOARD]
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-store",
                                       "X-Accel-Buffering": "no"})
    await resp.prepare(request)
    seen = -1
    last_sent = time.monotonic()
    try:
        while not board.closed:
            if board.version != seen:
                seen = board.version
                data = json.dumps(board.snapshot(), default=str)
                await resp.write(f"event: snapshot\ndata: {data}\n\n".encode())
                last_sent = time.monotonic()
                await asyncio.sleep(COALESCE)
                continue
            await board.wait_change(seen, KEEPALIVE)
            if board.version == seen and time.monotonic() - last_sent >= KEEPALIVE:
                await resp.write(b": keepalive\n\n")
                last_sent = time.monotonic()
    except (ConnectionResetError, asyncio.CancelledError):
        pass
    return resp


def _action_handler(verb: str) -> Callable[[web.Request], Awaitable[web.Response]]:
    async def handle(request: web.Request) -> web.Response:
        refused = guard_write(request)
        if refused is not None:
            _audit_refusal(verb, request, refused)
            return refused
        try:
            body = await request.json()
        except ValueError:
            return _refuse(400, "the body is not JSON")
        try:
            action = make_action(verb, body)
        except ActionError as e:
            return _refuse(400, str(e))
        state = request.app[APP_STATE]
        targets = state.registries_for(action.key, action.address, body.get("source"))
        if not targets:
            named = body.get("source")
            return _refuse(404, f"no registry {named!r} that drain and weight write to in this console" if named else
                           "no registry in this console that drain and weight write to (a keyed registry, or a "
                           "kind's override store)")
        who = request.remote or "?"
        done = []
        for name, registry in targets:
            try:
                done.append(await asyncio.wait_for(state.on_control(apply(registry, action, who, source=name)),
                                                   state.timeout))
            except Exception as e:  # noqa: BLE001 (said to the caller)
                log.warning("console: %s by %s in %s failed: %s", action.describe(), who, name, e)
                return _refuse(502, f"{name}: {e or type(e).__name__}")
        return _json({"ok": True, "done": done})

    return handle


def make_app(state: Any, board: Board) -> web.Application:
    app = web.Application(middlewares=[security_headers], client_max_size=MAX_BODY)
    app[BOARD] = board
    app[APP_STATE] = state
    static = resources.files("waypost.console").joinpath("static")
    app.router.add_get("/", index)
    app.router.add_get("/favicon.ico", favicon)
    app.router.add_post("/api/token", token_check)
    app.router.add_static("/static/", str(static), show_index=False, append_version=False)
    app.router.add_get("/api/services", services)
    app.router.add_get("/api/config", config)
    app.router.add_get("/api/events", events)
    app.router.add_get("/api/xds", xds)
    for verb in ("drain", "undrain", "weight"):
        app.router.add_post(f"/api/{verb}", _action_handler(verb))
    return app

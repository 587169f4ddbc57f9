"""etcd dial targets (the kind's ``parse_target``): ``etcd:///h1:2379,h2:2379?key=greet.rpc`` (go-zero's current
form; ``discov:///...`` is the same) and ``etcd://h1:2379/greet.rpc`` (go-zero's legacy form: the hosts in the
authority, the key the path with its slashes trimmed, as go-zero does; a key with a leading ``/`` is written
``?key=%2Fsvc``). Credentials: ``etcd://user:pass@/h1:2379?key=K`` or ``?user=&password=``.

Parameters: ``key``, ``format=gozero|etcd-naming|kratos`` (default gozero), ``exact=1`` (go-zero's exact key
match), ``cache=PATH`` (the on-disk cache of the last list: ``waypost.discovery.cache``), and the registry options
``user``, ``password``, ``tls=1``, ``cacert``, ``certfile``, ``keyfile``, ``dial_timeout``, ``request_timeout``
(named so because ``key`` is the service key in go-zero's targets). ``key_param`` and ``keyed_options`` read the
parameters every keyed kind's targets share (memory's too).
"""

from __future__ import annotations

from types import MappingProxyType
from urllib.parse import quote, urlencode

from ...discovery.formats import DEFAULT_FORMAT, FORMAT_NAMES
from ...errors import did_you_mean
from ...etcd.config import EtcdConfig, default
from ...resolver.target import BAD_CHARS_RE, Target, endpoints_of, example, fail, unquote_strict
from .config import DEFAULT_PORT

_BOOL_PARAMS = ("exact", "tls")
_SECONDS_PARAMS = ("dial_timeout", "request_timeout")
_TRUE = ("1", "true")
_FALSE = ("0", "false")


def parse_etcd_target(scheme: str, authority: str, path: str, params: dict[str, str], raw: str) -> Target:
    """An ``etcd:`` or ``discov:`` target (comes out with scheme ``etcd``)."""
    userinfo = ""
    if "@" in authority:
        userinfo, _, authority = authority.rpartition("@")
    if authority:
        # legacy form: hosts in the authority, key in the path (go-zero trims the slashes)
        hosts = endpoints_of(authority, scheme, raw, what="etcd host", default_port=DEFAULT_PORT)
        key = unquote_strict(path, scheme, raw).strip("/")
        if key and "key" in params:
            fail(scheme, raw, "the key is given twice (in the path and as ?key=); use one: "
                  f"{example(scheme)}")
        if not key:
            key = key_param(params, scheme, raw)
    else:
        hosts = endpoints_of(path[1:], scheme, raw, what="etcd host", default_port=DEFAULT_PORT)
        key = key_param(params, scheme, raw)
    fmt, options = keyed_options(params, scheme, raw)
    if userinfo:
        if "user" in options or "password" in options:
            fail(scheme, raw, "credentials are given twice (user:pass@ and ?user=/?password=)")
        user, colon, password = userinfo.partition(":")
        user = unquote_strict(user, scheme, raw)
        if not user:
            fail(scheme, raw, "empty user name before '@'")
        options["user"] = user
        if colon:
            options["password"] = unquote_strict(password, scheme, raw)
    if "password" in options and "user" not in options:
        fail(scheme, raw, "a password needs a user")
    for name in ("user", "cacert", "certfile", "keyfile", "cache"):
        if name in options and not options[name]:
            fail(scheme, raw, f"empty {name}=")
    if ("certfile" in options) != ("keyfile" in options):
        hint = ""
        if "keyfile" not in options and key.endswith((".pem", ".key", ".crt")):
            hint = " (key= is the service key; the TLS private key file is keyfile=)"
        fail(scheme, raw, f"certfile= and keyfile= go together{hint}")
    return Target(scheme="etcd", endpoints=hosts, key=key, format=fmt,
                  options=MappingProxyType(options), raw=raw)


def key_param(params: dict[str, str], scheme: str, raw: str) -> str:
    """The ``key=`` of a keyed target (required, non-empty, no control characters)."""
    key = params.get("key")
    if key is None:
        fail(scheme, raw, f"{scheme} target needs ?key=: {example(scheme)}")
    if not key:
        fail(scheme, raw, f"empty ?key=: {example(scheme)}")
    if BAD_CHARS_RE.search(key.replace(" ", "")):
        fail(scheme, raw, "the key contains control characters")
    return key


def keyed_options(params: dict[str, str], scheme: str, raw: str) -> tuple[str, dict[str, str]]:
    """The wire format (``format=``) and the other options of a keyed target, flags as 1/0, seconds checked."""
    fmt = params.get("format", DEFAULT_FORMAT)
    if fmt not in FORMAT_NAMES:
        close = did_you_mean(fmt, FORMAT_NAMES)
        fail(scheme, raw, f"unknown format {fmt!r}{close}; expected one of: {', '.join(FORMAT_NAMES)}")
    options: dict[str, str] = {}
    for name, value in params.items():
        if name in ("key", "format"):
            continue
        if name in _BOOL_PARAMS:
            lowered = value.lower()
            if lowered not in _TRUE + _FALSE:
                fail(scheme, raw, f"{name}= expects 1, 0, true or false, got {value!r}")
            value = "1" if lowered in _TRUE else "0"
        elif name in _SECONDS_PARAMS and not _is_positive_number(value):
            fail(scheme, raw, f"{name}= expects a number of seconds > 0, got {value!r}")
        options[name] = value
    return fmt, options


def _is_positive_number(text: str) -> bool:
    try:
        value = float(text)
    except ValueError:
        return False
    return 0 < value < float("inf")


def registry_url(target: Target) -> str:
    """The URL ``waypost.connect`` takes for an etcd target's cluster:
    ``etcd://[user:pass@]h1:2379,h2:2379[?tls=1&ca=...&cert=...&key=...]`` (it carries the password: do not log
    it)."""
    userinfo = ""
    if "user" in target.options:
        userinfo = quote(target.options["user"], safe="")
        if "password" in target.options:
            userinfo += ":" + quote(target.options["password"], safe="")
        userinfo += "@"
    renames = (("tls", "tls"), ("cacert", "ca"), ("certfile", "cert"), ("keyfile", "key"),
               ("dial_timeout", "dial_timeout"), ("request_timeout", "request_timeout"))
    query = [(url_name, target.options[name]) for name, url_name in renames if name in target.options]
    suffix = "?" + urlencode(query, quote_via=quote, safe="/") if query else ""
    return f"etcd://{userinfo}{','.join(target.endpoints)}{suffix}"


def dial_target(config: EtcdConfig, key: str) -> str:
    """The target that dials ``key`` in the cluster of ``config``, with its user, password and TLS files (only the
    timeouts that differ from the defaults are written)."""
    options: list[tuple[str, str]] = [("key", key)]
    if config.username:
        options.append(("user", config.username))
        if config.password:
            options.append(("password", config.password))
    if config.tls:
        options.append(("tls", "1"))
    for name, value in (("cacert", config.ca_file), ("certfile", config.cert_file), ("keyfile", config.key_file)):
        if value:
            options.append((name, value))
    for name in ("dial_timeout", "request_timeout"):
        value = getattr(config, name)
        if value != default(name):
            options.append((name, f"{value:g}"))
    return f"etcd:///{','.join(config.endpoints)}?{urlencode(options, quote_via=quote, safe='/')}"

"""``host:port`` addresses: the one parser, and which address a server should advertise in the registry.

Parsing (``split_host_port``, ``parse_host_port``; every dial target, registry URL, DNS name and advertised
address goes through them, so the rules and the error text are the same everywhere):

- ``host:port``, ``host``, ``[v6]:port`` or ``[v6]``; IPv6 addresses always in brackets (``::1:80`` is
  ambiguous and refused);
- the host is an IPv4 address, an IPv6 address (in the brackets) or a host name (letters, digits, ``-``,
  ``_``, dot-separated labels of at most 63 characters, 253 in all); all digits and dots means IPv4;
- the port is 1..65535; a listening address (``listen=True``) may also use port 0 (a free port), an
  empty host (``:PORT``: every interface) or be a bare ``PORT`` (the same); ``bind_address`` turns one into
  the ``host:port`` gRPC binds (gRPC itself refuses ``:PORT`` and ``PORT``);
- surrounding whitespace is ignored; a bad address raises ``AddressError`` naming it and the expected form.

The advertised address, first that applies wins:

1. ``advertise=`` given explicitly (``host`` or ``host:port``; a missing port is the bound port);
2. the host of ``listen_on`` when it is a concrete address (not empty, not ``0.0.0.0`` / ``::``);
3. the ``POD_IP`` environment variable (Kubernetes' downward API);
4. loopback for an in-process registry (``memory://``): every client that reads it runs in this process;
5. loopback when ``allow_loopback=True`` and every registry endpoint is on loopback (the caller says the
   clients run on this host);
6. the first up, non-loopback interface address, IPv4 preferred (IPv6 link-local addresses are skipped:
   they need a zone and are useless to other hosts);
7. the local address of a UDP socket "connected" to a public address (no packet is sent);
8. loopback, when nothing above found an address (a host with no other interface), unless
   ``allow_loopback=False`` (then an ``AddressError`` saying what to pass).

A registry on loopback does NOT make loopback the choice by itself: a node-local etcd proxy or a
``kubectl port-forward`` is on loopback while the clients are on other hosts, and a registered
127.0.0.1 sends each of them to itself. Whenever loopback is advertised for a registry that is not
in-process (an explicit ``advertise=`` loopback host, ``allow_loopback=True``, no other interface, a
``listen_on`` loopback host with a registry elsewhere) a WARNING says that only clients on this host
can reach it.

Never a wildcard (``0.0.0.0``, ``::``). IPv6 hosts are written in brackets: ``[fd00::2]:8080``.
"""

from __future__ import annotations

import ipaddress
import logging
import os
import re
import socket
import struct
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from contextlib import suppress
from dataclasses import dataclass
from typing import NoReturn
from urllib.parse import urlsplit

from .errors import WaypostError

log = logging.getLogger("waypost.netutil")

_WILDCARDS = {"", "0.0.0.0", "::", "[::]", "*"}


class AddressError(WaypostError, ValueError):
    """No usable address to advertise, or an address given by the user is malformed."""


@dataclass(frozen=True, slots=True)
class Interface:
    """One address of a network interface."""

    name: str
    address: str  # without brackets or zone
    up: bool = True
    loopback: bool = False


_HOSTNAME_RE = re.compile(r"[A-Za-z0-9_](?:[A-Za-z0-9_-]{0,62})(?:\.[A-Za-z0-9_](?:[A-Za-z0-9_-]{0,62}))*\.?")
_IPV4_LIKE_RE = re.compile(r"[0-9.]+")
_PORT_RE = re.compile(r"[0-9]{1,5}")


def split_host_port(text: str, *, what: str = "address", listen: bool = False) -> tuple[str, int | None]:
    """Split ``host:port`` / ``[v6]:port`` / ``host`` / ``[v6]``: the host (IPv6 without brackets) and the
    port, None when absent. Raises ``AddressError`` naming ``what``, the text and the expected form.

    ``listen=True`` is for addresses a server binds or announces itself on: the host may be empty (every
    interface; ``:PORT``, or a bare ``PORT``: all digits cannot be a host) and the port may be 0 (a free
    port, or the bound port).
    """
    return _split(text, what, listen, port_required=False)


def parse_host_port(text: str, *, what: str = "address", default_port: int | None = None,
                    listen: bool = False) -> tuple[str, int]:
    """``split_host_port`` with a port always present: ``default_port`` when the text has none (None: the
    port is required, and its absence is an ``AddressError``)."""
    host, port = _split(text, what, listen, port_required=default_port is None)
    if port is None:
        if default_port is None:
            _bad_address(text, what, "no port", listen, True)
        port = default_port
    return host, port


def normalize_host_port(text: str, *, what: str = "address", default_port: int | None = None) -> str:
    """The canonical ``host:port`` of ``text`` (port filled in, IPv6 in brackets, no surrounding spaces)."""
    return join_host_port(*parse_host_port(text, what=what, default_port=default_port))


def bind_address(text: str, *, what: str = "listen address") -> str:
    """The ``host:port`` a server binds for the listening address ``text`` (``HOST:PORT``, ``:PORT`` or a bare
    ``PORT``; port 0: a free one). An empty host (every interface) becomes ``0.0.0.0``, which gRPC binds on
    IPv6 too where the host has it; gRPC refuses ``:PORT`` (``host must not be empty``) and takes a bare
    ``PORT`` for a host name. Raises ``AddressError`` naming ``what`` when ``text`` is malformed."""
    host, port = parse_host_port(text, what=what, listen=True)
    return join_host_port(host or "0.0.0.0", port)


def join_host_port(host: str, port: int) -> str:
    """``host:port``, with IPv6 hosts in brackets (``host`` is given without them)."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _split(text: str, what: str, listen: bool, port_required: bool) -> tuple[str, int | None]:
    def bad(problem: str) -> NoReturn:
        _bad_address(text, what, problem, listen, port_required)

    s = text.strip()
    if s.startswith("["):
        close = s.find("]")
        if close < 0:
            bad("'[' without ']'")
        host, rest = s[1:close], s[close + 1:]
        try:
            ipaddress.IPv6Address(host)
        except ValueError:
            bad(f"{host!r} in brackets is not an IPv6 address")
        if not rest:
            return host, None
        if not rest.startswith(":"):
            bad(f"{rest!r} after ']' is not ':PORT'")
        return host, _port(rest[1:], bad, listen)
    if s.count(":") > 1:
        bad("IPv6 addresses must be written in brackets")
    if listen and s.isascii() and s.isdigit():  # a bare PORT: all digits is no host (nor an IPv4 address)
        return "", _port(s, bad, listen)
    host, colon, port_text = s.partition(":")
    if not host:
        if not listen:
            bad("empty host")
    elif _IPV4_LIKE_RE.fullmatch(host):
        try:
            ipaddress.IPv4Address(host)
        except ValueError:
            bad(f"{host!r} is not a valid IPv4 address")
    elif len(host) > 253 or not _HOSTNAME_RE.fullmatch(host):
        bad(f"{host!r} is not a valid host name")
    return host, (_port(port_text, bad, listen) if colon else None)


def _port(text: str, bad: Callable[[str], NoReturn], listen: bool) -> int:
    lowest = 0 if listen else 1
    if not _PORT_RE.fullmatch(text) or not lowest <= int(text) <= 65535:
        bad(f"bad port {text!r}")
    return int(text)


def _bad_address(text: str, what: str, problem: str, listen: bool, port_required: bool) -> NoReturn:
    form = "HOST:PORT" if port_required else "HOST[:PORT]"
    if listen and port_required:  # a listening address (bind_address); advertise= takes no wildcard
        form += ", :PORT or PORT (every interface)"
    ports = "0..65535" if listen else "1..65535"
    raise AddressError(f"{what} {text!r}: {problem}; expected {form} with PORT in {ports} and IPv6 addresses "
                       "in brackets (e.g. 10.0.0.5:8080, [fd00::2]:8080)")


# What a registry record may hold as an address (``valid_address``). Looser than the parser above on purpose:
# records written by other programs (go-zero, grpc-go, Kratos) are read as they name their hosts, and only what
# can never be dialled is refused (spaces, control characters, '/', an unbracketed ':', a port out of range).
WIRE_BRACKETED_HOST = r"\[[^\s\[\]/\x00-\x1f\x7f]+\]"
WIRE_PLAIN_HOST = r"[^\s:/\[\]\x00-\x1f\x7f]+"
#: a registry record's ``host:port``; group 1 is the port (its range is ``valid_address``'s to check)
WIRE_HOST_PORT = re.compile(rf"\A(?:{WIRE_BRACKETED_HOST}|{WIRE_PLAIN_HOST}):([0-9]{{1,5}})\Z")
_UNIX_ADDRESS = re.compile(r"\Aunix(?:-abstract)?:[^\s\x00-\x1f\x7f]+\Z")
#: the longest address a registry record may hold
MAX_ADDRESS_LENGTH = 1024


def valid_address(addr: str) -> bool:
    """An address a registry record may hold: ``host:port`` (IPv6 in brackets) with a port in 1..65535, or a
    ``unix:``/``unix-abstract:`` path; at most 1,024 characters."""
    if len(addr) > MAX_ADDRESS_LENGTH:
        return False
    m = WIRE_HOST_PORT.match(addr)
    if m is not None:
        return 0 < int(m.group(1)) < 65536
    return _UNIX_ADDRESS.match(addr) is not None


def is_wildcard(host: str) -> bool:
    """True for an empty host or an any-address (0.0.0.0, ::)."""
    h = host.strip("[]")
    if h in _WILDCARDS:
        return True
    try:
        return ipaddress.ip_address(h).is_unspecified
    except ValueError:
        return False


def check_dialable(address: str, *, what: str = "address") -> str:
    """``address`` if clients can dial it; AddressError for a wildcard host (``0.0.0.0:80``,
    ``[::]:80``, ``:80``), which is where a server listens, not an address to register. Other
    malformed addresses are left to the caller's own check (``unix:`` paths pass)."""
    if not isinstance(address, str) or address.startswith(("unix:", "unix-abstract:")):
        return address
    try:
        host, port = split_host_port(address, what=what, listen=True)
    except AddressError:
        return address
    if is_wildcard(host):
        raise AddressError(
            f"{what} {address!r} is an unspecified (wildcard) address: clients cannot dial it; register "
            f"an address other hosts can reach, e.g. 10.0.0.5:{port if port is not None else 8080} "
            "(serve() finds one by itself)")
    return address


def bind_problem(listen_on: str) -> str | None:
    """Why a server cannot listen on ``listen_on`` (e.g. ``Address already in use``; followed by the address
    that failed when it is not the one given, as for a host name), found by binding a probe socket there as
    gRPC would; None when the probe binds (or the text is no listening address). gRPC itself only logs the
    cause, and raises a RuntimeError that does not say it."""
    try:
        host, port = split_host_port(listen_on, what="listen address", listen=True)
        infos = socket.getaddrinfo(host or None, port or 0, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except (AddressError, OSError, UnicodeError) as e:
        return str(e) if isinstance(e, OSError) else None
    for family, kind, proto, _, sockaddr in infos:
        try:
            with socket.socket(family, kind, proto) as probe:
                probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                probe.bind(sockaddr)
        except OSError as e:
            failed = join_host_port(str(sockaddr[0]), int(sockaddr[1]))
            # the address that failed, when it is not the one asked (a name, a wildcard bound dual-stack)
            return f"{e.strerror or e}" + ("" if (str(sockaddr[0]), sockaddr[1]) == (host, port) else f" ({failed})")
    return None


def is_loopback(host: str) -> bool:
    """True for 127.0.0.0/8, ::1 and ``localhost``."""
    h = host.strip("[]").lower()
    if h == "localhost" or h.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(h).is_loopback
    except ValueError:
        return False


def _registry_url(registry: object) -> str | None:
    url = registry if isinstance(registry, str) else getattr(registry, "url", None)
    return url if isinstance(url, str) and url else None


def registry_in_process(registry: object) -> bool:
    """True when the registry lives in this process (``memory://``); ``registry`` is a URL or a Registry (a list
    of them: when every one does)."""
    if isinstance(registry, list | tuple):
        return bool(registry) and all(registry_in_process(r) for r in registry)
    url = _registry_url(registry)
    return url is not None and urlsplit(url).scheme == "memory"


def registry_is_local(registry: object) -> bool:
    """True when the registry is in-process (``memory://``) or every endpoint is on loopback.

    ``registry`` is a registry URL or a Registry object (its ``url`` attribute is used), or a list of them
    (every one local).
    """
    if isinstance(registry, list | tuple):
        return bool(registry) and all(registry_is_local(r) for r in registry)
    url = _registry_url(registry)
    if url is None:
        return False
    parts = urlsplit(url)
    if parts.scheme == "memory":
        return True
    netloc = parts.netloc.rsplit("@", 1)[-1]  # drop user:password
    hosts = [h for h in netloc.split(",") if h]
    if not hosts:
        return False
    try:
        return all(is_loopback(split_host_port(h, what="registry endpoint")[0]) for h in hosts)
    except AddressError:
        return False


def _check_ip(text: str, what: str) -> str:
    try:
        ip = ipaddress.ip_address(text.strip("[]"))
    except ValueError:
        raise AddressError(f"{what}={text!r} is not an IP address") from None
    if ip.is_unspecified:
        raise AddressError(f"{what}={text!r} is a wildcard address; advertise a reachable address")
    return str(ip)


def _usable(addr: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        ip = ipaddress.ip_address(addr.split("%", 1)[0])
    except ValueError:
        return None
    if ip.is_unspecified or ip.is_loopback or ip.is_link_local or ip.is_multicast:
        return None
    return ip


def pick_interface_address(interfaces: Iterable[Interface]) -> str | None:
    """The first up, non-loopback address, IPv4 before IPv6, in interface order."""
    v4: list[str] = []
    v6: list[str] = []
    for itf in interfaces:
        if not itf.up or itf.loopback:
            continue
        ip = _usable(itf.address)
        if ip is None:
            continue
        (v4 if ip.version == 4 else v6).append(str(ip))
    found = v4 or v6
    return found[0] if found else None


def outbound_address(probes: Sequence[tuple[int, str]] = ((socket.AF_INET, "192.0.2.1"),
                                                          (socket.AF_INET6, "2001:db8::1"))) -> str | None:
    """The local address the OS would use towards the outside (a UDP connect sends no packet)."""
    for family, target in probes:
        try:
            with socket.socket(family, socket.SOCK_DGRAM) as s:
                s.connect((target, 9))
                addr = str(s.getsockname()[0])
        except OSError:
            continue
        if _usable(addr) is not None:
            return addr
    return None


def list_interfaces() -> list[Interface]:
    """The addresses of this host's interfaces (Linux: ioctl + /proc; elsewhere: resolve the host name)."""
    if sys.platform.startswith("linux"):
        try:
            return _linux_interfaces()
        except OSError as e:  # a sandbox without /proc or ioctl: fall through
            log.debug("interface listing failed: %s", e)
    found: list[Interface] = []
    with suppress(OSError):
        for info in socket.getaddrinfo(socket.gethostname(), None):
            addr = str(info[4][0])
            found.append(Interface("?", addr, True, is_loopback(addr)))
    return found


def _linux_interfaces() -> list[Interface]:
    import fcntl

    SIOCGIFFLAGS, SIOCGIFADDR = 0x8913, 0x8915
    IFF_UP, IFF_LOOPBACK = 0x1, 0x8
    out: list[Interface] = []
    flags: dict[str, int] = {}
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        for _, name in socket.if_nameindex():
            req = struct.pack("256s", name.encode()[:15])
            try:
                fl = struct.unpack_from("H", fcntl.ioctl(s.fileno(), SIOCGIFFLAGS, req), 16)[0]
            except OSError:
                continue
            flags[name] = fl
            try:
                raw = fcntl.ioctl(s.fileno(), SIOCGIFADDR, req)
            except OSError:  # no IPv4 address on this interface
                continue
            addr = socket.inet_ntoa(raw[20:24])
            out.append(Interface(name, addr, bool(fl & IFF_UP), bool(fl & IFF_LOOPBACK)))
    try:
        with open("/proc/net/if_inet6") as f:
            lines = f.read().splitlines()
    except OSError:
        lines = []
    for line in lines:
        parts = line.split()
        if len(parts) < 6:
            continue
        addr = str(ipaddress.IPv6Address(bytes.fromhex(parts[0])))
        name = parts[5]
        fl = flags.get(name, IFF_UP)
        out.append(Interface(name, addr, bool(fl & IFF_UP), bool(fl & IFF_LOOPBACK) or addr == "::1"))
    return out


def advertised_address(
    listen_on: str,
    port: int,
    *,
    advertise: str | None = None,
    registry: object = None,
    allow_loopback: bool | None = None,
    env: Mapping[str, str] | None = None,
    interfaces: Callable[[], Iterable[Interface]] = list_interfaces,
    outbound: Callable[[], str | None] = outbound_address,
) -> str:
    """The ``host:port`` to register for a server bound on ``listen_on`` whose real port is ``port``.

    ``env`` (default ``os.environ``), ``interfaces`` and ``outbound`` are injectable for tests.
    Raises ``AddressError`` when an explicit address is malformed or nothing usable is found.
    """
    env = os.environ if env is None else env
    in_process = registry_in_process(registry)
    if advertise:
        host, p = split_host_port(advertise, what="advertise", listen=True)
        if not host or is_wildcard(host):
            raise AddressError(f"advertise={advertise!r}: a wildcard address cannot be reached; "
                               "give the address clients should dial (example: 10.0.0.5:8080)")
        address = join_host_port(host, p if p else port)
        if is_loopback(host) and not in_process:
            _warn_loopback(address, "advertise= names a loopback address")
        return address

    listen_host, _ = split_host_port(listen_on, what="listen_on", listen=True)
    if not is_wildcard(listen_host):
        address = join_host_port(listen_host, port)
        # Bound to loopback, the server has no other address; with a registry on loopback too (a local
        # test or demo set-up) that is consistent, with a remote registry it is surely a mistake.
        if is_loopback(listen_host) and not registry_is_local(registry):
            _warn_loopback(address, "the server listens on loopback only and the registry is not on this host")
        return address

    pod_ip = env.get("POD_IP", "").strip()
    if pod_ip:
        return join_host_port(_check_ip(pod_ip, "POD_IP"), port)

    # IPv6-only listeners ([::1]) are rare; 127.0.0.1 is reachable through a dual-stack [::] bind too.
    if in_process and allow_loopback is not False:
        return join_host_port("127.0.0.1", port)
    if allow_loopback and registry_is_local(registry):
        address = join_host_port("127.0.0.1", port)
        _warn_loopback(address, "allow_loopback=True and the registry is on loopback")
        return address

    found = pick_interface_address(interfaces()) or outbound()
    if found:
        return join_host_port(found, port)
    if allow_loopback is False:
        raise AddressError(
            "no non-loopback address found to advertise and allow_loopback=False; pass "
            "advertise='HOST:PORT' or set POD_IP"
        )
    address = join_host_port("127.0.0.1", port)
    _warn_loopback(address, "no network interface other than loopback was found")
    return address


def _warn_loopback(address: str, why: str) -> None:
    log.warning("advertising the loopback address %s (%s): only clients on this host can reach it; "
                "pass advertise='HOST:PORT' with an address other hosts can dial if they must", address, why)

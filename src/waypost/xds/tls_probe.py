"""What a control plane's port says to a TLS client: does it serve TLS, is its certificate trusted, does it ask for a
client certificate and take the one shown (``probe_tls``).

gRPC reports a plaintext call to a TLS port, or a TLS call without the client certificate an mTLS port asks for,
as ``UNAVAILABLE: Socket closed``; ``waypost xds status`` probes the port to say which it is. The probe is one
TLS handshake, watched:

- a server that answers the ClientHello with anything but a ServerHello (a plaintext gRPC server answers with
  HTTP/2 bytes) does not serve TLS;
- its certificate is checked against the CA given (host name included, as gRPC does), or the system's CAs;
- the handshake messages (OpenSSL's message callback) tell whether the server sent a CertificateRequest; in TLS
  1.3 a server that refuses the client's certificate, or its lack of one, closes the connection right after the
  handshake, where one that takes the client sends its HTTP/2 SETTINGS at once.
"""

from __future__ import annotations

import socket
import ssl
from dataclasses import dataclass
from pathlib import Path
from typing import Any

#: TLS handshake message types (RFC 8446 section 4)
_SERVER_HELLO, _CERTIFICATE_REQUEST = 2, 13
#: OpenSSL's reasons for bytes that are no TLS record (a plaintext HTTP/2 server's answer)
_NOT_TLS = frozenset({"WRONG_VERSION_NUMBER", "RECORD_LAYER_FAILURE", "PACKET_LENGTH_TOO_LONG", "HTTP_REQUEST"})


@dataclass(frozen=True)
class TlsProbe:
    """What one TLS handshake with the port showed (module docstring).

    ``tls``: it answered with a ServerHello (True), with bytes that are no TLS (False), or the probe cannot tell
    (None: ``error`` says what happened). ``untrusted``: why its certificate failed verification ("" when it
    passed). ``asks_cert``: it sent a CertificateRequest (None: this Python cannot tell). ``accepted``: after the
    handshake it sent its first bytes (it took this client) rather than closing."""

    tls: bool | None
    untrusted: str = ""
    asks_cert: bool | None = None
    accepted: bool = False
    error: str = ""


def probe_tls(host: str, port: int, *, ca: Path | None = None, cert: Path | None = None, key: Path | None = None,
              timeout: float = 5.0) -> TlsProbe | None:
    """One TLS handshake with ``host:port`` (showing ``cert``, verifying against ``ca``, else the system's CAs);
    None when nothing accepts the connection. Raises ``ssl.SSLError`` or ``OSError`` when ``ca``, ``cert`` or
    ``key`` do not load."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.set_alpn_protocols(["h2"])  # a gRPC server negotiates HTTP/2 by ALPN
    if ca is not None:
        ctx.load_verify_locations(cafile=str(ca))
    else:
        ctx.load_default_certs()
    if cert is not None:
        ctx.load_cert_chain(str(cert), str(key) if key is not None else None)
    seen: set[int] = set()

    def watch(_conn: Any, direction: str, _version: Any, _content: Any, msg_type: Any, _data: bytes) -> None:
        if direction == "read":
            seen.add(int(msg_type))

    # CPython's message callback (3.8+, not public): a class property; an instance attribute of that name would
    # be set on any Python and never called
    can_tell = isinstance(getattr(ssl.SSLContext, "_msg_callback", None), property)
    if can_tell:
        ctx._msg_callback = watch  # type: ignore[attr-defined]

    def probe(tls: bool | None, **kw: Any) -> TlsProbe:
        asks = (_CERTIFICATE_REQUEST in seen) if can_tell else None
        return TlsProbe(True if _SERVER_HELLO in seen else tls, asks_cert=asks, **kw)

    try:
        raw = socket.create_connection((host, port), timeout=timeout)
    except OSError:
        return None
    with raw:
        try:
            with ctx.wrap_socket(raw, server_hostname=host) as s:
                first = s.recv(1)
        except ssl.SSLCertVerificationError as e:
            return probe(True, untrusted=e.verify_message or str(e))
        except ssl.SSLError as e:
            return probe(False if e.reason in _NOT_TLS else None, error=str(e))
        except OSError as e:  # closed or reset: during the handshake or right after it
            return probe(None, error=str(e) or type(e).__name__)
    return probe(True, accepted=first != b"")


__all__ = ["TlsProbe", "probe_tls"]

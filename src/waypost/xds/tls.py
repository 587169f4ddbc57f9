"""The control plane's server TLS from PEM files, re-read when they change (``waypost xds serve --tls-cert``).

``ServerTls(TlsFiles(cert, key, client_ca)).credentials()`` is a ``grpc.dynamic_ssl_server_credentials``: gRPC
calls its fetcher before every new connection's handshake (on a gRPC thread, also under ``grpc.aio``) and
uses the configuration it returns from then on, or keeps the current one on ``None``. The fetcher stats the
files (device, inode, size, mtime, ctime: an in-place write and an atomic rename or symlink swap both show) and
reads them only when that changes, so a handshake costs two or three ``stat`` calls. New files are loaded only
when they check out (the chain parses, the key belongs to it, the CA parses) and read the same twice around
that check; otherwise the last good files stay in use: a file half written is retried at the next handshake,
a bad one is named in one warning (per change of the files) and not read again until it changes.

With ``client_ca`` the server requires a client certificate signed by that CA (mTLS): a client without one,
or with one from another CA, fails the handshake.
"""

from __future__ import annotations

import logging
import os
import ssl
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import grpc

from .errors import XdsConfigError

log = logging.getLogger("waypost.xds")

#: what each file is, for messages
_WHAT = {"cert": "certificate chain", "key": "private key", "client_ca": "client CA"}
_KEYS = ("cert", "key", "client_ca")


class TlsFileError(XdsConfigError):
    """A TLS file is missing, unreadable or not what it should be; ``field`` is ``cert``, ``key`` or
    ``client_ca`` (the caller names it as its user gave it: a flag or a config key), ``problem`` says what to do."""

    def __init__(self, field: str, path: str, problem: str) -> None:
        super().__init__(f"{_WHAT[field]} {path}: {problem}")
        self.field, self.path, self.problem = field, path, problem


@dataclass(frozen=True)
class TlsFiles:
    """Where the server's certificate chain, its key and (for mTLS) the CA of its clients are."""

    cert: str
    key: str
    client_ca: str | None = None


def tls_files_from_table(table: object, where: str) -> TlsFiles:
    """A config file's ``[tls]`` table: ``cert``, ``key`` and optionally ``client_ca``, each a path."""
    if not isinstance(table, Mapping):
        raise XdsConfigError(f"{where}: expected a table with 'cert', 'key' and optionally 'client_ca'")
    unknown = sorted(set(table) - set(_KEYS))
    if unknown:
        raise XdsConfigError(f"{where}: unknown key {str(unknown[0])[:40]!r} (expected {', '.join(_KEYS)})")
    for k in ("cert", "key"):
        if k not in table:
            raise XdsConfigError(f"{where}: {k!r} is missing (cert and key go together)")
    for k, v in table.items():
        if not isinstance(v, str) or not v:
            raise XdsConfigError(f"{where}: {k} must be a file path, got {v!r}")
    return TlsFiles(table["cert"], table["key"], table.get("client_ca"))


@dataclass(frozen=True)
class _Pem:
    cert: bytes
    key: bytes
    client_ca: bytes | None

    def config(self) -> grpc.ServerCertificateConfiguration:
        return grpc.ssl_server_certificate_configuration([(self.key, self.cert)], root_certificates=self.client_ca)


class _Changing(Exception):
    """The files changed while they were read (a writer is at work): try again at the next handshake."""


def _paths(files: TlsFiles) -> dict[str, str]:
    return {k: p for k in _KEYS if (p := getattr(files, k)) is not None}


def _read(field: str, path: str) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read()
    except FileNotFoundError:
        raise TlsFileError(field, path, f"no such file: give the path of the {_WHAT[field]} (PEM)") from None
    except IsADirectoryError:
        raise TlsFileError(field, path, f"is a directory: give the path of the {_WHAT[field]} file (PEM)") from None
    except OSError as e:
        raise TlsFileError(field, path, f"cannot read it ({e.strerror or e}): check its permissions") from None


def _check_certs(field: str, path: str, pem: bytes) -> None:
    try:
        ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT).load_verify_locations(cadata=pem.decode("ascii", "replace"))
    except (ssl.SSLError, ValueError):
        raise TlsFileError(field, path, "not a PEM certificate (-----BEGIN CERTIFICATE-----), or only part of "
                                        "one") from None


def _load(files: TlsFiles) -> _Pem:
    """The files' contents, checked; raises TlsFileError (or _Changing)."""
    paths = _paths(files)
    first = {k: _read(k, p) for k, p in paths.items()}
    _check_certs("cert", files.cert, first["cert"])
    if files.client_ca is not None:
        _check_certs("client_ca", files.client_ca, first["client_ca"])
    try:  # the only stdlib check that a key parses and belongs to a chain reads them from their paths
        ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER).load_cert_chain(files.cert, files.key)
    except ssl.SSLError as e:
        problem = (f"does not belong to the certificate in {files.cert}: give the key it was issued for"
                   if e.reason == "KEY_VALUES_MISMATCH" else
                   "not a PEM private key (-----BEGIN ... PRIVATE KEY-----, unencrypted), or only part of one")
        raise TlsFileError("key", files.key, problem) from None
    except OSError as e:  # gone or unreadable since the first read
        raise _Changing(str(e)) from None
    # what was checked from the paths is what was read only if a second read gives the same bytes
    if any(_read(k, p) != first[k] for k, p in paths.items()):
        raise _Changing("changed while read")
    return _Pem(first["cert"], first["key"], first.get("client_ca"))


def _stamp(path: str) -> tuple[int, ...] | str:
    try:
        st = os.stat(path)
    except OSError as e:
        return e.strerror or str(e)
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


class ServerTls:
    """Server credentials over ``files`` that follow changes to them (module docstring). The constructor
    loads the files and raises ``TlsFileError`` naming the first that is wrong."""

    def __init__(self, files: TlsFiles) -> None:
        self.files = files
        self._paths = _paths(files)
        self._lock = threading.Lock()
        for _ in range(3):  # being written as we start: a few tries
            self._loaded = self._stamps()
            try:
                self._pem = _load(files)
                break
            except _Changing:
                continue
        else:
            raise TlsFileError("cert", files.cert, "the files kept changing while read: start again once written")
        self._bad: object = None  # the stamps of files found bad (not read again until they change)
        self.reloads = 0

    def credentials(self) -> grpc.ServerCredentials:
        return grpc.dynamic_ssl_server_credentials(self._pem.config(), self._fetch,
                                                   require_client_authentication=self.files.client_ca is not None)

    def _stamps(self) -> tuple[Any, ...]:
        return tuple(_stamp(p) for p in self._paths.values())

    def _fetch(self) -> grpc.ServerCertificateConfiguration | None:
        try:
            return self.reload()
        except Exception:  # an error raised into gRPC's handshake path would only be logged there
            log.exception("xds: TLS: checking the certificate files failed; keeping the loaded ones")
            return None

    def reload(self) -> grpc.ServerCertificateConfiguration | None:
        """The new configuration if the files changed and check out, else None (keep the current one)."""
        with self._lock:
            stamps = self._stamps()  # before reading: a change during the read shows at the next call
            if stamps == self._loaded or stamps == self._bad:
                return None
            try:
                pem = _load(self.files)
            except _Changing:
                return None
            except TlsFileError as e:
                self._bad = stamps
                log.warning("xds: TLS: %s; keeping the certificate loaded before", e)
                return None
            self._loaded, self._bad = stamps, None
            if pem == self._pem:
                return None
            self._pem = pem
            self.reloads += 1
            log.info("xds: TLS: re-read %s (new connections use them)", ", ".join(self._paths.values()))
            return pem.config()

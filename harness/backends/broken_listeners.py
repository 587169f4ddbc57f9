"""Plain TCP listeners on 127.0.0.1 that are not gRPC servers, for connection-attempt tests.

- ``black_hole``: accepts every connection and never sends or reads a byte (a gRPC client's attempt stays
  CONNECTING until its own connect timeout, 20 s by default);
- ``reset``: accepts and resets at once (SO_LINGER 0, so the client sees an RST);
- ``garbage``: accepts, answers with bytes that are not HTTP/2, then closes.

Each runs one daemon accept thread; ``close()`` stops it and closes every accepted socket.
"""

from __future__ import annotations

import socket
import struct
import threading
from collections.abc import Iterator
from contextlib import contextmanager

GARBAGE = b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\nthis is not http/2\r\n"
KINDS = ("black_hole", "reset", "garbage")


class BrokenListener:
    """A listener of one ``kind`` (see the module docstring) on a free loopback port."""

    def __init__(self, kind: str) -> None:
        if kind not in KINDS:
            raise ValueError(f"unknown listener kind {kind!r}: expected one of {', '.join(KINDS)}")
        self.kind = kind
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind(("127.0.0.1", 0))
        self._sock.listen(64)
        self._sock.settimeout(0.1)  # so the accept loop sees close() within a tenth of a second
        self.port = self._sock.getsockname()[1]
        self.accepted = 0
        self._held: list[socket.socket] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"broken-{kind}-{self.port}", daemon=True)
        self._thread.start()

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._sock.accept()
            except TimeoutError:
                continue
            except OSError:  # closed under us
                return
            self.accepted += 1
            if self.kind == "black_hole":
                self._held.append(conn)  # kept open, never read: the client's bytes sit in the buffers
            elif self.kind == "reset":
                conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                conn.close()
            else:
                try:
                    conn.sendall(GARBAGE)
                except OSError:
                    pass
                conn.close()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self._sock.close()
        for c in self._held:
            c.close()
        self._held.clear()


@contextmanager
def broken_listeners(*kinds: str) -> Iterator[list[BrokenListener]]:
    """Listeners of the given kinds, closed afterwards."""
    started: list[BrokenListener] = []
    try:
        for k in kinds:
            started.append(BrokenListener(k))
        yield started
    finally:
        for s in started:
            s.close()

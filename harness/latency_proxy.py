"""A slow link for tests: ``TcpProxy`` whose every byte arrives ``delay`` seconds after it was sent.

Each direction of each connection has a reader (stamps chunks with their due time) and a sender
(waits for that time, then forwards), so bytes keep their order and the link keeps its bandwidth:
only the latency grows, as on a long-distance link. ``cut``/``restore``/``close`` work as on
``TcpProxy``.
"""

from __future__ import annotations

import contextlib
import queue
import socket
import threading
import time

from harness.tcp_proxy import TcpProxy


class LatencyProxy(TcpProxy):
    def __init__(self, upstream: tuple[str, int], delay: float) -> None:
        self.delay = delay  # seconds, each way
        super().__init__(upstream)

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        chunks: queue.Queue[tuple[float, bytes] | None] = queue.Queue()
        sender = threading.Thread(target=self._send_when_due, args=(chunks, src, dst), daemon=True)
        sender.start()
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                chunks.put((time.monotonic() + self.delay, data))
        except OSError:
            pass
        finally:
            chunks.put(None)

    def _send_when_due(self, chunks: queue.Queue[tuple[float, bytes] | None], src: socket.socket,
                       dst: socket.socket) -> None:
        try:
            while True:
                item = chunks.get()
                if item is None:
                    break
                due, data = item
                wait = due - time.monotonic()
                if wait > 0:
                    time.sleep(wait)
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)
                s.close()
            with self._lock:
                self._conns.discard(src)
                self._conns.discard(dst)

"""A loopback TCP proxy that can be cut and restored: a network partition between a client and a server (etcd, a
kube-apiserver, a Consul agent) without touching either. ``latency_proxy.LatencyProxy`` is the slow-link variant."""

from __future__ import annotations

import contextlib
import socket
import threading


class TcpProxy:
    """A loopback TCP proxy to one upstream that can be cut (all connections dropped, new ones
    refused by an immediate close) and restored: a network partition between client and etcd."""

    def __init__(self, upstream: tuple[str, int]) -> None:
        self.upstream = upstream
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind(("127.0.0.1", 0))
        self._sock.listen(64)
        self._sock.settimeout(0.2)
        self.port = self._sock.getsockname()[1]
        self.endpoint = f"127.0.0.1:{self.port}"
        self._up = True
        self._closed = False
        self._conns: set[socket.socket] = set()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._accept_loop, name="test-tcp-proxy", daemon=True)
        self._thread.start()

    def _accept_loop(self) -> None:
        while not self._closed:
            try:
                client, _ = self._sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            if not self._up:
                client.close()
                continue
            try:
                upstream = socket.create_connection(self.upstream, timeout=2)
            except OSError:
                client.close()
                continue
            upstream.settimeout(None)
            client.settimeout(None)
            with self._lock:
                self._conns.update((client, upstream))
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
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

    def cut(self) -> None:
        """Drop every connection and refuse new ones until ``restore()``."""
        self._up = False
        with self._lock:
            conns = list(self._conns)
        for s in conns:
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)

    def restore(self) -> None:
        self._up = True

    def close(self) -> None:
        self._closed = True
        self.cut()
        self._sock.close()
        self._thread.join(2)

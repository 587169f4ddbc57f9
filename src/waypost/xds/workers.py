"""``waypost xds serve --workers N``: N control-plane processes sharing one listening port.

One Python process serves ADS on one core (its event loop does every accept, push and ACK). With
``--workers N`` the command becomes a supervisor of N worker processes, each a whole control plane: it follows
the registry itself and serves the streams the kernel hands it. They share the port with ``SO_REUSEPORT``
(Linux spreads new connections over the listening sockets), and since versions are hashes of content
(``snapshot.py``) every worker sends the same version for the same resources: a client that reconnects to
another worker sees no change.

- The supervisor holds the port with a socket bound with ``SO_REUSEPORT`` but not listening (the kernel gives
  connections only to listening sockets), so ``--listen :0`` picks one port for all and a worker that restarts
  finds it free.
- A worker is the same command line run again (``sys.argv``) with ``WAYPOST_XDS_WORKER`` = its index and
  ``WAYPOST_XDS_WORKER_LISTEN`` = the address to bind; it prints ``xds: serving on`` as a lone control plane
  does, and the supervisor prints its own once every worker does.
- A worker that exits while the supervisor runs is started again (after 1 s, doubling to 30 s while it keeps
  failing); SIGTERM or Ctrl-C reach every worker, and the supervisor exits once they have; SIGHUP to the
  supervisor is passed on to every worker (each re-reads ``--config``).
- ``--metrics-port P``: worker i serves its metrics on 127.0.0.1:P+i. ``waypost xds status`` and the console
  reach the worker whose connection they get: each worker knows its own streams.
"""

from __future__ import annotations

import logging
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Sequence

from ..netutil import join_host_port, split_host_port

log = logging.getLogger("waypost.xds")

WORKER_ENV = "WAYPOST_XDS_WORKER"
LISTEN_ENV = "WAYPOST_XDS_WORKER_LISTEN"
#: how long a worker may take to print "xds: serving on" (it starts every source first)
START_TIMEOUT = 120.0
RESTART_FIRST, RESTART_MAX = 1.0, 30.0


def worker_index() -> int | None:
    """This process's worker index when it is a worker of ``--workers``, else None."""
    value = os.environ.get(WORKER_ENV)
    return int(value) if value is not None and value.isdigit() else None


def worker_listen() -> str | None:
    return os.environ.get(LISTEN_ENV) if worker_index() is not None else None


def hold_port(address: str) -> tuple[socket.socket, int]:
    """A socket bound to ``address`` with SO_REUSEPORT and not listening: the port for the workers (port 0:
    a free one). Raises OSError naming the cause when the address cannot be bound."""
    host, port = split_host_port(address, listen=True)
    infos = socket.getaddrinfo(host or None, port or 0, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    family, kind, proto, _, sockaddr = infos[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind(sockaddr)
    except OSError:
        sock.close()
        raise
    return sock, sock.getsockname()[1]


class Worker:
    def __init__(self, index: int, argv: Sequence[str], listen: str) -> None:
        self.index, self.argv, self.listen = index, list(argv), listen
        self.proc: subprocess.Popen[str] | None = None
        self.serving = threading.Event()
        self.failures = 0

    def start(self) -> None:
        env = {**os.environ, WORKER_ENV: str(self.index), LISTEN_ENV: self.listen}
        self.serving.clear()
        self.proc = subprocess.Popen(self.argv, env=env, stdout=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True)
        threading.Thread(target=self._read, args=(self.proc,), name=f"xds-worker-{self.index}", daemon=True).start()

    def _read(self, proc: subprocess.Popen[str]) -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            if line.startswith("xds: serving on"):
                self.serving.set()
                continue  # the supervisor prints the one line users wait for
            sys.stdout.write(line)
            sys.stdout.flush()


class Workers:
    """The supervisor (module docstring): ``start()`` returns once every worker serves; ``run(stop)`` keeps
    them up until ``stop`` is set, then ends them."""

    def __init__(self, count: int, argv: Sequence[str], address: str, grace: float = 10.0) -> None:
        if count < 2:
            raise ValueError("workers: at least 2 (1 is the plain command)")
        self.count, self.grace = count, grace
        self.sock, port = hold_port(address)
        host, _ = split_host_port(address, listen=True)
        self.address = join_host_port(host or "0.0.0.0", port)
        self.workers = [Worker(i, argv, self.address) for i in range(count)]

    def start(self) -> None:
        for w in self.workers:
            w.start()
        deadline = time.monotonic() + START_TIMEOUT
        for w in self.workers:
            while not w.serving.wait(0.2):
                assert w.proc is not None
                if w.proc.poll() is not None:
                    self.stop()
                    raise RuntimeError(f"xds worker {w.index} exited with {w.proc.returncode} before serving "
                                       "(its error is above)")
                if time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError(f"xds worker {w.index} did not serve within {START_TIMEOUT:.0f} s")

    def run(self, stop: threading.Event) -> int:
        """Keep the workers up until ``stop`` is set; returns ``stop()``'s exit code."""
        restart_at: dict[int, float] = {}
        while not stop.wait(0.5):
            for w in self.workers:
                assert w.proc is not None
                code = w.proc.poll()
                if code is None:
                    if w.serving.is_set():
                        w.failures = 0
                    continue
                now = time.monotonic()
                if w.index not in restart_at:
                    delay = min(RESTART_FIRST * 2 ** w.failures, RESTART_MAX)
                    w.failures += 1
                    restart_at[w.index] = now + delay
                    log.error("xds: worker %d exited with %s; starting it again in %.0f s", w.index, code, delay)
                elif now >= restart_at[w.index]:
                    del restart_at[w.index]
                    w.start()
        return self.stop()

    def forward(self, signum: int) -> None:
        """Send ``signum`` to every running worker (SIGHUP: each re-reads its config file)."""
        for w in self.workers:
            if w.proc is not None and w.proc.poll() is None:
                w.proc.send_signal(signum)

    def stop(self) -> int:
        """End every worker (SIGTERM, then SIGKILL past the grace); returns the first non-zero exit code."""
        for w in self.workers:
            if w.proc is not None and w.proc.poll() is None:
                w.proc.terminate()
        deadline = time.monotonic() + self.grace
        worst = 0
        for w in self.workers:
            if w.proc is None:
                continue
            try:
                code = w.proc.wait(max(deadline - time.monotonic(), 0.1))
            except subprocess.TimeoutExpired:
                w.proc.kill()
                code = w.proc.wait(5)
            worst = worst or code
        self.sock.close()
        return worst

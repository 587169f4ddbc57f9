"""A 3-member etcd cluster whose members can be cut off from each other without a firewall.

etcd members talk to each other over HTTP/1.1 (rafthttp): long-lived stream GETs
(``/raft/stream/msgappv2/<id>``, ``/raft/stream/message/<id>``), pipeline POSTs (``/raft``) and a few
housekeeping requests. Every raft request carries ``X-Server-From: <sender id in hex>``. Each member here
advertises the port of a relay (``PeerRelay``) instead of its own peer port; the relay reads the headers of
the first request of each connection, learns the sender and forwards the connection to the member, unless
the sender is cut off. ``isolate(i)`` then:

- makes member i's own relay refuse every connection (what the others send it), and
- makes the others' relays refuse connections whose sender is member i,

and closes the connections already open that these rules cover, so streams end too. ``heal()`` lifts it.
A connection whose first request has no ``X-Server-From`` (housekeeping: version probes, lease
forwarding to a leader) is let through between the connected members only.

Loopback only; one asyncio loop in a daemon thread serves every relay; every wait is bounded.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
import threading
import time
from collections.abc import Callable
from typing import Any

from waypost.etcd.local import LocalEtcd, find_binary

#: how long a relay waits for the headers of a connection's first request
HEADER_TIMEOUT = 5.0
HEADER_LIMIT = 64 * 1024


class PeerRelay:
    """Forwards the peer connections to one member; refuses those ``blocked(sender)`` says to."""

    def __init__(self, upstream: Callable[[], tuple[str, int]], blocked: Callable[[str | None], bool]) -> None:
        self._upstream = upstream
        self._blocked = blocked
        self.port = 0
        self._server: asyncio.AbstractServer | None = None
        #: open connections: (sender or None, client writer, upstream writer)
        self._conns: set[tuple[str | None, asyncio.StreamWriter, asyncio.StreamWriter]] = set()
        self.refused = 0

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), HEADER_TIMEOUT)
        except (asyncio.TimeoutError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, OSError):
            writer.close()
            return
        sender = None
        for line in head.split(b"\r\n")[1:]:
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"x-server-from":
                sender = value.strip().decode("ascii", "replace")
                break
        if self._blocked(sender):
            self.refused += 1
            writer.close()
            return
        try:
            up_reader, up_writer = await asyncio.wait_for(asyncio.open_connection(*self._upstream()), 2.0)
        except (asyncio.TimeoutError, OSError):
            writer.close()
            return
        entry = (sender, writer, up_writer)
        self._conns.add(entry)
        up_writer.write(head)
        try:
            await asyncio.gather(self._pump(reader, up_writer), self._pump(up_reader, writer))
        finally:
            self._conns.discard(entry)
            for w in (writer, up_writer):
                w.close()

    @staticmethod
    async def _pump(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
        try:
            while data := await src.read(65536):
                dst.write(data)
                await dst.drain()
        except (OSError, asyncio.IncompleteReadError):
            pass
        finally:
            with contextlib.suppress(OSError, RuntimeError):
                dst.close()

    def cut_blocked(self) -> int:
        """Close the open connections the rules now refuse; how many."""
        n = 0
        for sender, w, up in list(self._conns):
            if self._blocked(sender):
                n += 1
                for x in (w, up):
                    transport = x.transport
                    transport.abort()  # RST: no orderly end for a stream that must look cut
        return n

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for _, w, up in list(self._conns):
            w.transport.abort()
            up.transport.abort()


class PartitionCluster:
    """A ``LocalEtcd`` of ``members`` members (3 by default) behind ``PeerRelay``\\ s; see the module docstring.

    Use as a context manager (starts the cluster, closes everything), or ``start()`` / ``close()``.
    """

    def __init__(self, members: int = 3, base_dir: str | os.PathLike[str] | None = None) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="etcd-peer-relays", daemon=True)
        self._thread.start()
        self.isolated: int | None = None
        self.ids: list[str] = []  # member ids in hex, as X-Server-From carries them
        self.relays = [PeerRelay(self._upstream_of(i), self._rule_for(i)) for i in range(members)]
        for r in self.relays:
            self._run(r.start())
        self.etcd = LocalEtcd(members, base_dir=base_dir, advertise_peer_ports=[r.port for r in self.relays])

    def _run(self, coro: Any, timeout: float = 10.0) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout)

    def _upstream_of(self, i: int) -> Callable[[], tuple[str, int]]:
        return lambda: ("127.0.0.1", self.etcd.members[i].peer_port)

    def _rule_for(self, i: int) -> Callable[[str | None], bool]:
        def blocked(sender: str | None) -> bool:
            iso = self.isolated
            if iso is None:
                return False
            if i == iso:
                return True  # everything the others send to the isolated member
            return sender is not None and sender == self.ids[iso]  # what the isolated member sends
        return blocked

    # -- lifecycle -------------------------------------------------------------------------------

    def start(self) -> PartitionCluster:
        self.etcd.start()
        self.ids = [format(int(member_status(m.endpoint)["header"]["member_id"]), "x") for m in self.etcd.members]
        return self

    def close(self) -> None:
        self.isolated = None
        try:
            self.etcd.close()
        finally:
            for r in self.relays:
                with contextlib.suppress(Exception):
                    self._run(r.close())
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(5)
            if not self._loop.is_running():
                self._loop.close()

    def __enter__(self) -> PartitionCluster:  # noqa: PYI034 - typing.Self needs Python 3.11
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- the partition ---------------------------------------------------------------------------

    @property
    def endpoints(self) -> list[str]:
        return self.etcd.endpoints

    def isolate(self, i: int) -> None:
        """Cut member ``i`` off from the others (both directions), open connections included."""
        self.isolated = i

        async def cut() -> int:
            return sum(r.cut_blocked() for r in self.relays)

        self._run(cut())

    def heal(self) -> None:
        """Connect every member again (the members reconnect by themselves)."""
        self.isolated = None

    def follower(self) -> int:
        """The index of a member that is not the leader now."""
        leader = self.etcd.leader()
        return next(i for i, m in enumerate(self.etcd.members) if m is not leader)

    def wait_leaderless(self, i: int, timeout: float = 10.0) -> float:
        """Wait until member ``i`` reports no leader (Status leader 0); seconds it took. Proof that the cut
        works before anything is measured through it."""
        t0 = time.monotonic()
        deadline = t0 + timeout
        last: Any = None
        while time.monotonic() < deadline:
            try:
                last = member_status(self.etcd.members[i].endpoint, timeout=2.0)
                if int(last.get("leader", 0)) == 0:
                    return time.monotonic() - t0
            except Exception as e:  # noqa: BLE001  # a status that times out: ask again
                last = e
            time.sleep(0.1)
        raise AssertionError(f"member {i} still has a leader {timeout}s after the cut: {last}")

    def wait_leader_elsewhere(self, i: int, timeout: float = 10.0) -> None:
        """Wait until the members other than ``i`` agree on a leader among themselves."""
        deadline = time.monotonic() + timeout
        last: Any = None
        while time.monotonic() < deadline:
            try:
                leaders = {int(member_status(m.endpoint, timeout=2.0).get("leader", 0))
                           for j, m in enumerate(self.etcd.members) if j != i}
                if len(leaders) == 1 and 0 not in leaders and format(leaders.pop(), "x") != self.ids[i]:
                    return
                last = leaders
            except Exception as e:  # noqa: BLE001
                last = e
            time.sleep(0.1)
        raise AssertionError(f"no common leader among the members other than {i} within {timeout}s: {last}")


def etcdctl(endpoint: str, *args: str, timeout: float = 5.0) -> str:
    """etcdctl against one member only (no failover to the others)."""
    cmd = [find_binary("etcdctl"), f"--endpoints=http://{endpoint}", "--dial-timeout=2s",
           f"--command-timeout={max(timeout - 0.5, 0.5):g}s", *args]
    out = subprocess.run(cmd, capture_output=True, timeout=timeout + 5, check=False,
                         env=dict(os.environ, ETCDCTL_API="3"))
    if out.returncode != 0:
        raise RuntimeError(f"etcdctl {' '.join(args)} on {endpoint}: {out.stderr.decode(errors='replace').strip()}")
    return out.stdout.decode()


def member_status(endpoint: str, timeout: float = 5.0) -> dict[str, Any]:
    """One member's own Status (header.member_id, leader, raftTerm...)."""
    data = json.loads(etcdctl(endpoint, "endpoint", "status", "-w", "json", timeout=timeout))
    return data[0]["Status"]  # type: ignore[no-any-return]


def linearizable_read_fails(endpoint: str, timeout: float = 3.0) -> bool:
    """True when a linearizable read through ``endpoint`` alone gets no answer within ``timeout``."""
    try:
        etcdctl(endpoint, "get", "partition-probe", timeout=timeout)
    except (RuntimeError, subprocess.TimeoutExpired):
        return True
    return False

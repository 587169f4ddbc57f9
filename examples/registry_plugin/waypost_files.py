"""A complete registry kind as a plug-in: ``files://``, a registry that is a directory.

A server registers as one JSON file, ``ROOT/SERVICE/HOST_PORT.json`` = ``{"address", "metadata", "expires"}``,
rewritten every ttl/3 s (a heartbeat that moves ``expires`` on) and deleted at stop; a client lists the
directory every ``interval`` and keeps the files that have not expired. A server killed with SIGKILL leaves its
file behind, which clients drop once it expires, as a lease would. Servers and clients on one machine (or on a
shared file system) find each other with no server process at all.

    serve(server, "greeter", registry="files:///var/run/registry")
    channel = waypost.dial("files:///var/run/registry/greeter")          # ?interval=0.5s by default

The package declares the kind as an entry point (its ``pyproject.toml``), so installing it is all it takes::

    [project.entry-points."waypost.registries"]
    files = "waypost_files:KIND"

or, without installing it: ``waypost.register_kind(waypost_files.KIND)``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import random
import time
from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Any
from urllib.parse import unquote

from waypost import InvalidTarget, RegistryKind
from waypost.discovery.outage import Outage
from waypost.discovery.publisher_base import PublisherBase
from waypost.durations import parse_positive_duration
from waypost.resolver.loop_resolver import LoopResolver
from waypost.resolver.target import Target, fail
from waypost.types import Backend

log = logging.getLogger("waypost_files")

#: how often a client lists the directory by default
DEFAULT_INTERVAL = 0.5


def _root(url: str, what: str) -> Path:
    scheme, _, rest = url.partition("://")
    path = unquote(rest.partition("?")[0])
    if scheme.lower() != "files" or not path.startswith("/"):
        raise InvalidTarget(f"invalid files {what} {url!r}: write files:///ABSOLUTE/DIRECTORY")
    return Path(path)


def parse_registry_url(url: str) -> Path:
    """``files:///ROOT``: the directory services register in."""
    return _root(url, "registry URL")


def parse_target(scheme: str, authority: str, path: str, params: dict[str, str], raw: str) -> Target:
    """``files:///ROOT/SERVICE[?interval=SECONDS]``: the service's directory under ROOT."""
    if authority:
        fail(scheme, raw, f"a files target has no host ({authority!r}): write files:///ROOT/SERVICE")
    root, _, service = unquote(path).rstrip("/").rpartition("/")
    if not root or not service:
        fail(scheme, raw, "expected files:///ROOT/SERVICE (an absolute directory, then the service)")
    options = {}
    if "interval" in params:
        try:
            options["interval"] = str(parse_positive_duration(params["interval"]))
        except ValueError as e:
            fail(scheme, raw, f"interval=: {e}")
    return Target(scheme=scheme, endpoints=(), key=service, authority=root, raw=raw,
                  options=MappingProxyType(options))


class FilesPublisher(PublisherBase):
    """One server's registration: its file, kept fresh every ttl/3 s; written again at once if someone deleted it."""

    def __init__(self, url: str, key: str, address: str, ttl: int = 10, id: Any = None,
                 metadata: Mapping[str, Any] | None = None, format: Any = None, *, timeout: float = 5.0,
                 max_unregistered: float | None = None, on_unregistered: Any = None, retry_interval: float = 1.0,
                 **_: Any) -> None:
        if not key or "/" in key:
            raise ValueError(f"files: the service name must be non-empty without '/', got {key!r}")
        self.root = parse_registry_url(url)
        self.base_key, self.value, self.ttl = key, address, ttl
        self.timeout, self.retry_interval = float(timeout), retry_interval
        self.metadata = self._checked_metadata(metadata)
        self.outage = Outage(self, max_unregistered, on_unregistered)
        name = str(id) if id is not None else address.replace(":", "_")
        self.path = self.root / key / f"{name}.json"
        self._rng = random.Random()
        self._beat: asyncio.Task[None] | None = None

    @property
    def key(self) -> str | None:
        return str(self.path) if self._registered else None

    def __repr__(self) -> str:
        return f"<FilesPublisher {self.base_key!r}={self.value!r} in {self.root} {self._state}>"

    def _where(self) -> str:
        return f"files:///{str(self.root).lstrip('/')}"

    def _write(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        body = {"address": self.value, "metadata": self.metadata or {}, "expires": time.time() + self.ttl}
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}")
        tmp.write_text(json.dumps(body))
        os.replace(tmp, self.path)  # readers see the old file or the new one, never half of one

    async def _register(self) -> None:
        self._write()
        self._registered = True
        self.outage.end()
        if self._beat is None or self._beat.done():
            self._beat = asyncio.get_running_loop().create_task(self._heartbeat())

    async def _heartbeat(self) -> None:
        while self._state == "running" and self._registered:
            await asyncio.sleep(self.ttl / 3)
            if self._state != "running":
                return
            if not self.path.exists():  # deleted behind our back: register again at once
                log.warning("%r: the registration file went away; writing it again", self)
                self._recover_later(None)
                return
            self._write()

    async def _withdraw(self) -> None:
        self._registered = False
        if self._beat is not None:
            self._beat.cancel()
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()

    async def _update_metadata(self, metadata: Any) -> None:
        self.metadata = metadata
        if self._registered:
            self._write()


class FilesResolver(LoopResolver[None]):
    """A client's view: the service's unexpired files, read every ``interval`` s."""

    kind = "files"
    noun = "instances"
    list_name = "instance list"
    log = log

    def __init__(self, target: Target, options: Any = None, *, timeout: float = 5.0, **kw: Any) -> None:
        super().__init__(target, options, **kw)
        self.dir = Path(target.authority) / (target.key or "")
        self.interval = float(target.options.get("interval", DEFAULT_INTERVAL))
        self.timeout = timeout
        self._bad: set[str] = set()

    @contextlib.asynccontextmanager
    async def _session(self) -> AsyncIterator[None]:
        yield None

    def _read(self) -> tuple[Backend, ...]:
        now, found = time.time(), {}
        for path in sorted(self.dir.glob("*.json")) if self.dir.is_dir() else ():
            try:
                body = json.loads(path.read_text())
                if body["expires"] > now:
                    found[body["address"]] = Backend(body["address"], MappingProxyType(dict(body["metadata"])))
            except FileNotFoundError:
                continue  # deleted between the listing and the read
            except (ValueError, KeyError, TypeError) as e:
                if path.name not in self._bad:  # a bad file: logged once, skipped
                    self._bad.add(path.name)
                    log.warning("files: skipping %s: %s", path, e)
        return tuple(found.values())

    async def _follow(self, session: None) -> None:
        self._push(await asyncio.to_thread(self._read))
        await asyncio.sleep(self.interval)

    def _what(self) -> str:
        return f"service {self.target.key!r} in {self.dir.parent}"

    def _describe(self, e: Exception) -> str:
        return f"files: reading {self._what()} failed: {e}"

    def _first_list_within(self) -> float:
        return self.timeout


KIND = RegistryKind(
    scheme="files",
    default_port=None,
    target_example="files:///var/run/registry/greeter",
    url_example="files:///var/run/registry",
    parse_url=parse_registry_url,
    parse_target=parse_target,
    target_params=("interval",),
    publisher=FilesPublisher,
    resolver=FilesResolver,
    title="files",
)

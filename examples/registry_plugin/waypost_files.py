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
import json
import logging
import os
import time
from collections.abc import Sequence
from pathlib import Path
from types import MappingProxyType
from urllib.parse import unquote

from waypost.kinds import (
    Backend,
    Instance,
    InstanceGone,
    InvalidTarget,
    PollingDiscovery,
    Registrar,
    RegistryKind,
    Target,
    Words,
    parse_positive_duration,
)

log = logging.getLogger("waypost_files")

#: how often a client lists the directory by default
DEFAULT_INTERVAL = 0.5


def parse_registry_url(url: str) -> Path:
    """``files:///ROOT``: the directory services register in."""
    scheme, _, rest = url.partition("://")
    path = unquote(rest.partition("?")[0])
    if scheme.lower() != "files" or not path.startswith("/"):
        raise InvalidTarget(f"invalid files registry URL {url!r}: write files:///ABSOLUTE/DIRECTORY")
    return Path(path)


def parse_target(scheme: str, authority: str, path: str, params: dict[str, str], raw: str) -> Target:
    """``files:///ROOT/SERVICE[?interval=SECONDS]``: the service's directory under ROOT."""
    bad = f"invalid files target {raw!r}: "
    if authority:
        raise InvalidTarget(bad + f"a files target has no host ({authority!r}): write files:///ROOT/SERVICE")
    root, _, service = unquote(path).rstrip("/").rpartition("/")
    if not root or not service:
        raise InvalidTarget(bad + "expected files:///ROOT/SERVICE (an absolute directory, then the service)")
    options = {}
    if "interval" in params:
        try:
            options["interval"] = str(parse_positive_duration(params["interval"]))
        except ValueError as e:
            raise InvalidTarget(bad + f"interval=: {e}") from None
    return Target(scheme=scheme, endpoints=(), key=service, authority=root, raw=raw,
                  options=MappingProxyType(options))


class FilesRegistrar(Registrar):
    """One server's file, written at registration and at every renewal (moving ``expires`` on), deleted at stop."""

    def __init__(self, root: Path, timeout: float) -> None:
        self.root = root

    def _path(self, instance: Instance) -> Path:
        if not instance.service or "/" in instance.service:
            raise ValueError(f"files: the service name must be non-empty without '/', got {instance.service!r}")
        return self.root / instance.service / f"{instance.id}.json"

    async def register(self, instance: Instance) -> None:
        path = self._path(instance)
        path.parent.mkdir(parents=True, exist_ok=True)
        body = {"address": instance.address, "metadata": dict(instance.metadata),
                "expires": time.time() + instance.ttl}
        tmp = path.with_name(f".{path.name}.{os.getpid()}")
        tmp.write_text(json.dumps(body))
        os.replace(tmp, path)  # readers see the old file or the new one, never half of one

    async def renew(self, instance: Instance) -> None:
        if not self._path(instance).exists():  # deleted behind our back: waypost registers it again at once
            raise InstanceGone(f"{self._path(instance)} went away")
        await self.register(instance)

    async def deregister(self, instance: Instance) -> None:
        self._path(instance).unlink(missing_ok=True)


class FilesDiscovery(PollingDiscovery):
    """A client's view: the service's unexpired files, read every ``interval`` s."""

    def __init__(self, target: Target) -> None:
        self.root = Path(target.authority)
        self.interval = float(target.options.get("interval", DEFAULT_INTERVAL))
        self._bad: set[Path] = set()

    async def instances(self, service: str) -> Sequence[Backend]:
        return await asyncio.to_thread(self._read, self.root / service)

    def _read(self, directory: Path) -> Sequence[Backend]:
        if self.root.exists() and not self.root.is_dir():
            raise NotADirectoryError(f"the registry {self.root} is not a directory")
        now, found = time.time(), {}
        for path in sorted(directory.glob("*.json")) if directory.is_dir() else ():
            try:
                body = json.loads(path.read_text())
                if body["expires"] > now:
                    found[body["address"]] = Backend(body["address"], MappingProxyType(dict(body["metadata"])))
            except FileNotFoundError:
                continue  # deleted between the listing and the read
            except (ValueError, KeyError, TypeError) as e:
                if path not in self._bad:  # a bad file: logged once, skipped
                    self._bad.add(path)
                    log.warning("files: skipping %s: %s", path, e)
        return tuple(found.values())


KIND = RegistryKind(
    scheme="files",
    default_port=None,
    target_example="files:///var/run/registry/greeter",
    url_example="files:///var/run/registry",
    parse_url=parse_registry_url,
    parse_target=parse_target,
    target_params=("interval",),
    registrar=FilesRegistrar,
    discovery=FilesDiscovery,
    words=Words(renewal="a file rewrite", id_format="{host}_{port}"),
)

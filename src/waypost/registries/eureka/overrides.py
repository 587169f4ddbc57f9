"""``waypost drain|weight|undrain`` and the console's buttons on an Eureka registry, written to Eureka itself (the
record key names the app and the address: every instance of the app there is acted on). ``written`` says what.

- drain (weight 0): Eureka's status override ``OUT_OF_SERVICE`` (``PUT /apps/APP/ID/status``): out of every
  client's list (waypost's and Spring's) at their next fetch, across re-registrations, until it is removed;
- another weight: ``PUT /apps/APP/ID/metadata?weight=N`` (the status override removed), merged by Eureka until the
  instance registers again with its own;
- undo: the status override removed and the instance's own weight put back (kept in ``waypost.weight.own`` when
  first changed; ``-``: none). Eureka cannot remove a metadata key: an empty value means removed.
"""

from __future__ import annotations

import json
import logging
import time

from ...discovery.store import DeleteResult, KeyValue, PutResult
from ...kinds import parse_override, split_override_key
from .api import EurekaClient
from .apps import Instance, MalformedAnswer, as_list
from .config import app_name, parse_registry_url

log = logging.getLogger("waypost.console")

#: the metadata key keeping an instance's own weight while another weight is in force
OWN_WEIGHT_KEY = "waypost.weight.own"
DRAINED = "OUT_OF_SERVICE"


def drained(inst: Instance) -> bool:
    """Whether an operator's status override holds ``inst`` OUT_OF_SERVICE."""
    return str(inst.raw.get("overriddenStatus", "")).upper() == DRAINED


class EurekaOverrideStore:
    """``waypost drain|weight|undrain`` on an Eureka registry URL, and the console's writes (see the module
    docstring; on the control loop, where its ``client`` is used: the console reads with it too)."""

    def __init__(self, url: str, timeout: float = 5.0) -> None:
        config = parse_registry_url(url)
        self.url = config.url
        self.client = EurekaClient(config, timeout=timeout)  # no connection until used
        #: what the last put or delete did, in words (``waypost drain`` prints it: no override record is written)
        self.written = ""

    async def _instances(self, record_key: str) -> tuple[str, list[Instance]]:
        parts = split_override_key(record_key)
        if parts is None:
            raise ValueError(f"not an override record: {record_key!r}")
        return await self._instances_at(*parts)

    async def _instances_at(self, key: str, address: str) -> tuple[str, list[Instance]]:
        """The app of service ``key`` and its instances at ``address`` (whatever their status)."""
        app = app_name(key)
        body = await self.client.app(app)
        doc = body.get("application") if isinstance(body, dict) else None
        if body is not None and not isinstance(doc, dict):
            raise MalformedAnswer(f"malformed answer from eureka at {self.url}: reading {app}: {str(body)[:160]!r}")
        instances = (Instance.from_json(raw, app) for raw in as_list(doc.get("instance") if doc else None))
        return app, [inst for inst in instances if inst.address == address]

    @staticmethod
    def _record(inst: Instance) -> KeyValue | None:
        """What is in force on ``inst`` now, as an override record (None: nothing)."""
        if drained(inst):
            return KeyValue("", json.dumps({"weight": 0, "by": "eureka status override"}).encode())
        if _own_weight(inst) is not None and isinstance(inst.metadata.get("weight"), int):
            return KeyValue("", json.dumps({"weight": inst.metadata["weight"], "by": "eureka metadata"}).encode())
        return None

    async def put(self, key: str, value: bytes, *, prev_kv: bool = False) -> PutResult:
        override = parse_override(value)
        if override is None:
            raise ValueError(f"not an override: {value[:200]!r}")
        app, found = await self._instances(key)
        if not found:
            raise LookupError(f"eureka at {self.url}: no instance of {app} at {split_override_key(key)}: nothing to "
                              "drain (Eureka's overrides apply to registered instances only)")
        prev = self._record(found[0])
        for inst in found:
            if override["weight"] == 0:
                await self.client.set_status(app, inst.id, DRAINED)
                continue
            meta = {"weight": str(override["weight"])}
            if _own_weight(inst) is None:
                meta[OWN_WEIGHT_KEY] = _raw_meta(inst, "weight") or "-"
            await self.client.update_metadata(app, inst.id, meta)
            if drained(inst):
                await self.client.clear_status(app, inst.id)
        log.info("eureka: %s %s at %s", "drained" if override["weight"] == 0 else f"weight {override['weight']} for",
                 app, [i.id for i in found])
        ids = ", ".join(f"{app}/{i.id}" for i in found)
        self.written = (f"Eureka's status override of {ids} set to {DRAINED}: clients drop it at their next fetch"
                        if override["weight"] == 0 else
                        f"metadata weight={override['weight']} of {ids} in Eureka: clients see it at their next fetch")
        return PutResult(int(time.time()), prev if prev_kv else None)

    async def delete(self, key: str, *, prev_kv: bool = False) -> DeleteResult:
        app, found = await self._instances(key)
        prev = self._record(found[0]) if found else None
        done = []
        for inst in found:
            if drained(inst):
                await self.client.clear_status(app, inst.id)
                done.append(f"Eureka's status override of {app}/{inst.id} removed")
            own = _own_weight(inst)
            if own is not None:
                await self.client.update_metadata(app, inst.id,
                                                  {"weight": "" if own == "-" else own, OWN_WEIGHT_KEY: ""})
                done.append(f"its own weight ({'none' if own == '-' else own}) back in the metadata of {app}/{inst.id}")
        self.written = "; ".join(done) or f"nothing to undo on {app} in Eureka (no status override, no weight set)"
        return DeleteResult(0, int(prev is not None), [prev] if prev is not None and prev_kv else [])

    async def registered(self, key: str, address: str) -> bool:
        """Whether ``address`` is an instance of app ``key`` in Eureka now (whatever its status)."""
        return bool((await self._instances_at(key, address))[1])

    async def close(self) -> None:
        await self.client.close()


def _raw_meta(inst: Instance, key: str) -> str:
    meta = inst.raw.get("metadata")
    value = meta.get(key) if isinstance(meta, dict) else None
    return value if isinstance(value, str) else ""


def _own_weight(inst: Instance) -> str | None:
    """The weight text the console kept before it set one (``-``: none), or None when it set none."""
    return _raw_meta(inst, OWN_WEIGHT_KEY) or None

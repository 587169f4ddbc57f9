"""The ORCA messages, from the optional ``xds-protos`` package (``pip install waypost[xds]``).

``protos()`` returns ``(orca_load_report_pb2, orca_pb2)`` or None when the package is missing; the first
miss is logged once (INFO on a server: it then serves waypost's own load reports only; a client balancing on
ORCA treats every backend as reporting nothing, so it spreads calls evenly).
"""

from __future__ import annotations

import logging
import threading
from types import ModuleType

log = logging.getLogger("waypost.orca")

_lock = threading.Lock()
_loaded: tuple[ModuleType, ModuleType] | None = None
_missing = False


def protos() -> tuple[ModuleType, ModuleType] | None:
    """``(xds.data.orca.v3.orca_load_report_pb2, xds.service.orca.v3.orca_pb2)``, or None without xds-protos."""
    global _loaded, _missing
    if _loaded is not None:
        return _loaded
    if _missing:
        return None
    with _lock:
        if _loaded is None and not _missing:
            try:
                from xds.data.orca.v3 import orca_load_report_pb2
                from xds.service.orca.v3 import orca_pb2
            except ImportError as e:
                _missing = True
                log.info("ORCA load reports are off: the xds-protos package is not installed (%s); "
                         "install waypost[xds] for ORCA trailers, the OpenRcaService and weighted_round_robin "
                         "weights", e)
                return None
            _loaded = (orca_load_report_pb2, orca_pb2)
    return _loaded


def available() -> bool:
    """True when the ORCA messages can be built and read (xds-protos is installed)."""
    return protos() is not None

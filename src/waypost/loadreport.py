"""Deprecated: waypost's own load reports (``waypost.load.v1``) live in ``waypost.orca``.

This module keeps the names it had, as aliases of their home there: ``mount`` is
``waypost.orca.mount_waypost_report``, ``pb`` is ``waypost.orca.waypost_load_pb``, ``SERVICE`` is
``waypost.orca.waypost_report.SERVICE``; the others have the same names in ``waypost.orca``.
"""

from __future__ import annotations

import warnings

from .orca import (
    REPORT_METHOD,
    AsyncLoadInterceptor,
    LoadAccount,
    LoadInterceptor,
    LoadSnapshot,
    Reporter,
    load_interceptor,
    report_stub,
    set_load,
)
from .orca import mount_waypost_report as mount
from .orca import waypost_load_pb as pb
from .orca.waypost_report import SERVICE

warnings.warn("waypost.loadreport is deprecated: import its names from waypost.orca", DeprecationWarning,
              stacklevel=2)

__all__ = [
    "REPORT_METHOD",
    "SERVICE",
    "AsyncLoadInterceptor",
    "LoadAccount",
    "LoadInterceptor",
    "LoadSnapshot",
    "Reporter",
    "load_interceptor",
    "mount",
    "pb",
    "report_stub",
    "set_load",
]

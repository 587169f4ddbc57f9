"""``waypost demo``: a local etcd, 4 backends (one slow), every policy side by side, then a backend killed
and a new one added under load. See ``run_demo``."""

from __future__ import annotations

from .runner import DemoSettings, run_demo

__all__ = ["DemoSettings", "run_demo"]

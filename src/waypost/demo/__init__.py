"""``waypost demo``: a local etcd, 4 backends (one slow), seven policies side by side (the others named with
why they are left out), then a backend killed
and a new one added under load. See ``run_demo``."""

from __future__ import annotations

from .runner import DemoSettings, run_demo

__all__ = ["DemoSettings", "run_demo"]

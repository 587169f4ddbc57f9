"""Reloading a control plane's config file without a restart (``waypost xds serve --config FILE``).

A ``ConfigReloader`` thread reads the file again when it changes (its mtime, size and inode, polled every
``interval`` seconds: a stat, nothing more) and when asked (``request()``: the CLI's SIGHUP handler), then hands the
exports to ``apply`` (``ControlPlane.replace_exports``: only what changed is rebuilt, and equal definitions push
nothing). A file that does not load (a syntax error, a bad option, the file missing for a moment while an editor
replaces it) keeps the last good config: one ERROR line names the error, once per change of the file.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Generic, TypeVar

log = logging.getLogger("waypost.xds")


def _signature(path: Path) -> tuple[int, int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_mtime_ns, st.st_size, st.st_ino


_C = TypeVar("_C")


class ConfigReloader(Generic[_C]):
    """Calls ``apply(load())`` when ``path`` changes or ``request()`` is called (module docstring). ``load``
    raises on a bad file (its message is logged; ``apply`` is not called)."""

    def __init__(self, path: Path, load: Callable[[], _C], apply: Callable[[_C], None], *,
                 interval: float = 1.0) -> None:
        self.path, self.load, self.apply, self.interval = path, load, apply, interval
        self.reloads = 0  # reloads applied
        self._seen = _signature(path)
        self._wake = threading.Event()
        self._asked = False
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="xds-config-reload", daemon=True)
        self._thread.start()

    def request(self) -> None:
        """Reload now, changed or not (safe from a signal handler: it only sets an event)."""
        self._asked = True
        self._wake.set()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(10)

    def _run(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(self.interval)
            self._wake.clear()
            if self._stop.is_set():
                return
            self.check()

    def check(self) -> bool:
        """One look: reload if the file changed or a reload was asked for; True when a new config was applied."""
        now = _signature(self.path)
        asked, self._asked = self._asked, False
        if now == self._seen and not asked:
            return False
        self._seen = now
        why = "SIGHUP" if asked else "the file changed"
        try:
            loaded = self.load()
        except Exception as e:  # noqa: BLE001 -- any failure to load keeps the last good config
            log.error("xds: config not reloaded (%s): %s; the last good one stays", why, e)  # e names the file
            return False
        try:
            self.apply(loaded)
        except Exception as e:  # noqa: BLE001 -- e.g. an export given twice across --export and the file
            log.error("xds: config %s not reloaded (%s): %s; the last good one stays", self.path, why, e)
            return False
        self.reloads += 1
        log.info("xds: config %s reloaded (%s)", self.path, why)
        return True

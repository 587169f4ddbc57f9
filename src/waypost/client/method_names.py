"""Warnings for ``methodConfig`` names that match no method used on the channel (a silent service-config trap:
``{"service": "Greeter"}`` without its package applies to nothing, and gRPC says nothing either).

Checked when the channel makes a multicallable for a method it has not seen (a stub makes one per method of
its service when it is built), never per call:

- at each new method: a name that does not match it but whose service is the method's service without its
  package (or differs only in case), e.g. ``Greeter`` for ``/pkg.Greeter/SayHello``, or whose method differs only in case,
  gets "did you mean 'pkg.Greeter'?";
- once ``CHECK_AFTER`` distinct methods have been seen: every name that matched none of them.

Each name is reported once per channel, as a ``waypost.ConfigWarning`` (``warnings``: a mistake in the
program's configuration, shown once per place by default) attributed to the code that built the stub.
"""

from __future__ import annotations

import threading

from ..errors import warn_config
from ..service_config import ServiceConfig

#: distinct methods after which names that matched none of them are reported
CHECK_AFTER = 16


def _split(full_method: str) -> tuple[str, str]:
    service, _, method = full_method.lstrip("/").partition("/")
    return service, method


class MethodNameCheck:
    """One channel's check of its service config's ``methodConfig`` names against the methods it uses."""

    def __init__(self, target: str, names: tuple[tuple[str, str, str], ...]) -> None:
        self.target = target
        # names that can miss: the default entry ({}) matches everything
        self._unmatched = {(s, m): path for s, m, path in names if s}
        self._seen: set[str] = set()
        self._lock = threading.Lock()
        self._checked_all = False

    @classmethod
    def for_config(cls, target: str, sc: ServiceConfig) -> MethodNameCheck | None:
        """None when the config names no service (nothing to check)."""
        if not any(s for s, _m, _p in sc.names):
            return None
        return cls(target, sc.names)

    def saw(self, full_method: str) -> None:
        """The channel made a multicallable for ``full_method`` (cheap when it was seen before)."""
        if full_method in self._seen or not self._unmatched:
            return
        with self._lock:
            if full_method in self._seen:
                return
            self._seen.add(full_method)
            service, method = _split(full_method)
            hints = []
            for key in list(self._unmatched):
                s, m = key
                if s == service and (not m or m == method):
                    del self._unmatched[key]  # it matches a method in use
                    continue
                hint = self._hint(s, m, service, method)
                if hint:
                    hints.append((self._unmatched.pop(key), s, m, hint))
            due = not self._checked_all and len(self._seen) >= CHECK_AFTER
            if due:
                self._checked_all = True
                left, self._unmatched = dict(self._unmatched), {}
        for path, s, m, hint in hints:
            warn_config(f"waypost: {self.target}: service config {path} {_name(s, m)!r} matches no method called "
                        f"on this channel; did you mean {hint!r}?")
        if due:
            for (s, m), path in left.items():
                warn_config(f"waypost: {self.target}: service config {path} {_name(s, m)!r} matches none of the "
                            f"{CHECK_AFTER} methods called on this channel so far (names are 'package.Service' and "
                            "'Method', as in the .proto)")

    @staticmethod
    def _hint(s: str, m: str, service: str, method: str) -> str:
        """What the name ``(s, m)`` probably meant, given a method in use; "" when it does not look alike."""
        if s != service and (service.endswith("." + s) or s.lower() == service.lower()):
            if not m or m.lower() == method.lower():
                return _name(service, method if m else "")
            return ""
        if s == service and m and m.lower() == method.lower():
            return _name(service, method)
        return ""


def _name(service: str, method: str) -> str:
    return f"{service}/{method}" if method else service

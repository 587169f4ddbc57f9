"""Reading ORCA reports on the client: ``parse_report(data)`` -> ``LoadReport`` or None.

A report is refused (None, with the reason in ``ReportError``'s message when ``parse_report_or_error`` is used)
when its bytes are not an ``OrcaLoadReport``, or a value is NaN, infinite or negative, or ``mem_utilization``
or a named utilization is above 1 (A51 bounds those to [0, 1]). ``cpu_utilization`` and
``application_utilization`` above 1 are valid: ORCA allows a server to use more than its nominal share.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from ._protos import protos


class ReportError(ValueError):
    """Bytes that are not a usable ORCA report (the message says why)."""


@dataclass(frozen=True, slots=True)
class LoadReport:
    """The parts of an ORCA report that client policies use (absent values are 0, as in the proto)."""

    cpu_utilization: float = 0.0
    application_utilization: float = 0.0
    mem_utilization: float = 0.0
    rps_fractional: float = 0.0
    eps: float = 0.0
    utilization: dict[str, float] = field(default_factory=dict)


def _bad(name: str, v: float, upper: float | None) -> bool:
    return not math.isfinite(v) or v < 0 or (upper is not None and v > upper)


def parse_report_or_error(data: bytes) -> LoadReport:
    """``data`` as a LoadReport; ReportError saying what is wrong (LookupError without xds-protos)."""
    loaded = protos()
    if loaded is None:
        raise LookupError("ORCA reports cannot be read without xds-protos (pip install waypost[xds])")
    try:
        msg = loaded[0].OrcaLoadReport.FromString(bytes(data))
    except Exception as e:  # noqa: BLE001  # protobuf's DecodeError, or a type error for odd input
        raise ReportError(f"not an OrcaLoadReport ({type(e).__name__}: {e})") from None
    for name, upper in (("cpu_utilization", None), ("application_utilization", None), ("mem_utilization", 1.0),
                        ("rps_fractional", None), ("eps", None)):
        v = getattr(msg, name)
        if _bad(name, v, upper):
            raise ReportError(f"{name} = {v!r} is out of range")
    named = dict(msg.utilization)
    for k, v in named.items():
        if _bad(k, v, 1.0):
            raise ReportError(f"utilization[{k!r}] = {v!r} is out of range")
    return LoadReport(msg.cpu_utilization, msg.application_utilization, msg.mem_utilization,
                      msg.rps_fractional, msg.eps, named)


def parse_report(data: bytes) -> LoadReport | None:
    """``data`` as a LoadReport, or None when it is not a valid one (see the module doc)."""
    try:
        return parse_report_or_error(data)
    except (ReportError, LookupError):
        return None

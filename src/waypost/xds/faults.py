"""An export's ``fault`` option as gRPC's xDS fault injection (gRFC A33): the HTTPFault filter of the Listener's
HttpConnectionManager (before the router), and a route's own ``fault`` as its ``typed_per_filter_config``.

A percentage is sent as a FractionalPercent: per hundred when it is a whole number, else per million.
"""

from __future__ import annotations

from envoy.extensions.filters.http.fault.v3 import fault_pb2
from envoy.type.v3 import percent_pb2

from .traffic import Fault

#: the filter's name in http_filters; a route's typed_per_filter_config names it too
FAULT_FILTER = "envoy.filters.http.fault"


def _percent(value: float) -> percent_pb2.FractionalPercent:
    if value == int(value):
        return percent_pb2.FractionalPercent(numerator=int(value), denominator=percent_pb2.FractionalPercent.HUNDRED)
    return percent_pb2.FractionalPercent(numerator=round(value * 10_000),
                                         denominator=percent_pb2.FractionalPercent.MILLION)


def http_fault(fault: Fault | None) -> fault_pb2.HTTPFault:
    """The HTTPFault of ``fault`` (None: an empty one, which injects nothing: the filter is there for the routes
    that carry their own)."""
    msg = fault_pb2.HTTPFault()
    if fault is None:
        return msg
    if fault.delay is not None:
        msg.delay.fixed_delay.FromNanoseconds(round(fault.delay * 1e9))
        msg.delay.percentage.CopyFrom(_percent(fault.delay_percent))
    if fault.abort is not None:
        msg.abort.grpc_status = fault.abort
        msg.abort.percentage.CopyFrom(_percent(fault.abort_percent))
    return msg

from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from typing import ClassVar as _ClassVar, Optional as _Optional

DESCRIPTOR: _descriptor.FileDescriptor

class ReportRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class LoadReport(_message.Message):
    __slots__ = ("in_flight", "latency_estimate_seconds", "cpu_utilization", "application_utilization", "calls_completed", "calls_failed")
    IN_FLIGHT_FIELD_NUMBER: _ClassVar[int]
    LATENCY_ESTIMATE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    CPU_UTILIZATION_FIELD_NUMBER: _ClassVar[int]
    APPLICATION_UTILIZATION_FIELD_NUMBER: _ClassVar[int]
    CALLS_COMPLETED_FIELD_NUMBER: _ClassVar[int]
    CALLS_FAILED_FIELD_NUMBER: _ClassVar[int]
    in_flight: int
    latency_estimate_seconds: float
    cpu_utilization: float
    application_utilization: float
    calls_completed: int
    calls_failed: int
    def __init__(self, in_flight: _Optional[int] = ..., latency_estimate_seconds: _Optional[float] = ..., cpu_utilization: _Optional[float] = ..., application_utilization: _Optional[float] = ..., calls_completed: _Optional[int] = ..., calls_failed: _Optional[int] = ...) -> None: ...

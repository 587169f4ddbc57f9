"""Discovery: the Subscriber (client side) over a Registry; the server side's registration is ``waypost.Publisher``
(the etcd kind's, ``waypost.registries.etcd.registrar``).

go-zero's ``core/discov`` semantics, with metadata, never-ending re-registration, and value changes
applied on every path. Wire formats live in ``waypost.registry.formats``.
"""

from __future__ import annotations

from .container import Container
from .registration_contract import Registration
from .subscriber import Subscriber, active_subscriptions

__all__ = ["Container", "Registration", "Subscriber", "active_subscriptions"]

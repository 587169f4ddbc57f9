"""Discovery: Publisher (server side) and Subscriber (client side) over a Registry.

go-zero's ``core/discov`` semantics, with metadata, never-ending re-registration, and value changes
applied on every path. Wire formats live in ``waypost.registry.formats``.
"""

from __future__ import annotations

from .container import Container
from .publisher import Publisher
from .registration_contract import Registration
from .subscriber import Subscriber, active_subscriptions

__all__ = ["Container", "Publisher", "Registration", "Subscriber", "active_subscriptions"]

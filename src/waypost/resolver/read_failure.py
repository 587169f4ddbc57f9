"""A failed read of a resolver's source in words: what its error message says, for the channel and the log."""

from __future__ import annotations

from ..errors import WaypostError


def failure_text(e: BaseException) -> str:
    """``e``'s message (its type when it has none), after its type unless it is one of waypost's errors (their
    messages name what failed; another library's may not: ``ClientConnectorError: ...``)."""
    text = str(e) or type(e).__name__
    if not isinstance(e, WaypostError):
        text = f"{type(e).__name__}: {text}"
    return text

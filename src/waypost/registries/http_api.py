"""The plumbing of a registry's HTTP API client on aiohttp (an optional extra), written once: the install hint when
aiohttp is missing, the per-request timeout, and the session's life.

The session is made on first use, on the running loop (use one client from one loop); ``close()`` closes it and a
later request opens a new one. aiohttp is imported only when a session is made, so the kinds that use it load
without it until one is used; ``require_aiohttp`` makes the missing extra an error where the client is made.
"""

from __future__ import annotations

import abc
import os
from typing import Any, ClassVar


def require_aiohttp(install_hint: str) -> None:
    """Raise ImportError(``install_hint``) when aiohttp is missing (at construction, not on first use)."""
    try:
        import aiohttp  # noqa: F401
    except ImportError as e:
        raise ImportError(install_hint) from e


class HttpApiClient(abc.ABC):
    """A client of one registry's HTTP API; ``timeout`` (seconds, > 0) bounds its requests as the subclass says.
    Subclasses set ``install_hint`` (how to install the extra) and make their session (``_new_session``)."""

    install_hint: ClassVar[str]

    def __init__(self, timeout: float) -> None:
        require_aiohttp(self.install_hint)
        if not timeout > 0:
            raise ValueError(f"timeout must be positive, got {timeout!r}")
        self.timeout = float(timeout)
        self._session: Any = None

    @abc.abstractmethod
    def _new_session(self) -> Any:
        """A new ``aiohttp.ClientSession`` for this API (called on the running loop)."""

    def _get_session(self) -> Any:
        if self._session is None or self._session.closed:
            self._session = self._new_session()
        return self._session

    async def close(self) -> None:
        """Close the HTTP session (its connections); a later request opens a new one."""
        session, self._session = self._session, None
        if session is not None and not session.closed:
            await session.close()


def connect_problem(e: BaseException) -> str | None:
    """Why a connection to a registry's HTTP API failed, in plain words (``connection refused``, ``Name or service
    not known``), from aiohttp's connect error or an ``OSError``; None when ``e`` is no connection failure (an
    answer that came, a timeout)."""
    cause = getattr(e, "os_error", None) or e  # aiohttp's ClientConnectorError wraps the socket's error
    if not isinstance(cause, OSError):
        return None
    if isinstance(cause, ConnectionRefusedError):
        return "connection refused"
    if cause.errno is not None and cause.errno > 0:
        return os.strerror(cause.errno).lower()
    return cause.strerror or str(cause) or type(cause).__name__

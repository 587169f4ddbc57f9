"""The xDS package's own error."""

from __future__ import annotations

from ..errors import WaypostError


class XdsConfigError(WaypostError, ValueError):
    """An export, config file or prefix is malformed; the message names what and where."""

"""Registry URLs of any kind, read by the kind their scheme names (``kind_table.py``): ``parse_registry_url`` for
the keyed kinds ``waypost.connect`` takes, ``parse_any`` for every kind's."""

from __future__ import annotations

from typing import Any

from .. import urlparams
from ..errors import InvalidTarget, did_you_mean
from ..kind_table import RegistryKind, instance_registries, keyed, lookup, scheme_of
from ..redaction import redact_url


def _examples() -> str:
    return " or ".join(k.url_example or k.scheme for k in map(lookup, keyed()) if k is not None)


def _first_example() -> str:
    """The URL shown after a problem: the first keyed kind's."""
    schemes = keyed()
    first = lookup(schemes[0]) if schemes else None
    return (first.url_example or "") if first is not None else ""


def _not_keyed(url: str, scheme: str) -> InvalidTarget:
    """Why ``connect`` does not take a URL of another kind (or of none)."""
    kind = lookup(scheme) if scheme else None
    schemes = keyed()
    example = _first_example()
    if kind is not None and kind.holds_instances:
        return urlparams.url_error(
            url, f"{scheme}:// registries hold service instances, not keys: register with "
                 f"serve(..., registry={redact_url(url)!r})"
                 f", and dial its targets "
                 f"({kind.target_example}); connect() takes {' and '.join(schemes)} URLs", example=example)
    others = instance_registries()
    shown = urlparams.shown_scheme(scheme)
    return urlparams.url_error(
        url, f"unknown scheme {shown!r}{did_you_mean(shown, (*schemes, *others))} (known: {', '.join(schemes)}; "
             f"serve() and the publishers also take {' and '.join(f'{s}://' for s in others)})", example=example)


def keyed_kind(url: str) -> RegistryKind:
    """The keyed kind of a registry URL (``InvalidTarget`` naming the problem for any other)."""
    if not isinstance(url, str) or not url.strip():
        raise InvalidTarget(f"empty registry URL (example: {_examples()})")
    url = url.strip()
    scheme, sep, _ = url.partition("://")
    if not sep:
        raise urlparams.url_error(url, f"missing scheme ({' or '.join(f'{s}://' for s in keyed())})",
                                  example=_first_example())
    kind = lookup(scheme.lower())
    if kind is None or not kind.keyed:
        raise _not_keyed(url, scheme.lower())
    return kind


def parse_registry_url(url: str) -> Any:
    """The settings of a keyed registry URL (its kind's ``parse_url``: they have ``redacted`` and
    ``cache_key()``); raises ``waypost.InvalidTarget`` naming the problem."""
    from ..kind_table import part

    return part(keyed_kind(url), "parse_url")(url.strip())


def parse_any(url: str) -> object:
    """The settings of a registry URL of any kind (its kind's ``parse_url``); ``InvalidTarget`` naming the
    problem, for a scheme that is no registry too."""
    from ..kind_table import part

    scheme = scheme_of(url) if isinstance(url, str) else ""
    kind = lookup(scheme) if scheme else None
    if kind is None or kind.keyed or kind.parse_url is None:
        return parse_registry_url(url)  # its errors name the kinds
    return part(kind, "parse_url")(url)

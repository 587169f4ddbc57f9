"""The front of a registry URL that names hosts only (``SCHEME://H1[:P1][,H2...][?options]``): the checks every
such kind makes before reading its own options, in the same words.

``URLForm`` is how one kind's URL reads: its scheme, what its errors call it (``label``) and the example they end
with. ``rest(url)`` checks the URL is a non-empty string of that scheme; ``host_part(url, ...)`` then splits it into
the host list and the query, refusing user info and a path (with the kind's reasons: what the URL names instead).
Options are read with ``waypost.urlparams``; hosts with ``hosts``, by ``waypost.netutil``'s rules.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from .. import urlparams
from ..errors import InvalidTarget
from ..netutil import AddressError, normalize_host_port

Config = TypeVar("Config")


@dataclass(frozen=True)
class URLForm:
    """The registry URL of one kind: ``scheme`` (lower case), ``label`` (``consul registry URL``) and
    ``example`` (a whole URL, shown after each problem)."""

    scheme: str
    label: str
    example: str

    def error(self, url: str, problem: str) -> InvalidTarget:
        """``invalid <label> '<url>': <problem> (example: <example>)`` (a password in ``url`` hidden)."""
        return urlparams.url_error(url, problem, example=self.example, label=self.label)

    def rest(self, url: object, wrong_scheme: str | None = None) -> tuple[str, str]:
        """``(url stripped, what follows SCHEME://)``; ``InvalidTarget`` for an empty URL or another scheme
        (``wrong_scheme``: the problem to name then, instead of which scheme was expected and given)."""
        if not isinstance(url, str) or not url.strip():
            raise InvalidTarget(f"empty {self.label} (example: {self.example})")
        url = url.strip()
        scheme, sep, rest = url.partition("://")
        if not sep or scheme.lower() != self.scheme:
            if wrong_scheme is None:
                shown = urlparams.shown_scheme(scheme)
                wrong_scheme = f"expected scheme {self.scheme}://, got {shown + '://' if sep else 'no scheme'}"
            raise self.error(url, wrong_scheme)
        return url, rest

    def host_part(self, url: object, *, no_userinfo: str, no_path: str) -> tuple[str, str, str]:
        """``(url stripped, host list, query)`` of a URL of this scheme; a ``#fragment`` is dropped. Refused,
        naming the problem: user info (``no_userinfo``: why), a path (``unexpected path '/p'`` then
        ``no_path``: what the URL names instead), no host."""
        url, rest = self.rest(url)
        netloc, _, query = rest.partition("?")
        query = query.partition("#")[0]
        if "@" in netloc:
            raise self.error(url, f"user info ('user@') {no_userinfo}")
        netloc, slash, path = netloc.partition("/")
        if slash and path.strip("/"):
            raise self.error(url, f"unexpected path {'/' + path!r}{no_path}")
        if not netloc:
            raise self.error(url, "no host")
        return url, netloc, query

    def host(self, url: str, raw: str, *, what: str, default_port: int) -> str:
        """``raw`` as a normalized ``host:port`` (``default_port`` when it has none); ``what`` names it in errors."""
        try:
            return normalize_host_port(raw, what=what, default_port=default_port)
        except AddressError as e:
            raise self.error(url, str(e)) from None

    def hosts(self, url: str, host_list: str, *, what: str, default_port: int) -> list[str]:
        """Each ``host[:port]`` of a comma-separated list, as ``host`` makes it."""
        return [self.host(url, raw, what=what, default_port=default_port) for raw in host_list.split(",")]

    def settings(self, given: object, config_type: type[Config], parse: Callable[[str], Config]) -> Config:
        """``given`` as it is when it is a ``config_type`` already, else parsed as a registry URL (``parse``);
        TypeError for anything else."""
        if isinstance(given, config_type):
            return given
        if isinstance(given, str):
            return parse(given)
        name = config_type.__name__
        raise TypeError(f"expected a {self.scheme}:// registry URL or {'an' if name[0] in 'AEIOU' else 'a'} {name}, "
                        f"got {type(given).__name__}")

"""Query parameters of registry URLs and dial targets: the one set of checks every registry kind uses.

A registry URL (``etcd://...``, ``consul://...``, ``zk://...``) and the options a dial target carries for its
registry share their vocabulary: boolean flags (``tls=1``), TLS files (``ca``, ``cert``, ``key``), timeouts in
seconds, each option given at most once under one of its names. The checks here raise what the caller's
``fail(problem)`` makes of a problem (an ``InvalidTarget`` naming the URL or the target), so the same rule
reads the same in every error.

Timeouts here are bare numbers of seconds (``dial_timeout=3``), as in the URLs of etcd's and ZooKeeper's own
clients; the gRPC JSON durations of service configs (``"1.5s"``) are ``waypost.durations``.

``TargetLike`` is what the registry clients read of a parsed dial target: ``waypost.resolver.Target`` sits
layers above them and satisfies it.
"""

from __future__ import annotations

import math
import os
import urllib.parse
from collections.abc import Callable, Collection, Iterator, Mapping
from typing import Protocol

from .errors import InvalidTarget
from .redaction import redact_url

#: the texts a boolean option accepts (an empty value is false: ``?tls=`` as ``?tls=0``)
TRUE = frozenset({"1", "true", "yes", "on"})
FALSE = frozenset({"0", "false", "no", "off", ""})
#: the longest timeout an option may ask for
MAX_SECONDS = 3600.0

#: makes the exception for one problem with a URL or target (``problem`` is a short sentence, no example)
Fail = Callable[[str], Exception]


class TargetLike(Protocol):
    """What a registry client reads of a parsed dial target (``waypost.resolver.Target``)."""

    @property
    def scheme(self) -> str: ...

    @property
    def endpoints(self) -> tuple[str, ...]: ...

    @property
    def options(self) -> Mapping[str, str]: ...

    @property
    def redacted(self) -> str: ...


def url_error(url: str, problem: str, *, example: str, label: str = "registry URL") -> InvalidTarget:
    """``invalid <label> '<url without its password>': <problem> (example: <example>)``."""
    return InvalidTarget(f"invalid {label} {redact_url(url)!r}: {problem} (example: {example})")


def shown_scheme(scheme: str) -> str:
    """A scheme as an error may quote it: what looks like ``user:password@`` before it is hidden."""
    return scheme if "@" not in scheme else "***@" + scheme.rpartition("@")[2]


def flag(name: str, value: str, fail: Fail) -> bool:
    """A boolean option: 1/true/yes/on or 0/false/no/off (any case; empty is false)."""
    v = value.strip().lower()
    if v in TRUE:
        return True
    if v in FALSE:
        return False
    raise fail(f"{name}={value!r} is not a boolean (use 1 or 0)")


def seconds_ok(value: object) -> bool:
    """A number of seconds in (0, MAX_SECONDS] (not a bool, not NaN)."""
    return (isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
            and 0 < value <= MAX_SECONDS)


def seconds(name: str, value: str, fail: Fail) -> float:
    """A timeout option: a number of seconds, 0 < S <= 3600."""
    try:
        number = float(value)
    except ValueError:
        raise fail(f"{name}={value!r} is not a number of seconds") from None
    if not seconds_ok(number):
        raise fail(f"{name}={value!r} must be between 0 and 3600 seconds")
    return number


#: the word an error uses for each TLS file option
TLS_FILE_WORDS = {"ca": "CA", "cert": "certificate", "key": "key"}


def tls_file(what: str, value: str, fail: Fail) -> str:
    """A TLS file option (``what``: CA, certificate, key): the absolute path of a readable file."""
    path = os.path.expanduser(value)
    if not os.path.isfile(path):
        raise fail(f"TLS {what} file {value!r} does not exist")
    if not os.access(path, os.R_OK):
        raise fail(f"TLS {what} file {value!r} is not readable")
    return os.path.abspath(path)


def options(query: str, fail: Fail, *, known: Collection[str] | None = None,
            aliases: Mapping[str, str] | None = None) -> Iterator[tuple[str, str]]:
    """A URL's query as ``(option, value)`` pairs, in order, each option at most once under any of its names.

    ``aliases`` maps other accepted names to an option's own (``cacert`` -> ``ca``); with ``known``, a name
    that is neither known nor an alias is refused, listing both; without it the caller checks the names.
    Pairs come one at a time, so the first problem in the query is the one reported.
    """
    aliases = aliases or {}
    given: dict[str, str] = {}  # option -> the name it was given under
    try:
        pairs = urllib.parse.parse_qsl(query, keep_blank_values=True)
    except ValueError as e:
        raise fail(f"malformed query: {e}") from None
    for given_name, value in pairs:
        name = aliases.get(given_name, given_name)
        if known is not None and name not in known:
            raise fail(f"unknown option {given_name!r} (known: {', '.join(sorted([*known, *aliases]))})")
        if name in given:
            same = "" if given[name] == given_name else f" ({given[name]!r} and {given_name!r} are the same option)"
            raise fail(f"option {given_name!r} given twice{same}")
        given[name] = given_name
        yield name, value

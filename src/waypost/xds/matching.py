"""What a route of an export's ``routes`` matches, as gRPC's xDS routing defines it (gRFC A28): the call's path,
its headers, and a share of the calls. The first route whose matchers all match takes the call.

A route matches on a path (``service`` [+ ``method``], ``prefix``, ``path`` or ``safe_regex``, at most one;
none is the prefix ``""``; ``case_sensitive``), ``headers`` (a header MATCH is ``"VALUE"`` or a table with one
matcher and optionally ``invert_match = true``) and ``runtime_fraction``: every key and matcher, docs/xds.md,
"Route matching".

gRPC matches a header sent several times as its values joined with ``,``, never matches ``-bin`` headers, and
hides ``grpc-`` headers from matchers: such names are refused here.

**Regexes are checked against RE2's syntax**, not Python's: gRPC's clients compile them with RE2 (C-core, Go's
``regexp``, re2j), and a client that cannot compile one NACKs the whole RouteConfiguration. So constructs RE2 lacks
are refused at load with what to write instead: backreferences (``\\1``, ``(?P=name)``), lookahead and lookbehind,
atomic groups and possessive quantifiers, conditionals, comment groups, ``\\b`` inside ``[...]``, ``\\Z`` (RE2: ``\\z`` or ``$``),
``\\N{...}``/``\\u``/``\\U`` escapes, ``{,n}`` (RE2 reads it as text: ``{0,n}``), the ``x``/``a``/``L`` flags,
repetition counts above 1000. RE2's ``\\p{...}`` classes, ``\\Q...\\E``, ``\\x{...}`` and the ``U`` flag are refused
too (Python's parser, used for the rest of the check, has no such syntax).
"""

from __future__ import annotations

import importlib
import re
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .errors import XdsConfigError


def _sre_module(new: str, old: str) -> Any:
    """Python's regex parser (``re._parser`` since 3.11, ``sre_parse`` before): its parse tree tells which
    constructs a pattern uses."""
    try:
        return importlib.import_module(new)
    except ImportError:  # pragma: no cover - Python 3.10
        return importlib.import_module(old)


_sre = _sre_module("re._constants", "sre_constants")
_sre_parse = _sre_module("re._parser", "sre_parse")

HEADER_NAME_RE = re.compile(r"[a-z0-9][a-z0-9._\-]{0,127}")
_SERVICE_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_.]{0,254}")
_METHOD_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}")
#: the route keys that say which paths a route takes (at most one, ``method`` going with ``service``)
PATH_KEYS = ("service", "prefix", "path", "safe_regex")
HEADER_KINDS = ("exact", "prefix", "suffix", "contains", "present", "safe_regex", "range")
DENOMINATORS = {"hundred": 100, "ten_thousand": 10_000, "million": 1_000_000}
INT64 = (-(2**63), 2**63 - 1)
#: RE2's largest repetition count (``a{1001}`` does not compile)
RE2_MAX_REPEAT = 1000
MAX_TEXT = 4096
#: ``{,n}``: Python reads a count from 0, RE2 the text itself
_PYTHON_ONLY_COUNT = re.compile(r"\{,\d+\}")


@dataclass(frozen=True)
class PathMatch:
    """``kind`` prefix, path (exact) or safe_regex; ``case_sensitive`` None: not sent (gRPC's default: true)."""

    kind: str
    value: str
    case_sensitive: bool | None = None


@dataclass(frozen=True)
class HeaderMatch:
    """One header matcher: ``kind`` among HEADER_KINDS; ``value`` the text (exact, prefix, suffix, contains,
    safe_regex), ``present`` for present, ``start``/``end`` for range."""

    name: str
    kind: str
    value: str = ""
    present: bool = True
    start: int = 0
    end: int = 0
    invert: bool = False


@dataclass(frozen=True)
class Fraction:
    """``runtime_fraction.default_value``: ``numerator`` per ``denominator`` (100, 10,000 or 1,000,000)."""

    numerator: int
    denominator: int


@dataclass(frozen=True)
class Match:
    """What one route matches (module docstring); ``path`` None: every path (the prefix ``""``)."""

    path: PathMatch | None = None
    headers: tuple[HeaderMatch, ...] = ()
    fraction: Fraction | None = None

    def takes_every_call(self) -> bool:
        """Whether the route matches every call (no later route can be reached)."""
        every_path = self.path is None or (self.path.kind == "prefix" and self.path.value in ("", "/"))
        return every_path and not self.headers and (self.fraction is None or
                                                    self.fraction.numerator >= self.fraction.denominator)


def _fail(where: str, message: str) -> XdsConfigError:
    return XdsConfigError(f"{where}: {message}")


def _text(value: object, where: str, what: str, *, empty: bool = False) -> str:
    if not isinstance(value, str) or (not value and not empty) or len(value) > MAX_TEXT:
        need = "a string" if empty else "a non-empty string"
        raise _fail(where, f"{what}: expected {need} (at most {MAX_TEXT} characters), got {str(value)[:80]!r}")
    return value


# ------------------------------------------------------------------ RE2


def _escapes(pattern: str) -> tuple[str | None, str]:
    """A first pass over ``pattern``, escapes and character classes followed: what RE2 refuses there (or reads
    otherwise than Python), and the text for Python's parser (RE2's ``\\z`` as Python's ``\\Z``)."""
    out: list[str] = []
    i, in_class, body = 0, False, 0
    while i < len(pattern):
        c = pattern[i]
        if c == "\\":
            nxt = pattern[i + 1] if i + 1 < len(pattern) else ""
            if nxt and nxt in "123456789":
                return f"backreference \\{nxt} at position {i}: RE2 has no backreferences", ""
            if nxt == "Z":
                return f"\\Z at position {i}: RE2 has no \\Z; write \\z or $", ""
            if nxt in ("p", "P", "Q", "E", "C"):
                return (f"\\{nxt} at position {i}: Unicode classes, \\Q...\\E and \\C are not accepted here; write "
                        "the characters or a class [...]"), ""
            if nxt in ("N", "u", "U"):
                return f"\\{nxt} at position {i}: RE2 has no \\N{{...}}, \\u or \\U escapes; write the character", ""
            if nxt == "b" and in_class:
                return f"\\b at position {i} inside [...]: RE2 has no backspace escape there; write \\x08", ""
            out.append("\\Z" if nxt == "z" else pattern[i:i + 2])
            i += 2
            continue
        if in_class:
            if c == "[" and pattern.startswith("[:", i) and ":]" in pattern[i + 2:]:  # [:alpha:]
                end = pattern.index(":]", i + 2) + 2
                out.append(pattern[i:end])
                i = end
                continue
            in_class = not (c == "]" and i > body)  # a ] first in the class is a character
        elif c == "[":
            in_class = True
            body = i + 2 if pattern.startswith("[^", i) else i + 1
        elif c == "{" and (count := _PYTHON_ONLY_COUNT.match(pattern, i)):
            return f"{count.group()} at position {i}: RE2 reads it as text; write {{0,{count.group()[2:]}", ""
        out.append(c)
        i += 1
    return None, "".join(out)


def re2_problem(pattern: str) -> str | None:
    """Why ``pattern`` does not compile under RE2 (what to write instead), or None when it does (as far as
    Python's parser, with RE2's restrictions added, can tell: module docstring)."""
    problem, text = _escapes(pattern)
    if problem:
        return problem
    if "(?#" in text:
        return "a comment group (?#...): RE2 has none"
    try:
        with warnings.catch_warnings():  # Python's FutureWarnings (a possible nested set [[...) are not ours
            warnings.simplefilter("ignore")
            tree = _sre_parse.parse(text)
    except re.error as e:
        return f"not a valid regex: {e}"
    except RecursionError:
        return "not a valid regex: nested too deeply"
    bad_flags = _sre.SRE_FLAG_VERBOSE | _sre.SRE_FLAG_ASCII | _sre.SRE_FLAG_LOCALE
    if tree.state.flags & bad_flags:
        return "the x, a and L flags: RE2 has only i, m, s and U"
    return _walk(tree, bad_flags)


def _walk(sub: Any, bad_flags: int) -> str | None:
    for op, av in sub:
        if op is _sre.GROUPREF:
            return "a backreference ((?P=name)): RE2 has no backreferences"
        if op is _sre.GROUPREF_EXISTS:
            return "a conditional group (?(...)...): RE2 has none"
        if op in (_sre.ASSERT, _sre.ASSERT_NOT):
            return "lookahead/lookbehind ((?=, (?!, (?<=, (?<!): RE2 has none"
        if op is getattr(_sre, "ATOMIC_GROUP", None):
            return "an atomic group (?>...): RE2 has none"
        if op is getattr(_sre, "POSSESSIVE_REPEAT", None):
            return "a possessive quantifier (*+, ++, ?+): RE2 has none"
        children: list[Any] = []
        if op is _sre.SUBPATTERN:
            _, add, remove, p = av
            if (add | remove) & bad_flags:
                return "the x, a and L flags: RE2 has only i, m, s and U"
            children = [p]
        elif op in (_sre.MAX_REPEAT, _sre.MIN_REPEAT):
            lo, hi, p = av
            if lo > RE2_MAX_REPEAT or (hi is not _sre.MAXREPEAT and hi > RE2_MAX_REPEAT):
                return f"a repetition count above {RE2_MAX_REPEAT}: RE2 allows {{n,m}} up to {RE2_MAX_REPEAT}"
            children = [p]
        elif op is _sre.BRANCH:
            children = list(av[1])
        for child in children:
            problem = _walk(child, bad_flags)
            if problem:
                return problem
    return None


def _regex(value: object, where: str) -> str:
    text = _text(value, where, "the regex")
    problem = re2_problem(text)
    if problem:
        raise _fail(where, f"'{text[:80]}': {problem}")  # as written: a repr would double its backslashes
    return text


# ------------------------------------------------------------------ path


def parse_path(route: Mapping[str, Any], where: str) -> PathMatch | None:
    """The route's path matcher from its keys (``PATH_KEYS``, ``method``, ``case_sensitive``); None: no path
    matcher given."""
    given = [k for k in PATH_KEYS if k in route]
    if len(given) > 1:
        raise _fail(where, f"two path matchers ({given[0]} and {given[1]}): give one of "
                           f"{', '.join(PATH_KEYS)} (method goes with service)")
    case = route.get("case_sensitive")
    if "case_sensitive" in route and not isinstance(case, bool):
        raise _fail(f"{where}: case_sensitive", f"expected true or false, got {str(case)[:40]!r}")
    if "method" in route and "service" not in route:
        raise _fail(where, "method needs service (or write the whole path: path = \"/pkg.Svc/Method\")")
    if not given:
        if "case_sensitive" in route:
            raise _fail(f"{where}: case_sensitive", "goes with a path matcher (prefix, path, service)")
        return None
    kind = given[0]
    here = f"{where}: {kind}"
    value = route[kind]
    if kind == "service":
        if not isinstance(value, str) or not _SERVICE_RE.fullmatch(value):
            raise _fail(here, f"expected a full service name (pkg.Service), got {str(value)[:80]!r}")
        method = route.get("method")
        if method is None:
            return PathMatch("prefix", f"/{value}/", case)
        if not isinstance(method, str) or not _METHOD_RE.fullmatch(method):
            raise _fail(f"{where}: method", f"expected a method name, got {str(method)[:80]!r}")
        return PathMatch("path", f"/{value}/{method}", case)
    if kind == "safe_regex":
        if case is False:
            raise _fail(where, "case_sensitive = false does not apply to safe_regex (gRPC ignores it there): "
                               "write (?i) at the start of the regex")
        return PathMatch("safe_regex", _regex(value, here), case)
    text = _text(value, where, kind, empty=kind == "prefix")
    if text and not text.startswith("/"):
        raise _fail(here, f"{text[:80]!r} never matches: a gRPC path starts with '/' (/pkg.Service/Method)")
    if any(ch.isspace() for ch in text):
        raise _fail(here, f"{text[:80]!r} never matches: a gRPC path has no spaces")
    return PathMatch(kind, text, case)


# ------------------------------------------------------------------ headers


def _header_name(name: object, where: str) -> str:
    if not isinstance(name, str) or not HEADER_NAME_RE.fullmatch(name):
        raise _fail(where, "not a header name (lower-case letters, digits, '.', '-', '_')")
    if name.endswith("-bin") or name.startswith("grpc-"):
        raise _fail(where, "gRPC never matches -bin or grpc- headers (gRFC A28)")
    return name


def _int64(value: object, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not INT64[0] <= value <= INT64[1]:
        raise _fail(where, f"expected an integer (int64), got {str(value)[:40]!r}")
    return value


def _header(name: str, match: object, where: str) -> HeaderMatch:
    if isinstance(match, str):
        return HeaderMatch(name, "exact", _text(match, where, "the value", empty=True))
    if not isinstance(match, Mapping):
        raise _fail(where, f'expected "VALUE" or a table with one of {", ".join(HEADER_KINDS)} (and invert_match)')
    unknown = sorted(str(k) for k in match if k not in HEADER_KINDS and k != "invert_match")
    if unknown:
        raise _fail(where, f"unknown matcher {unknown[0][:40]!r}; known: {', '.join(HEADER_KINDS)} (and "
                           "invert_match = true)")
    kinds = [k for k in HEADER_KINDS if k in match]
    if len(kinds) != 1:
        raise _fail(where, f"give one matcher of {', '.join(HEADER_KINDS)}" +
                    (f", not {kinds[0]} and {kinds[1]}" if kinds else ""))
    invert = match.get("invert_match", False)
    if not isinstance(invert, bool):
        raise _fail(f"{where}: invert_match", f"expected true or false, got {str(invert)[:40]!r}")
    kind = kinds[0]
    arg = match[kind]
    here = f"{where}: {kind}"
    if kind == "present":
        if not isinstance(arg, bool):
            raise _fail(here, f"expected true (the header is sent) or false (it is not), got {str(arg)[:40]!r}")
        return HeaderMatch(name, kind, present=arg, invert=invert)
    if kind == "range":
        if not isinstance(arg, Mapping) or set(arg) != {"start", "end"}:
            raise _fail(here, "expected {start = N, end = M}: integers, start inclusive, end exclusive")
        start, end = _int64(arg["start"], f"{here}: start"), _int64(arg["end"], f"{here}: end")
        if start >= end:
            raise _fail(here, f"start {start} is not below end {end}: the range [start, end) would match nothing "
                              "(start inclusive, end exclusive)")
        return HeaderMatch(name, kind, start=start, end=end, invert=invert)
    if kind == "safe_regex":
        return HeaderMatch(name, kind, _regex(arg, here), invert=invert)
    return HeaderMatch(name, kind, _text(arg, here, "the value", empty=kind == "exact"), invert=invert)


def parse_headers(value: object, where: str) -> tuple[HeaderMatch, ...]:
    if not isinstance(value, Mapping) or not value:
        raise _fail(where, 'expected a table of HEADER = "VALUE" or HEADER = {MATCHER = ...} (at least one)')
    out = []
    for name, match in value.items():
        here = f"{where}: {str(name)[:60]!r}"
        out.append(_header(_header_name(name, here), match, here))
    return tuple(sorted(out, key=lambda h: h.name))


# ------------------------------------------------------------------ runtime_fraction


def parse_fraction(value: object, where: str) -> Fraction:
    """A percentage (``25``, ``0.5``) or ``{numerator = N, denominator = "hundred"|"ten_thousand"|"million"}``."""
    if isinstance(value, Mapping):
        if set(value) - {"numerator", "denominator"} or "numerator" not in value:
            raise _fail(where, 'expected {numerator = N, denominator = "hundred" | "ten_thousand" | "million"}')
        name = value.get("denominator", "hundred")
        if name not in DENOMINATORS:
            raise _fail(f"{where}: denominator", f"expected hundred, ten_thousand or million, got {str(name)[:40]!r}")
        denominator = DENOMINATORS[name]
        n = value["numerator"]
        if isinstance(n, bool) or not isinstance(n, int) or not 0 <= n <= denominator:
            raise _fail(f"{where}: numerator", f"expected an integer from 0 to {denominator}, got {str(n)[:40]!r}")
        return Fraction(n, denominator)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 100:
        raise _fail(where, f"expected a percentage from 0 to 100 (or {{numerator, denominator}}), got "
                           f"{str(value)[:40]!r}")
    if value == int(value):
        return Fraction(int(value), 100)
    return Fraction(round(value * 10_000), 1_000_000)


def parse_match(route: Mapping[str, Any], where: str) -> Match:
    """The matchers of one route table (module docstring)."""
    path = parse_path(route, where)
    headers = parse_headers(route["headers"], f"{where}: headers") if "headers" in route else ()
    fraction = parse_fraction(route["runtime_fraction"], f"{where}: runtime_fraction") \
        if "runtime_fraction" in route else None
    return Match(path, headers, fraction)

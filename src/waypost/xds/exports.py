"""What an xDS control plane serves: exports (``NAME=TARGET [OPTION=VALUE ...]``), config files, prefixes.

An export names one xDS service (the ``NAME`` of ``xds:///NAME``) and where its endpoints come from (any
waypost dial target, or a list of them), with options that shape the resources; every option and the config
file's layout: docs/xds.md, "Exports".

On the command line an export is one argument: ``NAME=TARGET`` followed by space-separated options
(targets never contain spaces). A config file (JSON, or TOML read with ``tomllib``) holds the same as tables
(``[exports.NAME]``), ``[[prefixes]]`` (every service key under a registry's prefix becomes an export of that
name) and ``[tls]`` (``waypost.xds.tls``).

Every mistake raises ``XdsConfigError`` naming the export (or file) and the field.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..kind_table import kind_of
from .errors import XdsConfigError
from .model import Export
from .policy import check_export
from .tls import TlsFiles, tls_files_from_table
from .traffic import (
    parse_fault,
    parse_max_requests,
    parse_routes,
    parse_split,
    parse_subset_key,
    parse_subsets,
    resolve_subsets,
)

if TYPE_CHECKING:
    from ..service_config.model import ServiceConfig

#: an xDS service name: what follows ``xds:///`` (a DNS-ish name, also the Listener/Cluster name)
NAME_RE = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9._/\-]{0,251}[A-Za-z0-9._\-])?")
RETRY_CODES = ("cancelled", "deadline-exceeded", "internal", "resource-exhausted", "unavailable")
OPTIONS = ("policy", "policy_config", "hash_header", "prefer", "retries", "retry_on",
           "service_config", "outlier_detection", "serve_empty",
           "subset_key", "subsets", "split", "routes", "max_requests", "fault", "load_reporting")
#: options that only a config file can set (their values are objects)
_OBJECT_OPTIONS = ("policy_config", "outlier_detection", "routes", "fault")
_HEADER_RE = re.compile(r"[a-z0-9][a-z0-9._\-]{0,127}")


@dataclass(frozen=True)
class PrefixExport:
    """Every service key under ``prefix`` in ``registry`` (an etcd or memory registry URL) becomes an export
    named by its key, with ``options`` (the export options above)."""

    registry: str
    prefix: str
    options: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class XdsConfig:
    """A parsed config: named exports and prefixes, and the server's TLS files (``[tls]``, ``tls.py``)."""

    exports: tuple[Export, ...] = ()
    prefixes: tuple[PrefixExport, ...] = ()
    tls: TlsFiles | None = None


def parse_export(spec: str, *, bare_key: Callable[[str], str] | None = None) -> Export:
    """``NAME=TARGET [OPTION=VALUE ...]`` -> Export. ``bare_key(key) -> target``, when given, turns a TARGET
    without a scheme (a key) into a target (the CLI's ``--registry`` rule)."""
    if not isinstance(spec, str) or not spec.strip():
        raise XdsConfigError("export: expected NAME=TARGET, got an empty string")
    head, *opts = spec.split()
    name, sep, target = head.partition("=")
    where = f"export {name!r}" if sep else f"export {head[:60]!r}"
    if not sep or not target:
        raise XdsConfigError(f"{where}: expected NAME=TARGET (example: greeter=etcd:///127.0.0.1:2379?key=greet.rpc)")
    if "://" not in target:
        if bare_key is None:
            raise XdsConfigError(f"{where}: TARGET {target!r} has no scheme (etcd:///h:2379?key=K, dns:///h:p, ...)")
        target = bare_key(target)
    options: dict[str, Any] = {}
    for opt in opts:
        key, sep, value = opt.partition("=")
        if not sep:
            raise XdsConfigError(f"{where}: option {opt[:60]!r}: expected OPTION=VALUE")
        if key in _OBJECT_OPTIONS:
            raise XdsConfigError(f"{where}: option {key!r} takes an object: set it in a config file (--config)")
        if key in options:
            raise XdsConfigError(f"{where}: option {key!r} given twice")
        options[key] = value
    return make_export(name, target, options, where)


def make_export(name: object, target: object, options: Mapping[str, Any], where: str | None = None) -> Export:
    """An Export from its parts, every field checked (``where`` prefixes the errors)."""
    where = where or f"export {name!r}"
    if not isinstance(name, str) or not NAME_RE.fullmatch(name):
        raise XdsConfigError(f"{where}: NAME must be letters, digits, '.', '-', '_' or inner '/' (at most 253), got {name!r}")
    targets = _targets(target, where)
    unknown = sorted(set(options) - set(OPTIONS))
    if unknown:
        raise XdsConfigError(f"{where}: unknown option {unknown[0]!r}; known: {', '.join(OPTIONS)}")
    kw: dict[str, Any] = {}
    for key, value in options.items():
        kw[key] = _OPTION_PARSERS[key](value, f"{where}: {key}")
    export = Export(name=name, target=targets, **kw)
    export = replace(export, subsets=resolve_subsets(export, where))
    if export.service_config is not None and export.retries:
        raise XdsConfigError(f"{where}: give retries either in service_config or as the retries option")
    check_export(export, where)
    return export


def _targets(target: object, where: str) -> str | tuple[str, ...]:
    items = [target] if isinstance(target, str) else target
    if not isinstance(items, (list, tuple)) or not items:
        raise XdsConfigError(f"{where}: target must be a target string or a non-empty list of them, got "
                             f"{type(target).__name__}")
    for t in items:
        if not isinstance(t, str) or "://" not in t or any(c.isspace() for c in t):
            raise XdsConfigError(f"{where}: target {str(t)[:80]!r} is not a dial target (scheme://..., no spaces)")
    from ..resolver.target import (
        parse_target,  # the resolvers' own grammar: a bad target fails here, not later
    )

    for t in items:
        try:
            parse_target(t)
        except ValueError as e:
            raise XdsConfigError(f"{where}: {e}") from None
    return items[0] if len(items) == 1 else tuple(items)


def _str(value: object, where: str) -> str:
    if not isinstance(value, str) or not value:
        raise XdsConfigError(f"{where}: expected a non-empty string, got {value!r}")
    return value


def _policy(value: object, where: str) -> str:
    return _str(value, where)


def _object(value: object, where: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping) or not all(isinstance(k, str) for k in value):
        raise XdsConfigError(f"{where}: expected an object, got {type(value).__name__}")
    return dict(value)


def _header(value: object, where: str) -> str:
    text = _str(value, where).lower()
    if not _HEADER_RE.fullmatch(text) or text.endswith("-bin"):
        raise XdsConfigError(f"{where}: not a usable header name (lower-case token, not -bin): {value!r}")
    return text


def _prefer(value: object, where: str) -> tuple[str, str]:
    kind, sep, want = _str(value, where).partition(":")
    if not sep or kind not in ("zone", "region") or not want:
        raise XdsConfigError(f"{where}: expected zone:ZONE or region:REGION, got {value!r}")
    return kind, want


def _retries(value: object, where: str) -> int:
    if isinstance(value, str) and value.strip().isdigit():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 10:
        raise XdsConfigError(f"{where}: expected an integer from 0 to 10, got {value!r}")
    return value


def _retry_on(value: object, where: str) -> tuple[str, ...]:
    items = value.split(",") if isinstance(value, str) else value
    if not isinstance(items, (list, tuple)) or not items:
        raise XdsConfigError(f"{where}: expected a comma list of {', '.join(RETRY_CODES)}")
    out = []
    for item in items:
        code = str(item).strip().lower().replace("_", "-")
        if code not in RETRY_CODES:
            raise XdsConfigError(f"{where}: {str(item)[:40]!r} is not one of {', '.join(RETRY_CODES)}")
        out.append(code)
    return tuple(dict.fromkeys(out))


def _bool(value: object, where: str) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in ("true", "1", "yes", "false", "0", "no"):
        return value.lower() in ("true", "1", "yes")
    raise XdsConfigError(f"{where}: expected true or false, got {value!r}")


def _service_config(value: object, where: str) -> ServiceConfig:
    from .routes import parse_service_config

    return parse_service_config(value, where)


_OPTION_PARSERS: dict[str, Callable[[object, str], object]] = {
    "service_config": _service_config,
    "policy": _policy, "policy_config": _object, "hash_header": _header, "prefer": _prefer,
    "retries": _retries, "retry_on": _retry_on, "outlier_detection": _object,
    "serve_empty": _bool,
    "subset_key": parse_subset_key, "subsets": parse_subsets, "split": parse_split, "routes": parse_routes,
    "max_requests": parse_max_requests, "fault": parse_fault, "load_reporting": _bool,
}


def load_config(path: str | Path) -> XdsConfig:
    """Read a config file: JSON (``.json``) or TOML (anything else), as in the module docstring."""
    p = Path(path)
    try:
        raw = p.read_bytes()
    except OSError as e:
        raise XdsConfigError(f"config {str(p)!r}: cannot read it: {e.strerror or e}") from None
    return parse_config(raw, str(p), as_json=p.suffix.lower() == ".json")


def parse_config(raw: bytes | str, where: str = "config", *, as_json: bool = False) -> XdsConfig:
    """Parse config text (JSON or TOML) into exports and prefixes."""
    text = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else raw
    try:
        if as_json:
            data = json.loads(text)
        else:
            try:
                import tomllib
            except ImportError:  # Python 3.10
                raise XdsConfigError(f"{where}: TOML needs Python 3.11 (tomllib); use a .json file") from None
            data = tomllib.loads(text)
    except (ValueError, RecursionError) as e:  # JSONDecodeError and TOMLDecodeError are ValueErrors
        kind = "JSON" if as_json else "TOML"
        raise XdsConfigError(f"{where}: not valid {kind}: {str(e).splitlines()[0] if str(e) else e!r}") from None
    return config_from_dict(data, where)


def config_from_dict(data: object, where: str = "config") -> XdsConfig:
    if not isinstance(data, Mapping):
        raise XdsConfigError(f"{where}: expected a table/object with 'exports' and/or 'prefixes'")
    unknown = sorted(set(data) - {"exports", "prefixes", "tls"})
    if unknown:
        raise XdsConfigError(f"{where}: unknown key {str(unknown[0])[:40]!r} (expected 'exports', 'prefixes', "
                             "'tls')")
    exports_raw = data.get("exports", {})
    if not isinstance(exports_raw, Mapping):
        raise XdsConfigError(f"{where}: 'exports' must be a table of NAME -> {{target = ..., options}}")
    exports = []
    for name, body in exports_raw.items():
        here = f"{where}: export {str(name)[:60]!r}"
        if isinstance(body, str):
            body = {"target": body}
        if not isinstance(body, Mapping) or "target" not in body:
            raise XdsConfigError(f"{here}: expected a target string or a table with 'target'")
        opts = {k: v for k, v in body.items() if k != "target"}
        exports.append(make_export(name, body["target"], opts, here))
    prefixes_raw = data.get("prefixes", [])
    if not isinstance(prefixes_raw, list):
        raise XdsConfigError(f"{where}: 'prefixes' must be a list of {{registry, prefix, options}}")
    prefixes = [parse_prefix(p, f"{where}: prefixes[{i}]") for i, p in enumerate(prefixes_raw)]
    tls = tls_files_from_table(data["tls"], f"{where}: tls") if "tls" in data else None
    return XdsConfig(tuple(exports), tuple(prefixes), tls)


def parse_prefix(body: object, where: str) -> PrefixExport:
    """A prefix entry: ``{registry, prefix, OPTION...}``; the options are checked with a sample export."""
    if not isinstance(body, Mapping):
        raise XdsConfigError(f"{where}: expected a table with 'registry' and 'prefix'")
    registry = body.get("registry")
    if not isinstance(registry, str) or not ((kind := kind_of(registry)) is not None and kind.keyed):
        raise XdsConfigError(f"{where}: registry must be an etcd:// or memory:// registry URL, got {registry!r}")
    prefix = body.get("prefix")
    if not isinstance(prefix, str) or prefix.startswith("/"):
        raise XdsConfigError(f"{where}: prefix must be a string not starting with '/', got {prefix!r}")
    options = {k: v for k, v in body.items() if k not in ("registry", "prefix")}
    make_export("sample", "direct:///127.0.0.1:1", options, where)  # the options fail now, not per key found
    return PrefixExport(registry, prefix, options)


def check_unique(exports: list[Export]) -> None:
    seen: set[str] = set()
    for e in exports:
        if e.name in seen:
            raise XdsConfigError(f"export {e.name!r} is given twice")
        seen.add(e.name)

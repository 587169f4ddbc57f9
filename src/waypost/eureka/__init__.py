"""Eureka (Spring Cloud Netflix): everything waypost knows of it, in one package (docs/eureka.md).

- ``config``: ``eureka://`` registry URLs and dial targets -> ``EurekaConfig`` (the servers, the base path);
- ``api``: a small asyncio client of Eureka's REST API, on aiohttp (the ``eureka`` extra), failing over between
  the servers;
- ``apps``: instances and metadata in and out of Eureka's JSON, a client's copy of the registry, the delta and
  its reconcile hash code;
- ``publisher``: ``EurekaPublisher``, what ``serve(registry="eureka://...")`` registers with;
- ``resolver``: ``EurekaResolver``, what ``dial("eureka://HOST/APP")`` follows;
- ``console_source``: the console's view of an Eureka registry and its drain (Eureka's status override).

The generic layers reach this package by name, through its row in ``waypost.registry.kinds`` (``package``), and
only these names: ``parse_registry_url``, ``EurekaPublisher`` (the row's ``publisher``), ``new_resolver`` (a
resolver factory), ``new_console_source``. They are imported on first use, so ``import waypost.eureka`` stays light.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from .config import DEFAULT_PORT, EXAMPLE, TARGET_EXAMPLE, EurekaConfig, parse_registry_url

if TYPE_CHECKING:  # the real types for type checkers; at run time they load on first use (__getattr__)
    from .console_source import EurekaSource as EurekaSource
    from .publisher import EurekaPublisher as EurekaPublisher
    from .resolver import EurekaResolver as EurekaResolver

_LAZY = {
    "EurekaPublisher": ("publisher", "EurekaPublisher"),
    "EurekaResolver": ("resolver", "EurekaResolver"),
    "EurekaSource": ("console_source", "EurekaSource"),
}


def new_resolver(target: Any, options: Any = None, /, **kw: Any) -> Any:
    """An ``EurekaResolver`` for a parsed ``eureka://`` target (the kinds table's resolver factory)."""
    from .resolver import EurekaResolver

    return EurekaResolver(target, options, **kw)


def new_console_source(url: str, board: Any, timeout: float) -> Any:
    """The console's source of the Eureka registry at ``url`` (``EurekaSource``)."""
    from .console_source import EurekaSource

    return EurekaSource(url, board, timeout)


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        module, attr = _LAZY[name]
        return getattr(importlib.import_module(f"{__name__}.{module}"), attr)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["DEFAULT_PORT", "EXAMPLE", "TARGET_EXAMPLE", "EurekaConfig", "EurekaPublisher", "EurekaResolver",
           "EurekaSource", "new_console_source", "new_resolver", "parse_registry_url"]

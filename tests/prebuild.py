"""Build or fetch every real test server and peer program before the test run: ``python -m tests.prebuild``.

The tests build what they need on first use (cached under ``~/.cache/waypost-servers``, locked, each bounded by
its own timeout), so this is never required. On a fresh machine, though, those cold builds (Consul, the
kube-apiserver, the Go and Java xDS peers, Eureka, ZooKeeper's jars) take minutes of both cores inside the timed
tests that happen to come first; CI runs this step first so that the suite times the tests, not the builds.

Best effort: an item that cannot be had here (no Go, no Java) or fails is reported and the rest go on; the tests
then skip or fail with the same message as before. Exit status 0 always.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from typing import Any


def _consul() -> Any:
    from harness import consul_agent

    return consul_agent.consul_binary()


def _apiserver() -> Any:
    from harness.k8s import build

    return build.apiserver_binary()


def _zookeeper() -> Any:
    from tests.zookeeper import support

    return support.zookeeper_lib()


def _eureka() -> Any:
    from tests.eureka import support

    return support.eureka_jars()


def _interop_go() -> Any:
    from harness.go_servers import go_binary
    from tests.interop import support

    go = go_binary()
    if go is None:
        raise RuntimeError("no Go toolchain")
    return support.build(go)


def _xds_go() -> Any:
    from tests.xds import go_peers

    return go_peers.go_programs()


def _xds_java() -> Any:
    from tests.xds import java_peers

    return java_peers.java_classpath()[:80] + "..."


def _xds_scale() -> Any:
    from harness.xds_scale_programs import XDS_SCALE_PROGRAMS

    return XDS_SCALE_PROGRAMS.build(float(os.environ.get("WAYPOST_XDS_GO_BUILD_TIMEOUT", "900")))


def _xds_engine() -> Any:
    from harness import native_engine

    reason = native_engine.skip_reason()
    if reason:
        raise RuntimeError(reason)
    return native_engine.build(float(os.environ.get("WAYPOST_XDS_ENGINE_BUILD_TIMEOUT", "1100")))


ITEMS: dict[str, Callable[[], Any]] = {
    "consul": _consul,
    "kube-apiserver": _apiserver,
    "zookeeper": _zookeeper,
    "eureka": _eureka,
    "interop go programs": _interop_go,
    "xds go peers": _xds_go,
    "xds java peers": _xds_java,
    "bench/xds_scale programs": _xds_scale,
    "native xds engine (cargo)": _xds_engine,
}


def main() -> int:
    for name, build in ITEMS.items():
        started = time.monotonic()
        try:
            got = build()
        except BaseException as e:  # pytest.skip raises a BaseException
            if isinstance(e, KeyboardInterrupt):
                raise
            print(f"prebuild: {name}: not available ({type(e).__name__}: {str(e)[:300]})", flush=True)
            continue
        print(f"prebuild: {name}: ready in {time.monotonic() - started:.1f} s ({got})"[:400], flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The native engine as a control plane for ``bench/xds_scale.py``: ``waypost_xds_engine`` (native/xds-engine, Rust:
tonic on tokio) serving the ADS streams, Python building the resources.

Like go-control-plane's ``gcp-server`` it is fed from memory, not from a registry: M services ``svc-0..`` of N
endpoints each (the addresses the benchmark gives every rival), their Listener, RouteConfiguration, Cluster and
ClusterLoadAssignment built by waypost's own builders (``waypost.xds.resources``) from an export per service and
handed to the engine serialized. On ``change S`` (stdin) it adds one endpoint to svc-S, or removes it again,
rebuilds that ClusterLoadAssignment in Python and hands it over (``update_resources``): the engine pushes it to
the streams subscribed to svc-S. Everything a change costs in Python is in the process's CPU time, as it would
be in ``waypost xds serve``.

Usage: python native_server.py MODULE_DIR [--services M] [--endpoints N] [--workers W]; prints
``{"listening": "HOST:PORT"}``, then ``{"changed": V}`` per change, once handed over.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "src"))

from waypost.types import Backend
from waypost.xds import parse_export
from waypost.xds.resources import ENDPOINT, load_assignment, static_resources


def address(svc: int, j: int) -> str:
    """The benchmark's endpoint addresses (``bench/xds_scale.py``'s ``_address``)."""
    return f"10.{svc % 250}.{j // 250}.{j % 250 + 1}:8080"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("module_dir", help="the directory holding the built waypost_xds_engine module")
    ap.add_argument("--services", type=int, default=1)
    ap.add_argument("--endpoints", type=int, default=10)
    ap.add_argument("--workers", type=int, default=None, help="tokio worker threads (default: one per core)")
    ap.add_argument("--listen", default="127.0.0.1:0")
    args = ap.parse_args()
    sys.path.insert(0, args.module_dir)
    import waypost_xds_engine

    exports = [parse_export(f"svc-{s}=direct:///127.0.0.1:1") for s in range(args.services)]
    engine = waypost_xds_engine.Engine(workers=args.workers)
    static: dict[str, dict[str, bytes]] = {}
    for export in exports:
        for type_url, msg in static_resources(export).items():
            static.setdefault(type_url, {})[export.name] = msg.SerializeToString()
    for type_url, items in static.items():
        engine.set_resources(type_url, items, "1")
    counts = [args.endpoints] * args.services

    def assignment(svc: int) -> bytes:
        backends = [Backend(address(svc, j)) for j in range(counts[svc])]
        return load_assignment(exports[svc], backends).SerializeToString()

    engine.set_resources(ENDPOINT, {e.name: assignment(s) for s, e in enumerate(exports)}, "1")
    port = engine.start(args.listen)
    print(json.dumps({"listening": f"{args.listen.rsplit(':', 1)[0]}:{port}"}), flush=True)
    version = 1
    for line in sys.stdin:
        cmd = line.split()
        if not cmd or cmd[0] == "quit":
            break
        if cmd[0] == "change":
            svc = int(cmd[1])
            counts[svc] = args.endpoints + 1 if counts[svc] == args.endpoints else args.endpoints
            version += 1
            engine.update_resources(ENDPOINT, {exports[svc].name: assignment(svc)}, version=str(version))
            print(json.dumps({"changed": version}), flush=True)
    engine.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""A process that lives inside a private network namespace and runs Kubernetes scenarios there.

Started by ``harness.k8s.support.NetnsHost`` (``unshare -n ... exec python -m harness.k8s.netns_host``), never by hand
outside such a namespace: the scenarios bind 10.77.0.x. It starts a ``KubeCluster`` (etcd + kube-apiserver on
127.0.0.1 inside the namespace; the binary from ``$WAYPOST_KUBE_APISERVER``, there is no network to build it),
then speaks JSON lines:

* stdout, once: ``{"ready": true, "base_url": ..., "ca_file": ..., "startup_s": ...}`` (or ``{"ready": false,
  "error": ...}`` and exit 2);
* stdin: ``{"scenario": NAME, "timeout": S, "args": {...}}`` -> runs ``harness.k8s.scenarios.SCENARIOS[NAME](cluster,
  **args)`` in a thread, bounded by S;
* stdout: ``{"ok": true}`` or ``{"ok": false, "error": "traceback text"}`` per request. A scenario that overran
  its timeout cannot be stopped (it is a thread): the answer then says ``"exiting": true``, the host stops its
  cluster and exits (code 3), and the outer side starts a new host for the next scenario.

Logs go to stderr; so does anything else written to fd 1 (prints, child processes), to keep stdout clean.
Exits when stdin closes (or on SIGTERM), stopping the cluster.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import signal
import sys
import threading
import time
import traceback
from typing import Any, TextIO

log = logging.getLogger("harness.k8s.netns_host")


def _protocol_stream() -> TextIO:
    """A private copy of stdout for the protocol; fd 1 itself then points at stderr."""
    out = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    return out


def _stack_of(thread: threading.Thread) -> str:
    frame = sys._current_frames().get(thread.ident or -1)
    return "".join(traceback.format_stack(frame)) if frame is not None else "(no frame)"


def _run_one(cluster: Any, name: str, args: dict[str, Any], timeout: float) -> dict[str, Any]:
    from harness.k8s import scenarios as k8s_scenarios

    fn = k8s_scenarios.SCENARIOS.get(name)
    if fn is None:
        return {"ok": False, "error": f"unknown scenario {name!r}; known: {sorted(k8s_scenarios.SCENARIOS)}"}
    result: dict[str, Any] = {}

    def target() -> None:
        try:
            fn(cluster, **args)
            result["ok"] = True
        except BaseException:  # noqa: BLE001 - reported to the outer side
            result["ok"] = False
            result["error"] = traceback.format_exc()

    t = threading.Thread(target=target, name=f"scenario-{name}", daemon=True)
    started = time.monotonic()
    t.start()
    t.join(timeout)
    if t.is_alive():
        return {"ok": False, "exiting": True,
                "error": f"scenario {name} did not finish within {timeout} s; the host exits. "
                         f"Its thread was at:\n{_stack_of(t)}"}
    log.info("scenario %s: %s in %.1f s", name, "ok" if result.get("ok") else "FAILED",
             time.monotonic() - started)
    return result


def _bounded(fn: Any, timeout: float) -> None:
    t = threading.Thread(target=fn, name="bounded", daemon=True)
    t.start()
    t.join(timeout)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--watch-cache", action="store_true", help="keep the apiserver's watch cache")
    ap.add_argument("--bind-host", default="127.0.0.1")
    ap.add_argument("--dir", help="the cluster's directory (kept afterwards); default a temporary one")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s [%(threadName)s] %(message)s")
    proto = _protocol_stream()

    def say(obj: dict[str, Any]) -> None:
        proto.write(json.dumps(obj) + "\n")
        proto.flush()

    def on_term(*_: object) -> None:
        raise KeyboardInterrupt

    # as PID 1 of its own PID namespace, a signal without a handler would be ignored
    signal.signal(signal.SIGTERM, on_term)

    from harness.k8s.support import KubeCluster

    started = time.monotonic()
    cluster = KubeCluster(bind_host=args.bind_host, watch_cache=args.watch_cache, base_dir=args.dir)
    try:
        cluster.start()
    except BaseException:  # noqa: BLE001 - reported on the protocol stream
        say({"ready": False, "error": traceback.format_exc()})
        with contextlib.suppress(Exception):
            cluster.stop()
        return 2
    try:
        say({"ready": True, "base_url": cluster.base_url, "ca_file": str(cluster.ca_file), "pid": os.getpid(),
             "startup_s": round(time.monotonic() - started, 2), "dir": str(cluster.dir)})
        log.info("cluster ready at %s in %.1f s", cluster.base_url, time.monotonic() - started)
        for raw in sys.stdin:
            if not raw.strip():
                continue
            try:
                req = json.loads(raw)
                name = str(req["scenario"])
                timeout = float(req.get("timeout", 60))
                kwargs = dict(req.get("args") or {})
            except (ValueError, KeyError, TypeError) as e:
                say({"ok": False, "error": f"bad request {raw.strip()!r}: {e}"})
                continue
            log.info("scenario %s (timeout %s s)", name, timeout)
            answer = _run_one(cluster, name, kwargs, timeout)
            say(answer)
            if answer.get("exiting"):
                log.error("%s", answer["error"])
                _bounded(cluster.stop, 40)
                proto.close()
                os._exit(3)  # the stuck scenario thread cannot be joined
        log.info("stdin closed: stopping")
    except KeyboardInterrupt:
        log.info("SIGTERM: stopping")
    finally:
        _bounded(cluster.stop, 40)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

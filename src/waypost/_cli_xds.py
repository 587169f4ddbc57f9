"""``waypost xds serve`` and ``waypost xds bootstrap``: waypost as an xDS control plane (docs/xds.md).

Registered by ``waypost._cli`` (``xds_commands``), which passes its global-options decorator and context
(this module sits below it and imports nothing of it). The xDS modules, which need the ``xds`` extra, are
imported only when a command runs.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from ._cli_signals import exit_if_interrupted, stop_on_signals

log = logging.getLogger("waypost.xds")


def _exports(c: Any, specs: tuple[str, ...], config: Path | None, prefixes: tuple[str, ...]) -> Any:
    from .resolver.target import target_for_registry
    from .xds.exports import PrefixExport, XdsConfig, check_unique, load_config, parse_export, parse_prefix

    cfg = load_config(config) if config is not None else XdsConfig()
    exports = list(cfg.exports)
    for spec in specs:
        exports.append(parse_export(spec, bare_key=lambda key: target_for_registry(c.registry(), key)))
    check_unique(exports)
    found: list[PrefixExport] = list(cfg.prefixes)
    for p in prefixes:
        head, *opts = p.split()
        body: dict[str, Any] = {"registry": c.registry_url, "prefix": head}
        for opt in opts:
            k, _, v = opt.partition("=")
            body[k] = v
        found.append(parse_prefix(body, f"prefix {head!r}"))
    if not exports and not found:
        raise click.UsageError("nothing to serve: give --export NAME=TARGET, --prefix PREFIX or --config FILE")
    return exports, found


def xds_commands(global_options: Callable[[Any], Any], pass_ctx: Callable[[Any], Any]) -> click.Group:
    """The ``xds`` command group, with the caller's global options on each command."""

    @click.group("xds", short_help="Serve waypost's discovery to gRPC's xDS clients.")
    def xds() -> None:
        """waypost as an xDS control plane: gRPC's own xDS clients (grpcio, grpc-go, grpc-java) dial xds:///NAME
        and balance over waypost's discovery (docs/xds.md)."""

    @xds.command("serve", short_help="Run the xDS control plane until SIGTERM.")
    @click.option("--listen", default="127.0.0.1:18000", show_default=True, metavar="HOST:PORT",
                  help="Where the ADS server listens (port 0: any free port).")
    @click.option("--export", "specs", multiple=True, metavar="'NAME=TARGET [OPT=V ...]'",
                  help="Serve NAME from a dial target, or from a KEY in --registry (repeatable). "
                       "Options: policy, hash_header, prefer, retries, retry_on, service_config, serve_empty.")
    @click.option("--prefix", "prefixes", multiple=True, metavar="'PREFIX [OPT=V ...]'",
                  help="Serve every service key under PREFIX in --registry (found as they appear; repeatable).")
    @click.option("--config", type=click.Path(dir_okay=False, path_type=Path), default=None,
                  help="Exports and prefixes from a JSON or TOML file.")
    @click.option("--tls-cert", type=click.Path(dir_okay=False, exists=True, path_type=Path), default=None,
                  help="Serve TLS with this certificate chain (PEM).")
    @click.option("--tls-key", type=click.Path(dir_okay=False, exists=True, path_type=Path), default=None,
                  help="The private key of --tls-cert (PEM).")
    @click.option("--metrics-port", type=click.IntRange(0, 65535), default=None,
                  help="Serve Prometheus metrics on 127.0.0.1:PORT.")
    @global_options
    @pass_ctx
    def serve_cmd(c: Any, listen: str, specs: tuple[str, ...], prefixes: tuple[str, ...], config: Path | None,
                  tls_cert: Path | None, tls_key: Path | None, metrics_port: int | None) -> None:
        """Serve the exported services over ADS (xDS v3, state of the world) until SIGTERM or Ctrl-C.

        Prints 'xds: serving on HOST:PORT' once it accepts streams. Example:
        waypost xds serve --listen 0.0.0.0:18000 --export 'greeter=etcd:///10.0.0.1:2379?key=greet.rpc'"""
        import grpc

        try:
            from .xds.control import ControlPlane
        except ImportError as e:
            raise click.ClickException(str(e)) from None  # names the extra to install
        if (tls_cert is None) != (tls_key is None):
            raise click.UsageError("--tls-cert and --tls-key go together")
        exports, prefixes_found = _exports(c, specs, config, prefixes)
        creds = None
        if tls_cert is not None and tls_key is not None:
            creds = grpc.ssl_server_credentials([(tls_key.read_bytes(), tls_cert.read_bytes())])
        if metrics_port is not None:
            from . import metrics

            metrics.serve(metrics_port)
        with stop_on_signals() as stop:
            control = ControlPlane(exports, prefixes_found)
            try:
                try:
                    port = control.start(listen, creds)
                except OSError as e:
                    raise click.ClickException(str(e)) from None
                host = listen.rpartition(":")[0] or "0.0.0.0"
                click.echo(f"xds: serving on {host}:{port}")
                sys.stdout.flush()
                names = ", ".join(e.name for e in exports) or "none yet"
                c.err.print(f"exports: {names}" + (f"; prefixes: {', '.join(p.prefix for p in prefixes_found)}"
                                                   if prefixes_found else ""), markup=False)
                while not stop.wait(0.5):
                    pass
            finally:
                control.stop(grace=1.0)
        exit_if_interrupted(stop)

    @xds.command("bootstrap", short_help="Print the bootstrap JSON a gRPC xDS client needs.")
    @click.option("--server", "servers", multiple=True, required=True, metavar="HOST:PORT",
                  help="A control plane (repeatable: replicas, tried in order).")
    @click.option("--node-id", default=None, help="The client's node id (default: waypost-HOSTNAME).")
    @click.option("--zone", default=None, help="The client's zone (node.locality.zone).")
    @global_options
    @pass_ctx
    def bootstrap_cmd(c: Any, servers: tuple[str, ...], node_id: str | None, zone: str | None) -> None:
        """Print the xDS bootstrap JSON: save it to a file named by GRPC_XDS_BOOTSTRAP, or put the text itself in
        GRPC_XDS_BOOTSTRAP_CONFIG, then dial xds:///NAME."""
        from .xds.bootstrap import bootstrap_json

        click.echo(bootstrap_json(list(servers), node_id, zone=zone))

    return xds

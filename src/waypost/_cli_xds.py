"""``waypost xds serve`` and ``waypost xds bootstrap``: waypost as an xDS control plane (docs/xds.md).

Registered by ``waypost._cli`` (``xds_commands``), which passes its global-options decorator and context
(this module sits below it and imports nothing of it). The xDS modules, which need the ``xds`` extra, are
imported only when a command runs.
"""

from __future__ import annotations

import logging
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from ._cli_signals import exit_if_interrupted, stop_on_signals
from ._cli_xds_status import status_command

log = logging.getLogger("waypost.xds")

#: how a dial target starts (``etcd://``, ``dns:///``): an ``--export`` value that does is missing its ``NAME=``
_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://")


def _exports(c: Any, specs: tuple[str, ...], config: Path | None, prefixes: tuple[str, ...]) -> Any:
    from .resolver.target import target_for_registry
    from .xds.errors import XdsConfigError
    from .xds.exports import PrefixExport, XdsConfig, check_unique, load_config, parse_export, parse_prefix

    cfg = load_config(config) if config is not None else XdsConfig()
    exports = list(cfg.exports)
    for spec in specs:
        head = spec.split()[0] if spec.split() else ""
        if _SCHEME.match(head):  # a TARGET alone: its own '=' (?key=...) would be read as NAME=
            raise click.ClickException(f"--export {spec!r}: a dial target without NAME=: expected 'NAME=TARGET "
                                       f"[OPTION=VALUE ...]' (e.g. --export 'greeter={head}')")
        try:
            exports.append(parse_export(spec, bare_key=lambda key: target_for_registry(c.registry(), key)))
        except XdsConfigError as e:
            raise click.ClickException(f"--export {spec!r}: {e} (--export takes 'NAME=TARGET [OPTION=VALUE ...]')"
                                       ) from None
    check_unique(exports)
    found: list[PrefixExport] = list(cfg.prefixes)
    for p in prefixes:
        head, *opts = p.split() or [""]
        if not head:
            raise click.ClickException(f"--prefix {p!r}: no PREFIX: expected 'PREFIX [OPTION=VALUE ...]' (e.g. "
                                       "--prefix 'prod/ policy=round_robin')")
        body: dict[str, Any] = {"registry": c.registry_url, "prefix": head}
        for opt in opts:
            k, sep, v = opt.partition("=")
            if not sep or not k:
                raise click.ClickException(f"--prefix {p!r}: option {opt!r} is not OPTION=VALUE (e.g. --prefix "
                                           f"'{head} policy=round_robin')")
            body[k] = v
        found.append(parse_prefix(body, f"--prefix {head!r}"))
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
                  help="Where the ADS server listens (:PORT or PORT: every interface; port 0: any free port).")
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

        from .netutil import bind_address, bind_problem, join_host_port, split_host_port

        try:
            from .xds.control import ControlPlane
        except ImportError as e:
            raise click.ClickException(str(e)) from None  # names the extra to install
        if (tls_cert is None) != (tls_key is None):
            raise click.UsageError("--tls-cert and --tls-key go together")
        address = bind_address(listen, what="--listen")  # :PORT and PORT (every interface) as gRPC takes them
        exports, prefixes_found = _exports(c, specs, config, prefixes)
        # Probed before gRPC binds: on a failed bind gRPC logs its own line and raises a RuntimeError that
        # does not say why; the probe's answer is the one line the command ends with.
        why = bind_problem(address)
        if why:
            raise click.ClickException(f"xds serve cannot listen on {address}: {why}")
        creds = None
        if tls_cert is not None and tls_key is not None:
            creds = grpc.ssl_server_credentials([(tls_key.read_bytes(), tls_cert.read_bytes())])
        if metrics_port is not None:
            from . import metrics

            try:
                metrics.serve(metrics_port)
            except OSError as e:
                raise click.ClickException(f"xds serve cannot serve metrics on 127.0.0.1:{metrics_port}: "
                                           f"{bind_problem(f'127.0.0.1:{metrics_port}') or e.strerror or e}") from None
        with stop_on_signals() as stop:
            control = ControlPlane(exports, prefixes_found)
            try:
                try:
                    port = control.start(address, creds)
                except (OSError, RuntimeError) as e:  # taken between the probe and the bind: grpcio's RuntimeError
                    raise click.ClickException(f"xds serve cannot listen on {address}: "
                                               f"{bind_problem(address) or e}") from None
                click.echo(f"xds: serving on {join_host_port(split_host_port(address, listen=True)[0], port)}")
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

    xds.add_command(status_command(global_options, pass_ctx))  # waypost xds status (CSDS)
    return xds

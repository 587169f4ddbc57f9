"""``waypost xds serve`` and ``waypost xds bootstrap``: waypost as an xDS control plane (docs/xds.md).

Registered by ``waypost.cli.commands`` (``xds_commands``), which passes its global-options decorator and context
(this module sits below it and imports nothing of it). The xDS modules, which need the ``xds`` extra, are
imported only when a command runs.
"""

from __future__ import annotations

import logging
import re
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from .signals import exit_if_interrupted, stop_on_signals
from .xds_status import status_command

if TYPE_CHECKING:
    from types import FrameType

    import grpc

    from ..xds.control import ControlPlane
    from ..xds.exports import Export, PrefixExport
    from ..xds.tls import TlsFiles

    #: what a config load gives: the exports, the prefixes, the config file's [tls] files
    Loaded = tuple[list[Export], list[PrefixExport], TlsFiles | None]

log = logging.getLogger("waypost.xds")

#: how a dial target starts (``etcd://``, ``dns:///``): an ``--export`` value that does is missing its ``NAME=``
_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://")


def _exports(c: Any, specs: tuple[str, ...], config: Path | None, prefixes: tuple[str, ...]) -> Loaded:
    from ..resolver.target import target_for_registry
    from ..xds.errors import XdsConfigError
    from ..xds.exports import XdsConfig, check_unique, load_config, parse_export, parse_prefix

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
    return exports, found, cfg.tls


def _server_credentials(cert: Path | None, key: Path | None, client_ca: Path | None, config: Path | None,
                        config_tls: TlsFiles | None) -> grpc.ServerCredentials | None:
    """The ADS server's TLS (``xds/tls.py``) from the flags or the config file's ``[tls]``; None: plaintext."""
    from ..xds.tls import ServerTls, TlsFileError, TlsFiles

    if client_ca is not None and cert is None:
        raise click.UsageError("--client-ca needs --tls-cert and --tls-key (mTLS is TLS whose clients also show a "
                               "certificate)")
    if (cert is None) != (key is None):
        raise click.UsageError("--tls-cert and --tls-key go together")
    if cert is not None and config_tls is not None:
        raise click.UsageError(f"TLS is given both by --tls-cert and in the [tls] table of {config}: give it in one "
                               "place")
    names = {"cert": "--tls-cert", "key": "--tls-key", "client_ca": "--client-ca"}
    if cert is not None and key is not None:
        files = TlsFiles(str(cert), str(key), None if client_ca is None else str(client_ca))
    elif config_tls is not None:
        files, names = config_tls, {k: f"{config}: tls.{k}" for k in names}
    else:
        return None
    try:
        return ServerTls(files).credentials()
    except TlsFileError as e:
        raise click.ClickException(f"{names[e.field]} {e.path}: {e.problem}") from None


def _print_exports(c: Any, exports: Sequence[Export], prefixes: Sequence[PrefixExport]) -> None:
    names = ", ".join(e.name for e in exports) or "none yet"
    c.err.print(f"exports: {names}" + (f"; prefixes: {', '.join(p.prefix for p in prefixes)}" if prefixes else ""),
                markup=False)


def _supervise(c: Any, address: str, count: int, exports: Sequence[Export], prefixes: Sequence[PrefixExport],
               reloads: bool) -> None:
    """``--workers N``: run N workers on one port until SIGTERM (``xds/workers.py``); exit with their code."""
    from ..xds.workers import Workers

    try:
        pool = Workers(count, [sys.executable, "-m", "waypost.cli", *sys.argv[1:]], address)
    except OSError as e:
        raise click.ClickException(f"xds serve cannot listen on {address}: {e.strerror or e}") from None
    import signal

    def on_hup(signum: int, _frame: FrameType | None) -> None:
        if reloads:
            pool.forward(signum)  # each worker re-reads --config
        else:
            log.warning("xds: SIGHUP: nothing to reload (no --config)")

    signal.signal(signal.SIGHUP, on_hup)
    with stop_on_signals() as stop:
        try:
            pool.start()
        except RuntimeError as e:
            raise click.ClickException(str(e)) from None
        click.echo(f"xds: serving on {pool.address}")
        sys.stdout.flush()
        _print_exports(c, exports, prefixes)
        c.err.print(f"workers: {count} processes on one port", markup=False)
        code = pool.run(stop)
    exit_if_interrupted(stop)
    if code:
        raise SystemExit(code)


def _reload_on_change(config: Path, load: Callable[[], Loaded], control: ControlPlane, prefixes: list[PrefixExport]
                      ) -> Callable[[], None]:
    """Start a ConfigReloader of ``config`` applying its exports to ``control`` (SIGHUP asks for a reload; prefixes
    are read at start only); returns what stops it."""
    import signal
    import threading

    from ..xds.reload import ConfigReloader

    def apply(loaded: Loaded) -> None:
        exports, found, _tls = loaded  # [tls] paths are read at start; xds/tls.py re-reads the files themselves
        if list(found) != list(prefixes):
            log.warning("xds: config %s: prefixes are read at start only; restart to apply their change", config)
        control.replace_exports(exports)

    reloader = ConfigReloader(config, load, apply)
    reloader.start()
    previous = None
    if threading.current_thread() is threading.main_thread():  # signal handlers exist there only
        previous = signal.signal(signal.SIGHUP, lambda _signum, _frame: reloader.request())

    def stop() -> None:
        reloader.stop()
        if previous is not None:
            signal.signal(signal.SIGHUP, previous)

    return stop


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
                       "Options: policy, hash_header, prefer, retries, retry_on, service_config, serve_empty, "
                       "subset_key, subsets, split, max_requests, load_reporting.")
    @click.option("--prefix", "prefixes", multiple=True, metavar="'PREFIX [OPT=V ...]'",
                  help="Serve every service key under PREFIX in --registry (found as they appear; repeatable).")
    @click.option("--config", type=click.Path(dir_okay=False, path_type=Path), default=None,
                  help="Exports and prefixes from a JSON or TOML file.")
    @click.option("--tls-cert", type=click.Path(dir_okay=False, path_type=Path), default=None,
                  help="Serve TLS with this certificate chain (PEM; re-read when it changes).")
    @click.option("--tls-key", type=click.Path(dir_okay=False, path_type=Path), default=None,
                  help="The private key of --tls-cert (PEM).")
    @click.option("--client-ca", type=click.Path(dir_okay=False, path_type=Path), default=None,
                  help="mTLS: require client certificates signed by this CA (PEM).")
    @click.option("--metrics-port", type=click.IntRange(0, 65535), default=None,
                  help="Serve Prometheus metrics on 127.0.0.1:PORT (with --workers: worker i on PORT+i).")
    @click.option("--workers", type=click.IntRange(1, 64), default=1, show_default=True,
                  help="Control-plane processes sharing the port (SO_REUSEPORT), each following the registry: "
                       "one per core for large fleets.")
    @click.option("--push-interval", type=click.FloatRange(0, 60), default=0.1, show_default=True, metavar="SECONDS",
                  help="The shortest time between two pushes: a lone change goes out at once, a burst folds into "
                       "one push per interval.")
    @click.option("--max-connection-age", type=click.FloatRange(0), default=1800.0, show_default=True,
                  metavar="SECONDS", help="Send a client's connection GOAWAY after about SECONDS (+/-10 %), so a "
                       "fleet spreads over the replicas again after one was away; 0: never.")
    @click.option("--load-reporting", is_flag=True,
                  help="Every export's clients report their load here (LRS), as load_reporting=true does for one.")
    @click.option("--load-reporting-interval", type=click.FloatRange(0.1, 3600), default=10.0, show_default=True,
                  metavar="SECONDS", help="How often a client sends its load report.")
    @click.option("--engine", type=click.Choice(["python", "native"]), default="python", show_default=True,
                  help="What serves the ADS streams: grpc.aio, or the Rust engine of native/xds-engine (installed "
                       "apart; plaintext, one process, no CSDS).")
    @global_options
    @pass_ctx
    def serve_cmd(c: Any, listen: str, specs: tuple[str, ...], prefixes: tuple[str, ...], config: Path | None,
                  tls_cert: Path | None, tls_key: Path | None, client_ca: Path | None,
                  metrics_port: int | None, workers: int, push_interval: float, max_connection_age: float,
                  load_reporting: bool, load_reporting_interval: float, engine: str) -> None:
        """Serve the exported services over ADS (xDS v3, state of the world) until SIGTERM or Ctrl-C.

        Prints 'xds: serving on HOST:PORT' once it accepts streams. Example:
        waypost xds serve --listen 0.0.0.0:18000 --export 'greeter=etcd:///10.0.0.1:2379?key=greet.rpc'"""
        from ..netutil import bind_address, bind_problem, join_host_port, split_host_port

        try:
            from ..xds.control import ControlPlane
            from ..xds.errors import XdsConfigError
            from ..xds.workers import worker_index, worker_listen
        except ImportError as e:
            raise click.ClickException(str(e)) from None  # names the extra to install
        address = bind_address(listen, what="--listen")  # :PORT and PORT (every interface) as gRPC takes them

        def load() -> Loaded:
            exports, found, tls = _exports(c, specs, config, prefixes)
            if load_reporting:
                from ..xds.lrs import with_load_reporting

                exports, found = with_load_reporting(exports, found)
            return exports, found, tls

        exports, prefixes_found, config_tls = load()
        creds = _server_credentials(tls_cert, tls_key, client_ca, config, config_tls)
        if engine == "native" and any(getattr(e, "load_reporting", False) for e in exports):
            raise click.ClickException("--engine native serves ADS alone, not load reports: drop --load-reporting "
                                       "and the exports' load_reporting, or use the default engine (--engine python)")
        if engine == "native" and (workers > 1 or creds is not None):
            raise click.ClickException("--engine native serves plaintext in one process: drop "
                                       f"{'--workers' if workers > 1 else 'TLS (--tls-cert, --tls-key, --client-ca)'}"
                                       ", or use the default engine (--engine python)")
        index = worker_index()
        if index is None and workers > 1:
            _supervise(c, address, workers, exports, prefixes_found, config is not None)
            return
        if index is not None:  # a worker of --workers: the supervisor holds the port for it
            address = worker_listen() or address
            metrics_port = None if metrics_port is None else metrics_port + index
        else:
            # Probed before gRPC binds: on a failed bind gRPC logs its own line and raises a RuntimeError that
            # does not say why; the probe's answer is the one line the command ends with.
            why = bind_problem(address)
            if why:
                raise click.ClickException(f"xds serve cannot listen on {address}: {why}")
        if metrics_port is not None:
            from .. import metrics

            try:
                metrics.serve(metrics_port)
            except OSError as e:
                raise click.ClickException(f"xds serve cannot serve metrics on 127.0.0.1:{metrics_port}: "
                                           f"{bind_problem(f'127.0.0.1:{metrics_port}') or e.strerror or e}") from None
        with stop_on_signals() as stop:
            try:
                control = ControlPlane(exports, prefixes_found, push_interval=push_interval,
                                       max_connection_age=max_connection_age or None, engine=engine,
                                       load_reporting_interval=load_reporting_interval)
            except XdsConfigError as e:
                raise click.ClickException(str(e)) from None
            stop_reload = None
            try:
                try:
                    port = control.start(address, creds, reuse_port=index is not None)
                except (OSError, RuntimeError) as e:  # taken between the probe and the bind: grpcio's RuntimeError
                    raise click.ClickException(f"xds serve cannot listen on {address}: "
                                               f"{bind_problem(address) or e}") from None
                click.echo(f"xds: serving on {join_host_port(split_host_port(address, listen=True)[0], port)}")
                sys.stdout.flush()
                if index is None:
                    _print_exports(c, exports, prefixes_found)
                if config is not None:  # SIGHUP or a change of the file: its exports applied, no restart
                    stop_reload = _reload_on_change(config, load, control, prefixes_found)
                while not stop.wait(0.5):
                    pass
            finally:
                if stop_reload is not None:
                    stop_reload()
                control.stop(grace=1.0)
        exit_if_interrupted(stop)

    @xds.command("bootstrap", short_help="Print the bootstrap JSON a gRPC xDS client needs.")
    @click.option("--server", "servers", multiple=True, required=True, metavar="HOST:PORT",
                  help="A control plane (repeatable: replicas, tried in order).")
    @click.option("--node-id", default=None, help="The client's node id (default: waypost-HOSTNAME).")
    @click.option("--zone", default=None, help="The client's zone (node.locality.zone).")
    @click.option("--tls", "tls", is_flag=True, help="Reach the control plane over TLS (gRFC A65 'tls' credentials).")
    @click.option("--ca-file", default=None, metavar="PATH",
                  help="--tls: the CA that signed the control plane's certificate (default: the system's roots).")
    @click.option("--cert-file", default=None, metavar="PATH", help="--tls: the client's certificate chain (mTLS).")
    @click.option("--key-file", default=None, metavar="PATH", help="--tls: the key of --cert-file.")
    @click.option("--refresh-interval", type=click.IntRange(1), default=None, metavar="SECONDS",
                  help="--tls: how often the client re-reads the files (its default: 600).")
    @global_options
    @pass_ctx
    def bootstrap_cmd(c: Any, servers: tuple[str, ...], node_id: str | None, zone: str | None, tls: bool,
                      ca_file: str | None, cert_file: str | None, key_file: str | None,
                      refresh_interval: int | None) -> None:
        """Print the xDS bootstrap JSON: save it to a file named by GRPC_XDS_BOOTSTRAP, or put the text itself in
        GRPC_XDS_BOOTSTRAP_CONFIG, then dial xds:///NAME. File paths are printed as given: the client reads them."""
        from ..xds.bootstrap import INSECURE, bootstrap_json, tls_channel_creds

        given = [flag for flag, v in (("--ca-file", ca_file), ("--cert-file", cert_file), ("--key-file", key_file),
                                      ("--refresh-interval", refresh_interval)) if v is not None]
        if given and not tls:
            raise click.UsageError(f"{given[0]} goes with --tls (the bootstrap is insecure without it)")
        creds = tls_channel_creds(ca_file, cert_file, key_file, refresh_interval) if tls else INSECURE
        click.echo(bootstrap_json(list(servers), node_id, zone=zone, channel_creds=creds))

    xds.add_command(status_command(global_options, pass_ctx))  # waypost xds status (CSDS)
    return xds

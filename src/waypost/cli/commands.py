"""The ``waypost`` subcommands (click + rich). Entry point: ``waypost.cli.main``.

Every command prints rich tables for people and JSON with ``--json`` for scripts. Errors a user can cause (bad
URL or target, unreachable registry, ...) end the command with ONE line on stderr and a non-zero status.
"""

from __future__ import annotations

import concurrent.futures
import json
import logging
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click
from rich.console import Console
from rich.table import Table

from ..discovery.formats import DEFAULT_FORMAT, FORMAT_NAMES
from ..errors import PermissionDenied, RegistryUnavailable, WaypostError
from .console import register as _register_console
from .demo import register as _register_demo
from .errors import not_a_key_registry, one_line_errors, unreachable, user_error
from .errors import one_line as _one_line
from .signals import exit_if_interrupted, stop_on_signals
from .xds import xds_commands

if TYPE_CHECKING:
    from ..discovery.store import Registry

DEFAULT_REGISTRY = "etcd://127.0.0.1:2379"
#: the logger of the operator actions' audit lines (``waypost.console.actions``, imported only when one runs)
AUDIT_LOGGER = "waypost.console.audit"
#: set by ``waypost.cli.main``: the command owns the process, so it sets up logging to stderr
CONFIGURE_LOGGING = False


class _Group(click.Group):
    """Turns waypost's own errors into one clean line (click prints ``Error: ...`` and exits 1; ``errors.py``)."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return list(self.commands)  # in the order they are defined: the order a new user needs them

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except Exception as e:
            clean = user_error(e)
            if clean is None:
                raise
            raise clean from None


class Ctx:
    """What every command needs: the registry URL, the output mode and the consoles."""

    def __init__(self, registry: str, as_json: bool, verbose: int = 0) -> None:
        self.registry_url = registry
        self.as_json = as_json
        self.verbose = verbose
        self.out = Console(highlight=False, soft_wrap=True)
        self.err = Console(stderr=True, highlight=False, soft_wrap=True)
        self._registry: Registry | None = None

    def registry(self, wait: float | None = None) -> Registry:
        """The registry of --registry, for a command that reads or writes keys (etcd, memory). ``wait``: how long
        a call may wait for an etcd endpoint to connect (a diagnostic command's --timeout), unless the URL says."""
        if self._registry is None:
            from ..discovery.connections import connect

            wrong = not_a_key_registry(self.registry_url, click.get_current_context().info_name or "")
            if wrong:
                raise click.ClickException(wrong)
            url = self.registry_url
            if wait is not None and url.startswith("etcd://") and "dial_timeout=" not in url:
                url += f"{'&' if '?' in url else '?'}dial_timeout={wait:g}"
            self._registry = connect(url)
        return self._registry

    def emit(self, obj: object) -> None:
        click.echo(json.dumps(obj, sort_keys=True, default=str))


pass_ctx = click.make_pass_decorator(Ctx)


def _global_options(f: Callable[..., Any]) -> Callable[..., Any]:
    """The global options, accepted after the subcommand too (``waypost watch KEY -v --json``)."""

    def set_registry(ctx: click.Context, _p: click.Parameter, value: str | None) -> None:
        if value is not None:
            ctx.find_object(Ctx).registry_url = value  # type: ignore[union-attr]

    def set_json(ctx: click.Context, _p: click.Parameter, value: bool) -> None:
        if value:
            ctx.find_object(Ctx).as_json = True  # type: ignore[union-attr]

    def add_verbose(ctx: click.Context, _p: click.Parameter, value: int) -> None:
        c = ctx.find_object(Ctx)
        if value and c is not None:
            c.verbose += value
            _configure_logging(ctx)

    f = click.option("-v", "--verbose", count=True, expose_value=False, callback=add_verbose,
                     help="Log more (-v: info, -vv: debug) to stderr.")(f)
    f = click.option("--json", "json_", is_flag=True, expose_value=False, callback=set_json,
                     help="Machine-readable output.")(f)
    return click.option("--registry", "registry_", default=None, metavar="URL", expose_value=False,
                        callback=set_registry, help="Registry URL (as before the command).")(f)


def _timeout_option(f: Callable[..., Any]) -> Callable[..., Any]:
    """``--timeout``: how long a diagnostic command waits for its lookup before it fails."""
    return click.option("--timeout", default=5.0, show_default=True, type=click.FloatRange(min=0.1),
                        metavar="SECONDS", help="Fail if the lookup has no answer within SECONDS.")(f)


def _configure_logging(ctx: click.Context) -> None:
    """Log to stderr at the level -v/-vv ask for (only as the real command: embedded use, such as tests,
    keeps its own logging set-up). One-shot commands end with one error line: their retries' warnings
    would only add noise, so without -v they log errors only."""
    c = ctx.find_object(Ctx)
    if not CONFIGURE_LOGGING or c is None:
        return
    command = ctx.find_root().invoked_subcommand
    quiet = logging.ERROR if command in ("ls", "resolve", "bench") else logging.WARNING
    level = quiet if c.verbose == 0 else logging.INFO if c.verbose == 1 else logging.DEBUG
    root = logging.getLogger("waypost")
    handler = next((h for h in root.handlers if getattr(h, "waypost_cli", False)), None)
    if handler is None:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s", "%H:%M:%S"))
        handler.waypost_cli = True  # type: ignore[attr-defined]
        root.addHandler(handler)
    if command in OPERATOR_ACTIONS and not any(isinstance(f, _NoAuditLine) for f in handler.filters):
        handler.addFilter(_NoAuditLine())
    root.setLevel(level)


#: the one-shot operator actions: they print what they did; their audit line is for the audit log
OPERATOR_ACTIONS = ("drain", "undrain", "weight")


class _NoAuditLine(logging.Filter):
    """Keeps the audit logger (``waypost.console.audit``) off the terminal of ``drain``/``undrain``/``weight``:
    the command prints what it did, and the audit line belongs where the audit log is collected (its logger,
    for whoever configures it; the override record itself keeps who and when), not echoed back to the operator
    who just typed the command. ``waypost console`` keeps it on stderr: there stderr is the server's log."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.name.startswith(AUDIT_LOGGER)


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--registry", envvar="WAYPOST_REGISTRY", default=DEFAULT_REGISTRY, show_default=True,
              metavar="URL", help="Registry URL (env WAYPOST_REGISTRY): etcd://h1:2379,h2:2379 or memory://NAME; "
              "console, drain, undrain and weight also take consul://, zk:// and eureka://.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output (JSON).")
@click.option("-v", "--verbose", count=True, help="Log more (-v: info, -vv: debug) to stderr.")
@click.version_option(package_name="waypost", prog_name="waypost")
@click.pass_context
def app(ctx: click.Context, registry: str, as_json: bool, verbose: int) -> None:
    """Service registration, discovery and load balancing for Python gRPC: etcd, Consul, ZooKeeper, Eureka,
    Kubernetes and DNS, and an xDS control plane for gRPC's own xDS clients.

    The global options may also follow the command (waypost watch KEY -v --json)."""
    ctx.obj = Ctx(registry, as_json, verbose)
    _configure_logging(ctx)


# --------------------------------------------------------------------------------------------- signals


def _wait(stop: threading.Event, duration: float | None, alive: Callable[[], bool] = lambda: True) -> None:
    deadline = None if duration is None else time.monotonic() + duration
    while not stop.is_set() and alive():
        if deadline is not None and time.monotonic() >= deadline:
            return
        stop.wait(0.2)


# --------------------------------------------------------------------------------------------- etcd


@app.command("etcd", short_help="Run a local development etcd.")
@click.option("--port", default=2379, show_default=True, type=click.IntRange(0, 65535),
              help="Client port on 127.0.0.1 (0: any free port).")
@click.option("--peer-port", default=None, type=click.IntRange(0, 65535),
              help="Peer port (default: client port + 1, or any free port).")
@click.option("--data-dir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Keep the data here (default: a temporary directory removed on exit).")
@_global_options
@pass_ctx
def etcd_cmd(c: Ctx, port: int, peer_port: int | None, data_dir: Path | None) -> None:
    """Run a single-node development etcd on 127.0.0.1 until Ctrl-C or SIGTERM."""
    from ..etcd.local import EtcdNotFound, LocalEtcd, find_binary, free_port, port_is_free

    try:
        find_binary("etcd")
    except EtcdNotFound as e:
        raise click.ClickException(str(e)) from None
    port = port or free_port()
    if not port_is_free(port):
        raise click.ClickException(f"127.0.0.1:{port} is already in use (an etcd already running? then just use "
                                   f"it: waypost --registry etcd://127.0.0.1:{port} ls)")
    if peer_port is None:
        peer_port = port + 1 if port < 65535 and port_is_free(port + 1) else free_port()
    elif not port_is_free(peer_port):
        raise click.ClickException(f"peer port 127.0.0.1:{peer_port} is already in use")
    if data_dir is not None:
        data_dir.mkdir(parents=True, exist_ok=True)
    node = LocalEtcd(1, base_dir=data_dir, client_ports=[port])
    node.members[0].peer_port = node.members[0].advertise_peer_port = peer_port  # (no relay in front of it)
    node.members[0].initial_cluster = f"{node.members[0].name}=http://127.0.0.1:{peer_port}"
    if data_dir is not None and (Path(data_dir) / "m0" / "member").exists():
        node.members[0].cluster_state = "existing"
    with stop_on_signals() as stop:
        try:
            node.start()
        except WaypostError as e:
            node.close()
            raise click.ClickException(f"etcd did not start: {_one_line(e)}") from None
        try:
            member = node.members[0]
            url = node.url()
            info = {"endpoint": member.client_url, "registry": url, "data_dir": str(member.data_dir),
                    "pid": member.proc.pid if member.proc else None}
            if c.as_json:
                c.emit(info)
            else:
                c.out.print(f"[bold green]etcd running[/] on {member.client_url}  (pid {info['pid']}, "
                            f"data {member.data_dir})")
                c.out.print(f"registry URL: [bold]{url}[/]   e.g. export WAYPOST_REGISTRY={url}")
                c.out.print("Ctrl-C to stop")
            sys.stdout.flush()
            _wait(stop, None, alive=lambda: node.members[0].running)
            if not node.members[0].running:
                raise click.ClickException(f"etcd exited unexpectedly: {node.members[0].tail_log(300).strip()}")
        finally:
            node.close()
    if not c.as_json:
        c.out.print("etcd stopped")
    exit_if_interrupted(stop)


# --------------------------------------------------------------------------------------------- ls


@app.command("ls", short_help="List services and instances (format per key).")
@click.argument("prefix", default="")
@_timeout_option
@_global_options
@pass_ctx
def ls_cmd(c: Ctx, prefix: str, timeout: float) -> None:
    """List services and their instances under PREFIX (all keys by default), wire format detected per key."""
    from ..discovery.formats import GOZERO_META_ROOT
    from ..discovery.listing import classify
    from ..discovery.store import SyncRegistry
    from .inspect import group, lease_ttls

    reg = SyncRegistry(c.registry(wait=timeout), timeout=timeout)
    try:
        res = reg.get(prefix, prefix=True)
        kvs = list(res.kvs)
        if prefix:  # go-zero metadata lives in side records outside the prefix
            try:
                kvs += reg.get(GOZERO_META_ROOT + prefix, prefix=True).kvs
            except PermissionDenied as e:  # a role that may read only the addresses
                click.echo(f"note: listing without waypost metadata: {e}", err=True)
        entries = classify(kvs)
        ttls = lease_ttls(reg, entries)
    except (TimeoutError, concurrent.futures.TimeoutError, RegistryUnavailable):
        raise click.ClickException(unreachable(c.registry(), f"list {prefix!r}" if prefix else "list the keys",
                                                 timeout)) from None
    if c.as_json:
        c.emit({"revision": res.revision, "services": group(entries, ttls)})
        return
    if not entries:
        c.out.print(f"nothing under {prefix!r} in {c.registry().url} (revision {res.revision})")
        return
    for service, instances in group(entries, ttls).items():
        t = Table(title=f"{service}  ({len(instances)} instance{'s' if len(instances) != 1 else ''})",
                  title_justify="left", title_style="bold")
        for col in ("address", "format", "id", "ttl", "metadata"):
            t.add_column(col, overflow="fold")
        for i in instances:
            addr = i["address"] or f"[red]? {i.get('value', '')!r}[/]"
            t.add_row(addr, i["format"], i["id"], _ttl_text(i["ttl"]), _meta_text(i["metadata"]))
        c.out.print(t)


def _ttl_text(ttl: int | None) -> str:
    return "-" if ttl is None else ("expired" if ttl < 0 else f"{ttl}s")


def _meta_text(meta: object) -> str:
    if isinstance(meta, dict):
        return ", ".join(f"{k}={v}" for k, v in sorted(meta.items()))
    return str(meta) if meta else ""


# --------------------------------------------------------------------------------------------- watch


@app.command("watch", short_help="Show instances of KEY (or of a dial TARGET) as they come and go.")
@click.argument("key")
@click.option("--format", "fmt", default=DEFAULT_FORMAT, show_default=True,
              type=click.Choice(FORMAT_NAMES), help="Wire format of the registrations.")
@click.option("--exact", is_flag=True, help="Watch the key itself, not the prefix KEY/ (go-zero's exact match).")
@click.option("--for", "duration", type=click.FloatRange(min=0), default=None, metavar="SECONDS",
              help="Stop after SECONDS (default: until Ctrl-C).")
@_timeout_option
@_global_options
@pass_ctx
def watch_cmd(c: Ctx, key: str, fmt: str, exact: bool, duration: float | None, timeout: float) -> None:
    """Show the instances of KEY, then every add and remove as it happens.

    KEY is a registry key (in --registry), or a dial target such as k8s://default/greet:50051 or
    dns:///greet.example.com:50051: what a channel dialing it would see."""
    lock = threading.Lock()
    state: dict[str, Any] = {"known": {}}

    def report(kind: str, addr: str, meta: dict[str, Any]) -> None:
        if c.as_json:
            c.emit({"event": kind, "key": key, "address": addr, "metadata": meta, "time": time.time()})
        else:
            style = {"add": "green", "remove": "red", "change": "yellow", "present": "cyan"}[kind]
            sign = {"add": "+", "remove": "-", "change": "~", "present": "="}[kind]
            stamp = time.strftime("%H:%M:%S")
            c.out.print(f"{stamp} [{style}]{sign} {addr}[/] {_meta_text(meta)}")
        sys.stdout.flush()

    def changed(now: dict[str, dict[str, Any]]) -> None:
        with lock:
            old = state["known"]
            for addr in sorted(set(old) - set(now)):
                report("remove", addr, old[addr])
            for addr in sorted(now):
                if addr not in old:
                    report("add", addr, now[addr])
                elif now[addr] != old[addr]:
                    report("change", addr, now[addr])
            state["known"] = now

    def present(now: dict[str, dict[str, Any]], where: str) -> None:
        with lock:
            state["known"] = now
            if not c.as_json:
                c.out.print(f"watching {where}: {len(now)} instance(s); Ctrl-C to stop")
            for addr, meta in sorted(now.items()):
                report("present", addr, meta)

    def reachability(why: str | None, url: str) -> None:
        """One line on stderr (and an event with --json) when the registry stops answering and when it is back."""
        text = f"{why if 'unreachable' in why else f'{url} unreachable: {why}'}; showing the last list until it " \
            "is back" if why else f"{url} is back"
        c.err.print(f"{time.strftime('%H:%M:%S')} {text}", markup=False)
        if c.as_json:
            c.emit({"event": "registry_unreachable" if why else "registry_reachable", "key": key, "registry": url,
                    "reason": why, "time": time.time()})
        sys.stdout.flush()

    if _is_target(key):
        _watch_target(c, key, timeout, duration, present, changed)
        return
    from ..discovery import Subscriber

    def snapshot(sub: Subscriber) -> dict[str, dict[str, Any]]:
        return {b.address: dict(b.metadata) for b in sub.backends()}

    with stop_on_signals() as stop:
        try:
            sub = Subscriber(c.registry(), key, exact=exact, format=fmt, timeout=timeout)
        except RegistryUnavailable:
            raise click.ClickException(unreachable(c.registry(), f"read {key!r}", timeout)) from None
        try:
            present(snapshot(sub), f"{key!r} ({fmt}) in {c.registry().url}")
            from .inspect import other_formats_hint

            hint = other_formats_hint(c.registry(), key, fmt, len(state["known"]), exact=exact)
            if hint:
                c.err.print(hint.replace("format=", "--format "), markup=False)
            sub.add_listener(lambda: changed(snapshot(sub)))
            changed(snapshot(sub))  # anything that changed between the snapshot and the listener
            from .inspect import follow_reachability

            follow_reachability(c.registry(), key, lambda why: reachability(why, c.registry().url), stop)
            _wait(stop, duration)
        finally:
            stop.set()  # ends the reachability thread
            sub.close()
    exit_if_interrupted(stop)


def _is_target(arg: str) -> bool:
    """``watch`` and ``resolve``: a dial target has a scheme (``etcd:///...``); anything else is a key in --registry."""
    return "://" in arg


def _watch_target(c: Ctx, target: str, timeout: float, duration: float | None,
                  present: Callable[[dict[str, dict[str, Any]], str], None],
                  changed: Callable[[dict[str, dict[str, Any]]], None]) -> None:
    """``waypost watch TARGET``: the dial target's resolver, reporting every list it pushes."""
    from ..lookup import follow

    seen: list[str] = []

    def on_error(message: str) -> None:
        if message not in seen[-1:]:
            c.err.print(f"{time.strftime('%H:%M:%S')} {message}", markup=False)
        seen.append(message)

    with stop_on_signals() as stop:
        resolver = follow(target, present, changed, on_error, timeout=timeout)
        try:
            _wait(stop, duration)
        finally:
            resolver.close()
    exit_if_interrupted(stop)


# --------------------------------------------------------------------------------------------- register


@app.command("register", short_help="Register ADDR under KEY until Ctrl-C.")
@click.argument("key")
@click.argument("addr")
@click.option("--ttl", default=10, show_default=True, type=click.IntRange(1, 3600), help="Lease TTL in seconds.")
@click.option("--meta", multiple=True, metavar="K=V", help="Metadata (repeatable); numbers and booleans are typed.")
@click.option("--id", "id_", default=None, help="Instance id (default: the lease id, as go-zero).")
@click.option("--format", "fmt", default=DEFAULT_FORMAT, show_default=True,
              type=click.Choice(FORMAT_NAMES), help="Wire format.")
@click.option("--for", "duration", type=click.FloatRange(min=0), default=None, metavar="SECONDS",
              help="Deregister after SECONDS (default: until Ctrl-C).")
@_global_options
@pass_ctx
def register_cmd(c: Ctx, key: str, addr: str, ttl: int, meta: tuple[str, ...], id_: str | None, fmt: str,
                 duration: float | None) -> None:
    """Register ADDR under KEY and keep it alive until Ctrl-C (then deregister)."""
    from ..netutil import split_host_port
    from ..registries.etcd.registrar import Publisher

    host, port = split_host_port(addr, what="ADDR")
    if not host or port is None:
        raise click.ClickException(f"ADDR {addr!r}: expected host:port (example: 10.0.0.5:8080)")
    from .inspect import parse_meta

    metadata = parse_meta(meta)
    with stop_on_signals() as stop:
        pub = Publisher(c.registry(), key, addr, ttl=ttl, id=id_, metadata=metadata or None, format=fmt)
        pub.start()
        try:
            info = {"event": "registered", "key": pub.key, "address": addr, "lease": pub.lease_id, "ttl": ttl,
                    "metadata": metadata, "format": fmt}
            if c.as_json:
                c.emit(info)
            else:
                c.out.print(f"[green]registered[/] {pub.key} = {addr} (lease {pub.lease_id}, ttl {ttl}s"
                            f"{', ' + _meta_text(metadata) if metadata else ''}); Ctrl-C to deregister")
            sys.stdout.flush()
            _wait(stop, duration)
        finally:
            pub.stop()
    if c.as_json:
        c.emit({"event": "deregistered", "key": key, "address": addr})
    else:
        c.out.print(f"deregistered {addr}")
    exit_if_interrupted(stop)


# --------------------------------------------------------------------------------------------- resolve


@app.command("resolve", short_help="What a client dialing TARGET (or KEY) would use.")
@click.argument("target")
@click.option("--subset", "subset_size", default=32, show_default=True, type=click.IntRange(0),
              help="Subset size a client keeps (0: no subsetting).")
@click.option("--client-id", default=None, help="Deterministic subsetting: this client's id.")
@_timeout_option
@_global_options
@pass_ctx
def resolve_cmd(c: Ctx, target: str, subset_size: int, client_id: str | None, timeout: float) -> None:
    """Show what a client dialing TARGET would use: addresses, metadata and its subset.

    TARGET is a dial target (etcd:///h:2379?key=greet.rpc, dns:///..., direct:///h:p) or a bare key in --registry."""
    from .inspect import resolve

    if not _is_target(target):
        from ..resolver.target import target_for_registry

        target = target_for_registry(c.registry(), target)
    result = resolve(target, subset_size=subset_size, client_id=client_id, timeout=timeout)
    if c.as_json:
        c.emit(result)
    if not result["backends"]:  # found nothing: a client dialing it fails its calls; status 1, as `host` does
        raise click.ClickException(_nothing_found(result))
    if c.as_json:
        return
    what = (f", key {result['key']!r}, {result['format']}" if result["format"] else f", service {result['key']!r}"
            ) if result.get("key") else ""
    t = Table(title=f"{result['target']}  ({result['scheme']}{what}): {len(result['backends'])} address(es), "
              f"{sum(b['in_subset'] for b in result['backends'])} in this client's subset", title_justify="left",
              title_style="bold")
    for col in ("address", "metadata", "in subset"):
        t.add_column(col, overflow="fold")
    for b in result["backends"]:
        t.add_row(b["address"], _meta_text(b["metadata"]), "yes" if b["in_subset"] else "[dim]no[/]")
    c.out.print(t)
    if result.get("note"):
        c.err.print(result["note"])


def _nothing_found(result: dict[str, Any]) -> str:
    """``resolve``'s one line for a target with no address: a registry key with nothing under it says so and names
    the registered keys closest to it; the wire-format note when records of another format are there."""
    if result.get("note"):
        return f"{result['target']}: no address; {result['note'].splitlines()[-1].removeprefix('note: ')}"
    if result["format"] and result.get("key"):
        close = result.get("close_keys") or []
        meant = f"; did you mean {' or '.join(repr(k) for k in close)}?" if close else ""
        return (f"nothing is registered under key {result['key']!r} in {result['target'].partition('?')[0]}{meant} "
                "(`waypost ls` lists the registered keys)")
    return f"{result['target']}: no address (a client dialing it would fail its calls)"


_register_demo(app, _global_options, pass_ctx)  # waypost demo / bench
app.add_command(xds_commands(_global_options, pass_ctx))  # waypost xds serve / bootstrap
_register_console(app, _global_options, pass_ctx)  # waypost console / drain / undrain / weight
one_line_errors(app)  # every command: an error found once it runs is one line (errors.py)

"""``waypost console`` (the live web page) and the operator actions ``waypost drain|undrain|weight``.

Registered on the ``waypost`` command group by ``waypost.cli.commands`` (``register``); this module does not import it.
"""

from __future__ import annotations

import getpass
import socket
import sys
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import click

from .signals import exit_if_interrupted, stop_on_signals

if TYPE_CHECKING:
    from ..discovery.store import Registry

CONSOLE_TOKEN_ENV = "WAYPOST_CONSOLE_TOKEN"


def _who() -> str:
    try:
        user = getpass.getuser()
    except Exception:  # noqa: BLE001 (no user name: still say where from)
        user = "?"
    return f"{user}@{socket.gethostname()} (cli)"


def _registered(registry: Registry, key: str, address: str) -> bool:
    """Whether ``address`` is registered under ``key`` now, in any wire format (for a note only)."""
    from ..discovery.formats import KRATOS_NAMESPACE
    from ..discovery.listing import classify

    kvs: list[Any] = []
    for prefix in (key + "/", f"{KRATOS_NAMESPACE}/{key}/"):
        kvs += registry.sync.get(prefix, prefix=True).kvs
    kvs += registry.sync.get(key).kvs  # go-zero's exact-match key
    return any(e["address"] == address for e in classify(kvs))


def _act(c: Any, verb: str, key: str, addr: str, weight: int | None = None) -> None:
    from .. import _loop
    from ..console.actions import ActionError, apply, make_action

    try:
        action = make_action(verb, {"key": key, "address": addr, "weight": weight})
    except ActionError as e:
        raise click.ClickException(str(e)) from None
    from ..kind_table import kind_of, part

    kind = kind_of(c.registry_url)
    written = ""  # what a store that writes no override record did instead (Eureka's status override)
    if kind is not None and kind.override_store is not None:  # a kind holding instances, with its own store
        store = part(kind, "override_store")(c.registry_url)
        done, present = _loop.run(_act_in_store(store, action), 30)
        where, written = done["source"], getattr(store, "written", "")
    else:
        registry = c.registry()
        done = _loop.run(apply(registry, action, _who(), source=registry.url), 30)
        where = registry.url
        try:
            present = _registered(registry, key, addr)
        except Exception:  # noqa: BLE001 (a note only)
            present = True
    if c.as_json:
        c.emit({**done, "registered": present, **({"record": None, "written": written} if written else {})})
        return
    what = {"drain": "drained (weight 0)", "weight": f"weight set to {weight}",
            "undrain": "override removed (its own weight again)"}[verb]
    c.out.print(f"{key} {addr}: {what} in {where}: {written}" if written else
                f"{key} {addr}: {what} in {where} ({done['record']}); its publisher applies it at once", markup=False)
    if not present:
        c.err.print(f"note: {addr} is not registered under {key!r} now; the override applies when it registers "
                    f"(a publisher that follows overrides: waypost's Publisher over etcd or memory)", markup=False)


async def _act_in_store(store: Any, action: Any) -> tuple[dict[str, Any], bool]:
    """An action on a registry kind's override store (``RegistryKind.override_store``: Consul's KV store,
    ZooKeeper's override znodes, ...); also whether the instance is registered there now."""
    from ..console.actions import apply

    try:
        done = await apply(store, action, _who(), source=store.url)
        try:
            present = bool(await store.registered(action.key, action.address))
        except Exception:  # noqa: BLE001 (a note only)
            present = True
        return {**done, "source": store.url}, present
    finally:
        await store.close()


def register(app: click.Group, global_options: Callable[..., Any], pass_ctx: Callable[..., Any]) -> None:
    """Add ``console``, ``drain``, ``undrain`` and ``weight`` to the ``waypost`` group."""

    @app.command("console", short_help="A live web page of every service and instance, with drain controls.")
    @click.option("--listen", default=None, metavar="HOST:PORT", help="Where to serve (default 127.0.0.1:8470).")
    @click.option("--registry", "registries", multiple=True, metavar="URL",
                  help="A registry to show, repeatable: etcd://, memory://, consul://, zk://, eureka:// "
                       "(default: the global --registry).")
    @click.option("--target", "targets", multiple=True, metavar="TARGET",
                  help="A dial target to show through its resolver, read-only (k8s://, consul://, zk://, dns:///).")
    @click.option("--metrics", "metrics", multiple=True, metavar="URL",
                  help="A client's waypost.metrics.serve URL (repeatable): what clients see, as live charts.")
    @click.option("--token", envvar=CONSOLE_TOKEN_ENV, default=None, metavar="TOKEN",
                  help=f"The token writes need (env {CONSOLE_TOKEN_ENV}; default: a new one, printed).")
    @click.option("--xds", "xds", default=None, metavar="HOST:PORT",
                  help="Also list the clients of this xDS control plane per service (its CSDS service).")
    @click.option("--read-only", is_flag=True, help="Refuse every write (drain, weight).")
    @click.option("--tls-cert", type=click.Path(exists=True, dir_okay=False), default=None, help="Serve HTTPS.")
    @click.option("--tls-key", type=click.Path(exists=True, dir_okay=False), default=None, help="Its key.")
    @click.option("--for", "duration", type=click.FloatRange(min=0), default=None, metavar="SECONDS",
                  help="Stop after SECONDS (default: until Ctrl-C).")
    @pass_ctx
    def console_cmd(c: Any, listen: str | None, registries: tuple[str, ...], targets: tuple[str, ...],
                    metrics: tuple[str, ...], xds: str | None, token: str | None, read_only: bool,
                    tls_cert: str | None,
                    tls_key: str | None, duration: float | None) -> None:
        """Serve a live web page of every key, instance and registry, with drain and weight controls.

        Writes need the token (printed at start unless given). See docs/console.md."""
        from ..netutil import bind_problem, join_host_port

        try:
            from ..console import DEFAULT_LISTEN, Console, ConsoleConfig
        except ImportError as e:
            raise click.ClickException(f"the console needs the console extra: pip install 'waypost[console]' ({e})")
        console = Console(ConsoleConfig(
            registries=list(registries) or [c.registry_url], targets=list(targets), metrics=list(metrics),
            listen=listen or DEFAULT_LISTEN, token=token, read_only=read_only, tls_cert=tls_cert,
            tls_key=tls_key, xds=xds))
        started = threading.Event()

        def on_started(url: str) -> None:
            if not console.loopback_only:
                click.echo(f"warning: listening on {url}, which is not a loopback address: anyone who can reach it "
                           "sees every registration" + ("" if tls_cert else ", in clear text (no --tls-cert)"),
                           err=True)
            if c.as_json:
                c.emit({"event": "serving", "url": url, "read_only": read_only,
                        "token": None if token or read_only else console.token})
            else:
                c.out.print(f"waypost console on [bold]{url}[/] ({', '.join(console.source_names())})")
                if read_only:
                    c.out.print("read-only: drain and weight are refused")
                elif token:
                    c.out.print(f"writes need the token from --token / {CONSOLE_TOKEN_ENV}")
                else:
                    c.out.print(f"write token: {console.token}   open {url}#token={console.token}")
                c.out.print("Ctrl-C to stop")
            sys.stdout.flush()
            started.set()

        with stop_on_signals() as stop:
            if duration is not None:
                timer = threading.Timer(duration, stop.set)
                timer.daemon = True
                timer.start()
            try:
                console.run(stop, on_started)
            except OSError as e:  # the port is taken, a TLS file is no key, ...
                address = join_host_port(console.host, console.port)
                raise click.ClickException(f"the console cannot listen on {address}: "
                                           f"{bind_problem(address) or e.strerror or e}") from None
        exit_if_interrupted(stop)

    def override_command(name: str, short_help: str) -> Callable[[Callable[..., None]], Any]:
        """An operator action on ADDR registered under KEY (drain, undrain, weight): same arguments and options."""
        def decorate(f: Callable[..., None]) -> Any:
            f = pass_ctx(global_options(click.argument("addr")(f)))
            return app.command(name, short_help=short_help)(click.argument("key")(f))
        return decorate

    @override_command("drain", "Take traffic off ADDR under KEY (weight 0 override).")
    def drain_cmd(c: Any, key: str, addr: str) -> None:
        """Drain ADDR registered under KEY: its publisher registers weight 0, so no policy picks it while its
        calls finish. Undo with waypost undrain KEY ADDR."""
        _act(c, "drain", key, addr)

    @override_command("undrain", "Remove the override of ADDR under KEY (undo drain or weight).")
    def undrain_cmd(c: Any, key: str, addr: str) -> None:
        """Remove the operator override of ADDR under KEY: its registration carries its own weight again."""
        _act(c, "undrain", key, addr)

    @override_command("weight", "Override the weight of ADDR under KEY.")
    @click.argument("weight", type=click.IntRange(0, 1_000_000))
    def weight_cmd(c: Any, key: str, addr: str, weight: int) -> None:
        """Set the weight of ADDR under KEY (0 drains it) until waypost undrain KEY ADDR."""
        _act(c, "weight", key, addr, weight)

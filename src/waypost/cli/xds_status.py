"""``waypost xds status``: what every client of an xDS control plane holds, from its CSDS service (docs/xds.md).

Asks ``envoy.service.status.v3.ClientStatusDiscoveryService/FetchClientStatus`` and prints one row per client
(as ``istioctl proxy-status`` does): its node id, cluster and zone, then per type (LDS, RDS, CDS, EDS) whether it
holds what was sent (SYNCED), has not answered yet (STALE) or rejected it (NACKED), with the version; NACK
messages and subscribed names never sent follow the table. On a terminal the table is drawn (rich); to a pipe or
a file it is plain text, one line per client with every cell whole, whatever the width. ``--json`` prints the
ClientStatusResponse itself.

Registered by ``waypost.cli.xds.xds_commands``; the xDS protos (the ``xds`` extra) are imported only when it runs.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from .xds_load import call_failed

if TYPE_CHECKING:
    import grpc

#: a type's cell names the worst state among its resources (NACKED first)
_WORST_FIRST = ("ERROR", "STALE", "SYNCED", "NOT_SENT")
_SHOWN = {"ERROR": "NACKED", "STALE": "STALE", "SYNCED": "SYNCED", "NOT_SENT": "NOT SENT"}
_STYLE = {"ERROR": "red", "STALE": "yellow", "SYNCED": "green", "NOT_SENT": "yellow"}


def fetch_status(server: str, node_prefix: str | None, tls: TlsFlags, timeout: float) -> Any:
    """The ClientStatusResponse of ``server`` (clients whose node id starts with ``node_prefix``, if given);
    raises click.ClickException saying why there is none."""
    import grpc
    from envoy.service.status.v3 import csds_pb2, csds_pb2_grpc
    from envoy.type.matcher.v3 import node_pb2, string_pb2

    request = csds_pb2.ClientStatusRequest()
    if node_prefix is not None:
        request.node_matchers.append(node_pb2.NodeMatcher(node_id=string_pb2.StringMatcher(prefix=node_prefix)))
    if tls.given:  # probed first: gRPC logs a failed handshake of its own on stderr before failing the call
        raise_on_tls_mismatch(server, tls, timeout)
    credentials = tls.credentials()
    channel = grpc.secure_channel(server, credentials) if credentials is not None else grpc.insecure_channel(server)
    try:
        return csds_pb2_grpc.ClientStatusDiscoveryServiceStub(channel).FetchClientStatus(request, timeout=timeout)
    except grpc.RpcError as e:
        code, details = e.code(), e.details() or ""  # type: ignore[attr-defined]  # a call's error is its Call
        if code is grpc.StatusCode.UNIMPLEMENTED:
            raise click.ClickException(f"{server} is not an xDS control plane with CSDS "
                                       "(it does not serve envoy.service.status.v3.ClientStatusDiscoveryService)"
                                       ) from None
        if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED) and not tls.given:
            # gRPC says "Socket closed" when a plaintext call meets a TLS port: a probe of the port tells
            raise_on_tls_mismatch(server, tls, timeout)
        raise call_failed(server, code, details, timeout) from None
    finally:
        channel.close()


@dataclass(frozen=True)
class TlsFlags:
    """The TLS flags of ``waypost xds status``: none given is a plaintext call."""

    ca: Path | None = None
    cert: Path | None = None
    key: Path | None = None

    def __post_init__(self) -> None:
        if (self.cert is None) != (self.key is None):
            raise click.UsageError("--tls-cert and --tls-key go together")

    @property
    def given(self) -> bool:
        return self.ca is not None or self.cert is not None

    def credentials(self) -> grpc.ChannelCredentials | None:
        """TLS channel credentials from the flags (None: plaintext)."""
        if not self.given:
            return None
        import grpc

        def read(p: Path | None) -> bytes | None:
            return p.read_bytes() if p is not None else None

        return grpc.ssl_channel_credentials(root_certificates=read(self.ca), private_key=read(self.key),
                                            certificate_chain=read(self.cert))


def raise_on_tls_mismatch(server: str, tls: TlsFlags, timeout: float) -> None:
    """Raises click.ClickException saying what a probe of ``server``'s port shows wrong with these TLS flags
    (``tls_mismatch``), if anything."""
    why = tls_mismatch(server, tls, timeout)
    if why is not None:
        raise click.ClickException(why)


def tls_mismatch(server: str, tls: TlsFlags, timeout: float) -> str | None:
    """Why a call to ``server`` with these TLS flags fails, when a probe of its port shows a TLS mismatch (one
    line: what happened and the flags to pass); None when the probe shows none (``xds/tls_probe.py``)."""
    import ssl

    from ..netutil import split_host_port
    from ..xds.tls_probe import probe_tls

    try:
        host, port = split_host_port(server, what="--server")
    except ValueError:
        return None
    if port is None:
        return None
    try:
        p = probe_tls(host, port, ca=tls.ca, cert=tls.cert, key=tls.key, timeout=min(timeout, 5.0))
    except (ssl.SSLError, OSError) as e:
        return f"cannot use the TLS files given (--tls-ca, --tls-cert, --tls-key): {e}"
    if p is None or p.tls is None:
        return None
    where = f"the control plane at {server}"
    if not tls.given:
        if not p.tls:
            return None  # plaintext on both sides: not a TLS matter
        if p.asks_cert:
            return (f"the TLS handshake failed: {where} serves TLS and asks for a client certificate (mTLS), and "
                    "this call was plaintext; pass --tls-ca, --tls-cert and --tls-key")
        return (f"the TLS handshake failed: {where} serves TLS and this call was plaintext; pass --tls-ca (and "
                "--tls-cert/--tls-key if it asks for a client certificate)")
    if not p.tls:
        return (f"the TLS handshake failed: {where} does not serve TLS (it answered in plaintext); leave out "
                "--tls-ca, --tls-cert and --tls-key")
    if p.untrusted:
        trusted = f"--tls-ca {tls.ca}" if tls.ca is not None else "the system's CA certificates"
        return (f"the TLS handshake failed: the certificate of {where} is not trusted by {trusted} "
                f"({p.untrusted}); pass --tls-ca with the CA that signed it")
    if p.accepted:
        return None
    if tls.cert is None:
        if p.asks_cert:
            return (f"a client certificate is required: {where} asks for one (mTLS) and closed the connection "
                    "without it; pass --tls-cert and --tls-key")
        return None
    return (f"{where} refused the client certificate {tls.cert} (it closed the connection after the TLS "
            "handshake); pass a certificate signed by a CA it trusts (its --client-ca)")


def type_cell(configs: list[Any]) -> tuple[str, str]:
    """(text, rich style) of one type's column for one client: its worst state and the version sent."""
    from envoy.service.status.v3 import csds_pb2

    if not configs:
        return "-", "dim"
    states = {csds_pb2.ConfigStatus.Name(g.config_status) for g in configs}
    worst = next((s for s in _WORST_FIRST if s in states), min(states))
    versions = sorted({g.version_info for g in configs if g.version_info})
    text = _SHOWN.get(worst, worst)
    if versions:
        text += f" ({', '.join(v[:8] for v in versions)})"
    return text, _STYLE.get(worst, "")


def rows(response: Any) -> tuple[list[list[tuple[str, str]]], list[str]]:
    """The table's rows (one per client; cells as (text, style)) and the notes below it (NACKs, names not sent)."""
    from envoy.service.status.v3 import csds_pb2

    from ..xds.resources import SHORT, TYPES

    table, notes = [], []
    for config in response.config:
        node = config.node
        who = " ".join(p for p in (node.id or "?", config.client_scope) if p)
        per_type: dict[str, list[Any]] = {t: [] for t in TYPES}
        for g in config.generic_xds_configs:
            per_type.setdefault(g.type_url, []).append(g)
            short = SHORT.get(g.type_url, g.type_url.rsplit(".", 1)[-1])
            if g.config_status == csds_pb2.ERROR:
                notes.append(f"{who}: {short} {g.name!r} version {g.error_state.version_info or '?'} "
                             f"NACKED: {g.error_state.details}")
            elif g.config_status == csds_pb2.NOT_SENT:
                notes.append(f"{who}: {short} {g.name!r} subscribed, not sent (not exported, or no "
                             "endpoints known yet)")
        zone = "/".join(p for p in (node.locality.region, node.locality.zone, node.locality.sub_zone) if p)
        table.append([(node.id or "?", ""), (config.client_scope or "-", ""), (node.cluster or "-", ""),
                      (zone or "-", "")]
                     + [type_cell(per_type[t]) for t in TYPES])
    return table, notes


def plain_table(header: list[str], body: list[list[str]]) -> str:
    """The table as text: columns padded with spaces, every cell whole (never wrapped or cut)."""
    widths = [max(len(r[i]) for r in (header, *body)) for i in range(len(header))]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(r, widths)).rstrip() for r in (header, *body))


def print_table(c: Any, title: str, header: list[str], rows: list[list[tuple[str, str]]]) -> None:
    """A table of (text, rich style) cells: drawn by rich on a terminal; to a pipe or a file, plain text with whole
    cells, one line per row, whatever the width (grep, awk, logs)."""
    if c.out.is_terminal:
        from rich.table import Table
        from rich.text import Text

        t = Table(title=title, title_justify="left", title_style="bold")
        for col in header:
            t.add_column(col, overflow="fold")
        for row in rows:
            t.add_row(*(Text(text, style=style) for text, style in row))
        c.out.print(t)
    else:
        click.echo(title)
        click.echo(plain_table(header, [[text for text, _ in row] for row in rows]))


def response_json(response: Any) -> str:
    """The ClientStatusResponse as JSON; a resource of a type this process has no descriptor of is printed
    without its contents (its type, name, version and states stay), with a note on stderr."""
    from google.protobuf.json_format import MessageToJson

    from ..xds import resources  # noqa: F401  (registers every type waypost serves, for the Any fields)

    try:
        return MessageToJson(response, indent=2, sort_keys=True)
    except TypeError as e:  # json_format cannot render an Any of an unknown type
        click.echo(f"note: resource contents left out: {e}", err=True)
        stripped = type(response)()
        stripped.CopyFrom(response)
        for config in stripped.config:
            for g in config.generic_xds_configs:
                g.ClearField("xds_config")
        return MessageToJson(stripped, indent=2, sort_keys=True)


def status_command(global_options: Callable[[Any], Any], pass_ctx: Callable[[Any], Any]) -> click.Command:
    """``waypost xds status``, with the caller's global options."""

    @click.command("status", short_help="What each client of an xDS control plane holds (CSDS).")
    @click.option("--server", required=True, metavar="HOST:PORT", help="The control plane (waypost xds serve).")
    @click.option("--node", "node_prefix", default=None, metavar="PREFIX",
                  help="Only the clients whose node id starts with PREFIX.")
    @click.option("--tls-ca", type=click.Path(dir_okay=False, exists=True, path_type=Path), default=None,
                  help="Reach a TLS control plane, trusting these CA certificates (PEM).")
    @click.option("--tls-cert", type=click.Path(dir_okay=False, exists=True, path_type=Path), default=None,
                  help="A client certificate chain (PEM) for a control plane that asks for one.")
    @click.option("--tls-key", type=click.Path(dir_okay=False, exists=True, path_type=Path), default=None,
                  help="The private key of --tls-cert (PEM).")
    @click.option("--timeout", type=click.FloatRange(min=0, min_open=True), default=10.0, show_default=True,
                  help="Seconds to wait for the answer.")
    @click.option("--load", "load", is_flag=True,
                  help="Show the load the clients report instead (per export and locality: rates, in flight, "
                       "errors, dropped calls, ORCA metrics).")
    @global_options
    @pass_ctx
    def status_cmd(c: Any, server: str, node_prefix: str | None, tls_ca: Path | None, tls_cert: Path | None,
                   tls_key: Path | None, timeout: float, load: bool) -> None:
        """List every client connected to the control plane at --server (one row per ADS stream: a process that
        dials several targets has one per target, TARGET) and, per resource type, whether it holds
        the version sent (SYNCED), has not answered it yet (STALE) or rejected it (NACKED, with the client's
        message below the table). --json prints the CSDS ClientStatusResponse as JSON. --load shows the load the
        clients report instead (exports with load_reporting)."""
        try:
            import waypost.xds  # noqa: F401  (names the extra to install when it is missing)
        except ImportError as e:
            raise click.ClickException(str(e)) from None
        if load and node_prefix is not None:
            raise click.UsageError("--node filters the client status; --load sums every client's reports: give one")
        if load:  # the LRS view (cli/xds_load.py)
            from .xds_load import HEADER, NONE_YET, fetch_load, load_rows, load_title

            tls = TlsFlags(tls_ca, tls_cert, tls_key)
            if tls.given:
                raise_on_tls_mismatch(server, tls, timeout)
            view = fetch_load(server, tls.credentials(), timeout)
            if c.as_json:
                click.echo(json.dumps(view, indent=2, sort_keys=True))
            elif not view["clusters"]:
                c.out.print(load_title(server, view) + NONE_YET, markup=False)
            else:
                print_table(c, load_title(server, view), HEADER, [[(cell, "") for cell in r] for r in load_rows(view)])
            return
        response = fetch_status(server, node_prefix, TlsFlags(tls_ca, tls_cert, tls_key), timeout)
        if c.as_json:
            click.echo(response_json(response))
            return
        if not response.config:
            c.out.print(f"no client connected to {server}" + (f" with a node id starting {node_prefix!r}"
                                                             if node_prefix is not None else ""), markup=False)
            return
        from ..xds.resources import SHORT

        table, notes = rows(response)
        title = f"{server}  ({len(table)} client{'s' if len(table) != 1 else ''})"
        header = ["NODE", "TARGET", "CLUSTER", "ZONE", *SHORT.values()]
        print_table(c, title, header, table)
        for note in notes:
            c.out.print(note, markup=False)

    return status_cmd

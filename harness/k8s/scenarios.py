"""Scenarios that run inside the private network namespace (harness/k8s/netns_host.py), one call each:
``SCENARIOS[name](cluster, **args)`` with a started ``harness.k8s.support.KubeCluster``; raise to fail.

Pods are 10.77.0.2-9 on the namespace's lo (``k8s_support.POD_ADDRESSES``). The cluster lives as long as the
host process does and is shared by the scenarios: use namespaces/names of your own (``unique()``).
"""

from __future__ import annotations

import itertools
import os
import time
from collections.abc import Callable
from typing import Any

import grpc

from harness.backends import echo_pb2, echo_pb2_grpc
from harness.backends.server import EchoServer

_ids = itertools.count(1)


def unique(prefix: str) -> str:
    """A DNS-1123 name no other scenario in this host uses."""
    return f"{prefix}-{os.getpid()}-{next(_ids)}"


def start_backends(hosts: list[str], names: list[str] | None = None) -> tuple[list[EchoServer], int]:
    """Echo servers on ``hosts``, all on one port (an EndpointSlice's ports apply to all its endpoints)."""
    names = names or [f"pod-{h.rsplit('.', 1)[-1]}" for h in hosts]
    first = EchoServer(names[0], bind_host=hosts[0])
    servers = [first]
    try:
        servers += [EchoServer(n, port=first.port, bind_host=h) for n, h in zip(names[1:], hosts[1:])]
    except BaseException:
        first.stop()
        raise
    for s in servers:
        s.start()
    return servers, first.port


def pods_reachable(cluster: Any) -> None:
    """Namespace + Service + EndpointSlice for 10.77.0.2/3, real gRPC servers there, plain channels reach them."""
    ns, svc = unique("reach"), "echo"
    cluster.create_namespace(ns)
    cluster.create_service(ns, svc, ports=[("grpc", 50051)])
    servers, port = start_backends(["10.77.0.2", "10.77.0.3"])
    try:
        rv = cluster.put_slice(ns, f"{svc}-1", svc, endpoints=[
            {"addresses": ["10.77.0.2"], "conditions": {"ready": True}},
            {"addresses": ["10.77.0.3"], "conditions": {"ready": True}},
        ], ports=[{"name": "grpc", "port": port, "protocol": "TCP"}])
        got = cluster.list_slices(ns, svc)
        assert [s["metadata"]["resourceVersion"] for s in got["items"]] == [rv], got
        addrs = sorted(a for ep in got["items"][0]["endpoints"] for a in ep["addresses"])
        assert addrs == ["10.77.0.2", "10.77.0.3"], addrs
        for addr, name in (("10.77.0.2", "pod-2"), ("10.77.0.3", "pod-3")):
            with grpc.insecure_channel(f"{addr}:{port}") as ch:
                reply = echo_pb2_grpc.EchoStub(ch).Unary(echo_pb2.EchoRequest(message="hi"), timeout=10)
            assert (reply.server, reply.message) == (name, "hi"), reply
    finally:
        for s in servers:
            s.stop()


# ---- the k8s:// resolver against the real apiserver -------------------------------------------------------
#
# Every wait is bounded (harness.waiting.wait_until); every channel, resolver, proxy and server is closed in a
# finally. The kubeconfigs live in the cluster's directory.

Req = echo_pb2.EchoRequest


def _kubeconfig(cluster: Any, **kw: Any) -> str:
    return str(cluster.write_kubeconfig(cluster.dir / f"{unique('kubeconfig')}.yaml", **kw))


def _servers_hit(stub: Any, calls: int = 24) -> set[str]:
    return {stub.Unary(Req(), timeout=10).server for _ in range(calls)}


def _grpc_port(port: int) -> list[dict[str, Any]]:
    return [{"name": "grpc", "port": port, "protocol": "TCP"}]


def _stop(servers: list[EchoServer]) -> None:
    for srv in servers:
        srv.stop()


def slices_merged_readiness_terminating(cluster: Any) -> None:
    """Two slices of one service merged (IPv4 and IPv6), readiness flipping both ways, a terminating endpoint never
    called, another service's slice ignored; calls go where the slices say."""
    import subprocess

    import waypost
    from harness.waiting import wait_until

    subprocess.run(["ip", "-6", "addr", "add", "fd77::2/128", "dev", "lo"], check=False, capture_output=True)
    ns, svc = unique("merge"), "greet"
    cluster.create_namespace(ns)
    servers, port = start_backends(["10.77.0.2", "10.77.0.3", "10.77.0.4", "10.77.0.5"])
    servers.append(EchoServer("pod-v6", port=port, bind_host="[fd77::2]"))
    servers[-1].start()
    try:
        cluster.put_slice(ns, "greet-a", svc, endpoints=["10.77.0.2", "10.77.0.3"], ports=_grpc_port(port))
        cluster.put_slice(ns, "greet-b", svc, endpoints=[
            {"addresses": ["10.77.0.4"], "conditions": {"ready": True, "serving": True, "terminating": True}}],
            ports=_grpc_port(port))
        cluster.put_slice(ns, "greet-v6", svc, address_type="IPv6", endpoints=["fd77::2"], ports=_grpc_port(port))
        cluster.put_slice(ns, "other-a", "other", endpoints=["10.77.0.5"], ports=_grpc_port(port))
        target = f"k8s://{ns}/{svc}:grpc?kubeconfig={_kubeconfig(cluster)}"
        with waypost.dial(target, balancer="round_robin") as ch:
            stub = echo_pb2_grpc.EchoStub(ch)
            # round_robin picks among READY connections only: wait for all three before counting who is called
            wait_until(lambda: len(ch.balancer.ready_addresses()) == 3, 20, what="three backends READY")
            assert _servers_hit(stub) == {"pod-2", "pod-3", "pod-v6"}  # not the terminating pod-4, not other's pod-5
            addrs = sorted(sc.address for sc in ch.balancer.subconns())
            assert addrs == sorted([f"10.77.0.2:{port}", f"10.77.0.3:{port}", f"[fd77::2]:{port}"]), addrs
            # pod-4 ready again (a new pod in slice b): it gets calls
            cluster.put_slice(ns, "greet-b", svc, endpoints=["10.77.0.4"], ports=_grpc_port(port))
            wait_until(lambda: "pod-4" in _servers_hit(stub), 15, what="pod-4 called once ready")
            # pod-3 not ready: no more calls there
            cluster.put_slice(ns, "greet-a", svc, endpoints=[
                "10.77.0.2", {"addresses": ["10.77.0.3"], "conditions": {"ready": False}}], ports=_grpc_port(port))
            wait_until(lambda: "pod-3" not in _servers_hit(stub), 15, what="pod-3 dropped when not ready")
            assert _servers_hit(stub, 40) == {"pod-2", "pod-4", "pod-v6"}
            # back to ready
            cluster.put_slice(ns, "greet-a", svc, endpoints=["10.77.0.2", "10.77.0.3"], ports=_grpc_port(port))
            wait_until(lambda: "pod-3" in _servers_hit(stub), 15, what="pod-3 back when ready")
            # the whole slice b deleted
            cluster.delete_slice(ns, "greet-b")
            wait_until(lambda: _servers_hit(stub, 40) == {"pod-2", "pod-3", "pod-v6"}, 15, what="slice b deleted")
    finally:
        _stop(servers)


def named_and_numbered_ports_and_context_namespace(cluster: Any) -> None:
    """The port as a name or a number; a target without a namespace takes the kubeconfig context's, also of a
    context chosen with ?context=."""
    import waypost

    ns, svc = unique("ports"), "greet"
    cluster.create_namespace(ns)
    servers, port = start_backends(["10.77.0.6"])
    try:
        cluster.put_slice(ns, "greet-a", svc, endpoints=["10.77.0.6"],
                          ports=[{"name": "http", "port": 8080, "protocol": "TCP"}, *_grpc_port(port)])
        kc = _kubeconfig(cluster, namespace=ns)
        # ?context= picks another context of the file (its namespace too); the current one names no namespace
        two = _kubeconfig(cluster, extra_contexts={"other": {"namespace": ns}})
        for target in (f"k8s://{ns}/{svc}:grpc?kubeconfig={kc}", f"k8s:///{ns}/{svc}:{port}?kubeconfig={kc}",
                       f"k8s:///{svc}:grpc?kubeconfig={kc}", f"k8s:///{svc}:grpc?kubeconfig={two}&context=other"):
            with waypost.dial(target) as ch:
                assert echo_pb2_grpc.EchoStub(ch).Unary(Req(), timeout=10).server == "pod-6", target
                assert [sc.address for sc in ch.balancer.subconns()] == [f"10.77.0.6:{port}"], target
    finally:
        _stop(servers)


def service_appears_after_dial(cluster: Any) -> None:
    """Dial a service that has no slices yet (sync and aio): calls fail fast meanwhile; the first slice is used."""
    import asyncio

    import waypost
    import waypost.aio
    from harness.waiting import wait_until

    ns, svc = unique("later"), "greet"
    cluster.create_namespace(ns)
    servers, port = start_backends(["10.77.0.7"])
    try:
        target = f"k8s://{ns}/{svc}:grpc?kubeconfig={_kubeconfig(cluster)}"
        with waypost.dial(target) as ch:
            stub = echo_pb2_grpc.EchoStub(ch)
            try:
                stub.Unary(Req(), timeout=2)
                raise AssertionError("a call succeeded with no endpoints")
            except grpc.RpcError as e:
                assert e.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED), e

            async def aio_call() -> str:
                async with waypost.aio.dial(target) as ach:
                    r = await echo_pb2_grpc.EchoStub(ach).Unary(Req(), timeout=15, wait_for_ready=True)
                    return str(r.server)

            loop = asyncio.new_event_loop()
            try:
                pending = loop.create_task(aio_call())
                loop.run_until_complete(asyncio.sleep(0.5))
                cluster.create_service(ns, svc, ports=[("grpc", port)])
                cluster.put_slice(ns, "greet-a", svc, endpoints=["10.77.0.7"], ports=_grpc_port(port))
                assert loop.run_until_complete(asyncio.wait_for(pending, 20)) == "pod-7"
            finally:
                loop.close()
            wait_until(lambda: _servers_hit(stub, 4) == {"pod-7"}, 15, what="the sync channel sees the new slice")
    finally:
        _stop(servers)


def _recording_resolver(target: str) -> tuple[Any, list[list[str]], list[str]]:
    from waypost.resolver import ResolverOptions, make_resolver

    pushes: list[list[str]] = []
    errors: list[str] = []
    r: Any = make_resolver(target, ResolverOptions(blocking=True))
    r.start(lambda bs: pushes.append([b.address for b in bs]), errors.append)
    return r, pushes, errors


def relist_after_410_without_spurious_removal(cluster: Any) -> None:
    """The link to the apiserver is cut; meanwhile one slice is deleted, another changed, and etcd compacted; on
    reconnect the watch's version is gone (410): a relist, whose diff drops exactly what went away. Endpoints
    present all along are never removed, not even for one push, and the last list was kept during the cut."""
    from harness.tcp_proxy import TcpProxy
    from harness.waiting import wait_until

    ns, svc = unique("gone"), "greet"
    cluster.create_namespace(ns)
    cluster.put_slice(ns, "greet-a", svc, endpoints=["10.77.0.2", "10.77.0.3"])
    cluster.put_slice(ns, "greet-b", svc, endpoints=["10.77.0.4"])
    proxy = TcpProxy(("127.0.0.1", cluster.port))
    kc = _kubeconfig(cluster, server=f"https://127.0.0.1:{proxy.port}")
    r, pushes, errors = _recording_resolver(f"k8s://{ns}/{svc}:grpc?kubeconfig={kc}")
    try:
        assert pushes == [["10.77.0.2:50051", "10.77.0.3:50051", "10.77.0.4:50051"]], pushes
        wait_until(lambda: r.discovery.watches >= 1, 10, what="the watch is open")
        proxy.cut()
        wait_until(lambda: errors, 15, what="the resolver notices the cut")
        cluster.delete_slice(ns, "greet-b")
        cluster.put_slice(ns, "greet-a", svc, endpoints=["10.77.0.2", "10.77.0.3", "10.77.0.5"])
        cluster.force_watch_gone()
        assert len(pushes) == 1, pushes  # the last list is kept while unreachable
        proxy.restore()
        want = ["10.77.0.2:50051", "10.77.0.3:50051", "10.77.0.5:50051"]
        wait_until(lambda: pushes[-1] == want, 30, what="the relisted endpoints")
        assert r.discovery.relists >= 1 and r.discovery.lists >= 2, (r.discovery.relists, r.discovery.lists)
        for p in pushes:  # never a list without the endpoints that stayed
            assert {"10.77.0.2:50051", "10.77.0.3:50051"} <= set(p), pushes
        # and the watch goes on from the relist's version
        cluster.put_slice(ns, "greet-c", svc, endpoints=["10.77.0.6"])
        wait_until(lambda: "10.77.0.6:50051" in pushes[-1], 15, what="a change after the relist")
    finally:
        r.close()
        proxy.close()


def apiserver_restart_keeps_serving(cluster: Any) -> None:
    """The apiserver is killed and restarted under load: 0 failed calls (the last list is used meanwhile), and
    a pod added after the restart gets calls."""
    import threading

    import waypost
    from harness.waiting import wait_until

    ns, svc = unique("restart"), "greet"
    cluster.create_namespace(ns)
    servers, port = start_backends(["10.77.0.2", "10.77.0.3", "10.77.0.8"])
    stop = threading.Event()
    sent, failed = [0], []
    try:
        cluster.put_slice(ns, "greet-a", svc, endpoints=["10.77.0.2", "10.77.0.3"], ports=_grpc_port(port))
        target = f"k8s://{ns}/{svc}:grpc?kubeconfig={_kubeconfig(cluster)}"
        with waypost.dial(target, balancer="round_robin") as ch:
            stub = echo_pb2_grpc.EchoStub(ch)
            assert _servers_hit(stub) == {"pod-2", "pod-3"}

            def load() -> None:
                deadline = time.monotonic() + 60
                while not stop.is_set() and time.monotonic() < deadline:
                    try:
                        stub.Unary(Req(), timeout=5)
                    except grpc.RpcError as e:
                        failed.append(e.code())
                    sent[0] += 1
                    time.sleep(0.005)

            worker = threading.Thread(target=load, daemon=True)
            worker.start()
            cluster.restart_apiserver(down_s=2, kill=True)
            cluster.put_slice(ns, "greet-a", svc, endpoints=["10.77.0.2", "10.77.0.3", "10.77.0.8"],
                              ports=_grpc_port(port))
            wait_until(lambda: "pod-8" in _servers_hit(stub), 30, what="a pod added after the restart")
            stop.set()
            worker.join(10)
            assert sent[0] > 100 and not failed, (sent[0], failed[:5])
    finally:
        stop.set()
        _stop(servers)


def kubeconfig_auth_and_clear_refusals(cluster: Any) -> None:
    """Token auth from a kubeconfig: a token without RBAC rights is refused with the 403 and the rule to add, a
    wrong token with the 401 and where it came from; granted, the same kubeconfig works; client certs too."""
    import waypost
    from harness.k8s.support import READER_TOKEN
    from waypost.errors import RegistryUnavailable

    ns, svc = unique("auth"), "greet"
    cluster.create_namespace(ns)
    servers, port = start_backends(["10.77.0.9"])
    try:
        cluster.put_slice(ns, "greet-a", svc, endpoints=["10.77.0.9"], ports=_grpc_port(port))
        reader = _kubeconfig(cluster, token=READER_TOKEN)
        for kc, words in ((reader, ["403", "endpointslices.discovery.k8s.io", ns]),
                          (_kubeconfig(cluster, token="no-such-token"), ["401", "kubeconfig"])):
            t0 = time.monotonic()
            try:
                waypost.dial(f"k8s://{ns}/{svc}:grpc?kubeconfig={kc}").close()
                raise AssertionError("dial succeeded with refused credentials")
            except RegistryUnavailable as e:
                assert all(w in str(e) for w in words), (words, str(e))
            assert time.monotonic() - t0 < 4, "a refusal fails the dial at once, not after the timeout"
        cluster.grant(ns, "reader")
        for kc in (reader, _kubeconfig(cluster, token=None, client_cert=True)):
            with waypost.dial(f"k8s://{ns}/{svc}:grpc?kubeconfig={kc}") as ch:
                assert echo_pb2_grpc.EchoStub(ch).Unary(Req(), timeout=10).server == "pod-9"
    finally:
        _stop(servers)


def in_cluster_config_and_token_rotation(cluster: Any) -> None:
    """In-cluster configuration (service host/port, the service account's token, CA and namespace): a target
    without a namespace uses the pod's; a rotated token file is read again (a bad one -> 401 on the next
    request, a good one again -> it recovers)."""
    import shutil

    from harness.k8s.support import ADMIN_TOKEN
    from harness.tcp_proxy import TcpProxy
    from harness.waiting import wait_until
    from waypost.registries.kubernetes import config as k8s_config

    ns, svc = unique("pod"), "greet"
    cluster.create_namespace(ns)
    cluster.put_slice(ns, "greet-a", svc, endpoints=["10.77.0.2"])
    sa = cluster.dir / unique("serviceaccount")
    sa.mkdir()
    shutil.copy(cluster.ca_file, sa / "ca.crt")
    (sa / "namespace").write_text(ns)

    def rotate(token: str) -> None:  # as the kubelet does: a new file renamed over the old one
        tmp = sa / "token.new"
        tmp.write_text(token)
        os.replace(tmp, sa / "token")

    rotate(ADMIN_TOKEN)
    proxy = TcpProxy(("127.0.0.1", cluster.port))
    saved = {k: os.environ.get(k) for k in ("KUBERNETES_SERVICE_HOST", "KUBERNETES_SERVICE_PORT", "KUBECONFIG")}
    old_dir = k8s_config.SERVICE_ACCOUNT_DIR
    os.environ.update(KUBERNETES_SERVICE_HOST="127.0.0.1", KUBERNETES_SERVICE_PORT=str(proxy.port))
    os.environ.pop("KUBECONFIG", None)
    k8s_config.SERVICE_ACCOUNT_DIR = sa
    r = None
    try:
        r, pushes, errors = _recording_resolver(f"k8s:///{svc}:grpc")
        assert r.discovery.source == "in-cluster" and r.discovery.namespace == ns, (r.discovery.source, r.discovery.namespace)
        assert pushes == [["10.77.0.2:50051"]], pushes
        wait_until(lambda: r.discovery.watches >= 1, 10, what="the watch is open")  # through the proxy, before the cut
        rotate("expired-token")
        proxy.cut()  # the next request (the resumed watch) carries the file's token
        proxy.restore()
        wait_until(lambda: any("401" in e for e in errors), 20, what="the rotated (bad) token is used")
        rotate(ADMIN_TOKEN)
        cluster.put_slice(ns, "greet-a", svc, endpoints=["10.77.0.2", "10.77.0.3"])
        wait_until(lambda: pushes[-1] == ["10.77.0.2:50051", "10.77.0.3:50051"], 30,
                   what="recovered with the rotated (good) token")
    finally:
        if r is not None:
            r.close()
        proxy.close()
        k8s_config.SERVICE_ACCOUNT_DIR = old_dir
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def cli_resolve_and_watch(cluster: Any) -> None:
    """``waypost resolve`` and ``waypost watch`` with a k8s target (the CLI in a child process, same namespace)."""
    import json
    import subprocess
    import sys

    ns, svc = unique("cli"), "greet"
    cluster.create_namespace(ns)
    cluster.put_slice(ns, "greet-a", svc, endpoints=["10.77.0.2", "10.77.0.3"])
    target = f"k8s://{ns}/{svc}:grpc?kubeconfig={_kubeconfig(cluster)}"
    out = subprocess.run([sys.executable, "-m", "waypost.cli", "--json", "resolve", target], check=False,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout)
    assert got["scheme"] == "k8s" and [b["address"] for b in got["backends"]] == \
        ["10.77.0.2:50051", "10.77.0.3:50051"], got
    watch = subprocess.Popen([sys.executable, "-m", "waypost.cli", "--json", "watch", target, "--for", "20"],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert watch.stdout is not None
        first = [json.loads(watch.stdout.readline()) for _ in range(2)]
        assert [(e["event"], e["address"]) for e in first] == [("present", "10.77.0.2:50051"),
                                                               ("present", "10.77.0.3:50051")], first
        cluster.put_slice(ns, "greet-a", svc, endpoints=["10.77.0.3", "10.77.0.4"])
        events = [json.loads(watch.stdout.readline()) for _ in range(2)]
        assert sorted((e["event"], e["address"]) for e in events) == [("add", "10.77.0.4:50051"),
                                                                      ("remove", "10.77.0.2:50051")], events
    finally:
        watch.kill()
        watch.wait(10)


def examples_in_pods(cluster: Any) -> None:
    """examples/kubernetes: two servers as pods (10.77.0.4, 10.77.0.5; registry=None, readiness through health),
    their slice written as the EndpointSlice controller would once the probe passes, and the example client
    calling through k8s://. Then SIGTERM to one: it reports NOT_SERVING (the probe's signal) and still answers
    during its drain delay."""
    import signal
    import subprocess
    import sys
    from pathlib import Path

    from grpc_health.v1 import health_pb2, health_pb2_grpc

    root = Path(__file__).resolve().parents[2]
    ns = unique("examples")
    cluster.create_namespace(ns)
    port = 50051
    procs = []
    try:
        for ip in ("10.77.0.4", "10.77.0.5"):
            # each pod has a network of its own in Kubernetes; here they share one, so each binds its own address
            p = subprocess.Popen([sys.executable, str(root / "examples/kubernetes/server.py"), "--host", ip,
                                  "--port", str(port), "--drain-delay", "3"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                 env={**os.environ, "POD_IP": ip})
            procs.append(p)
            line = p.stdout.readline() if p.stdout else ""
            assert line.startswith("serving greet on "), (line, p.stderr.read() if p.poll() is not None else "")
        for ip in ("10.77.0.4", "10.77.0.5"):  # the kubelet's probe: SERVING before the pod is in the slice
            with grpc.insecure_channel(f"{ip}:{port}") as ch:
                status = health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(), timeout=5).status
                assert status == health_pb2.HealthCheckResponse.SERVING, (ip, status)
        cluster.put_slice(ns, "greet-abc12", "greet", endpoints=["10.77.0.4", "10.77.0.5"], ports=_grpc_port(port))
        # enough calls that both pods are READY before the last ones (the first calls may all go to the pod
        # whose connection came up first, on a loaded machine); round_robin: one call at a time leaves both pods
        # idle, and the default policy would keep to the faster one (what is checked here is that the client
        # follows the slice to both pods)
        out = subprocess.run([sys.executable, str(root / "examples/kubernetes/client.py"), "--calls", "40",
                              "--balancer", "round_robin",
                              "--target", f"k8s://{ns}/greet:grpc?kubeconfig={_kubeconfig(cluster)}"],
                             check=False, capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr[-2000:]
        assert len(out.stdout.splitlines()) == 40
        assert {w for line in out.stdout.splitlines() for w in line.split() if w.startswith("10.77.0.")} == \
            {f"10.77.0.4:{port}", f"10.77.0.5:{port}"}, out.stdout
        # pod deleted: SIGTERM; NOT_SERVING at once, calls still answered during the drain delay
        procs[0].send_signal(signal.SIGTERM)
        with grpc.insecure_channel(f"10.77.0.4:{port}") as ch:
            stub = health_pb2_grpc.HealthStub(ch)
            deadline = time.monotonic() + 3
            status = None
            while time.monotonic() < deadline:
                status = stub.Check(health_pb2.HealthCheckRequest(), timeout=2).status
                if status == health_pb2.HealthCheckResponse.NOT_SERVING:
                    break
                time.sleep(0.05)
            assert status == health_pb2.HealthCheckResponse.NOT_SERVING, status
        assert procs[0].wait(30) == 0
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.wait(10)


def bench_slice_to_picker(cluster: Any, changes: int = 40, out: str = "") -> None:
    """For bench/k8s.py: an EndpointSlice gains a ready pod, ``changes`` times. Measured from just before the
    write: when a raw watch of the slices (one plain HTTP watch request, nothing else) sees the event, and when
    a waypost channel's picker can use the new pod (READY in its balancer). Writes the samples (ms) to ``out``."""
    import http.client
    import json
    import threading

    import waypost

    ns, svc = unique("bench"), "greet"
    cluster.create_namespace(ns)
    servers, port = start_backends(["10.77.0.2", "10.77.0.3"])
    new = f"10.77.0.3:{port}"
    seen_raw: dict[int, float] = {}
    stop = threading.Event()
    cluster.put_slice(ns, "greet-a", svc, endpoints=["10.77.0.2"], ports=_grpc_port(port))
    rv = cluster.list_slices(ns, svc)["metadata"]["resourceVersion"]

    def raw_watch() -> None:  # the floor: the apiserver's own event latency to a watching client
        from harness.k8s.support import ADMIN_TOKEN

        conn = http.client.HTTPSConnection(cluster.bind_host, cluster.port, timeout=60,
                                           context=cluster.ssl_context())
        conn.request("GET", cluster.slice_path(ns) + f"?watch=1&resourceVersion={rv}&labelSelector="
                     f"kubernetes.io%2Fservice-name%3D{svc}", headers={"Authorization": f"Bearer {ADMIN_TOKEN}"})
        resp = conn.getresponse()
        while not stop.is_set():
            line = resp.readline()
            if not line:
                return
            t = time.monotonic()
            obj = json.loads(line)["object"]
            round_ = int(obj["metadata"].get("annotations", {}).get("bench/round", "-1"))
            if any(ep["addresses"] == ["10.77.0.3"] for ep in obj.get("endpoints") or []):
                seen_raw.setdefault(round_, t)
        conn.close()

    watcher = threading.Thread(target=raw_watch, daemon=True)
    watcher.start()
    raw_ms: list[float] = []
    picker_ms: list[float] = []
    try:
        with waypost.dial(f"k8s://{ns}/{svc}:grpc?kubeconfig={_kubeconfig(cluster)}") as ch:
            echo_pb2_grpc.EchoStub(ch).Unary(Req(), timeout=10)
            time.sleep(0.5)  # the watches are open
            for i in range(changes):
                body = {"metadata": {"annotations": {"bench/round": str(i)}}}
                t0 = time.monotonic()
                cluster.put_slice(ns, "greet-a", svc, endpoints=["10.77.0.2", "10.77.0.3"], ports=_grpc_port(port),
                                  annotations=body["metadata"]["annotations"])
                deadline = t0 + 10
                while new not in ch.balancer.ready_addresses() and time.monotonic() < deadline:
                    time.sleep(0.0005)
                t_pick = time.monotonic()
                while i not in seen_raw and time.monotonic() < deadline:
                    time.sleep(0.0005)
                if i in seen_raw and new in ch.balancer.ready_addresses():
                    raw_ms.append((seen_raw[i] - t0) * 1e3)
                    picker_ms.append((t_pick - t0) * 1e3)
                cluster.put_slice(ns, "greet-a", svc, endpoints=["10.77.0.2"], ports=_grpc_port(port))
                while new in ch.balancer.ready_addresses() and time.monotonic() < deadline + 10:
                    time.sleep(0.001)
    finally:
        stop.set()
        _stop(servers)
    assert len(picker_ms) >= changes * 0.9, f"only {len(picker_ms)} of {changes} changes measured"
    if out:
        with open(out, "w") as f:
            json.dump({"raw_watch_ms": raw_ms, "picker_ms": picker_ms}, f)


SCENARIOS: dict[str, Callable[..., None]] = {
    "pods_reachable": pods_reachable,
    "slices_merged_readiness_terminating": slices_merged_readiness_terminating,
    "named_and_numbered_ports_and_context_namespace": named_and_numbered_ports_and_context_namespace,
    "service_appears_after_dial": service_appears_after_dial,
    "relist_after_410_without_spurious_removal": relist_after_410_without_spurious_removal,
    "apiserver_restart_keeps_serving": apiserver_restart_keeps_serving,
    "kubeconfig_auth_and_clear_refusals": kubeconfig_auth_and_clear_refusals,
    "in_cluster_config_and_token_rotation": in_cluster_config_and_token_rotation,
    "cli_resolve_and_watch": cli_resolve_and_watch,
    "bench_slice_to_picker": bench_slice_to_picker,
    "examples_in_pods": examples_in_pods,
}

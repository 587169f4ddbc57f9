"""Kubernetes' dial targets: ``k8s://NAMESPACE/SERVICE:PORT`` (go-zero's form), ``k8s:///NAMESPACE/SERVICE:PORT`` or
``k8s:///SERVICE:PORT`` (no namespace: the pod's own, or the kubeconfig context's): the ready endpoints of a
Kubernetes Service's EndpointSlices. PORT is a number or the name of an EndpointSlice port. Parameters:
``kubeconfig=PATH`` and ``context=NAME``. The namespace is ``Target.authority`` ("" when not given) and the
service ``Target.key``; the port is ``options["port"]``.
"""

from __future__ import annotations

import re
from types import MappingProxyType

from ...resolver.target import Target, fail, unquote_strict

# Kubernetes names: a namespace and a service are DNS-1123 labels; a port name is one too (EndpointSlice ports)
_DNS_LABEL_RE = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")


def _dns_label(text: str, what: str, raw: str) -> str:
    if len(text) > 63 or not _DNS_LABEL_RE.fullmatch(text):
        fail("k8s", raw, f"{what} {text!r} is not a Kubernetes name (lower-case letters, digits and '-', "
              "starting and ending with a letter or digit, at most 63 characters)")
    return text


def parse_k8s_target(scheme: str, authority: str, path: str, params: dict[str, str], raw: str) -> Target:
    """``k8s://ns/svc:port``, ``k8s:///ns/svc:port``, ``k8s:///svc:port``."""
    rest = unquote_strict(path[1:], "k8s", raw)
    if authority:
        namespace, service_port = unquote_strict(authority, "k8s", raw), rest
        if "/" in service_port:
            fail("k8s", raw, "the namespace is given twice (authority and path): write k8s://NAMESPACE/SERVICE:PORT")
    else:
        namespace, slash, service_port = rest.rpartition("/")
        if slash and not namespace:
            fail("k8s", raw, "empty namespace before '/'")
        if "/" in namespace:
            fail("k8s", raw, f"unexpected path {path!r}: write k8s:///NAMESPACE/SERVICE:PORT")
    if not service_port:
        fail("k8s", raw, "missing SERVICE:PORT")
    if "," in service_port:
        fail("k8s", raw, "a k8s target names exactly one service")
    service, colon, port = service_port.partition(":")
    if not colon or not port:
        fail("k8s", raw, f"missing the port after {service!r}: a number or the EndpointSlice port's name, "
              f"e.g. k8s://{namespace or 'default'}/{service or 'greet'}:50051")
    if namespace:
        _dns_label(namespace, "namespace", raw)
    _dns_label(service, "service", raw)
    if port.isdigit():
        if not 0 < int(port) < 65536:
            fail("k8s", raw, f"port {port} is out of range (1-65535)")
        port = str(int(port))
    else:
        _dns_label(port, "port name", raw)
    options = {"port": port}
    for name in ("kubeconfig", "context"):
        if name in params:
            if not params[name]:
                fail("k8s", raw, f"empty {name}=")
            options[name] = params[name]
    return Target(scheme="k8s", endpoints=(), key=service, options=MappingProxyType(options), raw=raw,
                  authority=namespace)

"""The Kubernetes kind: ``k8s://NAMESPACE/SERVICE:PORT`` targets (a Service's ready EndpointSlice endpoints); read
only: a server in Kubernetes registers through its readiness probe. docs/kubernetes.md."""

from __future__ import annotations

from ...kinds import RegistryKind, Words

_HERE = "waypost.registries.kubernetes."

KIND = RegistryKind(
    "k8s", None, "k8s://default/greet:50051", discovery=_HERE + "discovery:K8sDiscovery",
    parse_target=_HERE + "target:parse_k8s_target", target_params=("kubeconfig", "context"), extra="k8s",
    title="Kubernetes",
    words=Words(instance="endpoint", instances="endpoints", list_name="EndpointSlice list",
                read_failed="k8s: reading the EndpointSlices of {what} failed: {error}"),
)

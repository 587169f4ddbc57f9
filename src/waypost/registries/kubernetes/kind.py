"""The Kubernetes kind: ``k8s://NAMESPACE/SERVICE:PORT`` targets (a Service's ready EndpointSlice endpoints); read
only: a server in Kubernetes registers through its readiness probe. docs/kubernetes.md."""

from __future__ import annotations

from ...registry.kinds import RegistryKind

_HERE = "waypost.registries.kubernetes."

KIND = RegistryKind(
    "k8s", None, "k8s://default/greet:50051", resolver=_HERE + "resolver:K8sResolver",
    parse_target=_HERE + "target:parse_k8s_target", target_params=("kubeconfig", "context"), extra="k8s",
    title="Kubernetes",
)

"""Kubernetes: ``k8s://`` targets over a Service's EndpointSlices (the ``k8s`` extra). docs/kubernetes.md."""

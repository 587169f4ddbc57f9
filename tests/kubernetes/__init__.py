"""k8s:// targets: EndpointSlices, and a real kube-apiserver in a private network namespace."""

"""Kubernetes: a real kube-apiserver (built from source once, cached) over a real etcd; ``support`` re-exports
the pieces, one job per module."""

"""Interop with real go-zero and grpc-go etcd-naming peers."""

#!/usr/bin/env sh
# Regenerate waypost's etcd message classes from src/waypost/etcd/proto/waypost_etcd.proto.
# Needs grpcio-tools (pip install 'waypost[dev]'). Only messages are generated: the client calls
# etcd's gRPC method paths directly, so no *_grpc stubs are needed.
set -eu
cd "$(dirname "$0")/.."
PY="${PYTHON:-python}"
OUT=src/waypost/etcd/_proto
mkdir -p "$OUT"
"$PY" -m grpc_tools.protoc \
  -I src/waypost/etcd/proto \
  --python_out="$OUT" \
  --pyi_out="$OUT" \
  src/waypost/etcd/proto/waypost_etcd.proto
[ -f "$OUT/__init__.py" ] || printf '"""Generated etcd message classes (scripts/gen_proto.sh); do not edit."""\n' > "$OUT/__init__.py"
echo "generated $OUT/waypost_etcd_pb2.py"

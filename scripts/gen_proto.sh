#!/usr/bin/env sh
# Regenerate waypost's protobuf message classes: the etcd subset (src/waypost/etcd/proto) and the
# waypost.load.v1 load report (src/waypost/orca/proto). Needs grpcio-tools (pip install 'waypost[dev]').
# Only messages are generated: the etcd client calls etcd's gRPC method paths directly and the
# load-report service registers its one method by path, so no *_grpc stubs are needed.
set -eu
cd "$(dirname "$0")/.."
PY="${PYTHON:-python}"

gen() {  # gen <proto dir> <output dir> <proto file> <package docstring>
  mkdir -p "$2"
  "$PY" -m grpc_tools.protoc -I "$1" --python_out="$2" --pyi_out="$2" "$1/$3"
  [ -f "$2/__init__.py" ] || printf '"""%s (scripts/gen_proto.sh); do not edit."""\n' "$4" > "$2/__init__.py"
  echo "generated $2/${3%.proto}_pb2.py"
}

gen src/waypost/etcd/proto src/waypost/etcd/_generated waypost_etcd.proto "Generated etcd message classes"
gen src/waypost/orca/proto src/waypost/orca/_generated waypost_load.proto \
  "Generated waypost.load.v1 message classes"

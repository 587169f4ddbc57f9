#!/bin/sh
# Regenerate greet_pb2.py / greet_pb2_grpc.py (committed, used unchanged). Needs grpcio-tools.
set -e
cd "$(dirname "$0")"
"${PYTHON:-python}" -m grpc_tools.protoc -I. --python_out=. --pyi_out=. --grpc_python_out=. greet.proto

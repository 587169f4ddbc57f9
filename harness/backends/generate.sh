#!/bin/sh
# Regenerate the Echo test stubs (run from anywhere). The generated files are committed and used unchanged.
set -e
cd "$(dirname "$0")/../.."
"${PYTHON:-/work/venv/bin/python}" -m grpc_tools.protoc -I. --python_out=. --grpc_python_out=. harness/backends/echo.proto

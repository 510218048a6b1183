#!/bin/bash
# Runs a Python test script with Debian's interpreter (python3-grpcio, python3-protobuf,
# python3-torch) from the runfiles root, with clients/python importable.
set -euo pipefail
cd "${TEST_SRCDIR}/${TEST_WORKSPACE}"
export PYTHONPATH="${PWD}/clients/python"
export PYTHONDONTWRITEBYTECODE=1
exec /usr/bin/python3 "$@"

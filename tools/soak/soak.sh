#!/bin/bash
# `bazel run //tools/soak -- ARGS`: runs soak.py with Debian's /usr/bin/python3 (python3-grpcio,
# python3-protobuf, python3-torch) from the runfiles, where the binaries it drives are data deps.
# (Not py_binary: Bazel 4.2.3's autodetected toolchain takes whatever python3 is first on PATH.)
set -euo pipefail
runfiles="${RUNFILES_DIR:-$0.runfiles}"
cd "${runfiles}/ckpt"
export PYTHONDONTWRITEBYTECODE=1
exec /usr/bin/python3 tools/soak/soak.py "$@"

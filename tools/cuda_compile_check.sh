#!/usr/bin/env bash
# Compiles the CUDA/NCCL code paths of the Bazel build (--config=cuda) on a machine without a
# GPU or a CUDA LibTorch: the code that only a CUDA build compiles (ProcessGroupNCCL in
# libs/ddp/process_group.cc, USE_CUDA/USE_C10D_NCCL) against Debian's LibTorch 1.13 headers, which
# include c10/cuda and c10d's NCCL headers, plus the CUDA toolkit's and NCCL's headers.
#
# It only compiles (no CUDA LibTorch is here to link against): a LibTorch root is faked from
# /usr/include with the one header a CUDA build of LibTorch generates (c10/cuda/impl/
# cuda_cmake_macros.h) and an empty lib/libtorch_cuda.so, so that --config=cuda's repository rule
# accepts it. It proves the NCCL/CUDA branches compile against LibTorch 1.13's API; a PyTorch 2.x
# build is checked by tools/gpu_check.sh (CMake) on a GPU machine.
#
# Usage: tools/cuda_compile_check.sh   (CUDA_HOME defaults to /usr/local/cuda)
# Exit status: 0 when the targets compiled, 1 when they did not; prints "NOT RUN" and exits 0 when
# there is no CUDA toolkit with NCCL here (nothing to check against).
set -euo pipefail
cd "$(dirname "$0")/.."

cuda_home="${CUDA_HOME:-/usr/local/cuda}"
if [[ ! -f "$cuda_home/include/cuda_runtime_api.h" || ! -f "$cuda_home/include/nccl.h" ]]; then
  echo "cuda compile check: NOT RUN: no CUDA toolkit with nccl.h at $cuda_home (set CUDA_HOME)"
  exit 0
fi

fake="$(mktemp -d /tmp/ckpt-fake-cuda-libtorch.XXXXXX)"
trap 'rm -rf "$fake"' EXIT
mkdir -p "$fake/lib" "$fake/include/c10/cuda/impl"
touch "$fake/lib/libtorch_cuda.so"
for dir in ATen torch caffe2; do ln -s "/usr/include/$dir" "$fake/include/$dir"; done
# c10 is Debian's, except for the generated header, which goes into a copy of the folder tree.
for entry in /usr/include/c10/*; do
  [[ "$(basename "$entry")" == cuda ]] || ln -s "$entry" "$fake/include/c10/"
done
for entry in /usr/include/c10/cuda/*; do
  [[ "$(basename "$entry")" == impl ]] || ln -s "$entry" "$fake/include/c10/cuda/"
done
for entry in /usr/include/c10/cuda/impl/*; do ln -s "$entry" "$fake/include/c10/cuda/impl/"; done
printf '#pragma once\n#define C10_CUDA_BUILD_MAIN_LIB\n' >"$fake/include/c10/cuda/impl/cuda_cmake_macros.h"

# Every library with code that differs under --config=cuda, and the ones that stage through
# pinned memory on side streams.
targets=(
  //libs/ddp:process_group
  //libs/ddp:communicator
  //libs/ddp:distributed_data_parallel
  //libs/tensor:side_stream_copies
)
# A separate output base: the CUDA configuration would otherwise replace the CPU build's
# external repository and analysis cache.
output_base="${HOME}/.cache/ckpt/bazel-cuda-compile-check"
start=$(date +%s)
if CKPT_LIBTORCH_DIR="$fake" CUDA_HOME="$cuda_home" bazel --output_base="$output_base" build \
  --config=cuda --symlink_prefix=/ --disk_cache="${HOME}/.cache/ckpt/bazel-disk-cache" "${targets[@]}"; then
  status=0
  echo "cuda compile check: OK (${targets[*]} with USE_CUDA, USE_C10D_NCCL, CKPT_WITH_NCCL; $(($(date +%s) - start)) s)"
else
  status=1
  echo "cuda compile check: FAILED"
fi
bazel --output_base="$output_base" shutdown >/dev/null 2>&1 || true
exit "$status"

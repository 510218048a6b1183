#!/usr/bin/env bash
# Builds libs/ddp with CMake against the PyTorch that `python3` imports (a pip PyTorch on a GPU
# machine, or Debian's) in a temporary directory, and runs ddp_smoke_main:
#   - with nccl/cuda when nvidia-smi works (2 ranks with >= 2 GPUs; with one GPU, 1 nccl rank,
#     since NCCL refuses two ranks on one device, plus 2 gloo ranks on CPU);
#   - with gloo/cpu on 2 ranks otherwise.
# Prints "ddp smoke: OK" per run and exits 0 only if every run passed.
#
# Usage: tools/gpu_check.sh   (PYTHON=/path/to/python3 to pick the interpreter)
set -euo pipefail

repo="$(cd "$(dirname "$0")/.." && pwd)"
python="${PYTHON:-python3}"
build="$(mktemp -d /tmp/ckpt-ddp-gpu-check.XXXXXX)"
trap 'rm -rf "$build"' EXIT

prefix="$("$python" -c 'import torch; print(torch.utils.cmake_prefix_path)')"
echo "torch $("$python" -c 'import torch; print(torch.__version__)') at $prefix"

gpus=0
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
  gpus="$(nvidia-smi -L | grep -c '^GPU ' || true)"
fi
cuda_torch="$("$python" -c 'import torch; print(int(torch.cuda.is_available() and torch.distributed.is_nccl_available()))' 2>/dev/null || echo 0)"

cmake_args=(-S "$repo/libs/ddp" -B "$build" -DCMAKE_PREFIX_PATH="$prefix")
if [[ "$gpus" -gt 0 && "$cuda_torch" == 1 ]]; then
  # pip wheels take NCCL's and the CUDA runtime's headers from the nvidia-* packages.
  extra="$("$python" - <<'PY'
import importlib, os
dirs = []
for name in ("nvidia.nccl", "nvidia.cuda_runtime"):
    try:
        module = importlib.import_module(name)
    except ImportError:
        continue
    for path in module.__path__:
        include = os.path.join(path, "include")
        if os.path.isdir(include):
            dirs.append(include)
print(";".join(dirs))
PY
)"
  cmake_args+=(-DCKPT_DDP_WITH_NCCL=ON "-DCKPT_DDP_EXTRA_INCLUDE_DIRS=$extra")
  echo "GPUs: $gpus; building with NCCL (extra includes: ${extra:-none})"
else
  echo "no usable GPU or CUDA PyTorch (GPUs: $gpus, torch CUDA+NCCL: $cuda_torch); gloo/cpu only"
fi

cmake "${cmake_args[@]}" >"$build/configure.log" 2>&1 || { cat "$build/configure.log"; exit 1; }
cmake --build "$build" -j"$(nproc)" >"$build/build.log" 2>&1 || { tail -60 "$build/build.log"; exit 1; }

status=0
run() {
  echo "== ddp_smoke_main $*"
  if ! timeout 300 "$build/ddp_smoke_main" "$@"; then
    echo "== ddp_smoke_main $* FAILED"
    status=1
  fi
}
if [[ "$gpus" -gt 0 && "$cuda_torch" == 1 ]]; then
  if [[ "$gpus" -ge 2 ]]; then
    run nccl cuda 2
  else
    run nccl cuda 1
  fi
fi
run gloo cpu 2
exit "$status"

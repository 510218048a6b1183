#!/usr/bin/env bash
# The one prepared GPU check. Builds the trainer, the ckpt CLI, the loader service,
# load_from_loader and ddp_smoke_main with CMake (tools/cmake) against the PyTorch that $PYTHON
# imports, then runs, each under `timeout`:
#   (a) ddp_smoke_main: nccl/cuda on every GPU and on 1; gloo/cpu on 2 ranks always;
#   (b) the trainer: nccl/cuda with 1 rank and with every GPU, and ZeRO-1 (--zero=1) on every
#       GPU; gloo/cpu with 2 ranks always;
#   (c) a rank SIGKILLed mid-run, restarted by --max_restarts, ending bit-identical to an
#       uninterrupted run of the same config (the whole bundle, via ckpt export);
#   (d) the trainer's checkpoint stall with asynchronous uploads (the default) against the same
#       run with --sync_checkpoints (every upload waited for in the loop);
#   (e) a load through the loader service onto cuda:1 (two GPUs), or onto the CPU otherwise;
#   (f) a team's TorchScript model (tests/testdata/scripted_training.py's Net, scripted by
#       $PYTHON's torch) trained on shard files with nccl/cuda (gloo/cpu always), a rank
#       SIGKILLed and restarted, ending bit-identical to an uninterrupted run, as (c);
#   (g) PyTorch Distributed Checkpoint in and out with $PYTHON's torch (>= 2.2; no GPU needed):
#       directories it writes (one process; two Gloo processes saving a row-sharded DTensor) read
#       by ckpt inspect / import, exported back with ckpt export --format dcp, and loaded by its
#       dcp.load value for value (tools/dcp_interop.py); the directories are kept as
#       dcp-written.tar.gz beside the report, for test data.
# It writes one report (markdown) with every figure and a PASS / FAIL / NOT RUN line per check,
# prints its path, and exits 0 only if every check that ran passed. A machine without a GPU or a
# CUDA PyTorch runs the gloo/CPU half and says what it could not run.
#
# Usage: tools/gpu_check.sh [--cpu-only] [--report PATH] [--build-dir DIR] [--jobs N]
#   PYTHON=/path/to/python3   the interpreter whose torch to build against (default python3)
#   --deps TARBALL            Debian's gRPC, protobuf, Abseil, RocksDB, ... packed by
#                             tools/cmake/deps_bundle.sh, for a machine without the -dev packages
#   --cpu-only                skip every CUDA run even when GPUs are there
#   --ddp-only                build only ddp_smoke_main (LibTorch only) and run only (a)
#   --build-dir DIR           build (or rebuild incrementally) in DIR and keep it
#   --jobs N                  parallel compile jobs (default: nproc)
#   --only LETTERS            run only these checks, e.g. --only ce (the build always runs)
#   CKPT_CMAKE_ARGS="..."     extra CMake arguments, e.g. -DCKPT_WITH_NCCL=OFF
set -euo pipefail

repo="$(cd "$(dirname "$0")/.." && pwd)"
python="${PYTHON:-python3}"
cpu_only=0
ddp_only=0
report=""
build_dir=""
jobs="$(nproc)"
only="abcdefg"
deps_tarball=""

usage() { sed -n '2,/^set -euo pipefail$/p' "$0" | grep '^#' | sed 's/^# \{0,1\}//'; }

while [[ $# -gt 0 ]]; do
  case "$1" in
    --cpu-only) cpu_only=1 ;;
    --ddp-only) ddp_only=1 ;;
    --report) report="$2"; shift ;;
    --build-dir) build_dir="$2"; shift ;;
    --jobs) jobs="$2"; shift ;;
    --only) only="$2"; shift ;;
    --deps) deps_tarball="$(realpath "$2")"; shift ;;
    -h | --help) usage; exit 0 ;;
    *) echo "gpu_check: unknown argument $1" >&2; usage >&2; exit 2 ;;
  esac
  shift
done

work="$(mktemp -d /tmp/ckpt-gpu-check.XXXXXX)"
[[ -n "$report" ]] || report="$work/report.md"
[[ -n "$build_dir" ]] || build_dir="$work/build"
report="$(realpath -m "$report")"
mkdir -p "$(dirname "$report")" "$build_dir"
: >"$report"
bin="$build_dir/bin"
# Processes this script starts in the background (trainer, loader); stopped on exit.
background_pids=()
cleanup() {
  local pid
  for pid in "${background_pids[@]}"; do
    kill "$pid" 2>/dev/null || true
  done
}
trap cleanup EXIT

failed=0
results=()
script_start=$SECONDS

# ---- Reporting --------------------------------------------------------------------------------

say() { printf '%s\n' "$*" | tee -a "$report"; }
# Appends a file to the report as a code block (its last N lines), if there is one.
attach() {
  local file="$1" lines="${2:-40}"
  [[ -s "$file" ]] || return 0
  {
    echo '```'
    tail -n "$lines" "$file"
    echo '```'
  } >>"$report"
}
# result NAME PASS|FAIL|NOT_RUN REASON
result() {
  local name="$1" verdict="$2" reason="$3"
  [[ "$verdict" == NOT_RUN ]] && verdict="NOT RUN"
  [[ "$verdict" == FAIL ]] && failed=1
  results+=("$verdict  $name: $reason")
  say "**$verdict** $name: $reason"
  say ""
}
# Seconds, to 0.1 s, that COMMAND... took; its status is in $last_status.
last_status=0
last_seconds=0
timed() {
  local start end
  start="$(date +%s.%N)"
  set +e
  "$@"
  last_status=$?
  set -e
  end="$(date +%s.%N)"
  last_seconds="$(awk -v a="$start" -v b="$end" 'BEGIN { printf "%.1f", b - a }')"
}

# ---- Environment ------------------------------------------------------------------------------

gpus=0            # GPUs this run may use (0 in CPU mode)
gpu_reason=""     # why there is no CUDA run, when gpus == 0
torch_version=""

detect_environment() {
  say "# ckpt GPU check"
  say ""
  say "- date: $(date -u '+%Y-%m-%d %H:%M:%S UTC'); host $(hostname); $(nproc) CPUs"
  say "- repository: $repo ($(git -C "$repo" rev-parse --short HEAD 2>/dev/null || echo 'no git'))"
  local info
  if ! info="$("$python" - 2>&1 <<'PY'
import torch
cuda = torch.cuda.is_available()
nccl = torch.distributed.is_available() and torch.distributed.is_nccl_available()
print(torch.__version__, torch.version.cuda or "none", torch.cuda.device_count() if cuda else 0,
      int(nccl))
PY
  )"; then
    say "- python: $python cannot import torch: ${info##*$'\n'}"
    gpu_reason="$python cannot import torch"
    return 1
  fi
  info="${info##*$'\n'}"  # torch may print warnings first
  local torch_cuda torch_gpus torch_nccl
  read -r torch_version torch_cuda torch_gpus torch_nccl <<<"$info"
  say "- python: $python ($("$python" -c 'import sys; print(sys.version.split()[0])')), torch $torch_version, CUDA $torch_cuda, torch sees $torch_gpus GPU(s), NCCL available: $torch_nccl"
  local smi="no nvidia-smi"
  if command -v nvidia-smi >/dev/null 2>&1; then
    smi="$(nvidia-smi -L 2>&1 | head -8 | tr '\n' ';' || true)"
  fi
  say "- nvidia-smi -L: $smi"
  if [[ "$cpu_only" == 1 ]]; then
    gpu_reason="--cpu-only"
  elif [[ "$torch_cuda" == none ]]; then
    gpu_reason="torch $torch_version is a CPU-only build"
  elif [[ "$torch_gpus" == 0 ]]; then
    gpu_reason="torch sees no GPU (nvidia-smi: $smi)"
  elif [[ "$torch_nccl" != 1 ]]; then
    gpu_reason="torch $torch_version has no NCCL"
  else
    gpus="$torch_gpus"
  fi
  if [[ "$gpus" -gt 0 ]]; then
    say "- mode: GPU, $gpus GPU(s), plus the gloo/CPU runs"
  else
    say "- mode: gloo/CPU only: $gpu_reason"
  fi
  say ""
}

# ---- Build ------------------------------------------------------------------------------------

full_build=0  # 1: every binary; 0: ddp_smoke_main only (or nothing)

check_sources() {
  say "## Source lists (tools/cmake/sources.cmake against bazel query)"
  if ! command -v bazel >/dev/null 2>&1 || [[ ! -f "$repo/WORKSPACE" ]]; then
    result "source lists" NOT_RUN "no bazel here; the CMake build trusts the committed lists (CI checks them)"
    return
  fi
  if timeout 600 python3 "$repo/tools/cmake/gen_sources.py" --check >"$work/sources.log" 2>&1; then
    result "source lists" PASS "sources.cmake matches bazel query"
  else
    attach "$work/sources.log" 60
    result "source lists" FAIL "sources.cmake is stale (diff above); run python3 tools/cmake/gen_sources.py"
  fi
}

# cmake_build DIR EXTRA_ARGS...: configure and build; logs in DIR.
cmake_build() {
  local dir="$1"
  shift
  local generator=()
  if command -v ninja >/dev/null 2>&1; then generator=(-G Ninja); fi
  # An existing build dir keeps its generator; logs of an earlier run must not be read as this one's.
  [[ -f "$dir/CMakeCache.txt" ]] && generator=()
  rm -f "$dir/build.log" "$dir/ckpt_problems.txt"
  local cmake_args=()
  read -r -a cmake_args <<<"${CKPT_CMAKE_ARGS:-}"
  [[ -n "$deps_prefix" ]] && cmake_args+=(-DCKPT_DEPS_PREFIX="$deps_prefix")
  timed timeout 300 cmake -S "$repo/tools/cmake" -B "$dir" "${generator[@]}" \
    -DCKPT_PYTHON="$(command -v "$python")" "${cmake_args[@]}" "$@" >"$dir/configure.log" 2>&1
  configure_seconds="$last_seconds"
  [[ "$last_status" == 0 ]] || return 1
  # Keep going past a failing file, so one report lists every compile error.
  local keep_going=(-k)
  grep -q '^CMAKE_GENERATOR:INTERNAL=Ninja' "$dir/CMakeCache.txt" && keep_going=(-k 0)
  timed timeout 1800 cmake --build "$dir" -j "$jobs" -- "${keep_going[@]}" >"$dir/build.log" 2>&1
  build_seconds="$last_seconds"
  [[ "$last_status" == 0 ]]
}

deps_prefix=""  # where --deps was unpacked

build() {
  say "## Build (CMake, -j$jobs, $(command -v ninja >/dev/null 2>&1 && echo ninja || echo make))"
  configure_seconds=0
  build_seconds=0
  if [[ -n "$deps_tarball" ]]; then
    deps_prefix="$work/deps"
    mkdir -p "$deps_prefix"
    if ! tar -C "$deps_prefix" -xzf "$deps_tarball"; then
      result "build" FAIL "could not unpack --deps $deps_tarball"
      return
    fi
    say "- dependencies: $deps_tarball (tools/cmake/deps_bundle.sh), unpacked in $deps_prefix"
  fi
  if [[ "$ddp_only" == 1 ]]; then
    if cmake_build "$build_dir" -DCKPT_DDP_ONLY=ON; then
      bin="$build_dir/bin"
      result "build" PASS "ddp_smoke_main only (--ddp-only; LibTorch only), ${build_seconds} s"
    else
      attach "$build_dir/configure.log" 20
      attach "$build_dir/build.log" 30
      result "build" FAIL "ddp_smoke_main did not build (logs above)"
    fi
    return
  fi
  if cmake_build "$build_dir" -DCKPT_DDP_ONLY=OFF; then
    full_build=1
    say "- configure ${configure_seconds} s, build ${build_seconds} s ($build_dir)"
    grep -E '^-- ckpt:' "$build_dir/configure.log" | sed 's/^-- /- /' >>"$report" || true
    result "build" PASS "trainer, ckpt, loader, load_from_loader, ddp_smoke_main"
    return
  fi
  local why
  if [[ -s "$build_dir/ckpt_problems.txt" ]]; then
    why="configure failed: $(sed 's/^ckpt: //' "$build_dir/ckpt_problems.txt" | tr '\n' ';' | sed 's/;$//; s/;/; /g')"
  elif [[ -s "$build_dir/build.log" ]]; then
    why="compile or link failed (log tail above)"
    grep -E 'error|undefined reference' "$build_dir/build.log" | head -20 >"$work/errors.log" || true
    attach "$work/errors.log" 20
    attach "$build_dir/build.log" 30
  else
    why="configure failed (log tail above)"
    attach "$build_dir/configure.log" 30
  fi
  result "build" FAIL "$why"
  # ddp_smoke_main needs LibTorch only: still run (a) when -dev packages are missing.
  local ddp_dir="$work/build-ddp-only"
  mkdir -p "$ddp_dir"
  if cmake_build "$ddp_dir" -DCKPT_DDP_ONLY=ON; then
    bin="$ddp_dir/bin"
    say "- fallback: ddp_smoke_main alone (LibTorch only) built in ${build_seconds} s"
  else
    attach "$ddp_dir/configure.log" 20
    attach "$ddp_dir/build.log" 20
    say "- fallback: ddp_smoke_main alone did not build either"
  fi
  say ""
}

# needs_gloo NAME: true when the build has the Gloo backend; otherwise NAME gets a NOT RUN line.
# (A pip wheel ships no Gloo headers; CMake builds NCCL-only when no installed ones fit it.)
needs_gloo() {
  grep -q -- '-- ckpt: no Gloo' "$(dirname "$bin")/configure.log" 2>/dev/null || return 0
  result "$1" NOT_RUN "this build has no Gloo backend: torch $torch_version ships no Gloo headers and Debian's did not compile against it (see configure.log)"
  return 1
}

# needs_full_build NAME WHAT: true when every binary built; otherwise NAME gets a NOT RUN line.
needs_full_build() {
  [[ "$full_build" == 1 ]] && return 0
  result "$1" NOT_RUN "the $2 did not build (see Build)"
  return 1
}

# ---- (a) DDP smoke ----------------------------------------------------------------------------

smoke() {
  local backend="$1" device="$2" world="$3" log="$work/smoke-$1-$2-$3.log"
  timed timeout 180 "$bin/ddp_smoke_main" "$backend" "$device" "$world" >"$log" 2>&1
  if [[ "$last_status" == 0 ]] && grep -q 'ddp smoke: OK' "$log"; then
    result "(a) ddp_smoke_main $backend $device $world" PASS \
      "${last_seconds} s; $(grep -i 'loss' "$log" | tail -1)"
  else
    attach "$log" 25
    result "(a) ddp_smoke_main $backend $device $world" FAIL "exit $last_status after ${last_seconds} s (log above)"
  fi
}

check_smoke() {
  say "## (a) DDP smoke test (libs/ddp, bit-identical parameters on every rank)"
  if [[ ! -x "$bin/ddp_smoke_main" ]]; then
    result "(a) ddp_smoke_main" NOT_RUN "it did not build"
    return
  fi
  if [[ "$gpus" -gt 0 ]]; then
    smoke nccl cuda "$gpus"
    [[ "$gpus" -gt 1 ]] && smoke nccl cuda 1
  else
    result "(a) ddp_smoke_main nccl cuda" NOT_RUN "$gpu_reason"
  fi
  needs_gloo "(a) ddp_smoke_main gloo cpu 2" && smoke gloo cpu 2
  return 0
}

# ---- (b) trainer ------------------------------------------------------------------------------

# The summary's figures: "N steps in T, X samples/s; checkpoint stall S s", last loss, versions.
summary_of() {
  local log="$1"
  {
    grep -E 'steps in .* samples/s' "$log" | tail -1 | sed 's/^ *//'
    grep -E '^ *loss:' "$log" | tail -1 | sed 's/^ *//'
    grep -E 'versions written' "$log" | tail -1 | sed 's/^ *//'
  } | tr '\n' ';' | sed 's/;$//; s/; */; /g'
}

# run_trainer NAME LOG FLAGS...: runs the trainer to the end; PASS when it exits 0 having
# finished every step and written a checkpoint.
run_trainer() {
  local name="$1" log="$2"
  shift 2
  timed timeout 240 "$bin/trainer" --log_every=10 --rank_exit_timeout=5s "$@" >"$log" 2>&1
  if [[ "$last_status" == 0 ]] && grep -qE 'finished at step ([0-9]+) of \1' "$log" &&
    grep -qE 'versions written: @' "$log"; then
    result "$name" PASS "${last_seconds} s; $(summary_of "$log")"
    return 0
  fi
  attach "$log" 30
  result "$name" FAIL "exit $last_status after ${last_seconds} s (log above)"
  return 1
}

check_trainer() {
  say "## (b) The trainer (launcher + ranks, embedded store, checkpoints)"
  needs_full_build "(b) trainer" trainer || return 0
  local common=(--steps=60 --checkpoint_every=20 --batch_size=32)
  if [[ "$gpus" -gt 0 ]]; then
    run_trainer "(b) trainer nccl cuda 1 rank" "$work/trainer-nccl-1.log" "${common[@]}" \
      --backend=nccl --device=cuda --nproc_per_node=1 --store_dir="$work/store-nccl-1" || true
    if [[ "$gpus" -gt 1 ]]; then
      run_trainer "(b) trainer nccl cuda $gpus ranks" "$work/trainer-nccl-$gpus.log" "${common[@]}" \
        --backend=nccl --device=cuda --nproc_per_node="$gpus" --store_dir="$work/store-nccl-$gpus" || true
    else
      result "(b) trainer nccl cuda, all GPUs" NOT_RUN "one GPU only: the 1-rank run is the all-GPU run"
    fi
    # ZeRO-1 over NCCL: each rank's optimizer shard on its GPU, its slices copied to pinned host
    # memory and written as its part of every checkpoint (on one GPU: one rank owning it all).
    run_trainer "(b) trainer nccl cuda ZeRO-1, $gpus rank(s)" "$work/trainer-nccl-zero.log" \
      "${common[@]}" --backend=nccl --device=cuda --nproc_per_node="$gpus" --zero=1 \
      --store_dir="$work/store-nccl-zero" || true
  else
    result "(b) trainer nccl cuda" NOT_RUN "$gpu_reason"
  fi
  needs_gloo "(b) trainer gloo cpu 2 ranks" || return 0
  run_trainer "(b) trainer gloo cpu 2 ranks" "$work/trainer-gloo-2.log" "${common[@]}" \
    --backend=gloo --device=cpu --nproc_per_node=2 --store_dir="$work/store-gloo-2" || true
}

# ---- (c) SIGKILL and exact resume -------------------------------------------------------------

# The pid of the child of PARENT whose environment has RANK=RANK, or nothing.
rank_pid() {
  local parent="$1" rank="$2" child
  for child in $(pgrep -P "$parent" || true); do
    if tr '\0' '\n' <"/proc/$child/environ" 2>/dev/null | grep -qx "RANK=$rank"; then
      echo "$child"
      return
    fi
  done
}

# Waits until LOG shows a progress line at or past STEP; 1 if PID exits first or on timeout.
wait_for_step() {
  local log="$1" step="$2" pid="$3" deadline=$((SECONDS + 120)) seen
  while ((SECONDS < deadline)); do
    seen="$(grep -oE 'step [0-9]+/' "$log" 2>/dev/null | tail -1 | grep -oE '[0-9]+' || true)"
    [[ -n "$seen" && "$seen" -ge "$step" ]] && return 0
    kill -0 "$pid" 2>/dev/null || return 1
    sleep 0.05
  done
  return 1
}

# compare_stores A B OUT: exports both stores' latest bundle and compares them with
# tools/soak/compare_bundles.py (shared with the soak's trainer_kill): every tensor bitwise, every
# plain value. Prints "equal N" or "differ N MAX_ABS_DIFF FIRST_PATH WHAT".
# The model is $resume_model (mlp-synthetic unless (f) sets it).
compare_stores() {
  local a="$1" b="$2" out="$3"
  {
    timeout 120 "$bin/ckpt" --store_dir="$a" export "$resume_model@latest" "$out-a.pt" --bundle
    timeout 120 "$bin/ckpt" --store_dir="$b" export "$resume_model@latest" "$out-b.pt" --bundle
  } >>"$out.log" 2>&1
  timeout 120 "$python" "$repo/tools/soak/compare_bundles.py" "$out-a.pt" "$out-b.pt" 2>>"$out.log"
}

# The run resume_check trains: the model's store name, its flags, and the step the kill waits for
# (past a checkpoint, so STEPS must leave the run time to get there before it ends).
resume_model=mlp-synthetic
resume_model_flags=(--hidden=128)
resume_kill_step=400

# resume_check NAME BACKEND DEVICE RANKS KILL_RANK STEPS
resume_check() {
  local name="$1" backend="$2" device="$3" ranks="$4" kill_rank="$5" steps="$6"
  local tag="$backend-$ranks-$resume_model" flags
  flags=(--backend="$backend" --device="$device" --nproc_per_node="$ranks" --steps="$steps"
    --checkpoint_every=100 --log_every=20 "${resume_model_flags[@]}")
  local clean="$work/resume-$tag-clean" killed="$work/resume-$tag-killed"
  timed timeout 300 "$bin/trainer" "${flags[@]}" --store_dir="$clean" >"$clean.log" 2>&1
  local clean_seconds="$last_seconds"
  if [[ "$last_status" != 0 ]]; then
    attach "$clean.log" 25
    result "$name" FAIL "the uninterrupted run failed (exit $last_status, log above)"
    return
  fi
  local start_ns
  start_ns="$(date +%s%N)"
  timeout 300 "$bin/trainer" "${flags[@]}" --max_restarts=1 --store_dir="$killed" >"$killed.log" 2>&1 &
  local timeout_pid=$!
  background_pids+=("$timeout_pid")
  local launcher="" victim=""
  for _ in $(seq 100); do
    launcher="$(pgrep -P "$timeout_pid" | head -1 || true)"
    [[ -n "$launcher" ]] && break
    sleep 0.05
  done
  if [[ -n "$launcher" ]] && wait_for_step "$killed.log" "$resume_kill_step" "$timeout_pid"; then
    victim="$(rank_pid "$launcher" "$kill_rank")"
  fi
  if [[ -z "$victim" ]]; then
    wait "$timeout_pid" || true
    attach "$killed.log" 25
    result "$name" FAIL "could not find rank $kill_rank mid-run to kill (log above)"
    return
  fi
  local killed_at
  killed_at="$(grep -oE 'step [0-9]+/' "$killed.log" | tail -1)"
  kill -KILL "$victim"
  set +e
  wait "$timeout_pid"
  local status=$?
  set -e
  local killed_seconds
  killed_seconds="$(awk -v a="$start_ns" -v b="$(date +%s%N)" 'BEGIN { printf "%.1f", (b - a) / 1e9 }')"
  if [[ "$status" != 0 ]] || ! grep -q 'restarting all ranks' "$killed.log" ||
    ! grep -q "resuming $resume_model@" "$killed.log"; then
    attach "$killed.log" 30
    result "$name" FAIL "killed rank $kill_rank (pid $victim) at ${killed_at%/}; the run exited $status without a restart and resume (log above)"
    return
  fi
  local resumed verdict
  resumed="$(grep -oE "resuming $resume_model@[0-9]+[^)]*\\)?" "$killed.log" | head -1)"
  verdict="$(compare_stores "$clean" "$killed" "$work/resume-$tag-compare" || true)"
  local figures="uninterrupted ${clean_seconds} s; killed rank $kill_rank (pid $victim, signal 9) at ${killed_at%/}, $resumed, finished in ${killed_seconds} s"
  case "$verdict" in
    equal*)
      result "$name" PASS "$figures; final bundle (model, optimizer, scheduler, trainer state) bit-identical to the uninterrupted run (${verdict#equal } tensors)"
      ;;
    differ*)
      local parts
      read -r -a parts <<<"$verdict"
      local extra=""
      if [[ "$device" == cuda ]]; then
        # Tell a resume bug from run-to-run nondeterminism of the device: run the clean one again.
        timeout 300 "$bin/trainer" "${flags[@]}" --store_dir="$clean-again" >"$clean-again.log" 2>&1 || true
        extra="; two uninterrupted runs: $(compare_stores "$clean" "$clean-again" "$work/resume-$tag-again" || echo 'compare failed')"
      fi
      result "$name" FAIL "$figures; NOT bit-identical: ${parts[1]} tensors, max |diff| ${parts[2]}, first at ${parts[3]} (${parts[*]:4})$extra"
      ;;
    *)
      attach "$work/resume-$tag-compare.log" 20
      result "$name" FAIL "$figures; comparison failed: ${verdict:-no output} (log above)"
      ;;
  esac
}

check_resume() {
  say "## (c) A rank SIGKILLed and restarted (--max_restarts=1): exact resume"
  needs_full_build "(c) kill and resume" trainer || return 0
  if [[ "$gpus" -gt 1 ]]; then
    CUBLAS_WORKSPACE_CONFIG=:4096:8 resume_check "(c) kill + resume, nccl cuda 2 ranks" nccl cuda 2 1 4000
  elif [[ "$gpus" == 1 ]]; then
    CUBLAS_WORKSPACE_CONFIG=:4096:8 resume_check "(c) kill + resume, nccl cuda 1 rank" nccl cuda 1 0 4000
  else
    result "(c) kill + resume on GPU" NOT_RUN "$gpu_reason"
  fi
  needs_gloo "(c) kill + resume, gloo cpu 2 ranks" || return 0
  resume_check "(c) kill + resume, gloo cpu 2 ranks" gloo cpu 2 1 1500
}

# ---- (f) a team's TorchScript model on shard files: train, kill, exact resume ----------------

check_scripted() {
  say "## (f) A scripted model (--model=torchscript:) on shards: a rank SIGKILLed, exact resume"
  needs_full_build "(f) scripted model" trainer || return 0
  local team="$work/scripted-team"
  if ! timeout 300 "$python" "$repo/tests/testdata/scripted_training.py" make "$team" \
    >"$work/scripted-make.log" 2>&1; then
    attach "$work/scripted-make.log" 20
    result "(f) scripted model" FAIL "$python could not script the model (log above)"
    return
  fi
  # 96 examples in 4 shards, batch 4 per rank: 12 steps an epoch per 2 ranks, checkpoints every 100.
  resume_model=net-shards
  resume_model_flags=(--model=torchscript:"$team/net.ts" --data=shards:"$team/shards" --batch_size=4
    --optimizer=sgd --scheduler=step --step_size=7)
  resume_kill_step=150
  if [[ "$gpus" -gt 1 ]]; then
    CUBLAS_WORKSPACE_CONFIG=:4096:8 resume_check "(f) scripted model, nccl cuda 2 ranks" nccl cuda 2 1 600
  elif [[ "$gpus" == 1 ]]; then
    CUBLAS_WORKSPACE_CONFIG=:4096:8 resume_check "(f) scripted model, nccl cuda 1 rank" nccl cuda 1 0 600
  else
    result "(f) scripted model on GPU" NOT_RUN "$gpu_reason"
  fi
  if needs_gloo "(f) scripted model, gloo cpu 2 ranks"; then
    resume_check "(f) scripted model, gloo cpu 2 ranks" gloo cpu 2 1 600
  fi
  resume_model=mlp-synthetic
  resume_model_flags=(--hidden=128)
  resume_kill_step=400
}

# ---- (g) PyTorch Distributed Checkpoint in and out ----------------------------------------------

check_dcp() {
  say "## (g) PyTorch DCP written by torch $torch_version, imported, exported, loaded back"
  needs_full_build "(g) DCP" ckpt || return 0
  local dir="$work/dcp"
  rm -rf "$dir"
  mkdir -p "$dir"
  local status=0
  timeout 300 "$python" "$repo/tools/dcp_interop.py" write "$dir/written" >"$dir/write.log" 2>&1 ||
    status=$?
  if [[ "$status" == 3 ]]; then
    result "(g) DCP" NOT_RUN "$(tail -1 "$dir/write.log")"
    return
  elif [[ "$status" != 0 ]]; then
    attach "$dir/write.log" 30
    result "(g) DCP" FAIL "$python could not write the DCP directories (log above)"
    return
  fi
  tar czf "$(dirname "$report")/dcp-written.tar.gz" -C "$dir" written 2>/dev/null || true
  local name
  for name in one two; do
    local what="(g) DCP '$name' ($([[ "$name" == one ]] && echo 'one process' || echo 'two Gloo ranks, a row-sharded DTensor'))"
    if ! timeout 120 "$bin/ckpt" inspect "$dir/written/$name" >"$dir/$name.inspect" 2>&1; then
      attach "$dir/$name.inspect" 20
      result "$what" FAIL "ckpt inspect refused it (log above)"
      continue
    fi
    if ! timeout 120 "$bin/ckpt" --store_dir="$dir/store" import "$dir/written/$name" \
      --model="dcp-$name" >"$dir/$name.import" 2>&1 ||
      ! timeout 120 "$bin/ckpt" --store_dir="$dir/store" export "dcp-$name@1" \
        "$dir/$name.exported" --format dcp >"$dir/$name.export" 2>&1; then
      attach "$dir/$name.import" 10
      attach "$dir/$name.export" 10
      result "$what" FAIL "ckpt import / export failed (logs above)"
      continue
    fi
    if ! timeout 300 "$python" "$repo/tools/dcp_interop.py" load "$dir/$name.exported" \
      >"$dir/$name.loaded" 2>"$dir/$name.load.log"; then
      attach "$dir/$name.load.log" 20
      result "$what" FAIL "$python's dcp.load refused ckpt's export (log above)"
    elif diff <(sort "$dir/written/$name.model.txt") <(sort "$dir/$name.loaded") \
      >"$dir/$name.diff"; then
      result "$what" PASS "$(grep -c . "$dir/$name.loaded") tensors, value for value: imported ($(head -1 "$dir/$name.inspect" | sed 's/.*: //')), exported, loaded by torch $torch_version"
    else
      attach "$dir/$name.diff" 20
      result "$what" FAIL "what dcp.load read from ckpt's export differs from what was saved (diff above)"
    fi
  done
}

# ---- (d) checkpoint stall: asynchronous uploads against --sync_checkpoints -------------------

# stall_run MODE LOG BACKEND DEVICE: one trainer run; sets run_stall and run_checkpoints.
stall_run() {
  local sync="$1" log="$2" backend="$3" device="$4"
  # ~4.2 M parameters (17 MB, 50 MB with Adam's state): big enough that a save costs something.
  timed timeout 300 "$bin/trainer" --backend="$backend" --device="$device" --nproc_per_node=1 \
    --hidden=1024 --layers=4 --steps=50 --checkpoint_every=10 --log_every=10 \
    --sync_checkpoints="$sync" --store_dir="$work/stall-$backend-sync-$sync" >"$log" 2>&1
  run_stall="$(grep -oE 'checkpoint stall [0-9.]+' "$log" | grep -oE '[0-9.]+$' | tail -1 || true)"
  run_checkpoints="$(grep -E 'versions written' "$log" | grep -oE '@[0-9]+' | wc -l)"
}

# The same run twice: checkpoints uploaded in the background (the default; the loop pays for the
# snapshot) and with --sync_checkpoints (the loop waits for every upload, as torch.save would).
stall_check() {
  local name="$1" backend="$2" device="$3"
  local async_log="$work/stall-$backend-async.log" sync_log="$work/stall-$backend-sync.log"
  stall_run false "$async_log" "$backend" "$device"
  local async_status="$last_status" async_stall="$run_stall" async_checkpoints="$run_checkpoints"
  stall_run true "$sync_log" "$backend" "$device"
  local sync_status="$last_status" sync_stall="$run_stall" sync_checkpoints="$run_checkpoints"
  if [[ "$async_status" != 0 || "$sync_status" != 0 || -z "$async_stall" || -z "$sync_stall" ||
    "$async_checkpoints" == 0 || "$sync_checkpoints" == 0 ]]; then
    attach "$async_log" 20
    attach "$sync_log" 20
    result "$name" FAIL "a trainer run failed or printed no stall (logs above)"
    return
  fi
  local async_each sync_each
  async_each="$(awk -v s="$async_stall" -v n="$async_checkpoints" 'BEGIN { printf "%.4f", s / n }')"
  sync_each="$(awk -v s="$sync_stall" -v n="$sync_checkpoints" 'BEGIN { printf "%.4f", s / n }')"
  local figures="asynchronous: stall $async_stall s over $async_checkpoints checkpoints = $async_each s each; synchronous (--sync_checkpoints): $sync_stall s over $sync_checkpoints = $sync_each s each"
  if awk -v a="$async_each" -v b="$sync_each" 'BEGIN { exit !(a < b) }'; then
    result "$name" PASS "$figures"
  else
    result "$name" FAIL "$figures: the asynchronous checkpoint stalls as long as a synchronous one"
  fi
}

check_stall() {
  say "## (d) Checkpoint stall: asynchronous uploads against --sync_checkpoints"
  needs_full_build "(d) checkpoint stall" trainer || return 0
  if [[ "$gpus" -gt 0 ]]; then
    stall_check "(d) stall, nccl cuda 1 rank" nccl cuda
  else
    result "(d) stall on GPU" NOT_RUN "$gpu_reason"
  fi
  needs_gloo "(d) stall, gloo cpu 1 rank" || return 0
  stall_check "(d) stall, gloo cpu 1 rank" gloo cpu
}

# ---- (e) load onto a device through the loader service ----------------------------------------

load_check() {
  local device="$1" dir="$work/load"
  mkdir -p "$dir"
  # load_from_loader's module: Linear(4, 8), BatchNorm1d(8), ReLU, Linear(8, 3).
  if ! timeout 120 "$python" - "$dir/model.pt" >"$dir/load.log" 2>&1 <<'PY'; then
import sys
import torch
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.BatchNorm1d(8), torch.nn.ReLU(),
                            torch.nn.Linear(8, 3))
torch.save(model.state_dict(), sys.argv[1])
PY
    attach "$dir/load.log" 20
    result "(e) load onto $device" FAIL "could not write the test checkpoint with torch (log above)"
    return
  fi
  if [[ ! -d "$dir/store" ]] &&
    ! timeout 60 "$bin/ckpt" --store_dir="$dir/store" import "$dir/model.pt" --model mlp >>"$dir/load.log" 2>&1; then
    attach "$dir/load.log" 20
    result "(e) load onto $device" FAIL "ckpt import failed (log above)"
    return
  fi
  rm -f "$dir/port"
  timeout 120 "$bin/loader" --store_dir="$dir/store" --listen=127.0.0.1:0 --port_file="$dir/port" \
    >"$dir/loader.log" 2>&1 &
  local loader_pid=$!
  background_pids+=("$loader_pid")
  for _ in $(seq 200); do
    [[ -s "$dir/port" ]] && break
    sleep 0.05
  done
  if [[ ! -s "$dir/port" ]]; then
    kill "$loader_pid" 2>/dev/null || true
    attach "$dir/loader.log" 20
    result "(e) load onto $device" FAIL "the loader service did not start (log above)"
    return
  fi
  timed timeout 60 "$bin/load_from_loader" --loader="127.0.0.1:$(cat "$dir/port")" --ref=mlp \
    --device="$device" >"$dir/client-$device.log" 2>&1
  kill "$loader_pid" 2>/dev/null || true
  wait "$loader_pid" 2>/dev/null || true
  local loaded arrived stored
  loaded="$(grep -E '^loaded ' "$dir/client-$device.log" || true)"
  # "arrived: 8 float32 on cuda:1, 1 int64 on cuda:1": where Load put the tensors, before they are
  # copied into the module (a copy_ would succeed from any device, so only this line proves it).
  arrived="$(grep -E '^arrived: ' "$dir/client-$device.log" || true)"
  # The stored dtypes (the example asks for no cast).
  stored="$(timeout 60 "$bin/ckpt" --store_dir="$dir/store" show mlp@1 2>/dev/null |
    awk '$3 ~ /^\[/ { count[$2]++ } END { for (d in count) { printf "%s%d %s", sep, count[d], d; sep = ", " } }' || true)"
  if [[ "$last_status" != 0 || "$loaded" != *"onto $device"* ]]; then
    attach "$dir/client-$device.log" 20
    result "(e) load onto $device" FAIL "load_from_loader exited $last_status (log above)"
  elif [[ -z "$arrived" ]]; then
    result "(e) load onto $device" PASS "${last_seconds} s; '$loaded'; stored: ${stored:-?}; the tensors were copied into a module on $device, but load_from_loader does not print where Load put them (no 'arrived:' line), so the arrival device is not verified"
  elif grep -E '^arrived: ' "$dir/client-$device.log" | tr ',' '\n' | grep -qv "on $device\$"; then
    result "(e) load onto $device" FAIL "${last_seconds} s; '$arrived': not every tensor arrived on $device; stored: ${stored:-?}"
  else
    result "(e) load onto $device" PASS "${last_seconds} s; '$loaded'; '$arrived'; stored: ${stored:-?}"
  fi
}

check_load() {
  say "## (e) Load through the loader service onto a device (tools/examples/load_from_loader)"
  needs_full_build "(e) load" loader || return 0
  if [[ "$gpus" -gt 1 ]]; then
    load_check cuda:1
  elif [[ "$gpus" == 1 ]]; then
    result "(e) load onto cuda:1" NOT_RUN "one GPU only"
    load_check cuda:0
  else
    result "(e) load onto cuda:1" NOT_RUN "$gpu_reason"
  fi
  load_check cpu
}

# ---- Main -------------------------------------------------------------------------------------

main() {
  if detect_environment; then
    check_sources
    build
    [[ "$only" == *a* ]] && check_smoke
    [[ "$only" == *b* ]] && check_trainer
    [[ "$only" == *c* ]] && check_resume
    [[ "$only" == *d* ]] && check_stall
    [[ "$only" == *e* ]] && check_load
    [[ "$only" == *f* ]] && check_scripted
    [[ "$only" == *g* ]] && check_dcp
  else
    result "everything" FAIL "$gpu_reason"
  fi
  say "## Summary ($((SECONDS - script_start)) s)"
  say ""
  local line
  for line in "${results[@]}"; do
    say "    $line"
  done
  say ""
  say "logs and stores: $work; build: $build_dir"
  echo "report: $report"
  return "$failed"
}

main

#!/usr/bin/env bash
# Builds the parser fuzz targets with clang + libFuzzer + AddressSanitizer + UBSan and runs each
# for a bounded time on a seed corpus that real PyTorch writes. Prints one summary line per
# target (executions, coverage, corpus size) and exits non-zero if any target found a crash.
#
#   tools/fuzz/run_fuzzers.sh [--seconds N | --runs N] [TARGET...]
#
# --seconds N: each target fuzzes for N seconds (default 30). --runs N: each target runs exactly N
# inputs from seed 1, so the run repeats exactly (what CI uses).
#
# TARGET defaults to every target: the parsers (libs/format/fuzz), the store's manifest / Value
# decoders (libs/store/fuzz) and the tensor-data wire message (libs/rpc/fuzz). Seeds are written
# on every run, never committed: libs/format/fuzz/make_seeds.py (real PyTorch) for the parsers,
# libs/store/fuzz:make_seeds (those files imported into a real store) for the others. Findings
# (crash-*, leak-*, timeout-*, oom-*) and the grown corpus stay in $FUZZ_WORK (default
# ~/.cache/ckpt/fuzz).
set -euo pipefail
cd "$(dirname "$0")/../.."

seconds=30
runs=""
targets=()
while [ $# -gt 0 ]; do
  case "$1" in
    --seconds) seconds="$2"; shift 2 ;;
    --seconds=*) seconds="${1#*=}"; shift ;;
    --runs) runs="$2"; shift 2 ;;
    --runs=*) runs="${1#*=}"; shift ;;
    -h|--help) sed -n '2,17p' "$0"; exit 0 ;;
    *) targets+=("$1"); shift ;;
  esac
done
[ ${#targets[@]} -gt 0 ] || targets=(safetensors_fuzzer zip_fuzzer pickle_fuzzer torch_reader_fuzzer
                                     dcp_fuzzer manifest_fuzzer tensor_data_fuzzer)

# The package of each target, and the kind of seeds it takes.
package_of() {
  case "$1" in
    manifest_fuzzer) echo libs/store/fuzz ;;
    tensor_data_fuzzer) echo libs/rpc/fuzz ;;
    *) echo libs/format/fuzz ;;
  esac
}

work="${FUZZ_WORK:-$HOME/.cache/ckpt/fuzz}"
output_base="$HOME/.cache/ckpt/bazel-fuzz"
rm -rf "$work/seeds" "$work/seeds-manifest" "$work/seeds-tensor_data" "$work/seeds-dcp"
mkdir -p "$work/seeds" "$work/seeds-manifest" "$work/seeds-tensor_data" "$work/seeds-dcp"
/usr/bin/python3 libs/format/fuzz/make_seeds.py "$work/seeds" >/dev/null
# DCP directories, packed as dcp_fuzzer.cc takes them.
/usr/bin/python3 libs/format/testdata/dcp_fixtures.py "$work/seeds-dcp" >/dev/null

labels=(//libs/store/fuzz:make_seeds)
for t in "${targets[@]}"; do labels+=("//$(package_of "$t"):$t"); done
echo "fuzz: building ${targets[*]} with clang (libFuzzer, ASan, UBSan)"
bazel --output_base="$output_base" build --config=libfuzzer "${labels[@]}"
bin_root="$(bazel --output_base="$output_base" info --config=libfuzzer bazel-bin)"

# LibTorch is not instrumented: its allocations and ours may pair new/delete across the boundary,
# and it keeps static allocations alive at exit.
export ASAN_OPTIONS="alloc_dealloc_mismatch=0:detect_leaks=0:allocator_may_return_null=1"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
for kind in manifest tensor_data; do
  "$bin_root/libs/store/fuzz/make_seeds" "$work/seeds-$kind" --kind="$kind" \
      --torch_seeds=libs/format/fuzz/make_seeds.py >/dev/null
done
failed=0
for t in "${targets[@]}"; do
  bin="$bin_root/$(package_of "$t")"
  seeds="$work/seeds"
  case "$t" in
    manifest_fuzzer) seeds="$work/seeds-manifest" ;;
    tensor_data_fuzzer) seeds="$work/seeds-tensor_data" ;;
    dcp_fuzzer) seeds="$work/seeds-dcp" ;;
  esac
  corpus="$work/corpus/$t"
  findings="$work/findings/$t"
  mkdir -p "$corpus" "$findings"
  log="$work/$t.log"
  set +e
  if [ -n "$runs" ]; then
    budget=(-runs="$runs" -seed=1)
    corpus="$work/corpus-ci/$t"  # A fresh corpus, so the run does not depend on earlier ones.
    rm -rf "$corpus"
    mkdir -p "$corpus"
  else
    budget=(-max_total_time="$seconds")
  fi
  "$bin/$t" "$corpus" "$seeds" "${budget[@]}" -rss_limit_mb=2048 \
      -timeout=10 -max_len=1048576 -artifact_prefix="$findings/" -print_final_stats=1 >"$log" 2>&1
  rc=$?
  set -e
  executed=$(grep -Eo 'stat::number_of_executed_units: *[0-9]+' "$log" | grep -Eo '[0-9]+$' || echo "?")
  cov=$(grep -Eo 'cov: [0-9]+' "$log" | tail -1 | grep -Eo '[0-9]+' || echo "?")
  crashes=$(ls "$findings" | wc -l)
  label="${seconds}s"
  [ -z "$runs" ] || label="$runs runs"
  echo "fuzz: $t: $label, $executed executions, coverage $cov edges, corpus $(ls "$corpus" | wc -l) files, findings $crashes (rc $rc)"
  if [ "$rc" -ne 0 ] || [ "$crashes" -ne 0 ]; then
    failed=1
    grep -E "ERROR|SUMMARY|runtime error" "$log" | head -5 || true
  fi
done
exit $failed

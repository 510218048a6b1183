#ifndef CKPT_TOOLS_BENCH_TRAINING_FIGURES_H_
#define CKPT_TOOLS_BENCH_TRAINING_FIGURES_H_

// The training figures of tools/bench: R8 (2-rank Gloo DDP against two ranks alone, an MLP) and
// R9 (the real trainer on a team's scripted ResNet-18 against Python's DDP loop,
// scripted_training_bench.h).

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "tools/bench/report.h"

namespace ckpt::bench {

// Runs in a rank process (bench re-executed with --r8_rank=MODE): trains `steps` timed steps
// after a warm-up and writes its samples/s to "<out>.<rank>". MODE: "ddp" or "single".
absl::Status RunR8Rank(const std::string& mode, const std::string& out, int steps,
                       int64_t bucket_cap_bytes);

absl::Status FigureR8(const BenchOptions& options, Report& report);
absl::Status FigureR9(const BenchOptions& options, Report& report);

}  // namespace ckpt::bench

#endif  // CKPT_TOOLS_BENCH_TRAINING_FIGURES_H_

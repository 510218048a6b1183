#ifndef CKPT_TOOLS_BENCH_DEDUP_FIGURES_H_
#define CKPT_TOOLS_BENCH_DEDUP_FIGURES_H_

// The deduplication figures of tools/bench: D1 (ten fine-tuned versions sharing a frozen
// backbone: physical / logical bytes) and D1 scoped (the same commits as a scoped team makes
// them, and what the scope's bookkeeping costs).

#include "absl/status/status.h"
#include "tools/bench/report.h"

namespace ckpt::bench {

absl::Status FigureD1(const BenchOptions& options, Report& report);

}  // namespace ckpt::bench

#endif  // CKPT_TOOLS_BENCH_DEDUP_FIGURES_H_

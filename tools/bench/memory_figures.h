#ifndef CKPT_TOOLS_BENCH_MEMORY_FIGURES_H_
#define CKPT_TOOLS_BENCH_MEMORY_FIGURES_H_

// The memory figures of tools/bench, each measured in a fresh child process (this binary
// re-executed with --m1_child or --m2_child) so that the parent's heap, the page cache of other
// figures and the allocator's state do not count: M1 (peak RSS of a save and of a load against
// the checkpoint's bytes) and M2 (an export's peak RSS growth against the version's largest
// tensor).

#include <string>

#include "absl/status/status.h"
#include "tools/bench/report.h"

namespace ckpt::bench {

// Runs in an M1 child: MODE "save" commits the large workload to a new store at `db`, "load"
// loads large@1 from `db`. Prints "M1 <baseline KiB> <peak KiB> <checkpoint bytes>".
absl::Status RunM1Child(const BenchOptions& options, const std::string& mode,
                        const std::string& db);

// `saved_store` holds the large workload's version, for the load.
absl::Status FigureM1(const BenchOptions& options, const std::string& saved_store, Report& report);

// Runs in an M2 child: exports export@1 from the store at `db` to `out` in `format_name` (torch
// or safetensors). Prints "M2 <baseline KiB> <peak KiB> <largest tensor bytes> <file bytes>".
absl::Status RunM2Child(const std::string& format_name, const std::string& db,
                        const std::string& out);

absl::Status FigureM2(const BenchOptions& options, Report& report);

}  // namespace ckpt::bench

#endif  // CKPT_TOOLS_BENCH_MEMORY_FIGURES_H_

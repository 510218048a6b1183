#ifndef CKPT_TOOLS_BENCH_NETWORK_FIGURES_H_
#define CKPT_TOOLS_BENCH_NETWORK_FIGURES_H_

// The network figures of tools/bench: R4 (one gRPC Download stream from a store service on
// 127.0.0.1 against memcpy of the same bytes), R4' (against one loopback TCP stream without
// gRPC) and R4g (gRPC alone against that TCP stream, a reference with no target), each warm and
// cold.

#include "absl/status/status.h"
#include "tools/bench/report.h"
#include "tools/bench/save_load_figures.h"
#include "tools/bench/workloads.h"

namespace ckpt::bench {

// Serves `times.kept_store`, which holds the workload's version; the warm memcpy baseline is
// `times.memcpy_s`.
absl::Status FigureR4(const BenchOptions& options, const Workload& workload,
                      const SaveLoadTimes& times, Report& report);

}  // namespace ckpt::bench

#endif  // CKPT_TOOLS_BENCH_NETWORK_FIGURES_H_

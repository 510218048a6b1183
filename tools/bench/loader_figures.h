#ifndef CKPT_TOOLS_BENCH_LOADER_FIGURES_H_
#define CKPT_TOOLS_BENCH_LOADER_FIGURES_H_

// The loader figures of tools/bench: R5, the loader end to end (LoaderService -> RemoteLoader
// over loopback gRPC, and ShmLoaderServer -> SharedMemoryLoader over the shared-memory socket)
// against the local load of the same version, each warm and cold.

#include <string>

#include "absl/status/status.h"
#include "tools/bench/report.h"
#include "tools/bench/workloads.h"

namespace ckpt::bench {

// `store_path` is a store holding the workload's version (MODEL@1).
absl::Status FigureR5(const BenchOptions& options, const Workload& workload,
                      const std::string& store_path, Report& report);

}  // namespace ckpt::bench

#endif  // CKPT_TOOLS_BENCH_LOADER_FIGURES_H_

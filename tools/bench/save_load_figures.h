#ifndef CKPT_TOOLS_BENCH_SAVE_LOAD_FIGURES_H_
#define CKPT_TOOLS_BENCH_SAVE_LOAD_FIGURES_H_

// The save and load figures of tools/bench, on one workload: R1 (store save against raw write +
// fsync), R2 (against Python's torch.save + fsync), R3 (local load against torch.load), R6 (save
// against the same save without hashing) and R7 (the trainer's stall per asynchronous checkpoint
// against the synchronous save). MeasureSaveLoad times every side of R1, R2, R3 and R6 in
// interleaved runs; the figures are computed from its times.

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "tools/bench/report.h"
#include "tools/bench/workloads.h"

namespace ckpt::bench {

// Loads of one regime: seconds and minor page faults per MiB of each timed run.
struct RegimeLoads {
  std::vector<double> store_s, store_faults;    // LoadCheckpoint (tensors >= 1 MiB mapped)
  std::vector<double> copied_s, copied_faults;  // map_tensors_on_load=false
  std::vector<double> python_s, python_faults;  // torch.load
};

struct SaveLoadTimes {
  std::vector<double> raw_s, store_save_s, unhashed_save_s, python_save_s, hash_s, memcpy_s,
      libtorch_save_s, libtorch_load_s;
  // CPU seconds during each save and unhashed save: this process's, and the machine's.
  std::vector<double> save_cpu_s, save_machine_s, unhashed_cpu_s, unhashed_machine_s;
  RegimeLoads warm, cold;
  std::string kept_store;  // the last save run's store, holding WORKLOAD@1.
};

// Everything R1, R2, R3, R6 need for one workload, measured in interleaved runs; the timings go
// into `report`.
absl::StatusOr<SaveLoadTimes> MeasureSaveLoad(const BenchOptions& options, const Workload& workload,
                                              Report& report);

absl::Status FigureR1(const Workload& workload, const SaveLoadTimes& times, Report& report);
absl::Status FigureR2(const Workload& workload, const SaveLoadTimes& times, Report& report);
absl::Status FigureR3(const Workload& workload, const SaveLoadTimes& times, Report& report);
absl::Status FigureR6(const Workload& workload, const SaveLoadTimes& times, Report& report);
// Pairs its stalls with `times`' store saves.
absl::Status FigureR7(const BenchOptions& options, const Workload& workload,
                      const SaveLoadTimes& times, Report& report);

}  // namespace ckpt::bench

#endif  // CKPT_TOOLS_BENCH_SAVE_LOAD_FIGURES_H_

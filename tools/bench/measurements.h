#ifndef CKPT_TOOLS_BENCH_MEASUREMENTS_H_
#define CKPT_TOOLS_BENCH_MEASUREMENTS_H_

// The measurements several figures of tools/bench share: what a run cost (CPU, page faults), the
// baselines that need no other process (raw write + fsync, memcpy, the store's hashing alone),
// and the store's own save and load of a workload, timed.

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "libs/store/checkpoint_contents.h"
#include "libs/store/checkpoint_store.h"
#include "libs/store/rocksdb_checkpoint_store.h"
#include "tools/bench/stats.h"
#include "tools/bench/workloads.h"

namespace ckpt::bench {

// Ratio of throughputs = inverse ratio of times, run by run.
absl::StatusOr<Summary> ThroughputRatio(const std::vector<double>& operation_s,
                                        const std::vector<double>& baseline_s);

// CPU seconds (user + system) this process has used, all threads.
double ProcessCpuSeconds();

// CPU seconds every core of the machine has spent busy (not idle, not waiting for I/O), from
// /proc/stat: includes the kernel's writeback and other processes.
double MachineBusySeconds();

// Times `operation` (which returns its own seconds) and appends them to `seconds`, and the minor
// page faults the process took during it, per MiB of `bytes`, to `faults_per_mib`.
absl::Status TimeWithFaults(const std::function<absl::StatusOr<double>()>& operation, int64_t bytes,
                            std::vector<double>& seconds, std::vector<double>& faults_per_mib);

// fsync of the file or directory at `path`, opened with `flags` (O_RDONLY, plus O_DIRECTORY for
// a directory).
absl::Status FsyncPath(const std::string& path, int flags);

// Writes every tensor's bytes to a new file and fsyncs it and its directory: the least any
// durable save of these bytes to this filesystem must do.
absl::StatusOr<double> TimeRawWriteFsync(const Workload& workload, const std::string& path);

// Copies every tensor's bytes into destination memory allocated beforehand: the memory-bandwidth
// ceiling of moving these bytes, with no I/O, checks or framing. `prefault`: the destination is
// written once before the timed copy (warm); else it is left untouched, so the copy faults it in
// (cold, when allocated in the cold malloc regime).
absl::StatusOr<double> TimeMemcpy(const Workload& workload, bool prefault = true);

// SHA-256 and xxh3 exactly as the store computes them on upload: a SHA-256 of each 4 MiB chunk
// (its address) and an xxh3 of it (its read checksum); the tensor's content_hash is a SHA-256 of
// the chunk digests (ContentHasher) -- see RocksDbUploadSession::StoreChunks. Single-threaded:
// the CPU cost, which the store overlaps with its writes.
double TimeStoreHashing(const Workload& workload);

struct StoreKnobs {
  bool skip_hashing = false;  // StoreBenchmarkSeams::OpenWithoutHashing (R6's baseline).
  bool map_on_load = true;    // StoreOptions::map_tensors_on_load.
};

absl::StatusOr<std::unique_ptr<RocksDbCheckpointStore>> OpenStore(const std::string& path,
                                                                  StoreKnobs knobs = {});

// Commits `workload` to a new store at `db_path` (so nothing deduplicates against a previous
// run) with the default, synced commit. Returns the seconds of CommitCheckpoint alone.
absl::StatusOr<double> TimeStoreSave(const Workload& workload, const std::string& db_path,
                                     StoreKnobs knobs = {});

// Tensor bytes of the model and the optimizer state of `loaded`.
int64_t LoadedBytes(const LoadedCheckpoint& loaded);

// Loads the workload's version from `store` (local or remote): every byte is streamed into a
// fresh tensor and its chunk checksum verified. The first run also compares every model tensor
// with the original, so a fast wrong answer cannot pass for a figure.
absl::StatusOr<double> TimeStoreLoad(CheckpointStore& store, const Workload& workload,
                                     bool compare);

// This process's resident memory now and its peak since the last reset (VmRSS and VmHWM of
// /proc/self/status), in KiB.
struct ProcMemory {
  int64_t rss_kib = 0;
  int64_t hwm_kib = 0;
};
absl::StatusOr<ProcMemory> ReadProcMemory();
// Resets VmHWM to the current RSS (clear_refs 5), so the next peak is one measurement's alone.
void ResetPeakMemory();

}  // namespace ckpt::bench

#endif  // CKPT_TOOLS_BENCH_MEASUREMENTS_H_

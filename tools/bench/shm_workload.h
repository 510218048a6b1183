#ifndef CKPT_TOOLS_BENCH_SHM_WORKLOAD_H_
#define CKPT_TOOLS_BENCH_SHM_WORKLOAD_H_

// R5 via shared memory: a consumer on the loader's host loading through the loader's
// shared-memory socket (libs/loader/shm_server.h, libs/client/shm_loader.h), against the local
// load of the same version, in paired runs.
//
// Same memory regime on both sides: the shared-memory consumer maps the store's pack files (and
// a memfd for what the loader copies) and hashes every chunk; the local side is
// CheckpointStore::LoadCheckpoint on the same store, which maps tensors of 1 MiB or more from the
// same page cache (when the store maps on load, its default) and hashes every chunk too. Neither
// side allocates the tensors' memory, so malloc's regime does not move the figure; the page cache
// is warm for both (one untimed run of each first), and every run maps its pages afresh.
//
// Example:
//   ASSIGN_OR_RETURN(ShmLoadTimes times, TimeShmLoads(*store, ref, workload.bytes, /*runs=*/5));
//   ratio = Median(times.local_s) / Median(times.shm_s);  // throughput ratio, >= 0.9 wanted

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "libs/store/checkpoint_store.h"
#include "proto/ckpt/v1/types.pb.h"

namespace ckpt::bench {

struct ShmLoadTimes {
  std::vector<double> shm_s;    // OpenLoaderClient -> SharedMemoryLoader::Load, end to end.
  std::vector<double> local_s;  // CheckpointStore::LoadCheckpoint of the same version.
  // Of the last shared-memory load: tensor bytes the loader passed as pack files, and bytes it
  // wrote into a memfd (deduplicated or scattered tensors).
  int64_t in_place_bytes = 0;
  int64_t copied_bytes = 0;
};

// `runs` paired runs (local, then shared memory) of loading `ref` with its optimizer and
// scheduler state, dtypes kept, onto the CPU; each load must deliver `expected_bytes` of tensors.
// Starts an in-process loader service on 127.0.0.1 (the client's fallback, unused when all goes
// well) and a ShmLoaderServer on a socket in a fresh directory under /tmp, over `store`.
// INTERNAL when the shared-memory path is not taken or a load delivers other bytes; load errors
// as they are.
absl::StatusOr<ShmLoadTimes> TimeShmLoads(CheckpointStore& store, const v1::VersionRef& ref,
                                          int64_t expected_bytes, int runs);

}  // namespace ckpt::bench

#endif  // CKPT_TOOLS_BENCH_SHM_WORKLOAD_H_

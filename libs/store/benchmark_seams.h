#ifndef CKPT_LIBS_STORE_BENCHMARK_SEAMS_H_
#define CKPT_LIBS_STORE_BENCHMARK_SEAMS_H_

// What tools/bench needs and production code must not reach: the target is visible to
// //tools/bench alone, so no other caller can link it by accident.

#include <memory>

#include "absl/status/statusor.h"
#include "libs/store/rocksdb_checkpoint_store.h"

namespace ckpt {

struct StoreBenchmarkSeams {
  // A store whose chunks get serial addresses instead of SHA-256 and no xxh3, so R6 can measure
  // the store's cost without hashing. Nothing deduplicates, and the versions written cannot be
  // read back (every chunk fails its checksum). Errors as RocksDbCheckpointStore::Open.
  static absl::StatusOr<std::unique_ptr<RocksDbCheckpointStore>> OpenWithoutHashing(
      const StoreOptions& options);
};

}  // namespace ckpt

#endif  // CKPT_LIBS_STORE_BENCHMARK_SEAMS_H_

#include "libs/store/benchmark_seams.h"

namespace ckpt {

absl::StatusOr<std::unique_ptr<RocksDbCheckpointStore>> StoreBenchmarkSeams::OpenWithoutHashing(
    const StoreOptions& options) {
  return RocksDbCheckpointStore::Open(options, /*skip_hashing=*/true);
}

}  // namespace ckpt

#ifndef CKPT_LIBS_LOADER_LOCAL_LOADER_H_
#define CKPT_LIBS_LOADER_LOCAL_LOADER_H_

// LocalLoader: the Loader (loader_interface.h) that does the work in this process, over a
// CheckpointStore, reading chunks through a shared ChunkCache. The loader service is a gRPC
// adapter over one LocalLoader; `ckpt export` / `ckpt check` without --loader use one directly.
//
// Thread-safety: every method may be called concurrently; the store must outlive the loader.
//
// Example:
//   LocalLoader loader(*store, /*cache_bytes=*/int64_t{1} << 30);
//   ASSIGN_OR_RETURN(ExportResult written, loader.Export(ref, options, "out.pt"));

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "libs/loader/chunk_cache.h"
#include "libs/loader/loader_interface.h"
#include "libs/store/checkpoint_store.h"

namespace ckpt {

class LocalLoader final : public Loader {
 public:
  // `cache_bytes` bounds the chunk cache shared by every reader (0: nothing is kept).
  explicit LocalLoader(CheckpointStore& store, int64_t cache_bytes = 0);

  absl::StatusOr<LoadedState> Load(const v1::VersionRef& ref,
                                   const LoadTarget& target) const override;
  absl::StatusOr<PreflightReport> Preflight(const v1::VersionRef& ref,
                                            const std::vector<ExpectedTensor>& expected,
                                            const LoadTarget& target) const override;
  absl::StatusOr<ExportResult> Export(const v1::VersionRef& ref, const ExportOptions& options,
                                      const std::string& path) const override;

  // A reader of `ref` whose chunks come through the cache, for callers that stream (the loader
  // service's Load and Export). Errors as CheckpointStore::OpenVersion.
  absl::StatusOr<std::unique_ptr<VersionReader>> OpenVersion(const v1::VersionRef& ref) const;
  // Thread-safe (ChunkCache is): readers share it whatever the constness of their loader.
  ChunkCache& cache() const { return cache_; }

 private:
  CheckpointStore& store_;
  mutable ChunkCache cache_;
};

}  // namespace ckpt

#endif  // CKPT_LIBS_LOADER_LOCAL_LOADER_H_

#ifndef CKPT_LIBS_LOADER_CHUNK_CACHE_H_
#define CKPT_LIBS_LOADER_CHUNK_CACHE_H_

// ChunkCache: an LRU of hot store chunks, by bytes, shared by every reader of a loader process.
//
// Chunks are content-addressed (SHA-256) and immutable, so a chunk cached for one version serves
// every version and model that holds the same bytes, and never goes stale. Readers of a chunk the
// cache lacks do not all go to the store: the first one claims it and reads it ("fills" it); the
// others wait for that fill and share the result (single-flight). Sixteen clients loading one
// version at once therefore cost one store read per chunk and one cached copy.
//
// What is cached has passed the store's checks (length and xxh3, verified by the VersionReader as
// it reads), so hits are served without re-hashing. Memory: the cache holds at most
// capacity_bytes of chunks (a chunk larger than the whole capacity is served but not kept); an
// evicted chunk is freed as soon as the readers still sending it let go, so the process holds the
// capacity plus at most one tensor's chunks per reader in flight.
//
// Thread-safety: every method may be called concurrently.
//
// Example:
//   ChunkCache cache(/*capacity_bytes=*/int64_t{1} << 30);
//   ASSIGN_OR_RETURN(std::unique_ptr<VersionReader> reader, store.OpenVersion(ref));
//   std::unique_ptr<VersionReader> cached = CachedVersionReader(std::move(reader), &cache);
//   ASSIGN_OR_RETURN(at::Tensor weight, ReadTensor(*cached, "fc.weight"));  // via the cache

#include <cstdint>
#include <functional>
#include <list>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "libs/store/checkpoint_store.h"
#include "proto/ckpt/v1/types.pb.h"

namespace ckpt {

// Counters since the cache was made, and what it holds now.
struct ChunkCacheStats {
  // Chunk reads served without reading the store: cached, or shared with another reader's fill.
  int64_t hits = 0;
  // Chunk reads that claimed a fill (the store was read for them).
  int64_t misses = 0;
  // Hits that waited for another reader's fill of the chunk (counted in hits too).
  int64_t shared_fills = 0;
  // Tensors read straight from the store, bypassing the cache, because a fill they waited for
  // failed (e.g. its reader was cancelled).
  int64_t uncached_reads = 0;
  int64_t evictions = 0;
  // Chunk bytes the fills read from the store.
  int64_t bytes_from_store = 0;
  // Chunk bytes served from the cache or from shared fills.
  int64_t bytes_from_cache = 0;
  // Chunks and bytes held now, and the most bytes ever held (never above the capacity).
  int64_t entries = 0;
  int64_t resident_bytes = 0;
  int64_t peak_resident_bytes = 0;

  // "hits=.. misses=.. shared_fills=.. ..." for logs.
  std::string ToString() const;
};

// As ChunkCallback, with `owner`: when it is not null it keeps `bytes` alive and unchanged after
// the call returns (a chunk the cache holds or has just filled), so the callee may keep a view of
// them, e.g. to send them without a copy. When it is null, `bytes` are valid only during the call.
using SharedChunkCallback = std::function<absl::Status(int64_t offset, absl::string_view bytes,
                                                       const std::shared_ptr<const void>& owner)>;

class ChunkCache {
 public:
  // `capacity_bytes` >= 0; 0 caches nothing (but concurrent fills are still shared).
  explicit ChunkCache(int64_t capacity_bytes);
  ChunkCache(const ChunkCache&) = delete;
  ChunkCache& operator=(const ChunkCache&) = delete;

  // Streams `meta`'s bytes to `callback` in order, as reader.ReadTensorChunks does, one call per
  // chunk. Chunks the cache holds (or another reader is filling) come from memory; if any chunk
  // is missing, the tensor is read from `reader` once and the missing chunks are cached. Errors
  // from the reader (DATA_LOSS, ...) and from the callback as they are.
  absl::Status ReadTensorChunks(const VersionReader& reader, const v1::TensorMeta& meta,
                                const ChunkCallback& callback);
  // The same, handing out owners too (the LoaderService sends owned chunks as gRPC slices of the
  // cache's own memory). Chunks taken from the cache or assembled by this read come with their
  // owner, even one too large for the cache to keep; chunks passed straight through from
  // `reader` (another reader is filling them, or a fill failed) come without one.
  absl::Status ReadTensorSharedChunks(const VersionReader& reader, const v1::TensorMeta& meta,
                                      const SharedChunkCallback& callback);

  ChunkCacheStats stats() const;
  int64_t capacity_bytes() const { return capacity_bytes_; }

 private:
  // One chunk: being filled (done == false) or filled (bytes set, or status not OK).
  struct Slot {
    std::string sha256;
    bool done = false;
    absl::Status status;
    std::shared_ptr<const std::string> bytes;
    bool in_lru = false;
    std::list<std::string>::iterator lru_position;
  };

  // Completes a fill this reader claimed: caches `bytes` and wakes the waiters.
  void Publish(const std::shared_ptr<Slot>& slot, std::shared_ptr<const std::string> bytes);
  // Ends a claimed fill that failed: waiters fall back to reading the store themselves.
  void Fail(const std::shared_ptr<Slot>& slot, const absl::Status& status);
  void EvictToCapacity() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const int64_t capacity_bytes_;
  mutable absl::Mutex mu_;
  absl::flat_hash_map<std::string, std::shared_ptr<Slot>> slots_ ABSL_GUARDED_BY(mu_);
  // Filled, cached chunks by SHA-256, most recently used first.
  std::list<std::string> lru_ ABSL_GUARDED_BY(mu_);
  ChunkCacheStats stats_ ABSL_GUARDED_BY(mu_);
};

// A VersionReader that reads `reader`'s tensors through `cache` (not owned; must outlive it).
// manifest() is `reader`'s.
std::unique_ptr<VersionReader> CachedVersionReader(std::unique_ptr<VersionReader> reader,
                                                   ChunkCache* cache);
// The same over a reader it borrows (`reader` must outlive it too).
std::unique_ptr<VersionReader> CachedVersionReader(const VersionReader& reader, ChunkCache* cache);

}  // namespace ckpt

#endif  // CKPT_LIBS_LOADER_CHUNK_CACHE_H_

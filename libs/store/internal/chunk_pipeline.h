#ifndef CKPT_LIBS_STORE_INTERNAL_CHUNK_PIPELINE_H_
#define CKPT_LIBS_STORE_INTERNAL_CHUNK_PIPELINE_H_

// The RocksDB upload session's background pipeline for stable data (private; see
// internal/rocksdb_upload_session.h): hashing threads (one per core, up to four) take the queued
// pieces' chunks in order and hash them in parallel; one writing thread stores them in that order.
// Hashing is the slowest stage (SHA-256 at ~1.4 GiB/s a core, writes to the page cache at
// ~2 GiB/s here), so one hashing thread left a save bound by it (tools/bench R6).
//
//   ChunkPipeline pipeline(hash, store);
//   pipeline.Add(0, bytes, /*completes_tensor=*/true);  // bytes must stay alive until Drain
//   RETURN_IF_ERROR(pipeline.Drain());                   // every piece stored, or the first error

#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "libs/store/chunk_hasher.h"

namespace ckpt {

class ChunkPipeline {
 public:
  // The digest of one chunk; called on the hashing threads, concurrently.
  using Hash = std::function<ChunkDigest(absl::string_view bytes)>;
  // Stores one chunk of tensor `index`; called on the writing thread, in the order the chunks
  // were added. `completes_tensor` marks the tensor's last chunk.
  using Store = std::function<absl::Status(int index, const ChunkDigest& digest,
                                           absl::string_view bytes, bool completes_tensor)>;

  ChunkPipeline(Hash hash, Store store) : hash_(std::move(hash)), store_(std::move(store)) {}
  ~ChunkPipeline() { Stop(); }
  ChunkPipeline(const ChunkPipeline&) = delete;
  ChunkPipeline& operator=(const ChunkPipeline&) = delete;

  // Queues `bytes` (non-empty, whole chunks of kChunkBytes but the last, alive until Drain or
  // Stop returns) as the next chunks of tensor `index`; starts the threads on the first call.
  void Add(int index, absl::string_view bytes, bool completes_tensor);

  // Whether the threads run: only the writing thread may touch what Store touches until Stop.
  bool running() const { return writer_.joinable(); }

  // Waits until every queued piece is stored (or skipped after an error); the first error.
  absl::Status Drain();

  // The first error so far (Store's, or Cancel's reason), without waiting.
  absl::Status error() {
    absl::MutexLock lock(&mu_);
    return error_;
  }

  // From now on queued chunks are skipped, not stored; Drain answers `why` unless an error
  // came first.
  void Cancel(absl::Status why);

  // Ends the threads (after the queue runs out); Add starts them again.
  void Stop();

 private:
  struct Piece {
    int index = 0;
    absl::string_view bytes;
    bool completes_tensor = false;
  };
  struct HashedChunk {
    int index = 0;
    absl::string_view bytes;
    ChunkDigest digest;
    bool ends_piece = false;
    bool completes_tensor = false;
  };

  // Takes the next chunk of the front piece, hashes it (unlocked), files it by sequence number.
  void RunHasher();
  void RunWriter();
  bool HasPieceOrClosing() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The chunk that is next in order has been hashed, or every hasher has ended (and with them
  // every chunk: a hasher files its chunk before it looks for another).
  bool HasNextHashedOrDone() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const Hash hash_;
  const Store store_;
  absl::Mutex mu_;
  std::deque<Piece> pieces_ ABSL_GUARDED_BY(mu_);
  size_t piece_cursor_ ABSL_GUARDED_BY(mu_) = 0;  // bytes of the front piece taken.
  int64_t next_hash_sequence_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t next_write_sequence_ ABSL_GUARDED_BY(mu_) = 0;
  // Hashed chunks by sequence number, waiting for the writer to reach them.
  std::map<int64_t, HashedChunk> hashed_ ABSL_GUARDED_BY(mu_);
  int outstanding_pieces_ ABSL_GUARDED_BY(mu_) = 0;  // queued, not yet stored.
  bool closing_ ABSL_GUARDED_BY(mu_) = false;
  int hashers_running_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Status error_ ABSL_GUARDED_BY(mu_);
  std::vector<std::thread> hashers_;
  std::thread writer_;
};

}  // namespace ckpt

#endif  // CKPT_LIBS_STORE_INTERNAL_CHUNK_PIPELINE_H_

#ifndef CKPT_LIBS_STORE_CHUNK_BACKEND_H_
#define CKPT_LIBS_STORE_CHUNK_BACKEND_H_

// ChunkBackend: where the RocksDB store keeps its chunk bytes. RocksDB stays the index -- refs,
// manifests and `packed_chunks` (sha256 -> pack id, offset, length) -- and a backend holds only
// packs: immutable, append-once byte sequences named by a 64-bit id. Two implementations:
//   - PackDirectory (chunk_pack.h): pack files in a local directory (the default).
//   - S3ChunkBackend (s3_chunk_backend.h): one object per pack in an S3-compatible bucket.
//
// Why the pack is the unit in an object store too, not one object per chunk:
//   - Requests. A ResNet-50 checkpoint is ~320 tensors, most of them a few KiB; an object per
//     chunk is a PUT per chunk on save and a GET per chunk on load, each paying the server's
//     per-request latency (and, on a cloud, its per-request price). A pack is one multipart
//     upload of >= 8 MiB parts per commit, and a load reads ranges of it.
//   - One schema. `packed_chunks`, the refcounts, the upload records and GC's compaction of
//     mostly-dead packs stay exactly as they are for pack files; only the byte I/O moves.
//   - Content addressing stays, at the chunk level: RocksDB's refs say which chunks the store
//     holds, so a chunk is never uploaded twice, and pack ids are never reused, so a pack is
//     written once (If-None-Match guards against overwriting one).
//
// The contract the store relies on:
//   - A writer's bytes are readable by location, and survive a crash, only once Sync() returned
//     OK; the store syncs a pack before the RocksDB batch that names its chunks, so a committed
//     version never names bytes that are not durable. The store syncs each writer once.
//   - A pack is never changed after Sync (a region that a committed location names never
//     changes), so reads need no locks.
//   - Remove(id, generation) makes a pack unlistable; a backend that can keeps it readable for
//     readers on older snapshots until ReleaseRemoved(g >= generation) (pack files do; an object
//     store deletes at once, and readers that raced the delete see DATA_LOSS).
//   - Writes a crashed process left unfinished, invisible to List (an S3 multipart upload), are
//     listed by ListPending and dropped by AbortPending: GC's business after its grace period.
//
// Implementations are thread-safe; a ChunkWriter is used by one thread at a time.

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "libs/store/change_log.h"

namespace ckpt {

// Where a chunk lives: bytes [offset, offset + length) of pack `pack_id`.
struct PackLocation {
  uint64_t pack_id = 0;
  int64_t offset = 0;
  int64_t length = 0;
};

// "0123456789abcdef.pack": a pack's file or object name.
std::string PackFileName(uint64_t pack_id);
// The id PackFileName(id) names; nullopt for any other name.
std::optional<uint64_t> PackIdFromFileName(absl::string_view name);

// A private, copy-on-write mapping of a whole pack: writes to it stay private to the process
// (the pack never changes). Unmapped on destruction.
class MappedPackRegion {
 public:
  // `base` and `mapped_length` as mmap returned and took them; `size` is the pack's size.
  MappedPackRegion(void* base, size_t mapped_length, int64_t size)
      : base_(base), mapped_length_(mapped_length), size_(size) {}
  ~MappedPackRegion();
  MappedPackRegion(const MappedPackRegion&) = delete;
  MappedPackRegion& operator=(const MappedPackRegion&) = delete;
  // The pack's first byte.
  char* data() const { return static_cast<char*>(base_); }
  // Bytes of the pack that are mapped: touching data() + size() or beyond is SIGBUS.
  int64_t size() const { return size_; }

 private:
  void* const base_;
  const size_t mapped_length_;  // at least 1 (mmap refuses 0)
  const int64_t size_;
};

// Appends to one new pack. Not thread-safe.
class ChunkWriter {
 public:
  virtual ~ChunkWriter() = default;

  virtual uint64_t pack_id() const = 0;
  // Bytes appended so far, padding included.
  virtual int64_t size() const = 0;

  // Appends `bytes` at the next multiple of `alignment` (a power of two; the gap reads as zeros)
  // and returns their offset: tensors start aligned, so readers can map them in place.
  // RESOURCE_EXHAUSTED when the backend is out of space; FAILED_PRECONDITION after a Sync that
  // sealed the pack (S3); after any error the writer is unusable.
  virtual absl::StatusOr<int64_t> Append(absl::string_view bytes, int64_t alignment) = 0;

  // Makes every byte appended so far durable and readable by location.
  virtual absl::Status Sync() = 0;
};

// A pack as List sees it.
struct PackInfo {
  uint64_t pack_id = 0;
  int64_t size = 0;
  // When it was written, where the backend can be written behind this store's upload records
  // (an object store: what the store sees of it may lag); GC then leaves packs younger than its
  // grace period alone. nullopt for pack files, which only this process writes.
  std::optional<absl::Time> last_modified;
};

// A write that was started and never finished (neither synced nor abandoned cleanly).
struct PendingPack {
  uint64_t pack_id = 0;
  std::string handle;  // the backend's own (an S3 multipart upload id).
  absl::Time started = absl::InfinitePast();
};

class ChunkBackend {
 public:
  virtual ~ChunkBackend() = default;

  // What and where, for messages ("pack files in /data/ckpt/packs", "s3://bucket/prefix").
  virtual std::string Describe() const = 0;

  // Creates pack `pack_id` for appending. ALREADY_EXISTS when it exists.
  virtual absl::StatusOr<std::unique_ptr<ChunkWriter>> NewPack(uint64_t pack_id) = 0;

  // Reads `location` into `destination` (location.length bytes). DATA_LOSS when the pack is
  // missing or shorter than the location says.
  virtual absl::Status Read(const PackLocation& location, char* destination) const = 0;

  // Whether MapWhole works (pack files: yes; an object store: no, and readers copy instead).
  virtual bool CanMap() const = 0;
  // Maps all of pack `pack_id` as it is now, privately (copy-on-write). Its size() is the pack's
  // size then: callers check their extent first. UNIMPLEMENTED when !CanMap().
  virtual absl::StatusOr<std::shared_ptr<MappedPackRegion>> MapWhole(uint64_t pack_id) const = 0;

  // Every synced pack.
  virtual absl::StatusOr<std::vector<PackInfo>> List() const = 0;

  // Removes pack `pack_id` (see the header comment for readers holding its locations).
  virtual absl::Status Remove(uint64_t pack_id, uint64_t generation) = 0;
  // Releases what packs removed at generations <= `up_to` still hold. Returns how many releases
  // failed (an object store's DELETE): those stay for the next call.
  virtual int ReleaseRemoved(uint64_t up_to) = 0;

  // Writes in progress or abandoned that List does not show; empty where a pack is visible to
  // List from its first byte (pack files).
  virtual absl::StatusOr<std::vector<PendingPack>> ListPending() const = 0;
  // Discards such a write. OK when it is gone already.
  virtual absl::Status AbortPending(const PendingPack& pending) = 0;

  // The store's change log (change_log.h), kept where these packs are -- a directory beside pack
  // files, objects in the same bucket -- so that whatever holds the bytes also holds what names
  // them. Opened once, by the store that opens this backend.
  virtual absl::StatusOr<std::unique_ptr<ChangeLog>> OpenChangeLog() = 0;

  // The local file that holds pack `pack_id`, for handing the file itself to a consumer on this
  // host; nullopt where packs are not local files (an object store).
  virtual std::optional<std::string> LocalFilePath(uint64_t pack_id) const { return std::nullopt; }
};

}  // namespace ckpt

#endif  // CKPT_LIBS_STORE_CHUNK_BACKEND_H_

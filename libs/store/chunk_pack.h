#ifndef CKPT_LIBS_STORE_CHUNK_PACK_H_
#define CKPT_LIBS_STORE_CHUNK_PACK_H_

// Append-only pack files holding the RocksDB store's chunk bytes; RocksDB keeps only where each
// chunk lives (rocksdb_schema.h, `packed_chunks`). The store's default ChunkBackend
// (chunk_backend.h); s3_chunk_backend.h keeps the same packs in an object store.
//
// Why not RocksDB values: a value passes through the WAL and is written again when its memtable
// is flushed to a blob file, so every tensor byte hit the disk twice and was copied three times
// (docs/benchmarks/history.md, R1). A pack is written once, sequentially, and synced once per
// commit; a read is one pread straight into the destination tensor, or a private mapping of the
// page cache.
//
// Files are `<dir>/<16 hex digits>.pack`. A pack is only appended to by its one writer (an upload
// session or the garbage collector's compaction) and never modified or truncated after, so a
// region that a committed location names never changes: readers need no locks, and a private
// mapping of it never sees a write. Removing a pack unlinks it; its cached file descriptor stays
// open until ReleaseRemoved() covers the removal's generation, so readers on an older RocksDB
// snapshot can still read it (the store uses sequence numbers as generations).
//
// Example:
//   ASSIGN_OR_RETURN(std::unique_ptr<PackDirectory> packs, PackDirectory::Open(db_path +
//   "/packs")); ASSIGN_OR_RETURN(std::unique_ptr<ChunkWriter> writer, packs->NewPack(id));
//   ASSIGN_OR_RETURN(int64_t offset, writer->Append(bytes, /*alignment=*/4096));
//   RETURN_IF_ERROR(writer->Sync());                      // before the commit that names it
//   RETURN_IF_ERROR(packs->Read({id, offset, length}, destination));

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "libs/store/chunk_backend.h"

namespace ckpt {

// An open file descriptor, closed on destruction.
class PackFd {
 public:
  explicit PackFd(int fd) : fd_(fd) {}
  ~PackFd();
  PackFd(const PackFd&) = delete;
  PackFd& operator=(const PackFd&) = delete;
  int get() const { return fd_; }

 private:
  const int fd_;
};

class PackWriter;

// Thread-safe.
class PackDirectory final : public ChunkBackend {
 public:
  // Opens `dir`, creating it (and syncing its parent) when missing.
  static absl::StatusOr<std::unique_ptr<PackDirectory>> Open(const std::string& dir);

  std::string Describe() const override;

  // Creates pack `pack_id` (ALREADY_EXISTS if its file exists) for appending: a PackWriter.
  absl::StatusOr<std::unique_ptr<ChunkWriter>> NewPack(uint64_t pack_id) override;

  // Reads `location` into `destination` (location.length bytes). DATA_LOSS when the pack is
  // missing or shorter than the location says.
  absl::Status Read(const PackLocation& location, char* destination) const override;

  bool CanMap() const override { return true; }
  // Maps all of pack `pack_id` as it is now, privately (copy-on-write). Its size() is the file's
  // size then: touching bytes beyond it would be SIGBUS, so callers check their extent first.
  absl::StatusOr<std::shared_ptr<MappedPackRegion>> MapWhole(uint64_t pack_id) const override;

  // Every pack file's id and size in bytes (last_modified unset: only this store writes here).
  absl::StatusOr<std::vector<PackInfo>> List() const override;

  // Unlinks pack `pack_id`. Its descriptor is opened first (if it was not already) and kept, so
  // readers still holding an older location can read it until ReleaseRemoved(g) with
  // g >= `generation`.
  absl::Status Remove(uint64_t pack_id, uint64_t generation) override;
  // Closes the descriptors of packs removed at generations <= `up_to`, returning their space to
  // the filesystem.
  int ReleaseRemoved(uint64_t up_to) override;  // never fails: 0.

  // A pack file is listed from its creation: nothing is ever pending.
  absl::StatusOr<std::vector<PendingPack>> ListPending() const override {
    return std::vector<PendingPack>();
  }
  absl::Status AbortPending(const PendingPack& pending) override { return absl::OkStatus(); }

  std::optional<std::string> LocalFilePath(uint64_t pack_id) const override;

  // A DirectoryChangeLog in "changes" beside this directory (<store>/changes for <store>/packs).
  absl::StatusOr<std::unique_ptr<ChangeLog>> OpenChangeLog() override;

  const std::string& dir() const { return dir_; }

 private:
  explicit PackDirectory(std::string dir) : dir_(std::move(dir)) {}
  absl::StatusOr<std::shared_ptr<PackFd>> OpenPack(uint64_t pack_id) const;
  absl::Status CheckExtent(const PackFd& fd, const PackLocation& location) const;

  const std::string dir_;
  mutable absl::Mutex mu_;
  mutable absl::flat_hash_map<uint64_t, std::shared_ptr<PackFd>> open_ ABSL_GUARDED_BY(mu_);
  // Unlinked packs whose descriptors are still open, with their generations.
  std::vector<std::pair<uint64_t, uint64_t>> removed_ ABSL_GUARDED_BY(mu_);
};

// Appends to one pack file. Not thread-safe.
class PackWriter final : public ChunkWriter {
 public:
  PackWriter(std::string path, std::string dir, uint64_t pack_id, int fd)
      : path_(std::move(path)), dir_(std::move(dir)), pack_id_(pack_id), fd_(fd) {}

  uint64_t pack_id() const override { return pack_id_; }
  int64_t size() const override { return size_; }

  // Appends `bytes` at the next multiple of `alignment` (a power of two; the gap is a hole that
  // reads as zeros) and returns their offset: tensors start aligned, so readers can map them in
  // place. RESOURCE_EXHAUSTED when the filesystem is full, or would keep less than the reserve
  // that deletes and garbage collection need (1/32 of it, 2..256 MiB); the pack is then unusable.
  absl::StatusOr<int64_t> Append(absl::string_view bytes, int64_t alignment) override;

  // Makes every byte appended so far durable (fdatasync; the first call also syncs the
  // directory entry). Append has started writeback of all but the last few MiB already. May be
  // called again after more appends.
  absl::Status Sync() override;

 private:
  const std::string path_;
  const std::string dir_;
  const uint64_t pack_id_;
  PackFd fd_;
  int64_t size_ = 0;
  int64_t writeback_from_ = 0;  // Bytes before this have had writeback started.
  bool entry_synced_ = false;
  absl::Status failed_;
};

}  // namespace ckpt

#endif  // CKPT_LIBS_STORE_CHUNK_PACK_H_

#ifndef CKPT_LIBS_STORE_CHANGE_LOG_DIRECTORY_H_
#define CKPT_LIBS_STORE_CHANGE_LOG_DIRECTORY_H_

// DirectoryChangeLog: a ChangeLog (change_log.h) in a local directory beside the pack files, for
// stores whose chunks are pack files: a damaged or deleted RocksDB index is rebuilt from it.
//
// Records are appended to segment files named after their first record
// ("00000000000000000001.changes"), each entry an 8-byte sequence, a 4-byte length (both
// little-endian) and the record's frame; a segment is closed past kSegmentBytes and a new one
// begun (its directory entry synced). An append is one write and one fdatasync: one sync more
// than the index's own per change. An entry a crash cut short (or whose frame fails its checksum)
// at the end of the last segment was never acknowledged, and Open truncates it; damage anywhere
// else is DATA_LOSS when read.
//
// One process appends (the store's RocksDB lock guarantees it), so Append's fencing reduces to
// "the number after the last"; reads may run beside appends.
//
// Snapshot N is the file `snapshots/<N as 20 digits>.snapshot` in the log's directory, written
// atomically (a temporary file, fsync, rename, directory fsync); putting one removes all but the
// two newest.

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "libs/store/change_log.h"

namespace ckpt {

class DirectoryChangeLog final : public ChangeLog {
 public:
  // A segment is closed once it holds this many bytes.
  static constexpr int64_t kSegmentBytes = int64_t{8} << 20;

  // Opens the log in `dir`, creating the directory (and syncing its parent) when missing, and
  // truncating a torn last entry. DATA_LOSS for a segment whose entries do not follow on.
  static absl::StatusOr<std::unique_ptr<DirectoryChangeLog>> Open(const std::string& dir);
  ~DirectoryChangeLog() override;

  std::string Describe() const override;
  absl::Status Append(int64_t sequence, absl::string_view bytes) override;
  absl::StatusOr<std::vector<LoggedChange>> ReadAfter(int64_t after,
                                                      int max_count) const override;
  absl::Status PutSnapshot(int64_t sequence, absl::string_view bytes) override;
  absl::StatusOr<int64_t> LatestSnapshot() const override;
  absl::StatusOr<std::string> ReadSnapshot(int64_t sequence) const override;

  // The number of the last record (0 when the log is empty).
  int64_t last_sequence() const;

 private:
  struct Segment {
    int64_t first = 0;  // the number of its first record.
    std::string path;
  };
  // Where ReadAfter left off: the next entry after `sequence` starts at `offset` of segment
  // `segment`, so reading a log through in pages is linear.
  struct ReadPosition {
    int64_t sequence = -1;
    size_t segment = 0;
    int64_t offset = 0;
  };

  explicit DirectoryChangeLog(std::string dir) : dir_(std::move(dir)) {}
  absl::Status Recover();
  std::string SnapshotPath(int64_t sequence) const;
  // The snapshots' numbers, oldest first.
  absl::StatusOr<std::vector<int64_t>> ListSnapshots() const;
  absl::Status StartSegment(int64_t first) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const std::string dir_;
  mutable absl::Mutex mu_;
  std::vector<Segment> segments_ ABSL_GUARDED_BY(mu_);  // by first record.
  int fd_ ABSL_GUARDED_BY(mu_) = -1;                    // the last segment, for appending.
  int64_t size_ ABSL_GUARDED_BY(mu_) = 0;               // ... and its size.
  int64_t last_sequence_ ABSL_GUARDED_BY(mu_) = 0;
  mutable ReadPosition position_ ABSL_GUARDED_BY(mu_);
};

}  // namespace ckpt

#endif  // CKPT_LIBS_STORE_CHANGE_LOG_DIRECTORY_H_

#ifndef CKPT_LIBS_STORE_CHANGE_LOG_H_
#define CKPT_LIBS_STORE_CHANGE_LOG_H_

// ChangeLog: the store's ordered, append-only record of every change it acknowledges (issue #53).
//
// The RocksDB index of a store is a cache of its change log. Every acknowledged change -- a
// commit's batch (manifest, locations, refcounts, model record, aliases, history event), an
// alias move, a delete, retention, an annotation, a model change, an audit record, a GC batch --
// is first created in the log as record N+1, and only then written to RocksDB. So:
//   - a store opened on an empty directory against a log replays it and comes back exactly as it
//     was (every version, alias, history event and audit record, in the same order);
//   - a damaged or deleted index is rebuilt from the log, dropping nothing;
//   - a follower applies the records another process writes and serves reads from them;
//   - two writers cannot both succeed: record numbers are created, never overwritten, so a writer
//     that lost its place (paused, partitioned, replaced) finds its next number taken and stops.
//
// Where the log lives follows the chunk bytes (ChunkBackend::OpenChangeLog): beside the pack
// files (DirectoryChangeLog, change_log_directory.h), or in the same bucket as the packs
// (S3ChangeLog, s3_change_log.h), so the bucket alone is enough to bring a store back.
//
// Each record's bytes are framed by EncodeChangeFrame: a magic, a format version and the XXH3-64
// of the payload, so a damaged record is DATA_LOSS wherever it is read, never a silent change.
// The payload is the store's own (store.ChangeRecord, store_records.proto); the log only keeps
// bytes in order.
//
// Implementations are thread-safe.

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace ckpt {

// One record read back from a log.
struct LoggedChange {
  int64_t sequence = 0;  // 1, 2, ...: the log has no gaps.
  std::string bytes;     // As appended (a frame; DecodeChangeFrame checks it).
};

class ChangeLog {
 public:
  virtual ~ChangeLog() = default;

  // Where it is, for messages ("change log in /data/ckpt/changes", "s3://bucket/p/changes/").
  virtual std::string Describe() const = 0;

  // Creates record `sequence` (the last record's number + 1) holding `bytes`. OK once it is
  // durable. ALREADY_EXISTS when record `sequence` exists with other bytes: another writer holds
  // that number, and this one must stop writing (it is fenced). OK too when it exists with exactly
  // these bytes (an earlier attempt of this same append, whose answer was lost). Any other error
  // leaves it unknown whether the record exists: the caller reads it back (ReadAfter) before it
  // appends anything else.
  virtual absl::Status Append(int64_t sequence, absl::string_view bytes) = 0;

  // Up to `max_count` (>= 1) records numbered after `after`, in order and without gaps (fewer,
  // or none, at the log's end). DATA_LOSS when a record is missing while later ones exist.
  virtual absl::StatusOr<std::vector<LoggedChange>> ReadAfter(int64_t after,
                                                              int max_count) const = 0;

  // ---- Snapshots: the whole index as of one record, so that a store rebuilt on an empty
  // directory loads the newest and replays only the records after it, instead of every record
  // since the first. The records stay (fencing and followers read the log's tail, and a snapshot
  // is only used when the record it names is there); the two newest snapshots are kept.

  // Stores `bytes` (a frame, as records are) as the snapshot of the index after record
  // `sequence`: whole or not at all. One of the same number is replaced (it holds the same index).
  virtual absl::Status PutSnapshot(int64_t sequence, absl::string_view bytes) = 0;
  // The number of the newest snapshot; 0 when there is none.
  virtual absl::StatusOr<int64_t> LatestSnapshot() const = 0;
  // The bytes of snapshot `sequence`. NOT_FOUND when there is none of that number.
  virtual absl::StatusOr<std::string> ReadSnapshot(int64_t sequence) const = 0;
};

// The frame every record's bytes are kept in: "CKCL", a format byte, the payload's XXH3-64
// (8 bytes, little-endian) and the payload.
std::string EncodeChangeFrame(absl::string_view payload);
// The payload of `frame`; DATA_LOSS naming `where` (e.g. "change 12 in s3://b/changes/") when
// the frame is short, of another format, or its checksum fails.
absl::StatusOr<absl::string_view> DecodeChangeFrame(absl::string_view frame,
                                                    absl::string_view where);

// "00000000000000000042": a record number as a fixed-width name, so that names sort in number
// order (object keys, file names).
std::string ChangeName(int64_t sequence);
// The number ChangeName(n) names; -1 for any other text.
int64_t ChangeNumberFromName(absl::string_view name);

}  // namespace ckpt

#endif  // CKPT_LIBS_STORE_CHANGE_LOG_H_

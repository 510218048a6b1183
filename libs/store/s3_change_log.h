#ifndef CKPT_LIBS_STORE_S3_CHANGE_LOG_H_
#define CKPT_LIBS_STORE_S3_CHANGE_LOG_H_

// S3ChangeLog: a ChangeLog (change_log.h) as objects in the bucket that holds the store's packs,
// so that the bucket alone brings the whole store back (issue #53).
//
// - Record N is the object `<prefix>changes/<N as 20 digits>`, created with `If-None-Match: *`:
//   the server refuses (412) a second create of the same number, which is what fences a writer
//   that lost its place. Ceph's radosgw and AWS S3 honour the header on PUT (not on
//   CompleteMultipartUpload, so records above the client's multipart threshold are refused here
//   rather than created unconditionally).
// - An append whose answer was lost and that the client retried sees its own object (412 again):
//   the object is read back and compared, so a retried append is OK and another writer's record
//   is ALREADY_EXISTS.
// - ReadAfter lists with `start-after` and reads the listed records with up to `read_threads`
//   GETs at once.
// - Snapshot N is the object `<prefix>snapshots/<N as 20 digits>`, put whole (an object appears
//   whole or not at all, multipart or not); putting one deletes all but the two newest.
//
// Thread-safe.

#include <memory>
#include <string>
#include <vector>

#include "libs/s3/s3_client.h"
#include "libs/store/change_log.h"

namespace ckpt {

class S3ChangeLog final : public ChangeLog {
 public:
  // `prefix` as the packs' (S3ChunkBackendOptions::prefix): "" or ending in '/'.
  S3ChangeLog(std::shared_ptr<s3::S3Client> client, std::string prefix, int read_threads = 8);

  std::string Describe() const override;
  absl::Status Append(int64_t sequence, absl::string_view bytes) override;
  absl::StatusOr<std::vector<LoggedChange>> ReadAfter(int64_t after,
                                                      int max_count) const override;
  absl::Status PutSnapshot(int64_t sequence, absl::string_view bytes) override;
  absl::StatusOr<int64_t> LatestSnapshot() const override;
  absl::StatusOr<std::string> ReadSnapshot(int64_t sequence) const override;

  // The object key of record `sequence`.
  std::string ObjectKey(int64_t sequence) const;

 private:
  const std::shared_ptr<s3::S3Client> client_;
  // The snapshots' numbers, oldest first.
  absl::StatusOr<std::vector<int64_t>> ListSnapshots() const;

  const std::string changes_prefix_;    // prefix + "changes/"
  const std::string snapshots_prefix_;  // prefix + "snapshots/"
  const int read_threads_;
};

}  // namespace ckpt

#endif  // CKPT_LIBS_STORE_S3_CHANGE_LOG_H_

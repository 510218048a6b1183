#ifndef CKPT_LIBS_IO_ATOMIC_FILE_H_
#define CKPT_LIBS_IO_ATOMIC_FILE_H_

// AtomicFileWriter: writes a file so that readers see either the old file or the complete new
// one, never a truncated mix -- even after a crash, a full disk or a kill mid-write.
//
// Bytes go to a temporary file beside the target (same filesystem), which Commit() fsyncs,
// renames over the target and makes durable by fsyncing the directory. Destroying an uncommitted
// writer removes the temporary file. Not thread-safe.
//
// Example:
//   ASSIGN_OR_RETURN(AtomicFileWriter out, AtomicFileWriter::Create("/exports/model.safetensors"));
//   RETURN_IF_ERROR(out.Append(header));
//   RETURN_IF_ERROR(out.Append(tensor_bytes));
//   RETURN_IF_ERROR(out.Commit());

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace ckpt {

class AtomicFileWriter {
 public:
  // Creates the temporary file. NOT_FOUND if the directory does not exist, PERMISSION_DENIED,
  // RESOURCE_EXHAUSTED when the disk is full, UNAVAILABLE for other I/O errors.
  static absl::StatusOr<AtomicFileWriter> Create(std::string path);

  AtomicFileWriter(AtomicFileWriter&& other) noexcept;
  AtomicFileWriter& operator=(AtomicFileWriter&& other) noexcept;
  AtomicFileWriter(const AtomicFileWriter&) = delete;
  AtomicFileWriter& operator=(const AtomicFileWriter&) = delete;
  ~AtomicFileWriter();  // Abandons (deletes the temporary file) unless committed.

  // Appends bytes. RESOURCE_EXHAUSTED on a full disk (ENOSPC / EDQUOT), UNAVAILABLE otherwise;
  // after an error the writer is abandoned and further calls fail with FAILED_PRECONDITION.
  absl::Status Append(absl::string_view bytes);

  // Makes the file durable and visible under its final path. Errors as for Append.
  absl::Status Commit();

  // Deletes the temporary file; the target is untouched. Idempotent.
  void Abandon();

  const std::string& path() const { return path_; }
  uint64_t bytes_written() const { return bytes_written_; }

 private:
  AtomicFileWriter(std::string path, std::string temp_path, int fd);

  std::string path_;
  std::string temp_path_;
  int fd_ = -1;
  uint64_t bytes_written_ = 0;
};

// Writes `contents` to `path` atomically (see AtomicFileWriter).
absl::Status WriteFileAtomically(const std::string& path, absl::string_view contents);

// Makes `directory`'s entries durable (fsync of the directory): a created, renamed or removed
// file survives a crash only once its directory is synced.
absl::Status SyncDirectory(const std::string& directory);

// Translates errno from a failed system call on `path` into a status: ENOENT NOT_FOUND,
// EACCES / EPERM PERMISSION_DENIED, ENOSPC / EDQUOT RESOURCE_EXHAUSTED, others UNAVAILABLE.
absl::Status ErrnoToStatus(int error_number, absl::string_view operation, absl::string_view path);

}  // namespace ckpt

#endif  // CKPT_LIBS_IO_ATOMIC_FILE_H_

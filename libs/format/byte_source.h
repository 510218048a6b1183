#ifndef CKPT_LIBS_FORMAT_BYTE_SOURCE_H_
#define CKPT_LIBS_FORMAT_BYTE_SOURCE_H_

// ByteSource: read-only random access to the bytes of a checkpoint, from a file (pread) or from
// memory. The readers in libs/format fetch exactly the byte ranges they need through it, so a
// tensor's bytes land straight in the tensor's storage buffer without an intermediate copy.
//
// Implementations are thread-compatible for concurrent ReadAt calls (pread has no file position).
//
// Example:
//   ASSIGN_OR_RETURN(std::unique_ptr<ByteSource> file, OpenFileSource("/ckpts/model.pt"));
//   std::string magic(4, '\0');
//   RETURN_IF_ERROR(file->ReadAt(0, absl::MakeSpan(magic)));

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace ckpt {

class ByteSource {
 public:
  virtual ~ByteSource() = default;

  // Total size in bytes.
  virtual uint64_t size() const = 0;

  // What error messages call the source: the path, or a caller-given name for memory.
  virtual const std::string& name() const = 0;

  // Fills `dst` with the bytes at [offset, offset + dst.size()). DATA_LOSS if that range runs
  // past the end (the file is shorter than its own structures claim); UNAVAILABLE on an I/O error.
  virtual absl::Status ReadAt(uint64_t offset, absl::Span<char> dst) const = 0;

  // ReadAt into a new string of `length` bytes. The caller bounds `length` (checked against
  // size() here before allocating).
  absl::StatusOr<std::string> ReadString(uint64_t offset, uint64_t length) const;
};

// Opens `path` for reading. NOT_FOUND if it does not exist, PERMISSION_DENIED, or
// INVALID_ARGUMENT for a directory; UNAVAILABLE for other errors.
absl::StatusOr<std::unique_ptr<ByteSource>> OpenFileSource(const std::string& path);

// A source over `bytes`, which the caller keeps alive and unchanged while the source is used.
std::unique_ptr<ByteSource> MemorySource(absl::string_view bytes, std::string name);

}  // namespace ckpt

#endif  // CKPT_LIBS_FORMAT_BYTE_SOURCE_H_

#ifndef CKPT_LIBS_FORMAT_ZIP_WRITER_H_
#define CKPT_LIBS_FORMAT_ZIP_WRITER_H_

// ZipWriter: writes the zip container torch.save uses -- uncompressed ("stored") entries whose
// data starts on a 64-byte boundary (PyTorch pads the local header's extra field the same way,
// so readers can mmap tensor records), ZIP64 records when a size, offset or entry count needs
// them. Python's zipfile, PyTorch's reader (miniz) and libs/format's ZipReader read the output.
//
// Entries are written whole: the caller passes each record's bytes once (a tensor's storage),
// and nothing is buffered beyond the central directory, so a writer holding one record at a time
// streams a file of any size. The local header carries the CRC-32 and sizes (no data descriptor:
// the caller has the record in memory anyway, and every reader then finds them in the header).
// PlannedBytes gives the file's size from the entries' names and sizes alone, before any record
// exists. Not thread-safe.
//
// Example:
//   ZipWriter zip(&file);  // file: an AtomicFileWriter
//   RETURN_IF_ERROR(zip.AddEntry("archive/data.pkl", pickle));
//   RETURN_IF_ERROR(zip.AddEntry("archive/data/0", storage_bytes));
//   RETURN_IF_ERROR(zip.Finish());
//   RETURN_IF_ERROR(file.Commit());

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "libs/io/atomic_file.h"

namespace ckpt {

struct ZipWriterOptions {
  // Data of every entry starts at a multiple of this many bytes (PyTorch uses 64). 1 disables.
  int alignment = 64;
  // Write ZIP64 records even when nothing needs them (tests exercise the >4 GiB layout this way).
  bool force_zip64 = false;
};

// Receives the file's bytes in order; a non-OK return fails the call that wrote them.
using ZipSink = std::function<absl::Status(absl::string_view bytes)>;

class ZipWriter {
 public:
  // `out` must outlive the writer; the writer appends to it and never commits it.
  explicit ZipWriter(AtomicFileWriter* out, ZipWriterOptions options = {});
  // The file goes to `sink` (a stream, e.g. an RPC), in order, never revisited.
  explicit ZipWriter(ZipSink sink, ZipWriterOptions options = {});

  // The size of the file that entries of these (name, data size) pairs, added in this order,
  // make; exactly what bytes_written() is after their AddEntry calls and Finish.
  static uint64_t PlannedBytes(const std::vector<std::pair<std::string, uint64_t>>& entries,
                               ZipWriterOptions options = {});

  // Appends one stored entry. INVALID_ARGUMENT for an empty name, a name over 65535 bytes or a
  // duplicate; write errors from `out`. FAILED_PRECONDITION after Finish.
  absl::Status AddEntry(absl::string_view name, absl::string_view data);

  // Writes the central directory and end records. Call once, after the last entry.
  absl::Status Finish();

  // Bytes given to the output so far.
  uint64_t bytes_written() const { return offset_; }

 private:
  struct Entry {
    std::string name;
    uint32_t crc32;
    uint64_t size;
    uint64_t local_header_offset;
  };

  absl::Status Write(absl::string_view bytes);
  // Checks the name and writes the local header of an entry whose data follows.
  absl::Status AddHeader(absl::string_view name, uint64_t size, uint32_t crc32);

  ZipSink sink_;
  ZipWriterOptions options_;
  uint64_t offset_ = 0;
  std::vector<Entry> entries_;
  absl::flat_hash_set<std::string> names_;
  bool finished_ = false;
};

}  // namespace ckpt

#endif  // CKPT_LIBS_FORMAT_ZIP_WRITER_H_

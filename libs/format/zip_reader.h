#ifndef CKPT_LIBS_FORMAT_ZIP_READER_H_
#define CKPT_LIBS_FORMAT_ZIP_READER_H_

// ZipReader: the zip container of torch.save files (PyTorch >= 1.6), read without trusting it.
//
// It parses the end-of-central-directory record (ZIP64 too: torch writes ZIP64 records for big
// checkpoints), bounds-checks the central directory against the file, and reads an entry's bytes
// straight into a caller buffer after checking its local header, then verifies the entry's CRC-32.
// Stored entries (method 0, what torch.save writes) and deflated ones (method 8: the code/ files
// of a TorchScript archive, inflated with zlib, at most 1 GiB each) are readable; other methods
// and encrypted entries give UNIMPLEMENTED naming the entry. A deflated entry that claims more
// than deflate's 1032:1 expansion of its compressed size is refused before any allocation.
//
// The reader keeps a pointer to its ByteSource, which must outlive it. After Open, all methods are
// const and safe to call from several threads at once.
//
// Example:
//   ASSIGN_OR_RETURN(std::unique_ptr<ByteSource> file, OpenFileSource(path));
//   ASSIGN_OR_RETURN(ZipReader zip, ZipReader::Open(file.get()));
//   if (const ZipEntry* pkl = zip.Find("archive/data.pkl")) {
//     ASSIGN_OR_RETURN(std::string pickle, zip.ReadToString(*pkl, /*max_size=*/1 << 30));
//   }

#include <cstdint>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "libs/format/byte_source.h"

namespace ckpt {

// One central-directory record, with ZIP64 sizes and offsets already applied.
struct ZipEntry {
  std::string name;
  uint16_t flags = 0;   // General purpose bits; bit 0 = encrypted, bit 3 = data descriptor.
  uint16_t method = 0;  // 0 = stored, 8 = deflate, ...
  uint32_t crc32 = 0;
  uint64_t compressed_size = 0;
  uint64_t uncompressed_size = 0;
  uint64_t local_header_offset = 0;
};

class ZipReader {
 public:
  // Reads the central directory of `source`. INVALID_ARGUMENT when the file is not a zip archive
  // or its directory is inconsistent (offsets outside the file, overlapping records, duplicate
  // names); DATA_LOSS when it is cut short; UNIMPLEMENTED for multi-disk archives.
  static absl::StatusOr<ZipReader> Open(const ByteSource* source);

  // True when the first bytes look like a zip archive (a local header or an empty archive's
  // end record). Cheap sniffing for format detection; Open does the real checks.
  static bool HasZipMagic(absl::string_view first_bytes);

  // In central-directory order.
  const std::vector<ZipEntry>& entries() const { return entries_; }

  // nullptr if no entry has exactly this name.
  const ZipEntry* Find(absl::string_view name) const;

  // Where `entry`'s bytes start, after checking its local header (signature, name) and that the
  // data lies inside the file and before the central directory. INVALID_ARGUMENT otherwise.
  absl::StatusOr<uint64_t> DataOffset(const ZipEntry& entry) const;

  // Reads all of `entry` into `dst` (dst.size() must be entry.uncompressed_size, else
  // INVALID_ARGUMENT), inflating a deflated one, and checks its CRC-32: DATA_LOSS on a mismatch,
  // a short file or corrupt deflate data; UNIMPLEMENTED for other methods or encrypted entries.
  absl::Status Read(const ZipEntry& entry, absl::Span<char> dst) const;

  // Read into a new string; RESOURCE_EXHAUSTED if the entry is larger than `max_size`.
  absl::StatusOr<std::string> ReadToString(const ZipEntry& entry, uint64_t max_size) const;

  const ByteSource& source() const { return *source_; }

 private:
  ZipReader(const ByteSource* source, std::vector<ZipEntry> entries, uint64_t directory_offset);

  std::string Where(const ZipEntry& entry) const;
  // DATA_LOSS / INVALID_ARGUMENT when `entry` claims more bytes than its data can hold.
  absl::Status CheckSizeClaim(const ZipEntry& entry) const;
  // Inflates the deflated `entry`, whose data starts at `offset`, into `dst`.
  absl::Status Inflate(const ZipEntry& entry, uint64_t offset, absl::Span<char> dst) const;

  static constexpr uint16_t kMethodStored = 0;
  static constexpr uint16_t kMethodDeflate = 8;
  // Deflate's largest expansion (258-byte matches coded in ~2 bits): 1032:1.
  static constexpr uint64_t kMaxDeflateRatio = 1032;
  // zlib's counters are 32-bit; TorchScript sources are kilobytes.
  static constexpr uint64_t kMaxInflateBytes = uint64_t{1} << 30;

  const ByteSource* source_;
  std::vector<ZipEntry> entries_;
  absl::flat_hash_map<std::string, size_t> index_;
  uint64_t directory_offset_;  // Entry data must end before this.
};

}  // namespace ckpt

#endif  // CKPT_LIBS_FORMAT_ZIP_READER_H_

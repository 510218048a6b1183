#include "libs/format/zip_reader.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "libs/format/crc32.h"
#include "libs/format/zip_format.h"
#include "libs/status/status_macros.h"
#include "zlib.h"

namespace ckpt {
namespace {

using namespace ::ckpt::zip;  // NOLINT: the format's constants, named as in the spec.

constexpr uint64_t kMaxCommentSize = 0xFFFF;

// Little-endian field reader over a buffer that bounds-checks every read.
class FieldReader {
 public:
  explicit FieldReader(absl::string_view data) : data_(data) {}

  bool Has(size_t n) const { return n <= data_.size() - pos_; }
  size_t pos() const { return pos_; }
  void Skip(size_t n) { pos_ += n; }  // Callers check Has(n) first.

  uint16_t U16() { return static_cast<uint16_t>(Unsigned(2)); }
  uint32_t U32() { return static_cast<uint32_t>(Unsigned(4)); }
  uint64_t U64() { return Unsigned(8); }
  absl::string_view Bytes(size_t n) {
    absl::string_view out = data_.substr(pos_, n);
    pos_ += n;
    return out;
  }

 private:
  uint64_t Unsigned(int n) {
    uint64_t value = 0;
    for (int i = 0; i < n; ++i) {
      value |= uint64_t{static_cast<unsigned char>(data_[pos_ + i])} << (8 * i);
    }
    pos_ += n;
    return value;
  }

  absl::string_view data_;
  size_t pos_ = 0;
};

uint32_t LoadU32(absl::string_view data, size_t pos) {
  FieldReader reader(data.substr(pos, 4));
  return reader.U32();
}

struct EndRecord {
  uint64_t entry_count = 0;
  uint64_t directory_size = 0;
  uint64_t directory_offset = 0;
  uint64_t directory_limit = 0;  // The directory must end here (the first end record).
};

absl::Status Corrupt(const ByteSource& source, absl::string_view what) {
  return absl::InvalidArgumentError(
      absl::StrCat(source.name(), ": not a valid zip archive: ", what));
}

absl::StatusOr<EndRecord> ReadZip64End(const ByteSource& source, uint64_t locator_offset) {
  ASSIGN_OR_RETURN(std::string locator, source.ReadString(locator_offset, kZip64LocatorSize));
  FieldReader loc(locator);
  loc.U32();  // Signature, checked by the caller.
  const uint32_t disk = loc.U32();
  const uint64_t record_offset = loc.U64();
  const uint32_t disk_count = loc.U32();
  if (disk != 0 || disk_count > 1) {
    return absl::UnimplementedError(absl::StrCat(
        source.name(), ": multi-disk zip archives are not supported (", disk_count, " disks)"));
  }
  if (record_offset > locator_offset || locator_offset - record_offset < kZip64EndSize) {
    return Corrupt(source, absl::StrCat("ZIP64 end record offset ", record_offset,
                                        " does not lie before its locator at ", locator_offset));
  }
  ASSIGN_OR_RETURN(std::string record, source.ReadString(record_offset, kZip64EndSize));
  FieldReader rec(record);
  if (rec.U32() != kZip64EndSignature) {
    return Corrupt(source, absl::StrCat("no ZIP64 end record signature at offset ", record_offset));
  }
  rec.U64();  // Size of the rest of the record.
  rec.U16();  // Version made by.
  rec.U16();  // Version needed.
  const uint32_t this_disk = rec.U32();
  const uint32_t directory_disk = rec.U32();
  const uint64_t entries_on_disk = rec.U64();
  EndRecord end;
  end.entry_count = rec.U64();
  end.directory_size = rec.U64();
  end.directory_offset = rec.U64();
  end.directory_limit = record_offset;
  if (this_disk != 0 || directory_disk != 0 || entries_on_disk != end.entry_count) {
    return absl::UnimplementedError(
        absl::StrCat(source.name(), ": multi-disk zip archives are not supported"));
  }
  return end;
}

absl::StatusOr<EndRecord> ReadEnd(const ByteSource& source) {
  const uint64_t size = source.size();
  bool starts_like_zip = false;
  if (size >= 4) {
    ASSIGN_OR_RETURN(std::string head, source.ReadString(0, 4));
    starts_like_zip = LoadU32(head, 0) == kLocalHeaderSignature;
  }
  if (size < kEndSize) {
    if (starts_like_zip) {
      return absl::DataLossError(absl::StrCat(source.name(), ": a zip archive cut to ", size,
                                              " bytes (the file is truncated?)"));
    }
    return Corrupt(source, absl::StrCat("the file has only ", size, " bytes"));
  }
  const uint64_t tail_size = std::min(size, kEndSize + kMaxCommentSize);
  const uint64_t tail_offset = size - tail_size;
  ASSIGN_OR_RETURN(std::string tail, source.ReadString(tail_offset, tail_size));
  // The last end record whose comment fits in the file: a comment may itself contain "PK\5\6".
  for (size_t pos = tail.size() - kEndSize + 1; pos-- > 0;) {
    if (LoadU32(tail, pos) != kEndSignature) continue;
    FieldReader rec(absl::string_view(tail).substr(pos, kEndSize));
    rec.U32();
    const uint16_t this_disk = rec.U16();
    const uint16_t directory_disk = rec.U16();
    const uint16_t entries_on_disk = rec.U16();
    const uint16_t entry_count = rec.U16();
    const uint32_t directory_size = rec.U32();
    const uint32_t directory_offset = rec.U32();
    const uint16_t comment_size = rec.U16();
    if (pos + kEndSize + comment_size > tail.size()) continue;
    const uint64_t end_offset = tail_offset + pos;

    if (end_offset >= kZip64LocatorSize) {
      ASSIGN_OR_RETURN(std::string maybe_locator,
                       source.ReadString(end_offset - kZip64LocatorSize, 4));
      if (LoadU32(maybe_locator, 0) == kZip64LocatorSignature) {
        return ReadZip64End(source, end_offset - kZip64LocatorSize);
      }
    }
    if (this_disk != 0 || directory_disk != 0 || entries_on_disk != entry_count) {
      return absl::UnimplementedError(
          absl::StrCat(source.name(), ": multi-disk zip archives are not supported"));
    }
    if (entry_count == 0xFFFF || directory_size == 0xFFFFFFFF || directory_offset == 0xFFFFFFFF) {
      return Corrupt(source, "the end record defers to a ZIP64 end record that is missing");
    }
    EndRecord end;
    end.entry_count = entry_count;
    end.directory_size = directory_size;
    end.directory_offset = directory_offset;
    end.directory_limit = end_offset;
    return end;
  }
  if (starts_like_zip) {
    return absl::DataLossError(
        absl::StrCat(source.name(),
                     ": starts like a zip archive but has no end-of-central-directory record "
                     "(the file is truncated?)"));
  }
  return Corrupt(source, "no end-of-central-directory record in the last 64 KiB");
}

// Applies a ZIP64 extended-information extra field to the 32-bit values set to 0xFFFFFFFF.
absl::Status ApplyZip64Extra(const ByteSource& source, absl::string_view extra, ZipEntry& entry,
                             bool size32_max, bool compressed32_max, bool offset32_max) {
  FieldReader reader(extra);
  bool found = false;
  while (reader.Has(4)) {
    const uint16_t id = reader.U16();
    const uint16_t length = reader.U16();
    if (!reader.Has(length)) {
      return Corrupt(source, absl::StrCat("entry '", entry.name, "': extra field 0x", absl::Hex(id),
                                          " runs past its extra data"));
    }
    FieldReader field(reader.Bytes(length));
    if (id != kZip64ExtraId) continue;
    found = true;
    auto take = [&](uint64_t& value, const char* what) -> absl::Status {
      if (!field.Has(8)) {
        return Corrupt(
            source, absl::StrCat("entry '", entry.name, "': ZIP64 extra field lacks the ", what));
      }
      value = field.U64();
      return absl::OkStatus();
    };
    if (size32_max) RETURN_IF_ERROR(take(entry.uncompressed_size, "uncompressed size"));
    if (compressed32_max) RETURN_IF_ERROR(take(entry.compressed_size, "compressed size"));
    if (offset32_max) RETURN_IF_ERROR(take(entry.local_header_offset, "local header offset"));
  }
  if (!found && (size32_max || compressed32_max || offset32_max)) {
    return Corrupt(source, absl::StrCat("entry '", entry.name,
                                        "' has 0xFFFFFFFF sizes but no ZIP64 extra field"));
  }
  return absl::OkStatus();
}

}  // namespace

bool ZipReader::HasZipMagic(absl::string_view first_bytes) {
  if (first_bytes.size() < 4) return false;
  const uint32_t magic = LoadU32(first_bytes, 0);
  return magic == kLocalHeaderSignature || magic == kEndSignature;
}

ZipReader::ZipReader(const ByteSource* source, std::vector<ZipEntry> entries,
                     uint64_t directory_offset)
    : source_(source), entries_(std::move(entries)), directory_offset_(directory_offset) {
  for (size_t i = 0; i < entries_.size(); ++i) index_.emplace(entries_[i].name, i);
}

absl::StatusOr<ZipReader> ZipReader::Open(const ByteSource* source) {
  ASSIGN_OR_RETURN(EndRecord end, ReadEnd(*source));
  if (end.directory_offset > end.directory_limit ||
      end.directory_size > end.directory_limit - end.directory_offset) {
    return Corrupt(*source, absl::StrCat("central directory [", end.directory_offset, ", +",
                                         end.directory_size, ") does not end before offset ",
                                         end.directory_limit));
  }
  if (end.entry_count > end.directory_size / kCentralHeaderSize) {
    return Corrupt(*source, absl::StrCat("end record claims ", end.entry_count,
                                         " entries but the central directory has only ",
                                         end.directory_size, " bytes"));
  }
  ASSIGN_OR_RETURN(std::string directory,
                   source->ReadString(end.directory_offset, end.directory_size));
  FieldReader reader(directory);
  std::vector<ZipEntry> entries;
  entries.reserve(end.entry_count);
  absl::flat_hash_map<std::string, size_t> seen;
  for (uint64_t i = 0; i < end.entry_count; ++i) {
    const size_t record_offset = reader.pos();
    const uint64_t file_offset = end.directory_offset + record_offset;
    if (!reader.Has(kCentralHeaderSize)) {
      return Corrupt(*source, absl::StrCat("central directory entry ", i, " at offset ",
                                           file_offset, " runs past the directory"));
    }
    if (reader.U32() != kCentralHeaderSignature) {
      return Corrupt(*source, absl::StrCat("central directory entry ", i, " at offset ",
                                           file_offset, " has a bad signature"));
    }
    ZipEntry entry;
    reader.U16();  // Version made by.
    reader.U16();  // Version needed.
    entry.flags = reader.U16();
    entry.method = reader.U16();
    reader.U16();  // Time.
    reader.U16();  // Date.
    entry.crc32 = reader.U32();
    const uint32_t compressed32 = reader.U32();
    const uint32_t size32 = reader.U32();
    const uint16_t name_size = reader.U16();
    const uint16_t extra_size = reader.U16();
    const uint16_t comment_size = reader.U16();
    const uint16_t start_disk = reader.U16();
    reader.U16();  // Internal attributes.
    reader.U32();  // External attributes.
    const uint32_t offset32 = reader.U32();
    if (!reader.Has(size_t{name_size} + extra_size + comment_size)) {
      return Corrupt(*source, absl::StrCat("central directory entry ", i, " at offset ",
                                           file_offset, " runs past the directory"));
    }
    entry.name = std::string(reader.Bytes(name_size));
    const absl::string_view extra = reader.Bytes(extra_size);
    reader.Skip(comment_size);
    entry.compressed_size = compressed32;
    entry.uncompressed_size = size32;
    entry.local_header_offset = offset32;
    RETURN_IF_ERROR(ApplyZip64Extra(*source, extra, entry, size32 == 0xFFFFFFFF,
                                    compressed32 == 0xFFFFFFFF, offset32 == 0xFFFFFFFF));
    if (start_disk != 0 && start_disk != 0xFFFF) {
      return absl::UnimplementedError(
          absl::StrCat(source->name(), ": multi-disk zip archives are not supported"));
    }
    if (entry.local_header_offset >= end.directory_offset) {
      return Corrupt(
          *source, absl::StrCat("entry '", entry.name, "' claims its local header at ",
                                entry.local_header_offset, ", not before the central directory at ",
                                end.directory_offset));
    }
    if (!seen.emplace(entry.name, i).second) {
      return Corrupt(*source, absl::StrCat("duplicate entry '", entry.name, "'"));
    }
    entries.push_back(std::move(entry));
  }
  return ZipReader(source, std::move(entries), end.directory_offset);
}

const ZipEntry* ZipReader::Find(absl::string_view name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : &entries_[it->second];
}

std::string ZipReader::Where(const ZipEntry& entry) const {
  return absl::StrCat(source_->name(), ": zip entry '", entry.name, "'");
}

absl::StatusOr<uint64_t> ZipReader::DataOffset(const ZipEntry& entry) const {
  if (entry.local_header_offset > directory_offset_ ||
      directory_offset_ - entry.local_header_offset < kLocalHeaderSize) {
    return absl::InvalidArgumentError(absl::StrCat(Where(entry), ": local header at ",
                                                   entry.local_header_offset,
                                                   " overlaps the central directory"));
  }
  ASSIGN_OR_RETURN(std::string header,
                   source_->ReadString(entry.local_header_offset, kLocalHeaderSize));
  FieldReader reader(header);
  if (reader.U32() != kLocalHeaderSignature) {
    return absl::InvalidArgumentError(absl::StrCat(
        Where(entry), ": no local header signature at offset ", entry.local_header_offset));
  }
  reader.Skip(22);
  const uint16_t name_size = reader.U16();
  const uint16_t extra_size = reader.U16();
  const uint64_t name_offset = entry.local_header_offset + kLocalHeaderSize;
  const uint64_t data_offset = name_offset + name_size + extra_size;
  if (data_offset > directory_offset_ || entry.compressed_size > directory_offset_ - data_offset) {
    return absl::InvalidArgumentError(
        absl::StrCat(Where(entry), ": data [", data_offset, ", +", entry.compressed_size,
                     ") does not end before the central directory at ", directory_offset_));
  }
  ASSIGN_OR_RETURN(std::string local_name, source_->ReadString(name_offset, name_size));
  if (local_name != entry.name) {
    return absl::InvalidArgumentError(
        absl::StrCat(Where(entry), ": local header names '", local_name, "'"));
  }
  return data_offset;
}

absl::Status ZipReader::CheckSizeClaim(const ZipEntry& entry) const {
  if (entry.method == kMethodStored) {
    if (entry.uncompressed_size > source_->size()) {
      return absl::DataLossError(absl::StrCat(Where(entry), " claims ", entry.uncompressed_size,
                                              " bytes but the file has only ", source_->size()));
    }
  } else if (entry.uncompressed_size / kMaxDeflateRatio > entry.compressed_size) {
    // Checked before anything is allocated for it: a few bytes cannot claim gigabytes.
    return absl::InvalidArgumentError(absl::StrCat(
        Where(entry), " claims ", entry.uncompressed_size, " bytes from ", entry.compressed_size,
        " compressed ones, more than deflate can expand (", kMaxDeflateRatio, ":1)"));
  }
  return absl::OkStatus();
}

absl::Status ZipReader::Inflate(const ZipEntry& entry, uint64_t offset,
                                absl::Span<char> dst) const {
  if (entry.compressed_size > kMaxInflateBytes || dst.size() > kMaxInflateBytes) {
    return absl::UnimplementedError(absl::StrCat(
        Where(entry), " is a deflated entry of ", entry.compressed_size, " -> ", dst.size(),
        " bytes; deflated entries are read up to ", kMaxInflateBytes, " bytes"));
  }
  std::string compressed(entry.compressed_size, '\0');
  RETURN_IF_ERROR(source_->ReadAt(offset, absl::MakeSpan(compressed)));
  z_stream stream{};
  if (inflateInit2(&stream, -MAX_WBITS) != Z_OK) {  // raw deflate: zip has no zlib header
    return absl::InternalError("zlib: inflateInit2 failed");
  }
  stream.next_in = reinterpret_cast<Bytef*>(compressed.data());
  stream.avail_in = static_cast<uInt>(compressed.size());
  stream.next_out = reinterpret_cast<Bytef*>(dst.data());
  stream.avail_out = static_cast<uInt>(dst.size());
  const int result = inflate(&stream, Z_FINISH);
  const std::string message = stream.msg != nullptr ? stream.msg : "";
  const uint64_t produced = stream.total_out;
  inflateEnd(&stream);
  if (result == Z_STREAM_END && produced == dst.size()) return absl::OkStatus();
  if (result == Z_DATA_ERROR) {
    return absl::DataLossError(
        absl::StrCat(Where(entry), ": corrupt deflate data (", message, ")"));
  }
  if (result == Z_BUF_ERROR && stream.avail_out == 0) {
    return absl::DataLossError(absl::StrCat(Where(entry), " inflates to more than the ", dst.size(),
                                            " bytes the directory claims"));
  }
  return absl::DataLossError(absl::StrCat(Where(entry), " inflates to ", produced,
                                          " bytes, not the ", dst.size(),
                                          " the directory claims (truncated?)"));
}

absl::Status ZipReader::Read(const ZipEntry& entry, absl::Span<char> dst) const {
  if (entry.flags & 0x1) {
    return absl::UnimplementedError(absl::StrCat(Where(entry), " is encrypted"));
  }
  if (entry.method != kMethodStored && entry.method != kMethodDeflate) {
    return absl::UnimplementedError(
        absl::StrCat(Where(entry), " is compressed with method ", entry.method,
                     "; only stored entries (what torch.save writes) and deflated ones (the "
                     "code of a TorchScript archive) are supported"));
  }
  if (entry.method == kMethodStored && entry.compressed_size != entry.uncompressed_size) {
    return absl::InvalidArgumentError(
        absl::StrCat(Where(entry), ": stored entry with compressed size ", entry.compressed_size,
                     " != uncompressed size ", entry.uncompressed_size));
  }
  if (dst.size() != entry.uncompressed_size) {
    return absl::InvalidArgumentError(absl::StrCat(Where(entry), " holds ", entry.uncompressed_size,
                                                   " bytes; the buffer has ", dst.size()));
  }
  RETURN_IF_ERROR(CheckSizeClaim(entry));
  ASSIGN_OR_RETURN(uint64_t offset, DataOffset(entry));
  if (entry.method == kMethodDeflate) {
    RETURN_IF_ERROR(Inflate(entry, offset, dst));
  } else {
    RETURN_IF_ERROR(source_->ReadAt(offset, dst));
  }
  const uint32_t crc = Crc32(0, absl::string_view(dst.data(), dst.size()));
  if (crc != entry.crc32) {
    return absl::DataLossError(
        absl::StrFormat("%s: CRC-32 mismatch: central directory says %08x, "
                        "the data has %08x",
                        Where(entry), entry.crc32, crc));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> ZipReader::ReadToString(const ZipEntry& entry,
                                                    uint64_t max_size) const {
  if (entry.uncompressed_size > max_size) {
    return absl::ResourceExhaustedError(absl::StrCat(Where(entry), " has ", entry.uncompressed_size,
                                                     " bytes, more than the limit of ", max_size));
  }
  RETURN_IF_ERROR(CheckSizeClaim(entry));
  std::string out(entry.uncompressed_size, '\0');
  RETURN_IF_ERROR(Read(entry, absl::MakeSpan(out)));
  return out;
}

}  // namespace ckpt

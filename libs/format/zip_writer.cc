#include "libs/format/zip_writer.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "libs/format/crc32.h"
#include "libs/format/zip_format.h"
#include "libs/status/status_macros.h"

namespace ckpt {
namespace {

using zip::kCentralHeaderSignature;
using zip::kEndSignature;
using zip::kLocalHeaderSignature;
using zip::kZip64EndSignature;
using zip::kZip64ExtraId;
using zip::kZip64LocatorSignature;
constexpr uint16_t kPaddingExtraId = 0x4246;  // "FB", as PyTorch's writer pads.
constexpr uint32_t k32BitMax = 0xFFFFFFFF;
constexpr uint16_t k16BitMax = 0xFFFF;
constexpr uint16_t kVersionNeeded = 20;                     // 2.0: stored entries.
constexpr uint16_t kVersionNeededZip64 = 45;                // 4.5: ZIP64.
constexpr uint16_t kVersionMadeBy = (3 << 8) | 45;          // Unix, spec 4.5.
constexpr uint16_t kDosDate1980 = (0 << 9) | (1 << 5) | 1;  // Fixed stamp: output is reproducible.

void Put16(std::string& out, uint16_t value) {
  out.push_back(static_cast<char>(value & 0xFF));
  out.push_back(static_cast<char>(value >> 8));
}

void Put32(std::string& out, uint32_t value) {
  for (int shift = 0; shift < 32; shift += 8) out.push_back(static_cast<char>(value >> shift));
}

void Put64(std::string& out, uint64_t value) {
  for (int shift = 0; shift < 64; shift += 8) out.push_back(static_cast<char>(value >> shift));
}

}  // namespace

ZipWriter::ZipWriter(AtomicFileWriter* out, ZipWriterOptions options)
    : ZipWriter([out](absl::string_view bytes) { return out->Append(bytes); }, options) {}

ZipWriter::ZipWriter(ZipSink sink, ZipWriterOptions options)
    : sink_(std::move(sink)), options_(options) {
  options_.alignment = std::max(options_.alignment, 1);
}

uint64_t ZipWriter::PlannedBytes(const std::vector<std::pair<std::string, uint64_t>>& entries,
                                 ZipWriterOptions options) {
  // The real writer with a sink that keeps nothing: headers depend on names, sizes and offsets
  // only (the CRC is a fixed-width field), so the count cannot drift from what AddEntry writes.
  ZipWriter counter([](absl::string_view) { return absl::OkStatus(); }, options);
  for (const auto& [name, size] : entries) {
    counter.AddHeader(name, size, 0).IgnoreError();
    counter.offset_ += size;
  }
  counter.Finish().IgnoreError();
  return counter.offset_;
}

absl::Status ZipWriter::Write(absl::string_view bytes) {
  RETURN_IF_ERROR(sink_(bytes));
  offset_ += bytes.size();
  return absl::OkStatus();
}

absl::Status ZipWriter::AddEntry(absl::string_view name, absl::string_view data) {
  RETURN_IF_ERROR(AddHeader(name, data.size(), Crc32(0, data)));
  return Write(data);
}

absl::Status ZipWriter::AddHeader(absl::string_view name, uint64_t size, uint32_t crc32) {
  if (finished_) return absl::FailedPreconditionError("zip: entry added after Finish");
  if (name.empty() || name.size() > k16BitMax) {
    return absl::InvalidArgumentError(
        absl::StrCat("zip: entry name must be 1..65535 bytes, got ", name.size()));
  }
  if (!names_.insert(std::string(name)).second) {
    return absl::InvalidArgumentError(absl::StrCat("zip: duplicate entry '", name, "'"));
  }
  Entry entry{std::string(name), crc32, size, offset_};
  const bool zip64 = options_.force_zip64 || entry.size >= k32BitMax;

  std::string header;
  Put32(header, kLocalHeaderSignature);
  Put16(header, zip64 ? kVersionNeededZip64 : kVersionNeeded);
  Put16(header, 0);  // Flags.
  Put16(header, 0);  // Method: stored.
  Put16(header, 0);  // Time.
  Put16(header, kDosDate1980);
  Put32(header, entry.crc32);
  Put32(header, zip64 ? k32BitMax : static_cast<uint32_t>(entry.size));
  Put32(header, zip64 ? k32BitMax : static_cast<uint32_t>(entry.size));
  Put16(header, static_cast<uint16_t>(name.size()));
  std::string extra;
  if (zip64) {
    Put16(extra, kZip64ExtraId);
    Put16(extra, 16);
    Put64(extra, entry.size);  // Uncompressed.
    Put64(extra, entry.size);  // Compressed.
  }
  const uint64_t before_padding = offset_ + 30 + name.size() + extra.size() + 4;
  const uint64_t padding =
      (options_.alignment - before_padding % options_.alignment) % options_.alignment;
  Put16(extra, kPaddingExtraId);
  Put16(extra, static_cast<uint16_t>(padding));
  extra.append(padding, 'Z');
  Put16(header, static_cast<uint16_t>(extra.size()));
  absl::StrAppend(&header, name, extra);

  // The entry is recorded before its data is written: a failed write fails the whole file.
  entries_.push_back(std::move(entry));
  return Write(header);
}

absl::Status ZipWriter::Finish() {
  if (finished_) return absl::FailedPreconditionError("zip: Finish called twice");
  finished_ = true;
  const uint64_t directory_offset = offset_;
  bool any_zip64 = options_.force_zip64 || entries_.size() >= k16BitMax;
  for (const Entry& entry : entries_) {
    const bool size64 = options_.force_zip64 || entry.size >= k32BitMax;
    const bool offset64 = options_.force_zip64 || entry.local_header_offset >= k32BitMax;
    any_zip64 = any_zip64 || size64 || offset64;
    std::string extra;
    if (size64 || offset64) {
      Put16(extra, kZip64ExtraId);
      Put16(extra, static_cast<uint16_t>((size64 ? 16 : 0) + (offset64 ? 8 : 0)));
      if (size64) {
        Put64(extra, entry.size);
        Put64(extra, entry.size);
      }
      if (offset64) Put64(extra, entry.local_header_offset);
    }
    std::string header;
    Put32(header, kCentralHeaderSignature);
    Put16(header, kVersionMadeBy);
    Put16(header, size64 || offset64 ? kVersionNeededZip64 : kVersionNeeded);
    Put16(header, 0);
    Put16(header, 0);
    Put16(header, 0);
    Put16(header, kDosDate1980);
    Put32(header, entry.crc32);
    Put32(header, size64 ? k32BitMax : static_cast<uint32_t>(entry.size));
    Put32(header, size64 ? k32BitMax : static_cast<uint32_t>(entry.size));
    Put16(header, static_cast<uint16_t>(entry.name.size()));
    Put16(header, static_cast<uint16_t>(extra.size()));
    Put16(header, 0);               // Comment length.
    Put16(header, 0);               // Disk number.
    Put16(header, 0);               // Internal attributes.
    Put32(header, 0100644u << 16);  // External attributes: a regular file, rw-r--r--.
    Put32(header, offset64 ? k32BitMax : static_cast<uint32_t>(entry.local_header_offset));
    absl::StrAppend(&header, entry.name, extra);
    RETURN_IF_ERROR(Write(header));
  }
  const uint64_t directory_size = offset_ - directory_offset;
  any_zip64 = any_zip64 || directory_offset >= k32BitMax || directory_size >= k32BitMax;

  std::string end;
  if (any_zip64) {
    const uint64_t zip64_end_offset = offset_;
    Put32(end, kZip64EndSignature);
    Put64(end, 44);  // Size of the rest of this record.
    Put16(end, kVersionMadeBy);
    Put16(end, kVersionNeededZip64);
    Put32(end, 0);
    Put32(end, 0);
    Put64(end, entries_.size());
    Put64(end, entries_.size());
    Put64(end, directory_size);
    Put64(end, directory_offset);
    Put32(end, kZip64LocatorSignature);
    Put32(end, 0);
    Put64(end, zip64_end_offset);
    Put32(end, 1);
  }
  const uint16_t count16 = any_zip64 && entries_.size() >= k16BitMax
                               ? k16BitMax
                               : static_cast<uint16_t>(entries_.size());
  Put32(end, kEndSignature);
  Put16(end, 0);
  Put16(end, 0);
  Put16(end, options_.force_zip64 ? k16BitMax : count16);
  Put16(end, options_.force_zip64 ? k16BitMax : count16);
  Put32(end, any_zip64 && (options_.force_zip64 || directory_size >= k32BitMax)
                 ? k32BitMax
                 : static_cast<uint32_t>(directory_size));
  Put32(end, any_zip64 && (options_.force_zip64 || directory_offset >= k32BitMax)
                 ? k32BitMax
                 : static_cast<uint32_t>(directory_offset));
  Put16(end, 0);  // Comment length.
  return Write(end);
}

}  // namespace ckpt

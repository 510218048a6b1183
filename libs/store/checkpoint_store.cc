#include "libs/store/checkpoint_store.h"

#include <algorithm>
#include <cstring>
#include <random>
#include <string>
#include <tuple>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "libs/status/status_macros.h"
#include "libs/store/chunk_hasher.h"
#include "libs/store/chunk_layout.h"
#include "libs/tensor/key_normalization.h"

namespace ckpt {

absl::Status CheckStoredChunkPlace(const v1::TensorMeta& meta, absl::string_view name,
                                   int64_t offset, absl::string_view sha256, int64_t length) {
  if (sha256.size() != kSha256Bytes) {
    return absl::InvalidArgumentError(absl::StrCat(name, ": a stored chunk's address has ",
                                                   sha256.size(), " bytes; a SHA-256 has ",
                                                   kSha256Bytes));
  }
  if (offset < 0 || offset >= meta.byte_length() || offset % kChunkBytes != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        name, ": a stored chunk at offset ", offset, " of ", meta.byte_length(),
        " bytes; stored chunks start at multiples of ", kChunkBytes, " inside the tensor"));
  }
  const int64_t expected = std::min(kChunkBytes, meta.byte_length() - offset);
  if (length != expected) {
    return absl::InvalidArgumentError(absl::StrCat(name, ": the stored chunk at offset ", offset,
                                                   " is said to hold ", length,
                                                   " bytes; the chunk there holds ", expected));
  }
  return absl::OkStatus();
}

absl::Status UploadSession::AddStoredChunk(int tensor_index, int64_t offset,
                                           absl::string_view sha256, int64_t length) {
  (void)tensor_index, (void)offset, (void)length;
  return absl::NotFoundError(absl::StrCat("this store cannot reference the stored chunk ",
                                          HexEncode(sha256), ": send its bytes"));
}

absl::Status VersionReader::ReadTensorInto(const v1::TensorMeta& meta, char* destination) const {
  return ReadTensorChunks(meta, [&](int64_t offset, absl::string_view bytes) -> absl::Status {
    // ReadTensorChunks checked the chunk lengths against byte_length.
    std::memcpy(destination + offset, bytes.data(), bytes.size());
    return absl::OkStatus();
  });
}

absl::Status VersionReader::ReadTensorIntoForCheckingReceiver(const v1::TensorMeta& meta,
                                                              char* destination) const {
  return ReadTensorInto(meta, destination);
}

absl::Status CheckUploadRanges(const v1::Manifest& header, const std::vector<UploadRange>& ranges) {
  if (ranges.empty()) return absl::InvalidArgumentError("a part of an upload needs ranges");
  const int model_tensors = header.tensors_size();
  const int tensors = model_tensors + header.state_tensors_size();
  std::vector<UploadRange> sorted = ranges;
  for (const UploadRange& range : ranges) {
    if (range.tensor_index < 0 || range.tensor_index >= tensors) {
      return absl::InvalidArgumentError(absl::StrCat("range of tensor index ", range.tensor_index,
                                                     ": the upload has ", tensors, " tensors"));
    }
    const v1::TensorMeta& meta = range.tensor_index < model_tensors
                                     ? header.tensors(range.tensor_index)
                                     : header.state_tensors(range.tensor_index - model_tensors);
    const std::string name = absl::StrCat("bytes ", range.begin, "..", range.end, " of tensor '",
                                          meta.key(), "' (index ", range.tensor_index, ")");
    if (range.begin < 0 || range.end <= range.begin || range.end > meta.byte_length()) {
      return absl::InvalidArgumentError(
          absl::StrCat(name, ": a range must be non-empty and inside the tensor's ",
                       meta.byte_length(), " bytes"));
    }
    if (range.begin % kChunkBytes != 0 ||
        (range.end != meta.byte_length() && range.end % kChunkBytes != 0)) {
      return absl::InvalidArgumentError(
          absl::StrCat(name, ": a range begins on a chunk boundary (a multiple of ", kChunkBytes,
                       " bytes) and ends on one or at the tensor's end"));
    }
  }
  std::sort(sorted.begin(), sorted.end(), [](const UploadRange& a, const UploadRange& b) {
    return std::tie(a.tensor_index, a.begin) < std::tie(b.tensor_index, b.begin);
  });
  for (size_t i = 1; i < sorted.size(); ++i) {
    if (sorted[i].tensor_index == sorted[i - 1].tensor_index &&
        sorted[i].begin < sorted[i - 1].end) {
      return absl::InvalidArgumentError(absl::StrCat(
          "ranges ", sorted[i - 1].begin, "..", sorted[i - 1].end, " and ", sorted[i].begin, "..",
          sorted[i].end, " of tensor index ", sorted[i].tensor_index, " overlap"));
    }
  }
  return absl::OkStatus();
}

absl::Status VersionReader::ReadTensorRange(const v1::TensorMeta& meta, int64_t begin, int64_t end,
                                            char* destination) const {
  RETURN_IF_ERROR(CheckChunkLayout(meta));
  ASSIGN_OR_RETURN(const ChunkSpan span, ChunksCovering(meta, begin, end));
  std::string edge;  // a chunk that lies only partly in the range.
  int64_t offset = span.first_offset;
  for (int index = span.first_chunk; index < span.end_chunk; ++index) {
    const v1::ChunkRef& ref = meta.chunks(index);
    v1::TensorMeta one_chunk;
    one_chunk.set_key(meta.key());
    one_chunk.set_byte_length(ref.length());
    *one_chunk.add_chunks() = ref;
    const int64_t chunk_end = offset + ref.length();
    absl::Status read;
    if (offset >= begin && chunk_end <= end) {
      read = ReadTensorInto(one_chunk, destination + (offset - begin));
    } else {
      edge.resize(static_cast<size_t>(ref.length()));
      read = ReadTensorInto(one_chunk, edge.data());
      if (read.ok()) {
        const int64_t from = std::max(begin, offset);
        const int64_t to = std::min(end, chunk_end);
        std::memcpy(destination + (from - begin), edge.data() + (from - offset),
                    static_cast<size_t>(to - from));
      }
    }
    if (!read.ok()) {
      return absl::Status(
          read.code(),
          absl::StrCat("reading bytes ", begin, "..", end, " of tensor '", meta.key(),
                       "' (its bytes ", offset, "..", chunk_end, "): ", read.message()));
    }
    offset = chunk_end;
  }
  return absl::OkStatus();
}

absl::StatusOr<VersionReader::MappedBytes> VersionReader::MapTensorBytes(
    const v1::TensorMeta& meta) const {
  return MappedBytes();
}

absl::StatusOr<std::optional<VersionReader::FileRegion>> VersionReader::LocateTensorBytes(
    const v1::TensorMeta& meta) const {
  return std::optional<FileRegion>();
}

absl::Status NormalizeHeaderKeys(v1::Manifest& header) {
  std::vector<std::string> original_keys;
  original_keys.reserve(header.tensors_size());
  for (const v1::TensorMeta& meta : header.tensors()) original_keys.push_back(meta.key());
  ASSIGN_OR_RETURN(NormalizedKeys normalized, NormalizeKeys(original_keys));
  if (normalized.normalization.changed_keys() || !header.metadata().has_key_normalization()) {
    *header.mutable_metadata()->mutable_key_normalization() = normalized.normalization.ToProto();
  }
  absl::flat_hash_map<std::string, std::string> canonical_of;
  for (int i = 0; i < header.tensors_size(); ++i) {
    v1::TensorMeta& meta = *header.mutable_tensors(i);
    meta.set_original_key(original_keys[i]);
    meta.set_key(normalized.keys[i]);
    canonical_of.emplace(original_keys[i], normalized.keys[i]);
  }
  for (auto& [index, name] : *header.mutable_optimizer_param_names()) {
    auto it = canonical_of.find(name);
    if (it != canonical_of.end()) name = it->second;
  }
  return absl::OkStatus();
}

std::string RandomUploadName(absl::string_view prefix) {
  std::random_device random;
  std::string name(prefix);
  for (int i = 0; i < 4; ++i) absl::StrAppend(&name, absl::Hex(random(), absl::kZeroPad8));
  return name;
}

}  // namespace ckpt

#include "libs/store/chunk_layout.h"

#include <cstdint>
#include <string>

#include "absl/strings/str_cat.h"
#include "libs/store/chunk_hasher.h"

namespace ckpt {

namespace {

std::string TensorName(const v1::TensorMeta& meta, absl::string_view where) {
  return absl::StrCat("tensor '", meta.key(), "'", where.empty() ? "" : " of ", where);
}

}  // namespace

absl::Status CheckChunkLayout(const v1::TensorMeta& meta, absl::string_view where) {
  const std::string tensor = TensorName(meta, where);
  int64_t total = 0;
  for (const v1::ChunkRef& chunk : meta.chunks()) {
    if (chunk.length() < 0 || chunk.length() > kChunkBytes) {
      return absl::DataLossError(absl::StrCat(tensor, " names a chunk of ", chunk.length(),
                                              " bytes; chunks hold 0..", kChunkBytes));
    }
    total += chunk.length();
  }
  if (total != meta.byte_length()) {
    return absl::DataLossError(absl::StrCat(tensor, ": its chunks hold ", total,
                                            " bytes, its byte_length is ", meta.byte_length()));
  }
  return absl::OkStatus();
}

absl::StatusOr<ChunkSpan> ChunksCovering(const v1::TensorMeta& meta, int64_t begin, int64_t end,
                                         absl::string_view where) {
  if (begin < 0 || end < begin || end > meta.byte_length()) {
    return absl::OutOfRangeError(absl::StrCat("bytes ", begin, "..", end, " of ",
                                              TensorName(meta, where), ": it holds ",
                                              meta.byte_length(), " bytes"));
  }
  ChunkSpan span;
  span.first_offset = span.end_offset = begin;
  if (begin == end) return span;
  bool begun = false;
  int64_t offset = 0;  // where chunk `index` starts in the tensor.
  for (int index = 0; index < meta.chunks_size(); ++index) {
    const int64_t chunk_end = offset + meta.chunks(index).length();
    if (!begun && chunk_end > begin) {
      begun = true;
      span.first_chunk = index;
      span.first_offset = offset;
    }
    if (begun) {
      span.end_chunk = index + 1;
      span.end_offset = chunk_end;
      if (chunk_end >= end) break;
    }
    offset = chunk_end;
  }
  return span;
}

}  // namespace ckpt

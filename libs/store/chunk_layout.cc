#include "libs/store/chunk_layout.h"

#include <cstdint>
#include <string>

#include "absl/strings/str_cat.h"
#include "libs/store/chunk_hasher.h"

namespace ckpt {

absl::Status CheckChunkLayout(const v1::TensorMeta& meta, absl::string_view where) {
  const std::string tensor =
      absl::StrCat("tensor '", meta.key(), "'", where.empty() ? "" : " of ", where);
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

}  // namespace ckpt

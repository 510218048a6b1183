#ifndef CKPT_LIBS_STORE_CHUNK_LAYOUT_H_
#define CKPT_LIBS_STORE_CHUNK_LAYOUT_H_

// The check every reader of a manifest runs before it trusts a tensor's chunk refs: the store
// cuts a tensor's bytes into chunks of kChunkBytes from offset 0 (chunk_hasher.h), so each chunk
// ref is 0..kChunkBytes long and their lengths add up to the tensor's byte_length. A manifest
// that says otherwise was damaged or forged, and a reader that sized a buffer by a chunk's length
// before this check could be made to allocate anything. The store's readers, the Download
// service and the remote store's download client all call this one function.
//
// ChunksCovering is the one place a byte range of a tensor becomes the chunks that hold it: a
// ranged read (a rank of a resharded resume reading only its slice) is served and checked in
// whole chunks, since a chunk's checksum covers all of it, and the caller keeps the range.

#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "proto/ckpt/v1/types.pb.h"

namespace ckpt {

// OK when `meta`'s chunk refs describe its bytes; otherwise DATA_LOSS naming the tensor and,
// when `where` is not empty, the version ("tensor 'fc.weight' of mlp@3: ...").
absl::Status CheckChunkLayout(const v1::TensorMeta& meta, absl::string_view where = "");

// The chunks of a tensor that hold a byte range of it: chunks [first_chunk, end_chunk), of which
// the first starts at byte `first_offset` of the tensor and the last ends at `end_offset`. An
// empty range is held by no chunk (first_chunk == end_chunk).
struct ChunkSpan {
  int first_chunk = 0;
  int end_chunk = 0;
  int64_t first_offset = 0;
  int64_t end_offset = 0;
};

// The chunks of `meta` (whose layout CheckChunkLayout accepted) that hold bytes [begin, end) of
// it. OUT_OF_RANGE naming the tensor (and `where`, as above) unless 0 <= begin <= end <=
// byte_length.
absl::StatusOr<ChunkSpan> ChunksCovering(const v1::TensorMeta& meta, int64_t begin, int64_t end,
                                         absl::string_view where = "");

}  // namespace ckpt

#endif  // CKPT_LIBS_STORE_CHUNK_LAYOUT_H_

#ifndef CKPT_LIBS_STORE_CHUNK_LAYOUT_H_
#define CKPT_LIBS_STORE_CHUNK_LAYOUT_H_

// The check every reader of a manifest runs before it trusts a tensor's chunk refs: the store
// cuts a tensor's bytes into chunks of kChunkBytes from offset 0 (chunk_hasher.h), so each chunk
// ref is 0..kChunkBytes long and their lengths add up to the tensor's byte_length. A manifest
// that says otherwise was damaged or forged, and a reader that sized a buffer by a chunk's length
// before this check could be made to allocate anything. The store's readers, the Download
// service and the remote store's download client all call this one function.

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "proto/ckpt/v1/types.pb.h"

namespace ckpt {

// OK when `meta`'s chunk refs describe its bytes; otherwise DATA_LOSS naming the tensor and,
// when `where` is not empty, the version ("tensor 'fc.weight' of mlp@3: ...").
absl::Status CheckChunkLayout(const v1::TensorMeta& meta, absl::string_view where = "");

}  // namespace ckpt

#endif  // CKPT_LIBS_STORE_CHUNK_LAYOUT_H_

#ifndef CKPT_LIBS_LOADER_STREAM_DIGEST_H_
#define CKPT_LIBS_LOADER_STREAM_DIGEST_H_

// Checksums from the loader to its consumers (proto/ckpt/v1/loader.proto): what the Load and
// Export streams carry so that a client can tell the bytes it received are the bytes sent, and
// the checks a client runs on them.
//
//  - A tensor the loader sends as stored keeps its chunk refs in the stream's manifest: the
//    store's XXH3-64 of each chunk, computed when the chunk was written. ReceivedTensorCheck
//    hashes each chunk's bytes as they arrive and compares, so damage anywhere from the store
//    to the consumer (the loader's cache included) is caught and named by tensor and chunk.
//  - A tensor the loader casts has no stored digest: the loader hashes the bytes it sends as it
//    sends them (Xxh3Stream, libs/io/xxh3.h) and follows them with a TensorDigest; the check
//    compares that.
//  - Export pieces carry the XXH3-64 of their own bytes (Xxh3, libs/io/xxh3.h).
//
// XXH3-64 everywhere, because it runs at memory speed (tens of GB/s) so the checks cost almost
// nothing beside the copies, and the store already keeps it per chunk; it guards against
// accidental damage, not a forging server (TLS identities are for that).
//
// Example (a client of Load):
//   ASSIGN_OR_RETURN(ReceivedTensorCheck check, ReceivedTensorCheck::Create(meta, "mlp@3"));
//   RETURN_IF_ERROR(check.Add(piece));            // for each piece, in order
//   ASSIGN_OR_RETURN(bool verified, check.Complete());  // after the last byte
//   if (!verified) RETURN_IF_ERROR(check.CheckDigest(digest_message));

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "libs/io/xxh3.h"
#include "proto/ckpt/v1/loader.pb.h"
#include "proto/ckpt/v1/types.pb.h"

namespace ckpt {

// The check of one tensor of a Load stream, fed its bytes in order as they arrive.
class ReceivedTensorCheck {
 public:
  // `meta` is the tensor as the stream's manifest names it and must outlive the check; `where`
  // ("MODEL@N") goes into messages. DATA_LOSS when its chunk refs do not add up to its
  // byte_length.
  static absl::StatusOr<ReceivedTensorCheck> Create(const v1::TensorMeta& meta,
                                                    absl::string_view where);

  // The tensor's next bytes (the caller checks offsets). DATA_LOSS naming the tensor, the chunk
  // and its byte range when a chunk completed here differs from its ChunkRef.xxh3_64.
  absl::Status Add(absl::string_view bytes);

  // After the last byte: true when the chunk refs verified every byte, false when the tensor has
  // none and its TensorDigest is still to be checked. DATA_LOSS as Add (empty chunks), or when
  // fewer bytes arrived than byte_length.
  absl::StatusOr<bool> Complete();

  // The TensorDigest the stream sent for this tensor, after Complete. DATA_LOSS naming the
  // tensor when it disagrees with the bytes received, when the tensor has chunk refs (so no
  // digest belongs to it) or when its bytes are not all in yet.
  absl::Status CheckDigest(const v1::TensorDigest& digest);

  // Whether the tensor is checked by chunk refs (else by a TensorDigest).
  bool by_chunks() const { return meta_->chunks_size() > 0; }

 private:
  ReceivedTensorCheck(const v1::TensorMeta& meta, absl::string_view where)
      : meta_(&meta), where_(where) {}
  // Checks the current chunk, and any empty ones after it, once they are complete.
  absl::Status FinishFullChunks();

  const v1::TensorMeta* meta_;
  std::string where_;
  Xxh3Stream hash_;
  int64_t received_ = 0;
  int chunk_ = 0;               // the chunk being received.
  int64_t chunk_start_ = 0;     // its offset in the tensor.
  int64_t chunk_received_ = 0;  // its bytes received so far.
  bool completed_ = false;
  uint64_t tensor_digest_ = 0;  // without chunk refs: XXH3-64 of all bytes, after Complete.
};

}  // namespace ckpt

#endif  // CKPT_LIBS_LOADER_STREAM_DIGEST_H_

#ifndef CKPT_LIBS_STORE_DOWNLOAD_PLAN_H_
#define CKPT_LIBS_STORE_DOWNLOAD_PLAN_H_

// What a Download of a stored version sends, decided apart from the wire: which tensors a
// DownloadRequest selects (keys, key prefixes, state tensors) or which byte ranges of them (the
// whole chunks holding each range: chunk_layout.h's ChunksCovering), that each one's chunk refs
// are sound before any byte is read, and a cursor over their chunks in order, each read (and,
// unless the client checks chunks itself, verified) into a caller's buffer. The store service's
// Download reactor (services/checkpoint_store) drives it and only writes messages.
//
// Example:
//   ASSIGN_OR_RETURN(DownloadPlan plan, DownloadPlan::Create(reader->manifest(), request));
//   while (std::optional<DownloadPlan::Chunk> chunk = plan.NextChunk()) {
//     RETURN_IF_ERROR(plan.ReadChunk(*reader, *chunk, buffer));  // chunk->length bytes
//     Send(chunk->tensor_index, chunk->offset, buffer, chunk->length);
//   }

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "libs/store/checkpoint_store.h"
#include "libs/store/chunk_layout.h"
#include "proto/ckpt/v1/checkpoint_store.pb.h"

namespace ckpt {

class DownloadPlan {
 public:
  // One chunk to send: tensor `tensor_index` (Manifest.tensors first, then state_tensors), bytes
  // [offset, offset + length) of it.
  struct Chunk {
    int tensor_index = 0;
    int64_t offset = 0;
    int64_t length = 0;
    const v1::TensorMeta* tensor = nullptr;  // points into the manifest given to Create.
    const v1::ChunkRef* ref = nullptr;
  };

  // The tensors `request` selects from `manifest` (which must outlive the plan), in manifest
  // order: every model tensor when neither keys, key_prefixes nor ranges are given, and state
  // tensors only with include_state; with ranges, only the chunks that hold each range.
  // DATA_LOSS for a selected tensor whose chunk refs are unsound (CheckChunkLayout); NOT_FOUND
  // for a requested key that is not there, saying so when it is a state tensor and include_state
  // is off; OUT_OF_RANGE for a range outside its tensor; INVALID_ARGUMENT for ranges beside keys
  // or prefixes, or two ranges of one tensor.
  static absl::StatusOr<DownloadPlan> Create(const v1::Manifest& manifest,
                                             const v1::DownloadRequest& request);

  // The selected tensors' indices, in order.
  const std::vector<int>& tensor_indices() const { return tensors_; }

  // The next non-empty chunk, or nullopt when every selected byte was handed out.
  std::optional<Chunk> NextChunk();

  // `chunk`'s bytes from `reader` into `destination` (chunk.length bytes): its length and
  // location always checked, its xxh3 too unless the request said the client checks chunks
  // (VersionReader::ReadTensorIntoForCheckingReceiver). Errors name the tensor and byte range.
  absl::Status ReadChunk(const VersionReader& reader, const Chunk& chunk, char* destination) const;

 private:
  DownloadPlan(const v1::Manifest& manifest, bool client_checks_chunks)
      : manifest_(&manifest), client_checks_chunks_(client_checks_chunks) {}

  const v1::TensorMeta& TensorAt(int index) const;
  absl::Status SelectRanges(const v1::DownloadRequest& request, const std::string& where);
  absl::Status NotFound(const std::string& key, bool include_state, const std::string& where) const;

  const v1::Manifest* manifest_;
  bool client_checks_chunks_;
  std::vector<int> tensors_;
  std::vector<ChunkSpan> spans_;  // the chunks of tensors_[i] to send.
  // The cursor: the tensor being handed out, its next chunk, and where that chunk starts.
  size_t position_ = 0;
  bool started_ = false;  // chunk_index_ and tensor_offset_ are set for tensors_[position_].
  int chunk_index_ = 0;
  int64_t tensor_offset_ = 0;
};

}  // namespace ckpt

#endif  // CKPT_LIBS_STORE_DOWNLOAD_PLAN_H_

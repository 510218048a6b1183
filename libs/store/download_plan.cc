#include "libs/store/download_plan.h"

#include <algorithm>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "libs/status/status_macros.h"
#include "libs/store/chunk_layout.h"
#include "libs/store/version_ref.h"

namespace ckpt {

const v1::TensorMeta& DownloadPlan::TensorAt(int index) const {
  const int model_count = manifest_->tensors_size();
  return index < model_count ? manifest_->tensors(index)
                             : manifest_->state_tensors(index - model_count);
}

absl::StatusOr<DownloadPlan> DownloadPlan::Create(const v1::Manifest& manifest,
                                                  const v1::DownloadRequest& request) {
  DownloadPlan plan(manifest, request.client_checks_chunks());
  const std::string where = FormatVersionRef(manifest.model(), manifest.version());
  const absl::flat_hash_set<std::string> keys(request.keys().begin(), request.keys().end());
  const bool everything = keys.empty() && request.key_prefixes().empty();
  const int candidates =
      manifest.tensors_size() + (request.include_state() ? manifest.state_tensors_size() : 0);
  absl::flat_hash_set<std::string> found;
  for (int index = 0; index < candidates; ++index) {
    const v1::TensorMeta& meta = plan.TensorAt(index);
    bool selected = everything || keys.contains(meta.key());
    for (const std::string& prefix : request.key_prefixes()) {
      selected = selected || absl::StartsWith(meta.key(), prefix);
    }
    if (!selected) continue;
    if (keys.contains(meta.key())) found.insert(meta.key());
    RETURN_IF_ERROR(CheckChunkLayout(meta, where));
    plan.tensors_.push_back(index);
  }
  for (const std::string& key : request.keys()) {
    if (found.contains(key)) continue;
    const bool is_state =
        std::any_of(manifest.state_tensors().begin(), manifest.state_tensors().end(),
                    [&](const v1::TensorMeta& meta) { return meta.key() == key; });
    return absl::NotFoundError(absl::StrCat(
        "no tensor '", key, "' in ", where,
        is_state ? " among the model tensors (it is a state tensor: set include_state)" : ""));
  }
  return plan;
}

std::optional<DownloadPlan::Chunk> DownloadPlan::NextChunk() {
  while (position_ < tensors_.size()) {
    const v1::TensorMeta& meta = TensorAt(tensors_[position_]);
    if (chunk_index_ >= meta.chunks_size()) {
      ++position_;
      chunk_index_ = 0;
      tensor_offset_ = 0;
      continue;
    }
    const v1::ChunkRef& ref = meta.chunks(chunk_index_++);
    Chunk chunk{tensors_[position_], tensor_offset_, ref.length(), &meta, &ref};
    tensor_offset_ += ref.length();
    if (chunk.length > 0) return chunk;
  }
  return std::nullopt;
}

absl::Status DownloadPlan::ReadChunk(const VersionReader& reader, const Chunk& chunk,
                                     char* destination) const {
  // The store reads whole tensors; a one-chunk view of the tensor reads (and verifies) just this
  // chunk, so a caller holds one chunk whatever the tensor's size.
  v1::TensorMeta one_chunk;
  one_chunk.set_key(chunk.tensor->key());
  one_chunk.set_byte_length(chunk.length);
  *one_chunk.add_chunks() = *chunk.ref;
  const absl::Status read = client_checks_chunks_
                                ? reader.ReadTensorIntoForCheckingReceiver(one_chunk, destination)
                                : reader.ReadTensorInto(one_chunk, destination);
  if (read.ok()) return read;
  return absl::Status(
      read.code(), absl::StrCat("reading bytes ", chunk.offset, "..", chunk.offset + chunk.length,
                                " of tensor '", chunk.tensor->key(), "': ", read.message()));
}

}  // namespace ckpt

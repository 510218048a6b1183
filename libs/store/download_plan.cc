#include "libs/store/download_plan.h"

#include <algorithm>
#include <utility>

#include "absl/container/flat_hash_map.h"
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
  if (request.ranges_size() > 0) {
    RETURN_IF_ERROR(plan.SelectRanges(request, where));
    return plan;
  }
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
    plan.spans_.push_back(
        ChunkSpan{0, meta.chunks_size(), int64_t{0}, static_cast<int64_t>(meta.byte_length())});
  }
  for (const std::string& key : request.keys()) {
    if (found.contains(key)) continue;
    return plan.NotFound(key, request.include_state(), where);
  }
  return plan;
}

absl::Status DownloadPlan::NotFound(const std::string& key, bool include_state,
                                    const std::string& where) const {
  const bool is_state =
      !include_state &&
      std::any_of(manifest_->state_tensors().begin(), manifest_->state_tensors().end(),
                  [&](const v1::TensorMeta& meta) { return meta.key() == key; });
  return absl::NotFoundError(absl::StrCat(
      "no tensor '", key, "' in ", where,
      is_state ? " among the model tensors (it is a state tensor: set include_state)" : ""));
}

absl::Status DownloadPlan::SelectRanges(const v1::DownloadRequest& request,
                                        const std::string& where) {
  if (request.keys_size() > 0 || request.key_prefixes_size() > 0) {
    return absl::InvalidArgumentError(
        "a download names either byte ranges or keys and key prefixes, not both");
  }
  absl::flat_hash_map<std::string, int> index_of;  // model tensors win over state tensors.
  const int candidates =
      manifest_->tensors_size() + (request.include_state() ? manifest_->state_tensors_size() : 0);
  for (int index = 0; index < candidates; ++index) index_of.emplace(TensorAt(index).key(), index);
  std::vector<std::pair<int, ChunkSpan>> selected;
  absl::flat_hash_set<std::string> seen;
  for (const v1::TensorByteRange& range : request.ranges()) {
    if (!seen.insert(range.key()).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("two byte ranges of tensor '", range.key(), "': a download takes one each"));
    }
    auto found = index_of.find(range.key());
    if (found == index_of.end()) return NotFound(range.key(), request.include_state(), where);
    const v1::TensorMeta& meta = TensorAt(found->second);
    RETURN_IF_ERROR(CheckChunkLayout(meta, where));
    ASSIGN_OR_RETURN(const ChunkSpan span, ChunksCovering(meta, range.begin(), range.end(), where));
    selected.emplace_back(found->second, span);
  }
  std::sort(selected.begin(), selected.end(),
            [](const auto& a, const auto& b) { return a.first < b.first; });
  for (const auto& [index, span] : selected) {
    tensors_.push_back(index);
    spans_.push_back(span);
  }
  return absl::OkStatus();
}

std::optional<DownloadPlan::Chunk> DownloadPlan::NextChunk() {
  while (position_ < tensors_.size()) {
    const v1::TensorMeta& meta = TensorAt(tensors_[position_]);
    const ChunkSpan& span = spans_[position_];
    if (!started_) {
      started_ = true;
      chunk_index_ = span.first_chunk;
      tensor_offset_ = span.first_offset;
    }
    if (chunk_index_ >= span.end_chunk) {
      ++position_;
      started_ = false;
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

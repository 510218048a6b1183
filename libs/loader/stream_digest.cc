#include "libs/loader/stream_digest.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "libs/io/xxh3.h"
#include "libs/status/status_macros.h"
#include "libs/store/chunk_layout.h"

namespace ckpt {
namespace {

std::string Hex(uint64_t value) { return absl::StrFormat("%016x", value); }

}  // namespace

absl::StatusOr<ReceivedTensorCheck> ReceivedTensorCheck::Create(const v1::TensorMeta& meta,
                                                                absl::string_view where) {
  // A tensor sent as stored is checked chunk by chunk against the store's layout; one without
  // chunk refs (cast by the loader) is checked by the digest that follows it.
  if (meta.chunks_size() > 0) RETURN_IF_ERROR(CheckChunkLayout(meta, where));
  return ReceivedTensorCheck(meta, where);
}

absl::Status ReceivedTensorCheck::FinishFullChunks() {
  while (chunk_ < meta_->chunks_size() && chunk_received_ == meta_->chunks(chunk_).length()) {
    const v1::ChunkRef& ref = meta_->chunks(chunk_);
    const uint64_t digest = hash_.Digest();
    if (digest != ref.xxh3_64()) {
      return absl::DataLossError(absl::StrCat(
          "tensor '", meta_->key(), "' of ", where_, ": chunk ", chunk_, " of ",
          meta_->chunks_size(), " (bytes ", chunk_start_, "..", chunk_start_ + ref.length(),
          ") arrived with XXH3-64 ", Hex(digest), ", the store recorded ", Hex(ref.xxh3_64()),
          ": the bytes were damaged between the store and this client"));
    }
    hash_.Reset();
    chunk_start_ += ref.length();
    chunk_received_ = 0;
    ++chunk_;
  }
  return absl::OkStatus();
}

absl::Status ReceivedTensorCheck::Add(absl::string_view bytes) {
  if (static_cast<int64_t>(bytes.size()) > meta_->byte_length() - received_) {
    return absl::DataLossError(absl::StrCat("tensor '", meta_->key(), "' of ", where_, ": ",
                                            received_ + static_cast<int64_t>(bytes.size()),
                                            " bytes arrived, its byte_length is ",
                                            meta_->byte_length()));
  }
  received_ += static_cast<int64_t>(bytes.size());
  if (!by_chunks()) {
    hash_.Update(bytes);
    return absl::OkStatus();
  }
  while (!bytes.empty()) {
    const int64_t room = meta_->chunks(chunk_).length() - chunk_received_;
    const size_t take = static_cast<size_t>(std::min<int64_t>(room, bytes.size()));
    hash_.Update(bytes.substr(0, take));
    chunk_received_ += static_cast<int64_t>(take);
    bytes.remove_prefix(take);
    if (absl::Status status = FinishFullChunks(); !status.ok()) return status;
  }
  return absl::OkStatus();
}

absl::StatusOr<bool> ReceivedTensorCheck::Complete() {
  if (received_ != meta_->byte_length()) {
    return absl::DataLossError(absl::StrCat("tensor '", meta_->key(), "' of ", where_, ": ",
                                            received_, " of its ", meta_->byte_length(),
                                            " bytes arrived"));
  }
  completed_ = true;
  if (!by_chunks()) {
    tensor_digest_ = hash_.Digest();
    hash_ = Xxh3Stream();  // its state is not needed any more.
    return false;
  }
  if (absl::Status status = FinishFullChunks(); !status.ok()) return status;
  hash_ = Xxh3Stream();
  return true;
}

absl::Status ReceivedTensorCheck::CheckDigest(const v1::TensorDigest& digest) {
  if (by_chunks()) {
    return absl::DataLossError(absl::StrCat("tensor '", meta_->key(), "' of ", where_,
                                            " got a TensorDigest, but it travels as stored and "
                                            "is checked by its chunk refs"));
  }
  if (!completed_) {
    return absl::DataLossError(absl::StrCat("the TensorDigest of tensor '", meta_->key(), "' of ",
                                            where_, " arrived after ", received_, " of its ",
                                            meta_->byte_length(), " bytes"));
  }
  if (digest.byte_length() != meta_->byte_length() || digest.xxh3_64() != tensor_digest_) {
    return absl::DataLossError(
        absl::StrCat("tensor '", meta_->key(), "' of ", where_, ": its ", received_,
                     " bytes arrived with XXH3-64 ", Hex(tensor_digest_), ", the loader sent ",
                     digest.byte_length(), " bytes with XXH3-64 ", Hex(digest.xxh3_64()),
                     ": the bytes were damaged between the loader and this client"));
  }
  return absl::OkStatus();
}

}  // namespace ckpt

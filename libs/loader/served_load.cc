#include "libs/loader/served_load.h"

#include <cstring>
#include <optional>
#include <stdexcept>
#include <utility>

#include "ATen/ops/empty.h"
#include "ATen/ops/from_blob.h"
#include "absl/strings/str_cat.h"
#include "libs/io/xxh3.h"
#include "libs/loader/loader.h"
#include "libs/status/status_macros.h"
#include "libs/status/torch_status.h"
#include "libs/store/checkpoint_contents.h"
#include "libs/store/version_ref.h"
#include "libs/tensor/dtype.h"
#include "libs/tensor/sparse_layout.h"
#include "libs/tensor/value_proto.h"

namespace ckpt {

absl::StatusOr<ServedLoad> ServedLoad::Plan(const v1::Manifest& stored,
                                            const v1::LoadRequest& request) {
  ServedLoad load;
  ASSIGN_OR_RETURN(load.target_, LoadTargetFromProto(request.target()));
  load.target_.device = DeviceSpec::Cpu();
  ASSIGN_OR_RETURN(const std::vector<PlannedTensor> planned, PlanLoad(stored, load.target_));
  ASSIGN_OR_RETURN(v1::Manifest adapted, AdaptedManifest(stored, planned, load.target_));
  load.manifest_ = std::make_unique<v1::Manifest>(std::move(adapted));
  load.where_ = FormatVersionRef(stored.model(), stored.version());
  const v1::Manifest& sent = *load.manifest_;
  const int model_count = static_cast<int>(planned.size());
  const int count = model_count + sent.state_tensors_size();
  load.tensors_.reserve(static_cast<size_t>(count));
  for (int i = 0; i < count; ++i) {
    ServedTensor tensor;
    tensor.index = i;
    // AdaptedManifest keeps state tensors in stored order; they are never cast.
    tensor.stored = i < model_count ? planned[i].meta : &stored.state_tensors(i - model_count);
    tensor.sent = i < model_count ? &sent.tensors(i) : &sent.state_tensors(i - model_count);
    const DType stored_dtype = static_cast<DType>(tensor.stored->dtype());
    tensor.cast = i < model_count && load.target_.dtype.Apply(stored_dtype) != stored_dtype;
    tensor.needs_digest = tensor.sent->chunks_size() == 0;
    load.tensors_.push_back(tensor);
  }
  load.wanted_.assign(static_cast<size_t>(count), !request.has_only_tensors());
  for (const int32_t index : request.only_tensors().indexes()) {
    if (index < 0 || index >= count) {
      return absl::InvalidArgumentError(absl::StrCat("LoadRequest.only_tensors: index ", index,
                                                     " is outside the ", count,
                                                     " tensors of the adapted ", load.where_));
    }
    load.wanted_[static_cast<size_t>(index)] = true;
  }
  return load;
}

absl::Status ServedLoad::CastInto(const VersionReader& reader, const ServedTensor& tensor,
                                  char* destination) const {
  ASSIGN_OR_RETURN(const at::Tensor stored, ReadTensor(reader, *tensor.stored));
  ASSIGN_OR_RETURN(const DType cast_dtype, DTypeFromProto(tensor.sent->dtype()));
  ASSIGN_OR_RETURN(const c10::ScalarType scalar_type, ToScalarType(cast_dtype));
  if (tensor.stored->has_sparse()) {
    // The values cast, the indices as they were, laid out as the sent manifest's parts say.
    ASSIGN_OR_RETURN(const at::Tensor cast,
                     CatchTorchErrors([&] { return stored.to(scalar_type); }));
    ASSIGN_OR_RETURN(const at::Tensor bytes, StoredBytes(cast));
    if (static_cast<int64_t>(bytes.nbytes()) != tensor.sent->byte_length()) {
      return absl::InternalError(absl::StrCat("sparse tensor '", tensor.sent->key(), "': cast to ",
                                              bytes.nbytes(), " bytes, the manifest says ",
                                              tensor.sent->byte_length()));
    }
    if (bytes.nbytes() > 0) std::memcpy(destination, bytes.data_ptr(), bytes.nbytes());
    return absl::OkStatus();
  }
  return CatchTorchErrors([&] {
    at::Tensor into =
        at::from_blob(destination, stored.sizes(), at::TensorOptions().dtype(scalar_type));
    if (static_cast<int64_t>(into.nbytes()) != tensor.sent->byte_length()) {
      throw std::runtime_error(absl::StrCat("tensor '", tensor.sent->key(), "': cast to ",
                                            into.nbytes(), " bytes, the manifest says ",
                                            tensor.sent->byte_length()));
    }
    into.copy_(stored);
  });
}

absl::StatusOr<at::Tensor> ServedLoad::Cast(const VersionReader& reader,
                                            const ServedTensor& tensor) const {
  ASSIGN_OR_RETURN(const DType cast_dtype, DTypeFromProto(tensor.sent->dtype()));
  ASSIGN_OR_RETURN(const c10::ScalarType scalar_type, ToScalarType(cast_dtype));
  std::vector<int64_t> shape(tensor.sent->shape().begin(), tensor.sent->shape().end());
  at::Tensor cast;
  // A sparse tensor goes as its parts' bytes (libs/tensor/sparse_layout.h).
  RETURN_IF_ERROR(CatchTorchErrors([&] {
    cast = tensor.sent->has_sparse()
               ? at::empty({tensor.sent->byte_length()}, at::TensorOptions().dtype(at::kByte))
               : at::empty(shape, at::TensorOptions().dtype(scalar_type));
  }));
  RETURN_IF_ERROR(CastInto(reader, tensor, static_cast<char*>(cast.data_ptr())));
  return cast;
}

char* ServedLoadSink::Destination(const ServedTensor&) { return nullptr; }

absl::Status ServedLoadSink::Piece(const ServedTensor& tensor, int64_t, absl::string_view,
                                   const std::shared_ptr<const void>&) {
  return absl::InternalError(absl::StrCat("this transport takes tensor '", tensor.sent->key(),
                                          "' into memory, not as pieces"));
}

absl::Status ServedLoad::Send(const VersionReader& reader, ChunkCache* cache, bool digests,
                              ServedLoadSink& sink) const {
  // Casts and copies read the stored tensor through the cache too.
  const std::unique_ptr<VersionReader> cached =
      cache != nullptr ? CachedVersionReader(reader, cache) : nullptr;
  const VersionReader& source = cached != nullptr ? *cached : reader;
  for (const ServedTensor& tensor : tensors_) {
    if (!wanted(tensor.index)) continue;
    RETURN_IF_ERROR(sink.Interrupted());
    const bool digest_it = digests && tensor.needs_digest;
    const int64_t length = tensor.sent->byte_length();
    if (length == 0) {
      if (digest_it) RETURN_IF_ERROR(sink.Digest(Digest(tensor.index, "")));
      continue;
    }
    const ServedLoadSink::Placement placement = sink.Place(tensor);
    if (placement == ServedLoadSink::Placement::kSkip) continue;
    std::optional<Xxh3Stream> digest;  // hashed as the bytes go, for tensors that need one.
    if (digest_it) digest.emplace();
    if (placement == ServedLoadSink::Placement::kInto) {
      char* const destination = sink.Destination(tensor);
      if (destination == nullptr) {
        return absl::InternalError(
            absl::StrCat("no memory to place tensor '", tensor.sent->key(), "' of ", where_));
      }
      if (tensor.cast) {
        RETURN_IF_ERROR(CastInto(source, tensor, destination));
      } else {
        RETURN_IF_ERROR(source.ReadTensorInto(*tensor.stored, destination));
      }
      if (digest) digest->Update(absl::string_view(destination, static_cast<size_t>(length)));
    } else if (tensor.cast) {
      // The cast tensor is this answer's own: its memory goes out as it is, kept alive by
      // whatever the sink keeps of it.
      ASSIGN_OR_RETURN(const at::Tensor cast, Cast(source, tensor));
      const absl::string_view bytes(static_cast<const char*>(cast.data_ptr()), cast.nbytes());
      if (digest) digest->Update(bytes);
      RETURN_IF_ERROR(sink.Piece(tensor, 0, bytes, std::make_shared<at::Tensor>(cast)));
    } else {
      // Chunks go out as the cache hands them out, never assembled into a tensor.
      const auto piece = [&](int64_t offset, absl::string_view bytes,
                             const std::shared_ptr<const void>& owner) -> absl::Status {
        RETURN_IF_ERROR(sink.Interrupted());
        if (digest) digest->Update(bytes);
        return sink.Piece(tensor, offset, bytes, owner);
      };
      if (cache != nullptr) {
        RETURN_IF_ERROR(cache->ReadTensorSharedChunks(reader, *tensor.stored, piece));
      } else {
        RETURN_IF_ERROR(
            reader.ReadTensorChunks(*tensor.stored, [&](int64_t offset, absl::string_view bytes) {
              return piece(offset, bytes, nullptr);
            }));
      }
    }
    if (digest) {
      v1::TensorDigest sent;
      sent.set_tensor_index(tensor.index);
      sent.set_byte_length(length);
      sent.set_xxh3_64(digest->Digest());
      RETURN_IF_ERROR(sink.Digest(sent));
    }
  }
  return absl::OkStatus();
}

v1::TensorDigest ServedLoad::Digest(int index, absl::string_view bytes) {
  v1::TensorDigest digest;
  digest.set_tensor_index(index);
  digest.set_byte_length(static_cast<int64_t>(bytes.size()));
  digest.set_xxh3_64(Xxh3(bytes));
  return digest;
}

}  // namespace ckpt

// Fuzz target: a ckpt.v1.Manifest from untrusted bytes (an Upload header, a Download or Load
// manifest, a stored record) through the code that turns it into the store's own types: the
// header validation every commit runs (ValidateManifestHeader), a tensor per TensorMeta
// (ReadTensor in checkpoint_contents.h: dtype, shape, quantization, byte_length and chunk
// layout) and the optimizer / scheduler / extra value trees (ValueFromProto, resolving their
// state tensors the way LoadCheckpoint does). Each must return a status, never crash, hang or
// allocate what the manifest only claims.
#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "libs/status/status_macros.h"
#include "libs/store/checkpoint_contents.h"
#include "libs/store/checkpoint_store.h"
#include "libs/store/chunk_hasher.h"
#include "libs/store/manifest_validation.h"
#include "libs/tensor/value_proto.h"
#include "proto/ckpt/v1/checkpoint_store.pb.h"

namespace {

// A manifest may rightly describe large tensors, and reading one allocates its byte_length;
// what must never happen is an allocation the manifest's own numbers do not add up to. Inputs
// claiming more than this in all are skipped so that libFuzzer's malloc limit flags only the
// latter.
constexpr int64_t kMaxClaimedBytes = int64_t{64} << 20;

// Serves every chunk as zero bytes, after the checks the RocksDB store's ReadChunks makes on a
// manifest's chunk layout before it reads (each chunk 0..kChunkBytes, summing to byte_length).
class ZeroChunkReader final : public ckpt::VersionReader {
 public:
  explicit ZeroChunkReader(const ckpt::v1::Manifest& manifest) : manifest_(manifest) {}

  const ckpt::v1::Manifest& manifest() const override { return manifest_; }

  absl::Status ReadTensorChunks(const ckpt::v1::TensorMeta& meta,
                                const ckpt::ChunkCallback& callback) const override {
    int64_t total = 0;
    for (const ckpt::v1::ChunkRef& chunk : meta.chunks()) {
      if (chunk.length() < 0 || chunk.length() > ckpt::kChunkBytes) {
        return absl::DataLossError("chunk length out of range");
      }
      total += chunk.length();
    }
    if (total != meta.byte_length()) return absl::DataLossError("chunks disagree with length");
    int64_t offset = 0;
    for (const ckpt::v1::ChunkRef& chunk : meta.chunks()) {
      if (zeros_.size() < static_cast<size_t>(chunk.length())) zeros_.resize(chunk.length());
      RETURN_IF_ERROR(callback(offset, absl::string_view(zeros_.data(), chunk.length())));
      offset += chunk.length();
    }
    return absl::OkStatus();
  }

 private:
  const ckpt::v1::Manifest& manifest_;
  mutable std::string zeros_;
};

int64_t ClaimedBytes(const ckpt::v1::Manifest& manifest) {
  int64_t total = 0;
  for (const auto* list : {&manifest.tensors(), &manifest.state_tensors()}) {
    for (const ckpt::v1::TensorMeta& meta : *list) {
      if (meta.byte_length() < 0 || meta.byte_length() > kMaxClaimedBytes) return -1;
      total += meta.byte_length();
      if (total > kMaxClaimedBytes) return -1;
    }
  }
  return total;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  ckpt::v1::Manifest manifest;
  if (!manifest.ParseFromArray(data, static_cast<int>(size))) return 0;
  (void)ckpt::ValidateManifestHeader(manifest);
  if (ClaimedBytes(manifest) < 0) return 0;

  ZeroChunkReader reader(manifest);
  for (const ckpt::v1::TensorMeta& meta : manifest.tensors()) (void)ReadTensor(reader, meta);
  absl::flat_hash_map<std::string, const ckpt::v1::TensorMeta*> state_tensors;
  for (const ckpt::v1::TensorMeta& meta : manifest.state_tensors()) {
    state_tensors.emplace(meta.key(), &meta);
  }
  const ckpt::TensorResolver resolve = [&](absl::string_view key) -> absl::StatusOr<at::Tensor> {
    auto it = state_tensors.find(key);
    if (it == state_tensors.end()) return absl::DataLossError(absl::StrCat("no tensor ", key));
    return ReadTensor(reader, *it->second);
  };
  if (manifest.has_optimizer_state())
    (void)ckpt::ValueFromProto(manifest.optimizer_state(), resolve);
  if (manifest.has_scheduler_state())
    (void)ckpt::ValueFromProto(manifest.scheduler_state(), resolve);
  if (manifest.has_extra_state()) (void)ckpt::ValueFromProto(manifest.extra_state(), resolve);
  return 0;
}

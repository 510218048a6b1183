#ifndef CKPT_LIBS_LOADER_SERVED_LOAD_H_
#define CKPT_LIBS_LOADER_SERVED_LOAD_H_

// What answering one LoadRequest means, whatever carries the answer. The gRPC Load stream
// (services/loader) and the shared-memory server (shm_server.h) both plan with it, so they
// select, rename, cast and digest tensors alike; each keeps only its transport (gRPC messages
// of stored chunks; pack-file descriptors and a sealed memfd). It reads no bytes until asked.
//
// Example (a transport):
//   ASSIGN_OR_RETURN(const ServedLoad load, ServedLoad::Plan(reader->manifest(), request));
//   Send(load.manifest());
//   for (const ServedTensor& tensor : load.tensors()) {
//     if (!load.wanted(tensor.index)) continue;
//     if (!tensor.cast) { /* send *tensor.stored's chunks as they are */ continue; }
//     ASSIGN_OR_RETURN(at::Tensor cast, load.Cast(*reader, tensor));
//     /* send cast's bytes; then, if tensor.needs_digest, ServedLoad::Digest(...) */
//   }

#include <memory>
#include <string>
#include <vector>

#include "ATen/core/Tensor.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "libs/loader/load_target.h"
#include "libs/store/checkpoint_store.h"
#include "proto/ckpt/v1/loader.pb.h"

namespace ckpt {

// One tensor of an answer.
struct ServedTensor {
  // Its index in the answer: the adapted manifest's model tensors, then its state tensors.
  int index = 0;
  // As stored (points into the manifest given to Plan) and as the consumer receives it (points
  // into ServedLoad::manifest()).
  const v1::TensorMeta* stored = nullptr;
  const v1::TensorMeta* sent = nullptr;
  // The target casts it: its bytes are computed, not the stored chunks sent as they are.
  bool cast = false;
  // No chunk reference names the bytes the consumer receives (they were cast, or nothing was
  // stored), so the answer carries a digest of them (proto LoadResponse.digest).
  bool needs_digest = false;
};

class ServedLoad {
 public:
  // The answer `request` asks of the version whose manifest is `stored` (which must outlive
  // this). The target's device is forced to the CPU: consumers place tensors themselves.
  // INVALID_ARGUMENT as LoadTargetFromProto, PlanLoad and AdaptedManifest, and for an
  // only_tensors index outside the answer.
  static absl::StatusOr<ServedLoad> Plan(const v1::Manifest& stored,
                                         const v1::LoadRequest& request);

  // The manifest the answer starts with (AdaptedManifest).
  const v1::Manifest& manifest() const { return *manifest_; }
  const std::vector<ServedTensor>& tensors() const { return tensors_; }
  // Whether the answer carries tensor `index`'s bytes (LoadRequest.only_tensors; all when absent).
  bool wanted(int index) const { return wanted_[static_cast<size_t>(index)]; }
  const LoadTarget& target() const { return target_; }
  // "MODEL@vN", for messages.
  const std::string& where() const { return where_; }

  // `tensor`'s stored bytes read from `reader` (checked as it reads) and cast to its sent dtype:
  // into `destination` (tensor.sent->byte_length() bytes), or into a new contiguous CPU tensor.
  absl::Status CastInto(const VersionReader& reader, const ServedTensor& tensor,
                        char* destination) const;
  absl::StatusOr<at::Tensor> Cast(const VersionReader& reader, const ServedTensor& tensor) const;

  // The digest message of tensor `index`'s `bytes` (xxh3-64, proto TensorDigest).
  static v1::TensorDigest Digest(int index, absl::string_view bytes);

 private:
  ServedLoad() = default;

  LoadTarget target_;
  // Owned apart so that `sent` pointers survive moves of this object.
  std::unique_ptr<v1::Manifest> manifest_;
  std::vector<ServedTensor> tensors_;
  std::vector<bool> wanted_;
  std::string where_;
};

}  // namespace ckpt

#endif  // CKPT_LIBS_LOADER_SERVED_LOAD_H_

#ifndef CKPT_LIBS_LOADER_SERVED_LOAD_H_
#define CKPT_LIBS_LOADER_SERVED_LOAD_H_

// What answering one LoadRequest means, whatever carries the answer. The gRPC Load stream
// (services/loader) and the shared-memory server (shm_server.h) both plan with it and both send
// with it (ServedLoad::Send), so they select, rename, cast, read through the loader's chunk cache
// and digest tensors alike; each keeps only its transport, a ServedLoadSink (gRPC messages of
// pieces; pack-file descriptors and a sealed memfd).
//
// Example (a transport):
//   ASSIGN_OR_RETURN(const ServedLoad load, ServedLoad::Plan(reader->manifest(), request));
//   Send(load.manifest());
//   MySink sink(...);  // a ServedLoadSink
//   RETURN_IF_ERROR(load.Send(*reader, &cache, /*digests=*/request.send_digests(), sink));

#include <memory>
#include <string>
#include <vector>

#include "ATen/core/Tensor.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "libs/loader/chunk_cache.h"
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

// A transport's end of one answer: ServedLoad::Send hands it each wanted tensor's bytes, in the
// answer's order, and the digest of each tensor no chunk reference names.
class ServedLoadSink {
 public:
  virtual ~ServedLoadSink() = default;

  // How `tensor`'s bytes reach the consumer; asked once per wanted tensor of one byte or more,
  // before its bytes.
  enum class Placement {
    kSkip,    // the sink has placed them itself (a pack file passed as it is): nothing is read.
    kPieces,  // in order, as Piece calls: stored chunks as the cache holds them, or the cast.
    kInto,    // written into Destination(tensor), tensor.sent->byte_length() bytes.
  };
  virtual Placement Place(const ServedTensor& tensor) = 0;
  virtual char* Destination(const ServedTensor& tensor);
  // Bytes [offset, offset + bytes.size()) of `tensor` as sent. `owner`, when not null, keeps them
  // alive and unchanged after the call (the sink may send a view of them); when null they are
  // valid only during the call. An error ends the answer with it.
  virtual absl::Status Piece(const ServedTensor& tensor, int64_t offset, absl::string_view bytes,
                             const std::shared_ptr<const void>& owner);
  // The digest of a tensor whose bytes no chunk reference names (ServedTensor::needs_digest),
  // after its bytes; only when Send was asked for digests.
  virtual absl::Status Digest(const v1::TensorDigest& digest) = 0;
  // Asked before each tensor and each piece: an error (the consumer cancelled) ends the answer.
  virtual absl::Status Interrupted() { return absl::OkStatus(); }
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

  // Walks the wanted tensors into `sink`: each one's bytes read from `reader` through `cache`
  // (null: straight from the reader; the store checks every chunk it reads, and a cached chunk was
  // checked when it was read), cast where the target says, and with `digests` the digest of each
  // tensor that needs one, computed as the bytes go. A zero-byte tensor has no bytes to place,
  // only its digest. The first error of the reader, the cast or the sink, as it is.
  absl::Status Send(const VersionReader& reader, ChunkCache* cache, bool digests,
                    ServedLoadSink& sink) const;

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

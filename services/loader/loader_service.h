#ifndef CKPT_SERVICES_LOADER_LOADER_SERVICE_H_
#define CKPT_SERVICES_LOADER_LOADER_SERVICE_H_

// LoaderService: the ckpt.v1.Loader gRPC service, a thin adapter over libs/loader. It serves a
// CheckpointStore (a local RocksDbCheckpointStore or a RemoteCheckpointStore) to consumers that
// want a version in their own shape:
//
//  - Load (server stream): the version is opened once and planned with PlanLoad (subset, key
//    policy); the adapted Manifest goes first (selected model tensors in manifest order under the
//    consumer's keys, dtypes after the cast, chunk refs of uncast ones; optimizer / scheduler
//    trees and state_tensors only when asked for), then TensorData: model tensors as tensor_index
//    0..n-1, cast on the server, then state tensors as n + j, as stored. Pieces are at most min(1
//    MiB, LoadRequest.max_message_bytes). Device placement is the client's (the service never holds
//    GPU memory): LoadTarget.device is only validated. Checksums to the consumer: tensors sent as
//    stored keep their chunk refs in the manifest (the store's per-chunk XXH3-64 and SHA-256); a
//    cast tensor is hashed (XXH3-64) as it is sent and, when the request asks for send_digests,
//    followed by a TensorDigest (libs/loader/stream_digest.h). With LoadRequest.only_tensors the
//    manifest is the same and only the named tensors' bytes follow (a load split over several
//    streams, or one resumed on another loader after its stream broke).
//  - Preflight (unary): the manifest only, compared with the consumer's expected keys and shapes,
//    restricted to the target's subset; dtype differences reported (LocalLoader::Preflight; the
//    service only converts messages).
//  - Export (server stream): a torch .pt (weights_only-safe) or safetensors file of the adapted
//    model tensors, or the whole training bundle when the target asks for optimizer or scheduler
//    state (libs/loader/export.h), in pieces; the first carries total_bytes, a file name, the
//    version and what the file leaves out; each its offset in the file and the XXH3-64 of its
//    bytes.
//
// Every tensor read goes through the ChunkCache of the service's LocalLoader, shared by all
// calls, so concurrent readers of one version cost one store read per chunk and one cached copy
// (cache_stats()).
//
// Access as the store service: every call is checked by the AccessPolicy (libs/rpc/
// access_policy.h) before any work -- Load, Preflight and Export need the reader role, on the
// model they name -- UNAUTHENTICATED or PERMISSION_DENIED otherwise; grpc.health.v1 and
// reflection stay open.
//
// Threading: every step of a call blocks (store reads, torch casts, file staging), so each call
// runs as straight-line code on a thread of its own and waits for each write (flow control): a
// slow consumer holds its call at one message, not the version. Preflight and Export use gRPC's
// synchronous API. Load is a raw callback method (ByteBuffer in and out) whose reactor runs the
// same kind of blocking loop on a thread it starts: its TensorData messages are written with
// libs/rpc/tensor_data_message, from the cast tensor's own memory or one copy of a cached chunk,
// not through a protobuf (two copies fewer per byte). Streams beyond max_concurrent_streams fail
// with RESOURCE_EXHAUSTED.
//
// Lifetime: `store` must outlive the service, and the service the server serving it.
//
// Example:
//   LoaderServiceOptions options;
//   options.cache_bytes = int64_t{1} << 30;
//   ASSIGN_OR_RETURN(std::unique_ptr<LoaderService> service,
//                    LoaderService::Create(store.get(), options));
//   ASSIGN_OR_RETURN(std::unique_ptr<GrpcServer> server,
//                    GrpcServer::Start({}, {{service.get(), v1::Loader::service_full_name()}}));

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "grpcpp/server_context.h"
#include "grpcpp/support/byte_buffer.h"
#include "grpcpp/support/server_callback.h"
#include "grpcpp/support/sync_stream.h"
#include "libs/auth/access_policy.h"
#include "libs/loader/chunk_cache.h"
#include "libs/loader/local_loader.h"
#include "libs/rpc/tensor_data_message.h"
#include "libs/rpc/wire_constants.h"
#include "libs/store/checkpoint_store.h"
#include "proto/ckpt/v1/loader.grpc.pb.h"

namespace ckpt {

struct LoaderServiceOptions {
  // Who may call (identities, roles, model scopes). Default: nobody is asked (AllowAll), unless
  // auth_token is set.
  std::shared_ptr<const AccessPolicy> access;
  // Shorthand for access = AccessPolicy::SharedToken(auth_token): every call must carry
  // "authorization: Bearer <auth_token>". Ignored when `access` is set.
  std::string auth_token;
  // Bytes of store chunks kept in memory for all readers together (LRU). Default 1 GiB.
  int64_t cache_bytes = int64_t{1} << 30;
  // Load and Export streams served at once; more fail with RESOURCE_EXHAUSTED. Default 64.
  int max_concurrent_streams = 64;

  // Tests only: damage in transit. Called with every outgoing piece of tensor or file bytes
  // after its checksum was taken (the store's chunk digests, or the loader's XXH3-64 of what it
  // sends) and before it is written; it may change the bytes. When set, every piece is sent from
  // a copy, so cached chunks stay intact.
  struct OutgoingPiece {
    int64_t stream = 0;        // the service's Load and Export streams, counted from 0.
    bool export_file = false;  // an Export piece (offset in the file), else a Load one.
    int tensor_index = 0;      // Load: as TensorData.tensor_index.
    int64_t offset = 0;        // Load: in the tensor; Export: in the file.
  };
  std::function<void(const OutgoingPiece&, absl::Span<char>)> tamper_for_testing;
};

class LoaderService final : public v1::Loader::WithRawCallbackMethod_Load<v1::Loader::Service> {
 public:
  // `store` is not owned. INVALID_ARGUMENT for negative cache_bytes or max_concurrent_streams < 1.
  static absl::StatusOr<std::unique_ptr<LoaderService>> Create(CheckpointStore* store,
                                                               LoaderServiceOptions options);

  // `request` is a serialized LoadRequest; responses are serialized LoadResponses.
  grpc::ServerWriteReactor<grpc::ByteBuffer>* Load(grpc::CallbackServerContext* context,
                                                   const grpc::ByteBuffer* request) override;
  grpc::Status Preflight(grpc::ServerContext* context, const v1::PreflightRequest* request,
                         v1::PreflightResponse* response) override;
  grpc::Status Export(grpc::ServerContext* context, const v1::ExportRequest* request,
                      grpc::ServerWriter<v1::ExportResponse>* writer) override;

  // The shared chunk cache's counters (for logs and tests).
  ChunkCacheStats cache_stats() const { return loader_.cache().stats(); }
  // The chunk cache itself, for the process's shared-memory server (ShmLoaderServer).
  ChunkCache& cache() const { return loader_.cache(); }
  // Load and Export streams begun (for logs, and for tests of how clients spread their calls).
  int64_t streams_started() const { return streams_started_.load(); }

 private:
  class StreamSlot;
  class LoadReactor;

  // Writes one message and waits until gRPC has taken it; false once the stream is broken.
  using MessageWriter = std::function<bool(grpc::ByteBuffer)>;

  LoaderService(CheckpointStore* store, LoaderServiceOptions options);

  // OK when the caller may call `method` on `model` (AccessPolicy::Check).
  absl::Status Authorize(const grpc::ServerContextBase& context, absl::string_view method,
                         absl::string_view model) const;
  absl::Status DoLoad(const grpc::ServerContextBase& context, const v1::LoadRequest& request,
                      const MessageWriter& write);
  absl::Status DoPreflight(const v1::PreflightRequest& request, v1::PreflightResponse& response);
  absl::Status DoExport(grpc::ServerContext& context, const v1::ExportRequest& request,
                        grpc::ServerWriter<v1::ExportResponse>& writer);

  CheckpointStore& store_;
  const LoaderServiceOptions options_;
  const std::shared_ptr<const AccessPolicy> access_;
  // The loader logic (preflight, export, the chunk cache); the streaming stays here.
  const LocalLoader loader_;
  // Copies of cached chunks on their way out; gRPC may hold one past its write (PayloadPool).
  const std::shared_ptr<PayloadPool> payload_pool_;
  absl::Mutex mu_;
  int active_streams_ ABSL_GUARDED_BY(mu_) = 0;
  std::atomic<int64_t> streams_started_{0};  // for OutgoingPiece::stream.
};

}  // namespace ckpt

#endif  // CKPT_SERVICES_LOADER_LOADER_SERVICE_H_

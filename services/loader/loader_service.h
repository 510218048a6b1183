#ifndef CKPT_SERVICES_LOADER_LOADER_SERVICE_H_
#define CKPT_SERVICES_LOADER_LOADER_SERVICE_H_

// LoaderService: the ckpt.v1.Loader gRPC service, a thin adapter over libs/loader. It serves a
// CheckpointStore (a local RocksDbCheckpointStore or a RemoteCheckpointStore) to consumers that
// want a version in their own shape:
//
//  - Load (server stream): the version is opened once and planned with PlanLoad (subset, key
//    policy); the adapted Manifest goes first (selected model tensors in manifest order under the
//    consumer's keys, dtypes after the cast, no chunk refs; optimizer / scheduler trees and
//    state_tensors only when asked for), then TensorData: model tensors as tensor_index 0..n-1,
//    cast on the server, then state tensors as n + j, as stored. Pieces are at most
//    min(1 MiB, LoadRequest.max_message_bytes). Device placement is the client's (the service
//    never holds GPU memory): LoadTarget.device is only validated.
//  - Preflight (unary): the manifest only, compared with the consumer's expected keys and shapes
//    (libs/loader Preflight), restricted to the target's subset; dtype differences reported.
//  - Export (server stream): a torch .pt (weights_only-safe) or safetensors file of the adapted
//    model tensors (libs/loader/export.h), in pieces; the first carries total_bytes and a file
//    name.
//
// Every tensor read goes through one ChunkCache shared by all calls, so concurrent readers of one
// version cost one store read per chunk and one cached copy (cache_stats()).
//
// Authentication as the store service: with auth_token set, calls must carry "authorization:
// Bearer <token>", else UNAUTHENTICATED before any work; grpc.health.v1 stays open.
//
// Threading: gRPC's synchronous API. Each call runs on a gRPC server thread and blocks on store
// reads, casts and Write (which waits for flow control), so a slow consumer holds its call at one
// message, not the version. Streams beyond max_concurrent_streams fail with RESOURCE_EXHAUSTED.
// The sync API was chosen over callback reactors because every step of a call blocks (store
// reads, torch casts, file staging) and would otherwise need its own worker pool.
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

#include <cstdint>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "grpcpp/server_context.h"
#include "grpcpp/support/sync_stream.h"
#include "libs/loader/chunk_cache.h"
#include "libs/store/checkpoint_store.h"
#include "proto/ckpt/v1/loader.grpc.pb.h"

namespace ckpt {

// Tensor bytes one Load / Export message carries at most (1 MiB).
inline constexpr int kMaxLoaderPieceBytes = 1 << 20;

struct LoaderServiceOptions {
  // When non-empty, every call must carry "authorization: Bearer <auth_token>". Default: none.
  std::string auth_token;
  // Bytes of store chunks kept in memory for all readers together (LRU). Default 1 GiB.
  int64_t cache_bytes = int64_t{1} << 30;
  // Load and Export streams served at once; more fail with RESOURCE_EXHAUSTED. Default 64.
  int max_concurrent_streams = 64;
  // Where torch exports are staged before streaming (their zip directory comes last). Default:
  // $TMPDIR, else /tmp.
  std::string scratch_dir;
};

class LoaderService final : public v1::Loader::Service {
 public:
  // `store` is not owned. INVALID_ARGUMENT for negative cache_bytes or max_concurrent_streams < 1.
  static absl::StatusOr<std::unique_ptr<LoaderService>> Create(CheckpointStore* store,
                                                               LoaderServiceOptions options);

  grpc::Status Load(grpc::ServerContext* context, const v1::LoadRequest* request,
                    grpc::ServerWriter<v1::LoadResponse>* writer) override;
  grpc::Status Preflight(grpc::ServerContext* context, const v1::PreflightRequest* request,
                         v1::PreflightResponse* response) override;
  grpc::Status Export(grpc::ServerContext* context, const v1::ExportRequest* request,
                      grpc::ServerWriter<v1::ExportResponse>* writer) override;

  // The shared chunk cache's counters (for logs and tests).
  ChunkCacheStats cache_stats() const { return cache_.stats(); }

 private:
  class StreamSlot;

  LoaderService(CheckpointStore* store, LoaderServiceOptions options);

  absl::Status Authorize(const grpc::ServerContext& context) const;
  absl::Status DoLoad(grpc::ServerContext& context, const v1::LoadRequest& request,
                      grpc::ServerWriter<v1::LoadResponse>& writer);
  absl::Status DoPreflight(const v1::PreflightRequest& request, v1::PreflightResponse& response);
  absl::Status DoExport(grpc::ServerContext& context, const v1::ExportRequest& request,
                        grpc::ServerWriter<v1::ExportResponse>& writer);

  CheckpointStore& store_;
  const LoaderServiceOptions options_;
  ChunkCache cache_;
  absl::Mutex mu_;
  int active_streams_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace ckpt

#endif  // CKPT_SERVICES_LOADER_LOADER_SERVICE_H_

#ifndef CKPT_SERVICES_CHECKPOINT_STORE_STORE_SERVICE_H_
#define CKPT_SERVICES_CHECKPOINT_STORE_STORE_SERVICE_H_

// StoreService: the ckpt.v1.CheckpointStore gRPC service, a thin adapter that forwards each call
// to a CheckpointStore (libs/store) and translates statuses with ToGrpcStatus. All logic lives in
// the store; this file only speaks the wire protocol:
//
//  - Upload (client stream): an UploadHeader first (else INVALID_ARGUMENT), then TensorData
//    messages of at most kMaxTensorDataBytes each (else INVALID_ARGUMENT) fed to
//    UploadSession::AddTensorData, then an UploadCommit that calls Commit(). Once the header is
//    accepted the server sends initial metadata "ckpt-upload-accepted: 1" (plus the header's
//    validation warnings as "ckpt-upload-warning-bin" entries), so a client can report header
//    errors before streaming any byte. A stream that ends or is cancelled without a commit
//    destroys the session: nothing becomes visible and GarbageCollect reclaims its chunks.
//    Upload is a raw method so that a message the server cannot parse (garbage, or nested deeper
//    than protobuf's recursion limit) ends the call with INVALID_ARGUMENT naming that message,
//    instead of looking like a stream that ended (gRPC reports a failed parse as the end).
//  - Download (server stream): the version is opened once (OpenVersion, a consistent snapshot);
//    the full Manifest goes first, then TensorData for the selected tensors in manifest order
//    (tensor_index counts Manifest.tensors, then state_tensors). Tensors of zero bytes send no
//    TensorData. What is sent is planned by libs/store/download_plan.h (selection, chunk-ref
//    checks, chunk order). Store chunks (4 MiB) are sent in pieces of
//    DownloadRequest.max_message_bytes clamped to [64 KiB, 1 MiB] (0: 1 MiB); reading overlaps
//    writing (the next chunk is read while the current one is written, each piece only after the
//    previous write completed), so a slow reader holds the server at two chunks, not the
//    checkpoint. With DownloadRequest.client_checks_chunks the server sends chunks without
//    checking their xxh3 (lengths and locations are still checked) and the client checks each.
//    A cancelled call stops reading chunks. Download is a raw method: each chunk is read into a
//    pooled buffer and its messages are gRPC slices of that buffer (libs/rpc/tensor_data_message),
//    byte for byte what DownloadResponse's serializer would write.
//  - ListModels / ListVersions page in the adapter: page_size 0 means kDefaultPageSize, larger
//    than kMaxPageSize is capped; page_token is the last name (version) of the previous page.
//  - ListAudit and ListHistory page like them: page_size 0 means kDefaultPageSize, capped at
//    kMaxPageSize; next_after_sequence is the last record's (event's) sequence, 0 on the last
//    page. ListVersions with a filter runs CheckpointStore::FindVersions (INVALID_ARGUMENT for a
//    malformed filter).
//  - Watch (server stream): the store's RegistryWatch (CheckpointStore::Watch) forwarded message
//    by message. A watch only reads the registry's history, so it never holds up a commit. Each
//    watch has a thread of its own (not the work queue: it waits for the history most of its
//    life), at most max_watches at once (RESOURCE_EXHAUSTED beyond). A watcher that stops
//    reading cannot hold that thread forever:
//      * when one write to it has been blocked by flow control for watch_write_timeout, the
//        server cancels the call (the client sees CANCELLED) and logs "watch cut off: ...";
//      * when its writes have been held by flow control for 100 ms in all (the client reads, but
//        too slowly) and the history has moved on more than watch_max_lag events past what it
//        was sent, the watch ends with
//        RESOURCE_EXHAUSTED "watcher fell behind ...; resume with resume_token N", N being the
//        last message it was sent.
//    Either way the client resumes with its last resume_token and misses nothing. Memory per
//    watch is one history page (the store's Watch) plus the message being written.
//  - Every other call is unary and forwards one store method.
//
// Audit: every call that changes the store (Upload's commit, SetAlias, DeleteAlias,
// DeleteVersion, ApplyRetention and GarbageCollect unless dry runs, and the registry's
// CreateModel, UpdateModel, RenameModel, DeleteModel and AnnotateVersion) runs through an
// AuditedStore
// (libs/store/audited_store.h) made for that call, so the store records, write-ahead, who made
// it (the caller's identity, see below), from where (gRPC's peer, e.g.
// "ipv4:127.0.0.1:50312"), what it asked and how it ended; a commit's producer becomes that
// identity. A call whose audit record cannot be written is refused. Reads are not recorded.
// Calls refused by access control (UNAUTHENTICATED, PERMISSION_DENIED) are recorded, rate-limited,
// through a RefusedCallLog (libs/store/refused_call_log.h) written on the work queue.
//
// Scope: every call runs against a ScopedStore (libs/store/scoped_store.h) of the caller's model
// scope, which filters the calls that name no model (ListModels, ListAudit, Verify, GetStats,
// FindMissingChunks, a commit's new_bytes) and refuses the whole-store ones (GarbageCollect,
// history and watches of every model) for a scoped caller. docs/security.md ("What a scoped identity sees") has the table.
//
// Access: every call is checked by the service's AccessPolicy (libs/auth/access_policy.h) --
// who is calling (a token or a client certificate), whether its role allows the method, and
// whether its model scope covers the model the request names -- before any work is done:
// UNAUTHENTICATED or PERMISSION_DENIED naming the identity, method and what it lacks. An Upload
// is checked for its role when it opens and for its model when the header arrives. The check
// sits at the top of each method / reactor rather than in a server interceptor: gRPC's C++
// interceptor API is experimental and cannot see the model a request names, and here the
// standard grpc.health.v1 and reflection services (registered by GrpcServer) stay open.
// Model scope of the registry calls (ScopedStore): RenameModel checks the new name too (a scoped
// caller may not move a model out of its scope). ListHistory and Watch read events of many models
// at once, so a scoped caller must name its models (ListHistoryRequest.model; every
// WatchRequest.models entry in scope): a request for all models is PERMISSION_DENIED for it
// rather than silently narrowed, so it never mistakes a partial view for the whole registry. (A
// watch of a model in scope does see a rename of another model to a watched name, with the old
// name.)
// The request's `reason` goes with each change into the history (ChangeAttribution::reason).
//
// Threading: gRPC's callback threads only parse, check auth and hand off. Every store call runs on
// the service's own WorkQueue (worker_threads threads): RocksDB reads may miss the cache, commits
// fsync, and uploads hash megabytes, and gRPC asks that reactions not block. Each stream has at
// most one piece of work in flight, so its UploadSession / VersionReader is used by one thread at
// a time, as the store requires.
//
// Lifetime: the store must outlive the service, and the service must outlive the server that
// serves it. Destroy the service only after the server has shut down (GrpcServer::Shutdown and
// Wait): its destructor waits for the last call to finish, then joins its threads.
//
// Example:
//   ASSIGN_OR_RETURN(std::unique_ptr<RocksDbCheckpointStore> store,
//                    RocksDbCheckpointStore::Open(store_options));
//   StoreServiceOptions service_options;
//   service_options.auth_token = token;  // "" serves without authentication
//   ASSIGN_OR_RETURN(std::unique_ptr<StoreService> service,
//                    StoreService::Create(store.get(), service_options));
//   ASSIGN_OR_RETURN(std::unique_ptr<GrpcServer> server,  // 127.0.0.1:0 by default
//                    GrpcServer::Start({}, {{service.get(), "ckpt.v1.CheckpointStore"}}));

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "grpcpp/support/server_callback.h"
#include "libs/auth/access_policy.h"
#include "libs/rpc/tensor_data_message.h"
#include "libs/rpc/wire_constants.h"
#include "libs/store/audited_store.h"
#include "libs/store/checkpoint_store.h"
#include "libs/store/refused_call_log.h"
#include "proto/ckpt/v1/checkpoint_store.grpc.pb.h"

namespace ckpt {

namespace store_service_internal {
class WorkQueue;
}  // namespace store_service_internal

// kMaxTensorDataBytes, the page sizes and the Upload metadata names: libs/rpc/wire_constants.h.

struct StoreServiceOptions {
  // Who may call what (identities, roles, model scopes; libs/auth/access_policy.h). Default:
  // nobody is asked (AccessPolicy::AllowAll), unless auth_token is set.
  std::shared_ptr<const AccessPolicy> access;
  // Shorthand for access = AccessPolicy::SharedToken(auth_token): every call must carry
  // "authorization: Bearer <auth_token>", else UNAUTHENTICATED. Ignored when `access` is set.
  std::string auth_token;
  // Threads that run store work (RocksDB reads and writes, hashing, fsync). Calls beyond this
  // many wait in a queue; streams take a thread only while a chunk is read or stored. Default 8.
  int worker_threads = 8;
  // Watch streams served at once; more are RESOURCE_EXHAUSTED. Each holds a thread. Default 1000.
  int max_watches = 1000;
  // A watch whose current write has been blocked this long (the client stopped reading) is
  // cancelled. Default 30 s.
  absl::Duration watch_write_timeout = absl::Seconds(30);
  // A watch whose writes were held by flow control and that is more than this many history
  // events behind ends with RESOURCE_EXHAUSTED naming its resume token. Default 10000.
  int64_t watch_max_lag = 10000;
  // Refused calls (UNAUTHENTICATED, PERMISSION_DENIED) written to the audit log: at most this
  // many a second once `refused_calls_burst` were written at once; beyond, they are counted and
  // summarized in one record (libs/store/refused_call_log.h).
  double refused_calls_per_second = 20;
  int64_t refused_calls_burst = 200;

  // Tests only (never set by main.cc): damage in transit, so that a client's own arrival check
  // can be tested. Called with every chunk a Download is about to send, after the store read and
  // verified it and before any of it is written (`tensor_index` as TensorData.tensor_index,
  // `offset` in the tensor); it may change the bytes. The chunk is the stream's own buffer, so
  // the store's data stays intact.
  std::function<void(int tensor_index, int64_t offset, absl::Span<char> chunk)> tamper_for_testing;
};

// Upload and Download are raw methods (ByteBuffer in and out; see above).
class StoreService final : public v1::CheckpointStore::WithRawCallbackMethod_Upload<
                               v1::CheckpointStore::WithRawCallbackMethod_Download<
                                   v1::CheckpointStore::CallbackService>> {
 public:
  // `store` is not owned and must outlive the service. INVALID_ARGUMENT for worker_threads < 1.
  static absl::StatusOr<std::unique_ptr<StoreService>> Create(CheckpointStore* store,
                                                              StoreServiceOptions options);

  ~StoreService() override;
  StoreService(const StoreService&) = delete;
  StoreService& operator=(const StoreService&) = delete;

  // Requests are serialized UploadRequests; `response` receives the serialized UploadResponse.
  grpc::ServerReadReactor<grpc::ByteBuffer>* Upload(grpc::CallbackServerContext* context,
                                                    grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* FindMissingChunks(grpc::CallbackServerContext* context,
                                              const v1::FindMissingChunksRequest* request,
                                              v1::FindMissingChunksResponse* response) override;
  // `request` is a serialized DownloadRequest; responses are serialized DownloadResponses.
  grpc::ServerWriteReactor<grpc::ByteBuffer>* Download(grpc::CallbackServerContext* context,
                                                       const grpc::ByteBuffer* request) override;
  grpc::ServerUnaryReactor* ListModels(grpc::CallbackServerContext* context,
                                       const v1::ListModelsRequest* request,
                                       v1::ListModelsResponse* response) override;
  grpc::ServerUnaryReactor* ListVersions(grpc::CallbackServerContext* context,
                                         const v1::ListVersionsRequest* request,
                                         v1::ListVersionsResponse* response) override;
  grpc::ServerUnaryReactor* GetManifest(grpc::CallbackServerContext* context,
                                        const v1::GetManifestRequest* request,
                                        v1::Manifest* response) override;
  grpc::ServerUnaryReactor* SetAlias(grpc::CallbackServerContext* context,
                                     const v1::SetAliasRequest* request,
                                     v1::SetAliasResponse* response) override;
  grpc::ServerUnaryReactor* DeleteAlias(grpc::CallbackServerContext* context,
                                        const v1::DeleteAliasRequest* request,
                                        v1::DeleteAliasResponse* response) override;
  grpc::ServerUnaryReactor* DeleteVersion(grpc::CallbackServerContext* context,
                                          const v1::DeleteVersionRequest* request,
                                          v1::DeleteVersionResponse* response) override;
  grpc::ServerUnaryReactor* ApplyRetention(grpc::CallbackServerContext* context,
                                           const v1::ApplyRetentionRequest* request,
                                           v1::ApplyRetentionResponse* response) override;
  grpc::ServerUnaryReactor* GarbageCollect(grpc::CallbackServerContext* context,
                                           const v1::GarbageCollectRequest* request,
                                           v1::GarbageCollectResponse* response) override;
  grpc::ServerUnaryReactor* Verify(grpc::CallbackServerContext* context,
                                   const v1::VerifyRequest* request,
                                   v1::VerifyResponse* response) override;
  grpc::ServerUnaryReactor* GetStats(grpc::CallbackServerContext* context,
                                     const v1::GetStatsRequest* request,
                                     v1::StoreStats* response) override;
  grpc::ServerUnaryReactor* ListAudit(grpc::CallbackServerContext* context,
                                      const v1::ListAuditRequest* request,
                                      v1::ListAuditResponse* response) override;
  grpc::ServerUnaryReactor* CreateModel(grpc::CallbackServerContext* context,
                                        const v1::CreateModelRequest* request,
                                        v1::ModelInfo* response) override;
  grpc::ServerUnaryReactor* UpdateModel(grpc::CallbackServerContext* context,
                                        const v1::UpdateModelRequest* request,
                                        v1::ModelInfo* response) override;
  grpc::ServerUnaryReactor* RenameModel(grpc::CallbackServerContext* context,
                                        const v1::RenameModelRequest* request,
                                        v1::RenameModelResponse* response) override;
  grpc::ServerUnaryReactor* DeleteModel(grpc::CallbackServerContext* context,
                                        const v1::DeleteModelRequest* request,
                                        v1::DeleteModelResponse* response) override;
  grpc::ServerUnaryReactor* AnnotateVersion(grpc::CallbackServerContext* context,
                                            const v1::AnnotateVersionRequest* request,
                                            v1::VersionAnnotations* response) override;
  grpc::ServerUnaryReactor* ListHistory(grpc::CallbackServerContext* context,
                                        const v1::ListHistoryRequest* request,
                                        v1::ListHistoryResponse* response) override;
  grpc::ServerWriteReactor<v1::WatchResponse>* Watch(grpc::CallbackServerContext* context,
                                                     const v1::WatchRequest* request) override;

  // Watch streams being served now, and those ended so far because their client stopped
  // reading (cut off after watch_write_timeout, or fallen behind by watch_max_lag): for tests
  // and monitoring.
  int active_watches() const;

  // Ends every watch within about a second with UNAVAILABLE ("shutting down; resume with
  // resume_token N"), and refuses new ones: call before GrpcServer::Shutdown, whose grace would
  // otherwise be spent waiting for watches, which never end on their own. Clients resume where
  // they were once the store is back.
  void EndWatches();
  int64_t watches_cut_off() const;

 private:
  class UploadReactor;
  class DownloadReactor;
  class WatchReactor;

  StoreService(CheckpointStore* store, StoreServiceOptions options);

  // The caller, when it may call `method` on `model` (AccessPolicy::Check); UNAUTHENTICATED or
  // PERMISSION_DENIED otherwise, which goes to the audit log (RefusedCallLog).
  absl::StatusOr<Caller> Authorize(const grpc::CallbackServerContext& context,
                                   absl::string_view method, absl::string_view model) const;
  // Audits `status` as a refusal of `caller`'s call when it is PERMISSION_DENIED or
  // UNAUTHENTICATED.
  void NoteRefusal(const Caller& caller, absl::string_view method, absl::string_view model,
                   const absl::Status& status) const;

  // Who the audit log names for a call: its identity and gRPC's peer address.
  static AuditedStore::Actor ActorOf(const Caller& caller);
  // Who refusals name: "identity 'team-a'".
  static std::string Who(const Caller& caller);

  // Runs `work` on the work queue and finishes the call with its status, after checking that the
  // caller may call `method` on `model` ("" when it names none). `work` gets the caller and the
  // store as the caller may see it: a ScopedStore of its model scope.
  grpc::ServerUnaryReactor* RunUnary(
      grpc::CallbackServerContext* context, absl::string_view method, absl::string_view model,
      std::function<absl::Status(const Caller& caller, CheckpointStore& store)> work);

  void Schedule(std::function<void()> work);
  void StreamStarted();
  void StreamDone();
  // Admits one more watch (RESOURCE_EXHAUSTED beyond max_watches). WatchDone ends a Watch
  // reactor's stream (and its watch, when `counted`: WatchStarted admitted it).
  absl::Status WatchStarted();
  void WatchDone(bool counted);
  void WatchCutOff();

  CheckpointStore& store_;
  const StoreServiceOptions options_;
  const std::shared_ptr<const AccessPolicy> access_;

  // Chunk buffers of Download streams, which gRPC may hold past a write (see PayloadPool).
  const std::shared_ptr<PayloadPool> payload_pool_;
  // Writes refused calls to the audit log on the work queue; destroyed after it (drained).
  const std::unique_ptr<RefusedCallLog> refused_;

  mutable absl::Mutex mu_;
  int active_streams_ ABSL_GUARDED_BY(mu_) = 0;  // Upload / Download / Watch reactors not done.
  int active_watches_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t watches_cut_off_ ABSL_GUARDED_BY(mu_) = 0;
  std::atomic<bool> ending_watches_{false};

  // Last member: destroyed (drained and joined) first.
  std::unique_ptr<store_service_internal::WorkQueue> work_queue_;
};

}  // namespace ckpt

#endif  // CKPT_SERVICES_CHECKPOINT_STORE_STORE_SERVICE_H_

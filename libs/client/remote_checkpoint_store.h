#ifndef CKPT_LIBS_CLIENT_REMOTE_CHECKPOINT_STORE_H_
#define CKPT_LIBS_CLIENT_REMOTE_CHECKPOINT_STORE_H_

// RemoteCheckpointStore: the CheckpointStore interface (libs/store/checkpoint_store.h) served by
// a checkpoint_store server (//services/checkpoint_store) over gRPC. Code written against
// CheckpointStore -- CommitCheckpoint, LoadCheckpoint, the CLI -- works unchanged on a local
// RocksDbCheckpointStore or on this. Status codes and messages from the server pass through
// unchanged.
//
// Calls:
//  - Channel, credentials (plaintext, TLS, mutual TLS), deadlines and retries come from
//    libs/rpc/client_channel.h. Unary calls carry a deadline (RemoteStoreOptions::deadline;
//    stream_deadline for Verify, GarbageCollect and ApplyRetention, whose duration grows with
//    the store). Read-only calls are retried on UNAVAILABLE by ClientChannel::CallUnary, paced by
//    its RetryBackoff (libs/io/backoff.h), within the deadline; gRPC's own retries are off.
//    Other calls (dry runs of GarbageCollect and ApplyRetention included: the retried set is
//    per method) are never retried, since the server may have applied
//    them before the connection broke; instead, before sending one, the client waits (up to
//    connect_timeout) for the channel to be connected, so a restarting server is not an error.
//  - BeginUpload opens one Upload stream, sends the header and waits for the server to accept it,
//    so header errors (validation, names, expected_latest_version, UNAUTHENTICATED) come from
//    BeginUpload as with a local store. AddTensorData sends pieces of at most 1 MiB under gRPC
//    flow control and returns once they are sent; errors the server finds in the bytes surface
//    from a later AddTensorData or from Commit. Commit is sent once and never retried. Destroying
//    a session without Commit cancels the stream: the server abandons the upload and nothing
//    becomes visible. CommitCheckpoint (which holds the whole checkpoint) does retry: it sends
//    the upload again with the same idempotency key while it fails with UNAVAILABLE, for up to
//    connect_timeout (CommitRetryWindow), so a commit whose answer was lost to a broken
//    connection or a failover lands exactly once.
//  - OpenVersion opens one Download stream of the whole version (model and state tensors) and
//    reads its manifest. The server holds that version's snapshot for the reader's lifetime.
//    Reading tensors in manifest order (what LoadCheckpoint does) consumes that stream: the
//    client holds one 4 MiB chunk at a time, and flow control pauses the server while the caller
//    is busy, so nothing buffers the checkpoint. A tensor read out of order (behind or ahead of
//    the stream, or read twice) is fetched with a separate Download of MODEL@N restricted to its
//    key; the main stream stays where it was. Every chunk's length and xxh3 are checked on
//    arrival against the manifest (DATA_LOSS naming the chunk), as the local store does on disk.
//    A Download that breaks with UNAVAILABLE after its manifest (the store's host died; a store
//    list moves on to the successor) goes on from the first chunk not yet delivered, on a fresh
//    Download of MODEL@N by byte ranges, so a load in flight at a failover finishes and no byte is
//    delivered twice; three breaks in a row without a chunk between end the read.
//
// Audit: every change made through this client is recorded by the server (identity, peer, what);
// ListAudit reads that log. BeginAudit / FinishAudit are refused (see below).
//
// What the wire cannot do: CheckpointStore::ReadTensorChunks (reading by chunk list, outside a
// version) returns UNIMPLEMENTED; use OpenVersion(MODEL@N)->ReadTensorChunks. A remote
// AddTensorData does not store chunks before it returns (the server does, shortly after), and
// UploadSession::warnings() holds the header warnings the server reported when it accepted the
// header (at most 4 KiB of them; CommitResult::warnings has them all).
//
// Thread-safety: every method of RemoteCheckpointStore may be called concurrently (one gRPC
// channel, shared). An UploadSession or VersionReader is used by one thread at a time; each may
// outlive the RemoteCheckpointStore that made it.
//
// Example:
//   RemoteStoreOptions options;
//   options.address = "127.0.0.1:50051";
//   options.auth_token = token;  // or "" for a server without --auth_token_file
//   ASSIGN_OR_RETURN(std::unique_ptr<RemoteCheckpointStore> store,
//                    RemoteCheckpointStore::Connect(options));
//   ASSIGN_OR_RETURN(CommitResult committed, CommitCheckpoint(*store, "resnet18", contents));
//   ASSIGN_OR_RETURN(LoadedCheckpoint loaded, LoadCheckpoint(*store, committed.version));

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "libs/rpc/client_channel.h"
#include "libs/store/checkpoint_store.h"
#include "proto/ckpt/v1/checkpoint_store.grpc.pb.h"
#include "proto/ckpt/v1/checkpoint_store.pb.h"

namespace ckpt {

// Address, credentials, deadlines and retries: the shape every ckpt client shares.
using RemoteStoreOptions = ClientOptions;

class RemoteCheckpointStore final : public CheckpointStore {
 public:
  // Opens a channel to options.address and waits up to connect_timeout for it to connect.
  // INVALID_ARGUMENT for bad options; UNAVAILABLE naming the address when it does not connect.
  // Does not authenticate: a wrong token shows as UNAUTHENTICATED on the first call.
  static absl::StatusOr<std::unique_ptr<RemoteCheckpointStore>> Connect(
      const RemoteStoreOptions& options);

  ~RemoteCheckpointStore() override;
  RemoteCheckpointStore(const RemoteCheckpointStore&) = delete;
  RemoteCheckpointStore& operator=(const RemoteCheckpointStore&) = delete;

  absl::StatusOr<std::unique_ptr<UploadSession>> BeginUpload(absl::string_view model,
                                                             v1::Manifest header,
                                                             const CommitOptions& options) override;
  // A part on an Upload stream of its own (UploadHeader.join); every upload this store begins is
  // joinable (as CommitOptions::joinable_as, or a random name), since its stream cannot tell the
  // writers the server's id.
  absl::StatusOr<std::unique_ptr<UploadPart>> JoinUpload(absl::string_view upload_id,
                                                         std::vector<UploadRange> ranges) override;
  absl::StatusOr<std::vector<std::string>> FindMissingChunks(
      const std::vector<std::string>& sha256s) override;

  absl::StatusOr<v1::Manifest> GetManifest(const v1::VersionRef& ref) override;
  absl::StatusOr<std::unique_ptr<VersionReader>> OpenVersion(const v1::VersionRef& ref) override;
  // UNIMPLEMENTED: the wire reads tensors by version, not by chunk list.
  absl::Status ReadTensorChunks(const v1::TensorMeta& meta, const ChunkCallback& callback) override;

  // Both page through the server's listing until it is complete.
  absl::StatusOr<std::vector<v1::ModelInfo>> ListModels() override;
  absl::StatusOr<std::vector<v1::VersionInfo>> ListVersions(absl::string_view model) override;
  // attribution.reason travels with the request; the server names the identity.
  absl::StatusOr<int64_t> SetAlias(absl::string_view model, absl::string_view alias,
                                   int64_t version, int64_t expected_current_version = 0,
                                   const ChangeAttribution& attribution = {}) override;
  absl::Status DeleteAlias(absl::string_view model, absl::string_view alias,
                           const ChangeAttribution& attribution = {}) override;
  absl::StatusOr<int64_t> DeleteVersion(absl::string_view model, int64_t version, bool force,
                                        const ChangeAttribution& attribution = {}) override;

  // The wire has no reason for retention (ApplyRetentionRequest): attribution is not sent.
  absl::StatusOr<v1::ApplyRetentionResponse> ApplyRetention(
      absl::string_view model, const v1::RetentionPolicy& policy, bool dry_run,
      const ChangeAttribution& attribution = {}) override;
  absl::StatusOr<v1::GarbageCollectResponse> GarbageCollect(bool dry_run) override;
  absl::StatusOr<v1::VerifyResponse> Verify(absl::string_view model, int64_t version) override;
  absl::StatusOr<v1::StoreStats> GetStats() override;

  // The server's audit log, paged through until complete (or query.limit).
  absl::StatusOr<std::vector<v1::AuditRecord>> ListAudit(const AuditQuery& query) override;
  // FAILED_PRECONDITION: the server audits the calls made to it, naming the caller it
  // authenticated (services/checkpoint_store); a client must not write records on its behalf.
  absl::StatusOr<int64_t> BeginAudit(v1::AuditRecord record) override;
  absl::Status FinishAudit(int64_t sequence, const absl::Status& outcome, absl::string_view detail,
                           int64_t version) override;

  // ---- The model registry (remote_checkpoint_store_history.cc). Changes are sent once, never
  // retried (like every change); ListHistory only reads and is restarted on UNAVAILABLE.
  absl::StatusOr<v1::ModelInfo> CreateModel(absl::string_view model,
                                            const v1::ModelDetails& details,
                                            const ChangeAttribution& attribution) override;
  absl::StatusOr<v1::ModelInfo> UpdateModel(absl::string_view model,
                                            const v1::ModelDetailsChange& change,
                                            const ChangeAttribution& attribution) override;
  absl::Status RenameModel(absl::string_view model, absl::string_view new_name,
                           const ChangeAttribution& attribution) override;
  absl::StatusOr<v1::DeleteModelResponse> DeleteModel(
      absl::string_view model, bool force, const ChangeAttribution& attribution) override;
  absl::StatusOr<v1::VersionAnnotations> AnnotateVersion(
      absl::string_view model, int64_t version, const v1::AnnotationChange& change,
      const ChangeAttribution& attribution) override;
  // Pages through the server's history until complete (or query.limit).
  absl::StatusOr<std::vector<v1::RegistryEvent>> ListHistory(const HistoryQuery& query) override;
  // The first message of a Watch of `models` (the state), after which the stream is cancelled.
  absl::StatusOr<RegistryState> GetRegistryState(const std::vector<std::string>& models) override;
  // A ListHistory probe, then a Watch resuming after `after_sequence` that waits for its first
  // event until `deadline`.
  absl::StatusOr<bool> WaitForHistory(int64_t after_sequence, absl::Time deadline) override;
  // The server's Watch stream, read by a thread of the watch into a small buffer (so Next can
  // wait with a deadline; when the caller stops calling Next, flow control stops the server,
  // which eventually cuts the watch off). When the stream breaks with UNAVAILABLE (the server
  // restarted), the watch waits for the channel (connect_timeout) and resumes with the resume
  // token of the last message it received: the caller misses nothing and sees nothing twice.
  // It gives up, ending with UNAVAILABLE, when the channel does not come back within
  // connect_timeout or max_retries streams in a row fail before delivering anything. Any other
  // error (CANCELLED or RESOURCE_EXHAUSTED when the server cut a slow watcher off) ends the
  // watch after the messages received before it; a new Watch with the last resume_token
  // continues. Names are checked here (INVALID_ARGUMENT); access errors come from Next. The
  // stream has no deadline. A watch may outlive the RemoteCheckpointStore that made it.
  absl::StatusOr<std::unique_ptr<RegistryWatch>> Watch(const v1::WatchRequest& request) override;

  // connect_timeout: how long a restarting server, or the follower taking over from a writer
  // that died, may take to answer (CommitCheckpoint resends a commit that long).
  absl::Duration CommitRetryWindow() const override;

  const std::string& address() const;

  // The channel, stub and options, shared with sessions and readers
  // (internal/remote_store_connection.h).
  class Connection;

 private:
  RemoteCheckpointStore(std::shared_ptr<Connection> connection,
                        std::shared_ptr<ClientChannel> channel);
  std::shared_ptr<Connection> connection_;
  // For the registry calls (remote_checkpoint_store_history.cc): the channel Connection wraps
  // and a stub on it (shared with the watches it starts).
  std::shared_ptr<ClientChannel> channel_;
  std::shared_ptr<v1::CheckpointStore::Stub> stub_;
};

}  // namespace ckpt

#endif  // CKPT_LIBS_CLIENT_REMOTE_CHECKPOINT_STORE_H_

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
//    the store). Read-only calls are retried by gRPC on UNAVAILABLE with exponential backoff,
//    within the deadline. Other calls (dry runs of GarbageCollect and ApplyRetention included:
//    gRPC's retry policy is per method) are never retried, since the server may have applied
//    them before the connection broke; instead, before sending one, the client waits (up to
//    connect_timeout) for the channel to be connected, so a restarting server is not an error.
//  - BeginUpload opens one Upload stream, sends the header and waits for the server to accept it,
//    so header errors (validation, names, expected_latest_version, UNAUTHENTICATED) come from
//    BeginUpload as with a local store. AddTensorData sends pieces of at most 1 MiB under gRPC
//    flow control and returns once they are sent; errors the server finds in the bytes surface
//    from a later AddTensorData or from Commit. Commit is sent once and never retried. Destroying
//    a session without Commit cancels the stream: the server abandons the upload and nothing
//    becomes visible.
//  - OpenVersion opens one Download stream of the whole version (model and state tensors) and
//    reads its manifest. The server holds that version's snapshot for the reader's lifetime.
//    Reading tensors in manifest order (what LoadCheckpoint does) consumes that stream: the
//    client holds one 4 MiB chunk at a time, and flow control pauses the server while the caller
//    is busy, so nothing buffers the checkpoint. A tensor read out of order (behind or ahead of
//    the stream, or read twice) is fetched with a separate Download of MODEL@N restricted to its
//    key; the main stream stays where it was. Every chunk's length and xxh3 are checked on
//    arrival against the manifest (DATA_LOSS naming the chunk), as the local store does on disk.
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
//   ASSIGN_OR_RETURN(CommitResult committed, store->CommitCheckpoint("resnet18", contents));
//   ASSIGN_OR_RETURN(LoadedCheckpoint loaded, store->LoadCheckpoint(committed.version));

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
  absl::StatusOr<std::vector<std::string>> FindMissingChunks(
      const std::vector<std::string>& sha256s) override;

  absl::StatusOr<v1::Manifest> GetManifest(const v1::VersionRef& ref) override;
  absl::StatusOr<std::unique_ptr<VersionReader>> OpenVersion(const v1::VersionRef& ref) override;
  // UNIMPLEMENTED: the wire reads tensors by version, not by chunk list.
  absl::Status ReadTensorChunks(const v1::TensorMeta& meta, const ChunkCallback& callback) override;

  // Both page through the server's listing until it is complete.
  absl::StatusOr<std::vector<v1::ModelInfo>> ListModels() override;
  absl::StatusOr<std::vector<v1::VersionInfo>> ListVersions(absl::string_view model) override;
  absl::StatusOr<int64_t> SetAlias(absl::string_view model, absl::string_view alias,
                                   int64_t version, int64_t expected_current_version = 0) override;
  absl::Status DeleteAlias(absl::string_view model, absl::string_view alias) override;
  absl::StatusOr<int64_t> DeleteVersion(absl::string_view model, int64_t version,
                                        bool force) override;

  absl::StatusOr<v1::ApplyRetentionResponse> ApplyRetention(absl::string_view model,
                                                            const v1::RetentionPolicy& policy,
                                                            bool dry_run) override;
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

  const std::string& address() const;

  // The channel, stub and options, shared with sessions and readers (defined in the .cc).
  class Connection;

 private:
  explicit RemoteCheckpointStore(std::shared_ptr<Connection> connection);
  std::shared_ptr<Connection> connection_;
};

}  // namespace ckpt

#endif  // CKPT_LIBS_CLIENT_REMOTE_CHECKPOINT_STORE_H_

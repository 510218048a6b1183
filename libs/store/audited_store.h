#ifndef CKPT_LIBS_STORE_AUDITED_STORE_H_
#define CKPT_LIBS_STORE_AUDITED_STORE_H_

// AuditedStore: a CheckpointStore that records every change made through it in the audit log of
// the store it wraps (CheckpointStore::BeginAudit / FinishAudit), naming who made it and from
// where.
//
// Each mutating call -- an UploadSession's Commit, SetAlias, DeleteAlias, DeleteVersion, and
// ApplyRetention and GarbageCollect unless they are dry runs -- runs as:
//   1. BeginAudit: a record with outcome PENDING, durable before anything changes;
//   2. the call, on the wrapped store;
//   3. FinishAudit: the outcome (OK, or FAILED with the call's status) and what changed
//      ("alias best: 3 -> 5", "deleted versions 1, 2", "reclaimed 4096 bytes in 1 chunks, ...").
// When BeginAudit fails the call is not made and BeginAudit's error is returned, so no change
// goes unaudited. When FinishAudit fails after the call, the call's own result is still returned
// (the change was made, and an error would invite a retry that repeats it); the record stays
// PENDING -- "outcome unknown" -- and the failure is written to stderr.
//
// Commits: the committing identity is the version's producer. BeginUpload sets the header's
// metadata.producer to actor.identity; a producer the client wrote is kept, as the client's
// claim, in metadata.labels["client_producer"]. The record is begun when Commit is called (an
// upload that is never committed changes nothing), and its version filled in when it finished.
//
// Registry changes (CreateModel, UpdateModel, RenameModel, DeleteModel, AnnotateVersion) are
// audited the same way. Every change's ChangeAttribution gets actor.identity as its identity, so
// the registry's history names the same caller as the audit log; the caller's reason is kept.
//
// Reads, JoinUpload (a part changes nothing visible: the commit that takes it is audited),
// FindMissingChunks, the history, Watch and the audit methods themselves forward unchanged
// (ForwardingStore).
//
// Ownership: the wrapped store is borrowed (it must outlive the AuditedStore and every session it
// returns) or owned. Sessions keep the wrapped store, not the AuditedStore: an AuditedStore made
// for one call (what the store service does) may be destroyed while its upload goes on.
// Thread-safety: as the wrapped store.
//
// Example:
//   AuditedStore audited(*store, {"local:alice", "local"});
//   ASSIGN_OR_RETURN(int64_t previous, audited.SetAlias("resnet", "best", 5));
//   // store->ListAudit({}) now ends with {identity "local:alice", action "set_alias",
//   // outcome OK, detail "alias best: 3 -> 5", ...}

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "libs/store/checkpoint_store.h"
#include "libs/store/forwarding_store.h"

namespace ckpt {

class AuditedStore final : public ForwardingStore {
 public:
  // Who makes the calls, as the audit log names them.
  struct Actor {
    std::string identity;  // "anonymous", "local:alice", "trainer:alice@host1", ... non-empty.
    std::string peer;      // "ipv4:10.0.0.7:51234" (gRPC's peer), or "local" in-process.
  };

  // Borrows `inner`.
  AuditedStore(CheckpointStore& inner, Actor actor);
  // Owns `inner`.
  AuditedStore(std::unique_ptr<CheckpointStore> inner, Actor actor);
  ~AuditedStore() override;
  AuditedStore(const AuditedStore&) = delete;
  AuditedStore& operator=(const AuditedStore&) = delete;

  const Actor& actor() const { return actor_; }

  // The mutating calls, audited; everything else forwards unchanged (ForwardingStore).
  absl::StatusOr<std::unique_ptr<UploadSession>> BeginUpload(absl::string_view model,
                                                             v1::Manifest header,
                                                             const CommitOptions& options) override;
  absl::StatusOr<int64_t> SetAlias(absl::string_view model, absl::string_view alias,
                                   int64_t version, int64_t expected_current_version = 0,
                                   const ChangeAttribution& attribution = {}) override;
  absl::Status DeleteAlias(absl::string_view model, absl::string_view alias,
                           const ChangeAttribution& attribution = {}) override;
  absl::StatusOr<int64_t> DeleteVersion(absl::string_view model, int64_t version, bool force,
                                        const ChangeAttribution& attribution = {}) override;
  absl::StatusOr<v1::ApplyRetentionResponse> ApplyRetention(
      absl::string_view model, const v1::RetentionPolicy& policy, bool dry_run,
      const ChangeAttribution& attribution = {}) override;
  absl::StatusOr<v1::GarbageCollectResponse> GarbageCollect(bool dry_run) override;
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

 private:
  // `attribution` with the actor's identity: callers name why, never who.
  ChangeAttribution Attributed(const ChangeAttribution& attribution) const;

  class Session;

  // A record of `action` on `model` by actor_, ready for BeginAudit.
  v1::AuditRecord NewRecord(absl::string_view action, absl::string_view model) const;

  const Actor actor_;
};

// The name of the user this process runs as (getpwuid(geteuid())), or "uid:N" when the password
// database has no entry for it: for identities of local callers, "local:<user>".
std::string ProcessUserName();

}  // namespace ckpt

#endif  // CKPT_LIBS_STORE_AUDITED_STORE_H_

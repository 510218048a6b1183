#ifndef CKPT_LIBS_STORE_CHECKPOINT_STORE_H_
#define CKPT_LIBS_STORE_CHECKPOINT_STORE_H_

// CheckpointStore: the versioned, deduplicated, checksummed home of every checkpoint.
//
// A store holds models (names); a model holds immutable versions 1, 2, 3, ... Each version is a
// v1::Manifest (tensor metadata, optimizer / scheduler / extra value trees, metadata) whose tensor
// bytes live in content-addressed chunks (chunk_hasher.h) shared by every version and model that
// has the same bytes. Aliases ("best", "production") are movable names for versions; "latest"
// is implicit. A reference is "MODEL@7", "MODEL@best" or "MODEL" (= latest); see version_ref.h.
//
// Writing has one path: BeginUpload() validates a header (manifest_validation.h) and returns an
// UploadSession; AddTensorData() streams each tensor's bytes (chunks are stored as they fill, so
// memory stays at one chunk per tensor in flight); Commit() makes the version visible atomically.
// A session destroyed without Commit() leaves no version; its chunks are reclaimed by
// GarbageCollect(). CommitCheckpoint() (checkpoint_contents.h) does all of that for an in-memory
// checkpoint.
//
// Several writers can share one upload (the ranks of a job saving their shares of a checkpoint in
// parallel): each joins the session's upload_id() with JoinUpload() for the byte ranges it owns,
// writes them through its UploadPart and Finish()es it; the session's Commit() then assembles
// every tensor from the finished parts (and whatever it got itself) into one version, identical
// to a one-writer upload of the same bytes (same chunks, same content hashes).
//
// Reads verify the xxh3 checksum of every chunk: a mismatch is DATA_LOSS naming the chunk and
// tensor, and the bad bytes are never handed out.
//
// Thread-safety: every method of a CheckpointStore may be called concurrently. Two commits to one
// model get distinct consecutive versions. An UploadSession, UploadPart or VersionReader is used
// by one thread at a time; many may be open at once.
//
// Example (checkpoint_contents.h has the torch-facing side: CommitCheckpoint, LoadCheckpoint):
//   StoreOptions store_options;
//   store_options.db_path = "/data/ckpt";
//   ASSIGN_OR_RETURN(std::unique_ptr<RocksDbCheckpointStore> store,
//                    RocksDbCheckpointStore::Open(store_options));
//   ASSIGN_OR_RETURN(v1::VersionRef ref, ParseVersionRef("resnet18@best"));
//   ASSIGN_OR_RETURN(v1::Manifest manifest, store->GetManifest(ref));
//   ASSIGN_OR_RETURN(std::unique_ptr<VersionReader> reader, store->OpenVersion(ref));
//   RETURN_IF_ERROR(reader->ReadTensorChunks(manifest.tensors(0), callback));

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "proto/ckpt/v1/checkpoint_store.pb.h"
#include "proto/ckpt/v1/registry.pb.h"
#include "proto/ckpt/v1/types.pb.h"

namespace ckpt {

// Who makes a change and why, kept with it in the registry's history (v1::RegistryEvent).
// AuditedStore sets `identity` to its caller's, whatever the caller put there.
struct ChangeAttribution {
  std::string identity;  // empty: recorded as "unknown".
  std::string reason;    // free-form; may be empty.
};

// How a commit is made.
struct CommitOptions {
  // Optimistic concurrency: if > 0, the commit fails with FAILED_PRECONDITION unless the model's
  // latest version is still this one when the commit applies. 0: no check.
  int64_t expected_latest_version = 0;
  // Aliases moved to the new version in the same atomic write ("latest" is implicit and refused).
  std::vector<std::string> aliases;
  // CommitCheckpoint only: strip wrapper prefixes ("module.", "_orig_mod.", ...) from the state
  // dict's keys and record what was stripped in metadata.key_normalization. When false the keys
  // are stored as given, and metadata.key_normalization as the caller set it.
  bool normalize_keys = true;
  // CommitCheckpoint only: called after each tensor is stored with the tensor bytes stored so far
  // and in all, for progress bars. May be empty.
  std::function<void(int64_t bytes_done, int64_t bytes_total)> progress;
  // Who commits and why, for the history.
  ChangeAttribution attribution;
  // BeginUpload only: the name other writers join this upload by (UploadSession::upload_id(),
  // CheckpointStore::JoinUpload) instead of the store's id for it. A client over a stream that
  // learns nothing from the server before the commit picks one (a random token) and tells the
  // writers; ALREADY_EXISTS when a live upload has the name. Empty: the store's id.
  std::string joinable_as;
  // Makes the commit idempotent: if the model already has a version committed with this key (an
  // earlier attempt whose answer was lost), Commit returns that version (CommitResult::replayed)
  // and makes nothing new; ALREADY_EXISTS when that version holds other tensors. At most 128
  // printable ASCII characters without spaces (INVALID_ARGUMENT from BeginUpload). Recorded in
  // the commit's own batch, so a store that replays the change log (a follower taking over)
  // knows it too. CommitCheckpoint picks one when it may retry (CommitRetryWindow). Empty: none.
  std::string idempotency_key;
};

// A name no other upload or commit has: `prefix` then 128 random bits in hex. For
// CommitOptions::joinable_as and idempotency_key.
std::string RandomUploadName(absl::string_view prefix);

struct CommitResult {
  v1::VersionRef version;             // always MODEL@N.
  int64_t logical_bytes = 0;          // tensor bytes the version holds (model and state tensors).
  int64_t new_bytes = 0;              // bytes of chunks the store did not hold before this commit.
  std::vector<std::string> warnings;  // also stored in Manifest.warnings.
  // CommitOptions::idempotency_key had committed `version` before; nothing new was made.
  bool replayed = false;
};

// Bytes [begin, end) of tensor `tensor_index` of an upload (model tensors first, then state
// tensors, as UploadSession::tensor_index counts them).
struct UploadRange {
  int tensor_index = 0;
  int64_t begin = 0;
  int64_t end = 0;
};

// One version being written. Obtained from CheckpointStore::BeginUpload. Destroying it without a
// successful Commit() abandons the upload: no version appears, and GarbageCollect() reclaims the
// chunks it stored. Not thread-safe: one caller at a time. After any error the session is failed:
// further calls return FAILED_PRECONDITION and it can only be destroyed.
class UploadSession {
 public:
  virtual ~UploadSession() = default;

  // The validated header: the manifest that Commit() completes.
  virtual const v1::Manifest& header() const = 0;
  // Manifest.tensors then Manifest.state_tensors: what tensor_index counts.
  virtual int tensor_count() const = 0;
  // Findings of header validation that did not reject it (Manifest.warnings).
  virtual const std::vector<std::string>& warnings() const = 0;

  // Appends `bytes` to tensor `tensor_index` (model tensors first, then state tensors). Bytes of
  // one tensor arrive in order: `offset` must equal the bytes already given for it; tensors may
  // interleave. Full chunks are hashed and stored before this returns. INVALID_ARGUMENT for a bad
  // index, an out-of-order offset, or bytes beyond the tensor's byte_length; storage errors as
  // RocksDB reports them.
  virtual absl::Status AddTensorData(int tensor_index, int64_t offset, absl::string_view bytes) = 0;

  // As AddTensorData, except that the caller keeps `bytes` alive and unchanged until Commit()
  // returns or the session is destroyed, so the session may hash and store them in the
  // background, overlapped with the caller's next tensors; errors then surface from a later call
  // or from Commit. The default is AddTensorData.
  virtual absl::Status AddStableTensorData(int tensor_index, int64_t offset,
                                           absl::string_view bytes) {
    return AddTensorData(tensor_index, offset, bytes);
  }

  // Appends to tensor `tensor_index` the committed chunk `sha256` (32 bytes) of `length` bytes that
  // the store already holds, without its bytes (v1::StoredChunk): the caller hashed its chunks and
  // asked FindMissingChunks. `offset` must be where the tensor's bytes have got to, on a chunk
  // boundary, and `length` the size of the chunk that belongs there (CheckStoredChunkPlace):
  // INVALID_ARGUMENT otherwise, or when the stored chunk has another length. NOT_FOUND when the
  // store holds no such committed chunk (send the bytes instead). The default is NOT_FOUND, so a
  // store that cannot reference chunks makes its callers send bytes.
  virtual absl::Status AddStoredChunk(int tensor_index, int64_t offset, absl::string_view sha256,
                                      int64_t length);

  // Makes the version visible: checks every tensor got exactly byte_length bytes, through this
  // session or from the ranges of the parts finished for this upload (JoinUpload), which must tile
  // it without gap or overlap (else INVALID_ARGUMENT naming it), fills content hashes and chunk
  // refs, then writes manifest, version counter, refcounts and alias moves in one synced batch.
  // FAILED_PRECONDITION if expected_latest_version no longer holds; DATA_LOSS if a tensor's bytes
  // do not match a content_hash given in the header.
  virtual absl::StatusOr<CommitResult> Commit() = 0;

  // The id other writers join this upload by (CheckpointStore::JoinUpload); empty when the store
  // cannot share uploads (the default).
  virtual std::string upload_id() const { return ""; }
};

// One writer's part of an upload begun elsewhere (CheckpointStore::JoinUpload): the bytes of some
// ranges of its tensors. A range begins on a chunk boundary (a multiple of kChunkBytes) and ends
// on one or at its tensor's end, so its chunks are the very chunks a one-writer upload would
// store (same addresses: deduplication against other versions holds). Finish() stores the part
// durably and hands it to the upload, whose Commit() takes it. A part destroyed unfinished, or
// finished for an upload that is then abandoned, leaves no version, and its chunks are an
// abandoned upload's: GarbageCollect() reclaims them after the store's grace period. Not
// thread-safe: one caller at a time.
class UploadPart {
 public:
  virtual ~UploadPart() = default;

  // The upload's header, as BeginUpload validated it (no chunks, no content hashes); of a part on
  // a remote store, which keeps the header, only the model.
  virtual const v1::Manifest& header() const = 0;

  // The ranges JoinUpload was given; AddRangeData's range_index counts them.
  virtual const std::vector<UploadRange>& ranges() const = 0;

  // Appends `bytes` to range `range_index`, `offset` bytes from the range's begin. A range's bytes
  // arrive in order (offset = the bytes already given for it); ranges may interleave.
  // INVALID_ARGUMENT for a bad index, an out-of-order offset or bytes past the range's end;
  // storage errors as RocksDB reports them. After an error the part is failed.
  virtual absl::Status AddRangeData(int range_index, int64_t offset, absl::string_view bytes) = 0;

  // Stores every range's bytes durably and hands them to the upload. INVALID_ARGUMENT naming a
  // range that did not get all its bytes; FAILED_PRECONDITION when the upload has ended
  // (committed or abandoned) meanwhile.
  virtual absl::Status Finish() = 0;
};

// OK when the chunk `sha256` of `length` bytes may be the next piece of `meta`'s bytes after
// `offset` bytes of it: `offset` on a chunk boundary (a multiple of kChunkBytes) inside the tensor,
// `length` = min(kChunkBytes, byte_length - offset), a 32-byte address. INVALID_ARGUMENT naming
// the tensor (`name`) otherwise. UploadSession::AddStoredChunk's check, shared by its
// implementations so a remote client refuses what the server would.
absl::Status CheckStoredChunkPlace(const v1::TensorMeta& meta, absl::string_view name,
                                   int64_t offset, absl::string_view sha256, int64_t length);

// OK when `ranges` may be a part of an upload of `header` (CheckpointStore::JoinUpload): at least
// one; each names a tensor of the header (model tensors, then state tensors), is not empty, lies
// inside its tensor, begins on a chunk boundary and ends on one or at the tensor's end; no two
// overlap. INVALID_ARGUMENT naming the range otherwise. JoinUpload's check, shared so that a
// remote client refuses what the server would.
absl::Status CheckUploadRanges(const v1::Manifest& header, const std::vector<UploadRange>& ranges);

// Called with consecutive pieces of a tensor's bytes: `offset` within the tensor, `bytes` valid
// only during the call. A non-OK return stops the read and is returned from it.
using ChunkCallback = std::function<absl::Status(int64_t offset, absl::string_view bytes)>;

// One version, read from a consistent point in time: concurrent deletes and GC do not affect an
// open reader. Not thread-safe: one caller at a time.
class VersionReader {
 public:
  virtual ~VersionReader() = default;

  // With Manifest.aliases filled.
  virtual const v1::Manifest& manifest() const = 0;

  // Streams the bytes of `meta` (a tensor of manifest()) chunk by chunk, verifying each chunk's
  // length and xxh3 before handing it out: DATA_LOSS naming the chunk (hex SHA-256), the tensor
  // and the version on a mismatch or a missing chunk.
  virtual absl::Status ReadTensorChunks(const v1::TensorMeta& meta,
                                        const ChunkCallback& callback) const = 0;

  // Reads the bytes of `meta` into `destination` (meta.byte_length() bytes, which the caller
  // owns), with the checks of ReadTensorChunks. On an error the contents of `destination` are
  // unspecified (bytes may be there before their checksum was found wrong). The default copies
  // through ReadTensorChunks; stores that can read straight into `destination` override it.
  virtual absl::Status ReadTensorInto(const v1::TensorMeta& meta, char* destination) const;

  // As ReadTensorInto, except that the chunks' xxh3 checksums may go unchecked (their lengths
  // and locations are still checked): for a caller that hands the bytes to a receiver who checks
  // every chunk against meta's ChunkRefs itself (a Download whose client asked for it). The
  // default checks them anyway.
  virtual absl::Status ReadTensorIntoForCheckingReceiver(const v1::TensorMeta& meta,
                                                         char* destination) const;

  // Bytes [begin, end) of `meta` into `destination` (end - begin bytes): the whole chunks that
  // hold them are read and checked (a checksum covers a whole chunk; chunk_layout.h's
  // ChunksCovering), only the range is kept, and memory beyond `destination` stays at one chunk.
  // For a rank of a resharded resume, which reads only its slices. OUT_OF_RANGE unless
  // 0 <= begin <= end <= byte_length; DATA_LOSS as ReadTensorChunks. The default reads each chunk
  // through ReadTensorInto on a one-chunk view of `meta` (straight into `destination` where the
  // chunk lies inside the range), which a store reading by chunk refs serves; a reader that
  // wraps another forwards this, and one that cannot read such a view (a remote one) overrides
  // it.
  virtual absl::Status ReadTensorRange(const v1::TensorMeta& meta, int64_t begin, int64_t end,
                                       char* destination) const;

  // The bytes of `meta` mapped from storage without a copy (a private, copy-on-write mapping of
  // the page cache), every chunk checked; `data` is null when this reader cannot map them. The
  // mapping lives as long as `owner`. The default maps nothing.
  struct MappedBytes {
    std::shared_ptr<void> owner;
    char* data = nullptr;
  };
  virtual absl::StatusOr<MappedBytes> MapTensorBytes(const v1::TensorMeta& meta) const;

  // Where the bytes of `meta` lie in place, back to back, in one file of the store (a pack of
  // the RocksDB store): the file's path and their offset in it, for a loader that hands the file
  // itself to a consumer on its host (libs/loader/shm_server.h). Reads and checks no bytes: the
  // receiver checks them against meta's chunk digests. nullopt when they do not lie so; the
  // default locates nothing.
  struct FileRegion {
    std::string path;
    int64_t offset = 0;
  };
  virtual absl::StatusOr<std::optional<FileRegion>> LocateTensorBytes(
      const v1::TensorMeta& meta) const;
};

// Puts `header`'s model tensors under canonical keys (libs/tensor NormalizeKeys: "module.",
// "_orig_mod.", ... stripped), keeping each TensorMeta.key it finds as original_key; records the
// normalization in metadata.key_normalization (when keys changed, or none was recorded) and maps
// optimizer_param_names to the canonical keys. What CommitCheckpoint does with normalize_keys, and
// the store service with an UploadHeader's normalize_keys: the one place keys are normalized on
// the way in. INVALID_ARGUMENT when two keys would become one.
absl::Status NormalizeHeaderKeys(v1::Manifest& header);

// AuditRecord.action of each kind of change.
inline constexpr absl::string_view kAuditCommit = "commit";
inline constexpr absl::string_view kAuditSetAlias = "set_alias";
inline constexpr absl::string_view kAuditDeleteAlias = "delete_alias";
inline constexpr absl::string_view kAuditDeleteVersion = "delete_version";
inline constexpr absl::string_view kAuditApplyRetention = "apply_retention";
inline constexpr absl::string_view kAuditGarbageCollect = "garbage_collect";
inline constexpr absl::string_view kAuditCreateModel = "create_model";
inline constexpr absl::string_view kAuditUpdateModel = "update_model";
inline constexpr absl::string_view kAuditRenameModel = "rename_model";
inline constexpr absl::string_view kAuditDeleteModel = "delete_model";
inline constexpr absl::string_view kAuditAnnotate = "annotate";
// A call access control refused (RefusedCallLog): nothing changed; the record's outcome is FAILED
// with the refusal, its detail the method.
inline constexpr absl::string_view kAuditRefused = "refused";
// How many refused calls went unrecorded because more came than the log records a second.
inline constexpr absl::string_view kAuditRefusalsDropped = "refusals_dropped";

// Every kAudit* action above.
inline constexpr absl::string_view kAuditActions[] = {
    kAuditCommit,         kAuditSetAlias,       kAuditDeleteAlias, kAuditDeleteVersion,
    kAuditApplyRetention, kAuditGarbageCollect, kAuditCreateModel, kAuditUpdateModel,
    kAuditRenameModel,    kAuditDeleteModel,    kAuditAnnotate,    kAuditRefused,
    kAuditRefusalsDropped};

// Whether `action` is one of kAuditActions.
inline bool IsAuditAction(absl::string_view action) {
  for (absl::string_view known : kAuditActions) {
    if (action == known) return true;
  }
  return false;
}

// Which audit records ListAudit returns (every filter applies): oldest first.
struct AuditQuery {
  // Only records of this model; empty: every model, and calls of none (garbage collection).
  std::string model;
  // Only calls begun at or after this time; InfinitePast(): all.
  absl::Time since = absl::InfinitePast();
  // Only records after this sequence number (paging: the last one a previous call returned).
  int64_t after_sequence = 0;
  // At most this many records; 0: no limit.
  int64_t limit = 0;
};

// Which registry events ListHistory returns (every filter applies): oldest first.
struct HistoryQuery {
  // Only events of this model (a rename is an event of its old name); empty: every model.
  std::string model;
  // Only ALIAS_SET / ALIAS_DELETED events of this alias (needs `model`); empty: every event.
  std::string alias;
  // Only events after this sequence number (paging, and Watch's resume token).
  int64_t after_sequence = 0;
  // Only events at or after this time; InfinitePast(): all.
  absl::Time since = absl::InfinitePast();
  // At most this many events; 0: no limit.
  int64_t limit = 0;
};

// The state a watch starts from: the watched models and the sequence number of the newest
// registry event that state includes (events after it are the changes since).
struct RegistryState {
  std::vector<v1::ModelInfo> models;
  int64_t sequence = 0;
};

// A running watch: CheckpointStore::Watch. Not thread-safe, except Cancel.
class RegistryWatch {
 public:
  virtual ~RegistryWatch() = default;
  // The next update, waiting for it until `deadline`: nullopt when none came by then. The first
  // update of a watch begun without a resume token is the state (WatchResponse.state). An error
  // ends the watch; CANCELLED after Cancel().
  virtual absl::StatusOr<std::optional<v1::WatchResponse>> Next(absl::Time deadline) = 0;
  // Ends a Next() waiting in another thread soon, with CANCELLED.
  virtual void Cancel() = 0;
};

// SetAlias's expected_current_version that only creates an alias: fails if it exists.
inline constexpr int64_t kAliasMustNotExist = -1;

// Implementations: RocksDbCheckpointStore (rocksdb_checkpoint_store.h) and RemoteCheckpointStore
// (libs/client); decorators derive from ForwardingStore (forwarding_store.h). A method added here
// passes through every decorator unchanged until one overrides it: decide whether ScopedStore
// must check it against the caller's scope and whether AuditedStore must audit it.
class CheckpointStore {
 public:
  virtual ~CheckpointStore() = default;

  // ---- Writing.

  // Starts writing a version of `model` described by `header` (a Manifest without version,
  // chunks or content hashes; content_hash may be given to have the bytes checked against it).
  // INVALID_ARGUMENT for a bad model or alias name, or a header that fails validation
  // (manifest_validation.h).
  virtual absl::StatusOr<std::unique_ptr<UploadSession>> BeginUpload(
      absl::string_view model, v1::Manifest header, const CommitOptions& options) = 0;


  // How long CommitCheckpoint goes on sending a commit that failed with UNAVAILABLE: zero (the
  // default, a store in this process, whose UNAVAILABLE does not heal by trying again) sends it
  // once. A remote store says how long its server (or the store taking over from it) may take
  // to come back.
  virtual absl::Duration CommitRetryWindow() const { return absl::ZeroDuration(); }

  // Joins the live upload `upload_id` (UploadSession::upload_id()) as a writer of `ranges` of its
  // tensors: the ranks of a job each saving their share of one checkpoint, concurrently. NOT_FOUND
  // when no upload of that id is in progress in this store; INVALID_ARGUMENT for no ranges, or a
  // range that is empty, lies outside its tensor, or does not begin on a chunk boundary and end on
  // one or at its tensor's end; ALREADY_EXISTS (from BeginUpload) for a joinable_as taken.
  virtual absl::StatusOr<std::unique_ptr<UploadPart>> JoinUpload(
      absl::string_view upload_id, std::vector<UploadRange> ranges) = 0;

  // Which of `sha256s` (32-byte chunk addresses) the store does not hold committed.
  virtual absl::StatusOr<std::vector<std::string>> FindMissingChunks(
      const std::vector<std::string>& sha256s) = 0;

  // ---- Reading.

  // The manifest `ref` names (version number, alias, or latest when neither), with
  // Manifest.aliases filled. NOT_FOUND naming "MODEL@REF"; INVALID_ARGUMENT for a bad name.
  virtual absl::StatusOr<v1::Manifest> GetManifest(const v1::VersionRef& ref) = 0;

  // A consistent reader of the version `ref` names. Errors as GetManifest.
  virtual absl::StatusOr<std::unique_ptr<VersionReader>> OpenVersion(const v1::VersionRef& ref) = 0;

  // Streams `meta`'s bytes from the store's current state (no snapshot: a chunk freed by GC
  // since `meta` was read is DATA_LOSS). Checks as VersionReader::ReadTensorChunks.
  virtual absl::Status ReadTensorChunks(const v1::TensorMeta& meta,
                                        const ChunkCallback& callback) = 0;



  // ---- Versions and aliases.

  // Every model, by name. A model whose versions were all deleted stays listed (version_count 0)
  // and keeps its version counter.
  virtual absl::StatusOr<std::vector<v1::ModelInfo>> ListModels() = 0;
  // Every version of `model`, oldest first. NOT_FOUND for an unknown model.
  virtual absl::StatusOr<std::vector<v1::VersionInfo>> ListVersions(absl::string_view model) = 0;
  // The versions of `model` that `filter` selects (version_filter.h), oldest first. Errors as
  // ListVersions; INVALID_ARGUMENT for a malformed filter.
  absl::StatusOr<std::vector<v1::VersionInfo>> FindVersions(absl::string_view model,
                                                            const v1::VersionFilter& filter);

  // Points `alias` at MODEL@version atomically; returns the version it pointed at before (0 if it
  // is new). Compare-and-set: with expected_current_version > 0, FAILED_PRECONDITION unless the
  // alias points there now; with kAliasMustNotExist, unless the alias does not exist yet; 0: no
  // check. INVALID_ARGUMENT for a bad or reserved alias; NOT_FOUND for a missing
  // model or version.
  // Every move is an ALIAS_SET event in the history (from, to, `attribution`).
  virtual absl::StatusOr<int64_t> SetAlias(absl::string_view model, absl::string_view alias,
                                           int64_t version, int64_t expected_current_version = 0,
                                           const ChangeAttribution& attribution = {}) = 0;
  // NOT_FOUND if the alias does not exist.
  virtual absl::Status DeleteAlias(absl::string_view model, absl::string_view alias,
                                   const ChangeAttribution& attribution = {}) = 0;

  // Deletes MODEL@version, decrementing its chunks' refcounts in the same batch. Returns the bytes
  // whose refcount reached zero (freed by the next GarbageCollect). FAILED_PRECONDITION naming the
  // aliases when aliases point at it and !force (with force they are removed in the same batch);
  // NOT_FOUND for a missing version. Version numbers are never reused.
  virtual absl::StatusOr<int64_t> DeleteVersion(absl::string_view model, int64_t version,
                                                bool force,
                                                const ChangeAttribution& attribution = {}) = 0;

  // ---- Retention, garbage collection, verification.

  // Deletes versions outside the policy (keep the newest keep_last, plus every version divisible
  // by keep_every; never an aliased version or the latest) and drops optimizer state (keeping
  // weights, scheduler and extra state) from unaliased versions older than the newest
  // drop_optimizer_state_older_than. All in one batch; dry_run only reports. INVALID_ARGUMENT for
  // negative policy numbers; NOT_FOUND for an unknown model.
  virtual absl::StatusOr<v1::ApplyRetentionResponse> ApplyRetention(
      absl::string_view model, const v1::RetentionPolicy& policy, bool dry_run,
      const ChangeAttribution& attribution = {}) = 0;

  // Frees chunks whose refcount is zero and the chunks of abandoned uploads (no live session,
  // begun longer ago than the store's grace period), and reports logical bytes freed. Never frees
  // a chunk that an upload in progress has stored or relies on. dry_run only reports.
  virtual absl::StatusOr<v1::GarbageCollectResponse> GarbageCollect(bool dry_run) = 0;

  // Re-reads and re-hashes (SHA-256 and xxh3) every chunk of MODEL@version (version 0: every
  // version of MODEL; empty model: the whole store, which also cross-checks refcounts against
  // the manifests). Problems are reported, not returned as errors; NOT_FOUND for a missing model
  // or version.
  virtual absl::StatusOr<v1::VerifyResponse> Verify(absl::string_view model, int64_t version) = 0;

  virtual absl::StatusOr<v1::StoreStats> GetStats() = 0;

  // ---- Audit log.
  //
  // Every change to the store is recorded write-ahead by whoever makes it on behalf of a caller
  // (AuditedStore, audited_store.h, does it for each mutating call): BeginAudit durably records
  // the call with outcome PENDING before the change, FinishAudit rewrites that record with the
  // outcome after it. The store methods above do not audit themselves: they do not know who is
  // calling.

  // Records `record` (identity, peer, action, model, version, alias, detail as given) with a
  // fresh sequence number, the current time and outcome PENDING, durably (as durable as a
  // commit: StoreOptions::sync_commits), and returns the sequence number. INVALID_ARGUMENT for an
  // empty identity or an unknown action; FAILED_PRECONDITION where the store cannot take records
  // from its caller (a remote store records the calls made to it itself).
  virtual absl::StatusOr<int64_t> BeginAudit(v1::AuditRecord record) = 0;

  // Rewrites record `sequence` with the call's outcome (OK, or FAILED with outcome's code and
  // message), `detail` (what changed, for people) and, when `version` > 0, the version the call
  // made or touched (a commit's version is only known once it committed). NOT_FOUND for an
  // unknown sequence; FAILED_PRECONDITION when the record is no longer PENDING, or as BeginAudit.
  virtual absl::Status FinishAudit(int64_t sequence, const absl::Status& outcome,
                                   absl::string_view detail, int64_t version) = 0;

  // The records `query` selects, oldest (lowest sequence) first. PENDING records are returned
  // as stored. INVALID_ARGUMENT for a bad model name or a negative after_sequence or limit.
  virtual absl::StatusOr<std::vector<v1::AuditRecord>> ListAudit(const AuditQuery& query) = 0;

  // ---- The model registry.
  //
  // Every change -- a commit, an alias move or delete, a version delete, retention, an
  // annotation, a model created, changed, renamed or deleted -- appends a v1::RegistryEvent in
  // the same atomic write as the change, with the change's ChangeAttribution. That history is
  // what ListHistory pages through and what Watch streams.

  // A model with no versions and `details` (description, owner, tags; the times are set by the
  // store). ALREADY_EXISTS if the name is, or ever was, a model (version numbers must never be
  // reused under a name); INVALID_ARGUMENT for a bad name. A commit to a new name creates the
  // model too, without details.
  virtual absl::StatusOr<v1::ModelInfo> CreateModel(absl::string_view model,
                                                    const v1::ModelDetails& details,
                                                    const ChangeAttribution& attribution) = 0;
  // Applies `change` to the model's details. NOT_FOUND for an unknown model.
  virtual absl::StatusOr<v1::ModelInfo> UpdateModel(absl::string_view model,
                                                    const v1::ModelDetailsChange& change,
                                                    const ChangeAttribution& attribution) = 0;
  // Moves the model, its versions (whose manifests then name `new_name`), aliases, annotations
  // and details to `new_name` in one atomic write; the old name stays reserved. NOT_FOUND for an
  // unknown model; ALREADY_EXISTS if `new_name` is or was a model.
  virtual absl::Status RenameModel(absl::string_view model, absl::string_view new_name,
                                   const ChangeAttribution& attribution) = 0;
  // Deletes the model; the name stays reserved (its version counter is kept, so re-creating it
  // continues the numbering). FAILED_PRECONDITION while it has versions, unless `force`, which
  // deletes them and their aliases in the same write. NOT_FOUND for an unknown model.
  virtual absl::StatusOr<v1::DeleteModelResponse> DeleteModel(
      absl::string_view model, bool force, const ChangeAttribution& attribution) = 0;

  // Applies `change` to MODEL@version's annotations and returns them. NOT_FOUND for a missing
  // version; INVALID_ARGUMENT for an empty metric or tag name or a non-finite metric.
  virtual absl::StatusOr<v1::VersionAnnotations> AnnotateVersion(
      absl::string_view model, int64_t version, const v1::AnnotationChange& change,
      const ChangeAttribution& attribution) = 0;

  // The events `query` selects, oldest first. INVALID_ARGUMENT for a bad model or alias name, an
  // alias without a model, or a negative after_sequence or limit.
  virtual absl::StatusOr<std::vector<v1::RegistryEvent>> ListHistory(const HistoryQuery& query) = 0;

  // `models` (every model when empty; unknown names are left out) as they are at one instant,
  // with the sequence number of the newest event that instant includes.
  virtual absl::StatusOr<RegistryState> GetRegistryState(
      const std::vector<std::string>& models) = 0;

  // Waits until an event after `after_sequence` exists or `deadline` passes: true when one
  // exists.
  virtual absl::StatusOr<bool> WaitForHistory(int64_t after_sequence, absl::Time deadline) = 0;

  // Watches `request.models`: the state first (unless request.resume_token > 0 or
  // request.resume), then every
  // matching event in order, each update carrying the resume token that continues after it.
  // The default runs over GetRegistryState, ListHistory and WaitForHistory, reading the history
  // a page at a time (memory per watch is bounded by one page); a remote store streams its
  // server's Watch. INVALID_ARGUMENT for bad names or a negative token.
  virtual absl::StatusOr<std::unique_ptr<RegistryWatch>> Watch(const v1::WatchRequest& request);
};

}  // namespace ckpt

#endif  // CKPT_LIBS_STORE_CHECKPOINT_STORE_H_

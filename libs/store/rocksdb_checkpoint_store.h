#ifndef CKPT_LIBS_STORE_ROCKSDB_CHECKPOINT_STORE_H_
#define CKPT_LIBS_STORE_ROCKSDB_CHECKPOINT_STORE_H_

// The CheckpointStore on a local RocksDB database (schema: rocksdb_schema.h).
//
// Durability: chunk bytes are appended (not synced) to the upload's own pack as it streams (a
// pack file, chunk_pack.h, or an object, s3_chunk_backend.h: StoreOptions::chunk_backend); a
// commit syncs that pack, then writes one synced WriteBatch holding the
// manifest, the chunks' pack locations, the model record (version counter), refcount increments,
// alias moves and the removal of the upload record. Recovery replays a prefix of RocksDB's log, so
// a crash at any instant leaves each version either wholly present or absent, and a location is
// only ever recorded for bytes already durable.
//
// Concurrency: metadata changes (commit, alias, delete, retention, GC) serialize on one mutex and
// are read-modify-write under it; chunk hashing and chunk writes of uploads run outside it, in
// parallel. Readers never take it: they read from RocksDB snapshots. Uploads in progress are
// tracked in memory (the DB's lock file guarantees one process), so GC never frees a chunk that a
// live upload has stored or found already present.
//
// Lifetime: sessions and readers keep the database open; it closes when the store and the last
// of them are gone.
//
// Example:
//   StoreOptions options;
//   options.db_path = "/data/ckpt";
//   ASSIGN_OR_RETURN(std::unique_ptr<RocksDbCheckpointStore> store,
//                    RocksDbCheckpointStore::Open(options));

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "libs/store/checkpoint_store.h"
#include "libs/store/chunk_backend.h"

namespace rocksdb {
class FileSystem;
}  // namespace rocksdb

namespace ckpt {

struct StoreOptions {
  // Directory of the RocksDB database. Required.
  std::string db_path;
  // Create the database when `db_path` holds none. When false, opening a missing store is
  // NOT_FOUND.
  bool create_if_missing = true;
  // fsync the WAL on every commit and metadata change. Without it a power failure (not a process
  // crash) can lose the most recent acknowledged commits. Default true.
  bool sync_commits = true;
  // GarbageCollect leaves the chunks of an upload abandoned less than this long ago, so a client
  // that reconnects can still find them (FindMissingChunks). Uploads with a live session are
  // never collected, whatever their age. Default 1 hour.
  absl::Duration abandoned_upload_grace = absl::Hours(1);
  // ReadTensor (checkpoint_contents.h) returns tensors of 1 MiB or more that point into a private
  // (copy-on-write) mapping of their pack file instead of copies, when their chunks lie back to
  // back in one pack (every tensor an upload stored whole) and no tensor mapped earlier by the
  // same reader overlaps those bytes (deduplicated chunks); one mapping per pack and reader.
  // Every chunk is still checked on load, and two tensors never share memory. Such a tensor is not
  // resizable, and holds its pack file (and its disk space) until it is freed. Default true.
  bool map_tensors_on_load = true;
  // The RocksDB file system the database's files (WAL, MANIFEST, SST files) go through; pack
  // files are plain POSIX files regardless. Null (the default): RocksDB's default file system.
  // Tests pass one that records what was synced or injects faults.
  std::shared_ptr<rocksdb::FileSystem> rocksdb_file_system;
  // Where chunk bytes go. Null (the default): pack files in `db_path`/packs. An S3ChunkBackend
  // (s3_chunk_backend.h) keeps the same packs as objects in a bucket, RocksDB staying the index;
  // a backend serves one store (GC removes the packs this store's index does not name), and the
  // same backend must be passed every time the store is opened.
  std::shared_ptr<ChunkBackend> chunk_backend;
  // Record every acknowledged change in the backend's change log (change_log.h: beside the pack
  // files, or in their bucket) before it is applied here, and replay what this index lacks at
  // open: an empty `db_path` is rebuilt from the log, so losing the index loses nothing.
  // Default true; false only for measuring what the log costs (tools/bench).
  bool keep_change_log = true;
  // Open as a follower of the change log (a standby beside the writer, sharing its bucket):
  // reads are served from this index, FollowChangeLog applies what the writer appends, and every
  // change is refused with UNAVAILABLE until TakeOverAsWriter. Needs keep_change_log.
  bool start_as_follower = false;
  // The writer puts a snapshot of the whole index beside its change log every this many changes
  // (in the background), so that a store rebuilt on an empty directory loads it and replays only
  // the changes after it. 0: never. Default 10,000.
  int64_t change_log_snapshot_every = 10000;
};

// A seam for tools/bench only (libs/store/benchmark_seams.h, visible to tools/bench alone).
struct StoreBenchmarkSeams;

class RocksDbCheckpointStore final : public CheckpointStore {
 public:
  // Opens or creates the store. INVALID_ARGUMENT for an empty db_path; NOT_FOUND when the store
  // does not exist and !create_if_missing; UNAVAILABLE when another process holds it open;
  // FAILED_PRECONDITION for an unknown schema version; DATA_LOSS for corrupt files.
  static absl::StatusOr<std::unique_ptr<RocksDbCheckpointStore>> Open(const StoreOptions& options);

  ~RocksDbCheckpointStore() override;
  RocksDbCheckpointStore(const RocksDbCheckpointStore&) = delete;
  RocksDbCheckpointStore& operator=(const RocksDbCheckpointStore&) = delete;

  absl::StatusOr<std::unique_ptr<UploadSession>> BeginUpload(absl::string_view model,
                                                             v1::Manifest header,
                                                             const CommitOptions& options) override;
  absl::StatusOr<std::unique_ptr<UploadPart>> JoinUpload(absl::string_view upload_id,
                                                         std::vector<UploadRange> ranges) override;
  absl::StatusOr<std::vector<std::string>> FindMissingChunks(
      const std::vector<std::string>& sha256s) override;

  absl::StatusOr<v1::Manifest> GetManifest(const v1::VersionRef& ref) override;
  absl::StatusOr<std::unique_ptr<VersionReader>> OpenVersion(const v1::VersionRef& ref) override;
  absl::Status ReadTensorChunks(const v1::TensorMeta& meta, const ChunkCallback& callback) override;

  absl::StatusOr<std::vector<v1::ModelInfo>> ListModels() override;
  absl::StatusOr<std::vector<v1::VersionInfo>> ListVersions(absl::string_view model) override;
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
  absl::StatusOr<v1::VerifyResponse> Verify(absl::string_view model, int64_t version) override;
  absl::StatusOr<v1::StoreStats> GetStats() override;

  // Records live in the `audit` column family (rocksdb_schema.h), one per call, keyed by
  // sequence number; each write is a synced batch of its own (see StoreOptions::sync_commits),
  // so a PENDING record is on disk before the change it announces is applied.
  absl::StatusOr<int64_t> BeginAudit(v1::AuditRecord record) override;
  absl::Status FinishAudit(int64_t sequence, const absl::Status& outcome, absl::string_view detail,
                           int64_t version) override;
  absl::StatusOr<std::vector<v1::AuditRecord>> ListAudit(const AuditQuery& query) override;

  // Registry events live in the `history` column family, keyed by sequence number, each written
  // in the batch of its change; annotations in `annotations`, keyed like manifests.
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
  absl::StatusOr<std::vector<v1::RegistryEvent>> ListHistory(const HistoryQuery& query) override;
  absl::StatusOr<RegistryState> GetRegistryState(const std::vector<std::string>& models) override;
  absl::StatusOr<bool> WaitForHistory(int64_t after_sequence, absl::Time deadline) override;

  const std::string& db_path() const;

  // ---- Several stores on one change log (issue #53; libs/ha/store_failover.h drives these).
  // A follower applies the records the writer appended since it last looked; how many. Watchers
  // wake for their events. FAILED_PRECONDITION on the writer or without a log.
  absl::StatusOr<int64_t> FollowChangeLog();
  // Becomes the writer: catches up, then creates a takeover record after the log's last, so no
  // earlier writer can append again (its next number is taken), and reconciles the audit records
  // the old writer left PENDING. The caller must hold the writer's lease (etcd) first: two stores
  // taking over in turn would fence each other, never both write.
  absl::Status TakeOverAsWriter();
  // Becomes a follower: changes are refused with UNAVAILABLE naming `writer_address` (may be
  // empty: not known yet). A change already appending finishes or fails as it would have.
  void StepDown(std::string writer_address);
  bool is_follower() const;
  // The number of the last change-log record this index holds (0: none, or no log).
  int64_t last_change() const;

  // Internal state shared with sessions and readers (internal/rocksdb_store_core.h).
  class Core;

 private:
  friend struct StoreBenchmarkSeams;
  // `skip_hashing`: see StoreBenchmarkSeams::OpenWithoutHashing.
  static absl::StatusOr<std::unique_ptr<RocksDbCheckpointStore>> Open(const StoreOptions& options,
                                                                      bool skip_hashing);
  explicit RocksDbCheckpointStore(std::shared_ptr<Core> core);
  // Records the new upload `upload_id` (Hex64 of a NewUploadNumber, which also names its pack)
  // to `model` and registers it live.
  absl::Status RecordUpload(absl::string_view model, const std::string& upload_id);
  std::shared_ptr<Core> core_;
};

}  // namespace ckpt

#endif  // CKPT_LIBS_STORE_ROCKSDB_CHECKPOINT_STORE_H_

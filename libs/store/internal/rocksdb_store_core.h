#ifndef CKPT_LIBS_STORE_INTERNAL_ROCKSDB_STORE_CORE_H_
#define CKPT_LIBS_STORE_INTERNAL_ROCKSDB_STORE_CORE_H_

// RocksDbCheckpointStore's private core, shared by its files (listed in srcs only): Core -- the
// store's RocksDB handle, record reads and writes, chunk I/O over its ChunkBackend (pack files
// or an object store, chunk_backend.h), pack space, the audit log's and the history's sequence
// numbers, readers' registrations and live uploads. The public API is rocksdb_checkpoint_store.h;
// the upload session is internal/rocksdb_upload_session.h.
//
// The files, by concern (as RocksDB splits db_impl.cc):
//   rocksdb_checkpoint_store.cc              open, begin upload, reads, versions and aliases
//   rocksdb_checkpoint_store_maintenance.cc  retention, garbage collection, verify, stats
//   rocksdb_checkpoint_store_audit.cc        the audit log: load, reconcile, begin, finish, list
//   rocksdb_checkpoint_store_history.cc      models, annotations, the history (append, load, wait)
//   internal/rocksdb_upload_session.cc       the upload session and its hashing pipeline
//   internal/rocksdb_store_core.h            this file: Core's declaration
//   internal/rocksdb_store_core.cc           Core: construction, readers, writes, live uploads
//   internal/rocksdb_store_core_records.cc   model, version and alias records; refcount deltas
//   internal/rocksdb_store_core_chunks.cc    chunk reads, mapping and checks; pinning and storing
//   internal/rocksdb_store_core_packs.cc     pack space: reclaiming, compaction, live locations
//   internal/rocksdb_store_core_changes.cc   the change log: every acknowledged batch recorded
//                                            there first; replay, rebuild, fencing
//   internal/rocksdb_store_records.h         small helpers (namespace rocksdb_store_internal),
//                                            which a .cc file that wants them unqualified says
//                                            with a using-directive of its own

#include <optional>
#include <thread>
#include <vector>

#include "libs/io/disjoint_ranges.h"
#include "libs/store/change_log.h"
#include "libs/store/internal/rocksdb_store_records.h"

namespace ckpt {

// The whole-pack mappings one reader shares among the tensors it maps, and the regions it has
// handed out.
struct PackMappings {
  absl::Mutex mu;
  absl::flat_hash_map<uint64_t, std::shared_ptr<MappedPackRegion>> packs ABSL_GUARDED_BY(mu);
  // Per pack, the byte ranges handed out, which never overlap.
  absl::flat_hash_map<uint64_t, DisjointRanges> handed_out ABSL_GUARDED_BY(mu);

  // Claims bytes [start, end) of pack `pack_id`; false when they overlap bytes handed out
  // before (a deduplicated chunk can lie inside another tensor's run, or runs can touch).
  bool Claim(uint64_t pack_id, int64_t start, int64_t end) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
};

class RocksDbCheckpointStore::Core {
 public:
  Core(StoreOptions options, std::unique_ptr<StoreDb> db, std::shared_ptr<ChunkBackend> packs,
       bool skip_hashing);
  // Waits for a snapshot of the change log being written.
  ~Core();

  const StoreOptions& options() const { return options_; }
  // StoreBenchmarkSeams::OpenWithoutHashing: chunks get serial addresses, nothing is hashed.
  bool skip_hashing() const { return skip_hashing_; }
  rocksdb::DB* db() const { return db_; }
  ChunkBackend& packs() const { return *packs_; }

  // ---- Readers and writes (internal/rocksdb_store_core.cc).

  // Readers register before they take their snapshot, with the latest sequence number then (their
  // snapshot sees at least that much). GarbageCollect closes a removed pack's descriptor once
  // every registered reader started after the batch that stopped naming the pack.
  int64_t AddReader();
  void RemoveReader(int64_t id);
  // The oldest sequence number a registered reader may see; the newest when there is none.
  uint64_t OldestReaderSequence();
  rocksdb::ColumnFamilyHandle* cf(ColumnFamily cf) const { return store_db_->cf(cf); }

  rocksdb::ReadOptions Read(const rocksdb::Snapshot* snapshot = nullptr) const {
    rocksdb::ReadOptions read;
    read.snapshot = snapshot;
    read.verify_checksums = true;
    return read;
  }

  // A synced write (sync, and StoreOptions::sync_commits) is an acknowledged one: numbered, so
  // that a write-ahead log that later loses it is refused on open (StoreDb::WriteAcknowledged).
  absl::Status Write(rocksdb::WriteBatch& batch, absl::string_view what, bool sync);

  // Synced whatever sync_commits says: for batches after which files are removed (GC), whose loss
  // in a power failure would bring back locations naming deleted packs.
  absl::Status WriteDurably(rocksdb::WriteBatch& batch, absl::string_view what);

  // ---- The change log (internal/rocksdb_store_core_changes.cc; change_log.h says why).
  //
  // With a log attached, every acknowledged write (Write with sync, WriteDurably) is first
  // created in the log as the next record and then applied here, under change_mu_, so the log's
  // order is the index's. Unacknowledged writes (an upload's own records, sync=false) stay local:
  // an upload in flight is lost with its host and retried by its client.

  // Called once by Open, before the audit log and history are loaded. Applies the records this
  // index has not (every record, into an empty index: the rebuild from a bucket or a lost
  // directory), or, for an index that never had a log, records the whole index as record 1.
  // DATA_LOSS when the index has applied records the log no longer holds;
  // FAILED_PRECONDITION when a non-empty index without a log meets a non-empty log (two stores).
  absl::Status AttachChangeLog(std::unique_ptr<ChangeLog> log);
  // Null when the store keeps no log (StoreOptions::keep_change_log false).
  const ChangeLog* change_log() const { return change_log_.get(); }
  // The number of the last record applied to this index.
  int64_t last_change();
  // Applies records other writers appended since (a follower's catch-up); how many. Each
  // applied batch's history is published. FAILED_PRECONDITION on a store that keeps no log.
  absl::StatusOr<int64_t> ApplyNewChanges();

  // Roles (RocksDbCheckpointStore::TakeOverAsWriter / StepDown). A follower refuses every change
  // with UNAVAILABLE naming `writer` (where the writer is, when known).
  bool is_follower();
  void StepDown(std::string writer);
  // Catches up with the log and creates a takeover record after its last one (retrying while
  // another writer still appends), which fences every earlier writer; then takes changes.
  absl::Status TakeOver();
  // The error a follower answers changes with.
  absl::Status FollowerRefusal(absl::string_view what) ABSL_EXCLUSIVE_LOCKS_REQUIRED(change_mu_);

  // ---- Records (internal/rocksdb_store_core_records.cc).

  absl::StatusOr<std::optional<rocksdb_store_internal::ModelRecord>> ReadModel(
      absl::string_view model, const rocksdb::Snapshot* snapshot) const;

  // A deleted model's record (ModelRecord.deleted) is returned like any other: its version counter
  // still counts. ReadExistingModel and ReadAllModels leave deleted models out.
  absl::StatusOr<rocksdb_store_internal::ModelRecord> ReadExistingModel(
      absl::string_view model, const rocksdb::Snapshot* snapshot, absl::string_view ref_text) const;

  // The version `ref` names.
  absl::StatusOr<int64_t> ResolveVersion(const v1::VersionRef& ref,
                                         const rocksdb::Snapshot* snapshot) const;

  absl::StatusOr<v1::Manifest> ReadManifest(absl::string_view model, int64_t version,
                                            const rocksdb::Snapshot* snapshot) const;

  // version -> aliases (by name) of `model`.
  absl::StatusOr<std::map<int64_t, std::vector<std::string>>> ReadAliases(
      absl::string_view model, const rocksdb::Snapshot* snapshot) const;

  // The version of `model` committed with idempotency key `key` (CommitOptions), if any.
  absl::StatusOr<std::optional<int64_t>> ReadIdempotentCommit(absl::string_view model,
                                                              absl::string_view key) const;

  // Every (version, manifest) of `model`, oldest first.
  absl::StatusOr<std::vector<std::pair<int64_t, v1::Manifest>>> ReadAllManifests(
      absl::string_view model, const rocksdb::Snapshot* snapshot) const;

  // Every model that is not deleted, by name.
  absl::StatusOr<std::vector<std::pair<std::string, rocksdb_store_internal::ModelRecord>>>
  ReadAllModels(const rocksdb::Snapshot* snapshot) const;

  // `model`'s ModelInfo: counts, details and aliases as `snapshot` sees them.
  absl::StatusOr<v1::ModelInfo> BuildModelInfo(const std::string& model,
                                               const rocksdb_store_internal::ModelRecord& record,
                                               const rocksdb::Snapshot* snapshot) const;

  // Adds the removal of `manifest`'s version of `model` to `batch` -- its manifest, annotations
  // and the aliases `pointing` at it -- and its chunk references to `deltas` (which the caller
  // applies once, with ApplyRefDeltas, for all the versions of one batch), and takes its counts
  // out of `record`. `record.latest_version` is the caller's to fix.
  void StageVersionDelete(absl::string_view model, const v1::Manifest& manifest,
                          const std::vector<std::string>& pointing,
                          rocksdb_store_internal::ModelRecord& record,
                          rocksdb_store_internal::RefDeltas& deltas,
                          rocksdb::WriteBatch& batch) const;

  // Newest version of `model` other than those in `excluded`; 0 if none.
  absl::StatusOr<int64_t> NewestVersionExcept(absl::string_view model,
                                              const std::set<int64_t>& excluded) const;

  // Applies summed refcount changes to `batch`. Adds to `*released_bytes` the bytes of chunks
  // whose count reaches zero and to `*new_bytes` those of chunks counted for the first time.
  absl::Status ApplyRefDeltas(const rocksdb_store_internal::RefDeltas& deltas,
                              rocksdb::WriteBatch& batch, int64_t* released_bytes,
                              int64_t* new_bytes) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // ---- Chunks (internal/rocksdb_store_core_chunks.cc).

  // Reads chunk `chunk` into `destination` (chunk.length() bytes) from its pack, or from the
  // `chunks` column family for schema-1 data. NOT_FOUND when the store holds neither; DATA_LOSS
  // when the stored length disagrees. Checks nothing else: callers verify the xxh3.
  absl::Status ReadChunkInto(const v1::ChunkRef& chunk, const rocksdb::Snapshot* snapshot,
                             char* destination) const;

  // Where `chunk` lives in a pack; nullopt for a schema-1 inline chunk or a missing one.
  absl::StatusOr<std::optional<PackLocation>> FindPackLocation(
      const v1::ChunkRef& chunk, const rocksdb::Snapshot* snapshot) const;

  static std::string ChunkName(const v1::TensorMeta& meta, const v1::ChunkRef& chunk,
                               int64_t offset, absl::string_view where);

  static absl::Status CheckChunkBytes(const v1::TensorMeta& meta, const v1::ChunkRef& chunk,
                                      int64_t offset, absl::string_view where,
                                      absl::string_view bytes);

  // Reads every chunk of `meta` into `destination` (byte_length bytes), checking each one's
  // length and location and, with `check_xxh3`, its checksum (see
  // VersionReader::ReadTensorIntoForCheckingReceiver for who may skip that).
  absl::Status ReadTensorInto(const v1::TensorMeta& meta, char* destination,
                              const rocksdb::Snapshot* snapshot, absl::string_view where,
                              bool check_xxh3 = true) const;

  // Maps `meta`'s bytes in place when its chunks lie back to back in one pack (how an upload
  // writes a tensor it did not deduplicate), checking every chunk; data is null when they do not,
  // or when `mappings` already handed out any of these bytes (a deduplicated twin, or a chunk
  // inside another tensor's run: two tensors must not share memory, or a write to one would show
  // in the other).
  absl::StatusOr<VersionReader::MappedBytes> MapTensor(const v1::TensorMeta& meta,
                                                       const rocksdb::Snapshot* snapshot,
                                                       absl::string_view where,
                                                       PackMappings& mappings) const;

  static absl::Status ChunkReadError(const v1::TensorMeta& meta, const v1::ChunkRef& chunk,
                                     int64_t offset, absl::string_view where,
                                     const absl::Status& status);

  // Streams the chunks of `meta`, checking each. `where` names the version for messages.
  absl::Status ReadChunks(const v1::TensorMeta& meta, const ChunkCallback& callback,
                          const rocksdb::Snapshot* snapshot, absl::string_view where) const;

  // Re-reads one chunk and re-hashes it; "" when it is sound, else what is wrong.
  std::string CheckChunk(const v1::ChunkRef& chunk, const rocksdb::Snapshot* snapshot) const;

  // Pins `digest` for an upload (GC leaves it alone) and stores the chunk unless the store already
  // holds it committed or this upload wrote it.
  // New chunks are appended to `pack` (the upload's own pack file); `written` maps each chunk the
  // upload stored to its location, which Commit records in its synced batch.
  // The upload record of each stored chunk goes into `records`, which the session writes in
  // batches (kUploadRecordBatch).
  absl::Status PinAndStoreChunk(absl::string_view upload_id, const ChunkDigest& digest,
                                absl::string_view bytes, int64_t alignment, ChunkWriter& pack,
                                absl::flat_hash_set<std::string>& pinned,
                                absl::flat_hash_map<std::string, PackLocation>& written,
                                rocksdb::WriteBatch& records);

  // Pins the committed chunk `sha256` for an upload that references it without its bytes
  // (UploadSession::AddStoredChunk) and returns its digest from the chunk's record. NOT_FOUND when
  // the store holds no committed chunk of that address. The pin stays either way (released with
  // the upload's others): GC may not take the chunk between this look-up and the commit.
  absl::StatusOr<ChunkDigest> PinStoredChunk(absl::string_view sha256,
                                             absl::flat_hash_set<std::string>& pinned);

  // ---- Pack space (internal/rocksdb_store_core_packs.cc).

  // What ReclaimPacks did not do, for GarbageCollectResponse.
  struct ReclaimOutcome {
    int64_t removals_failed = 0;  // aborts, removals, deletions and compactions that failed.
    int64_t unknown_age = 0;      // packs and pending writes without a time: kept.
  };

  // Removes packs that no committed location names, except the packs of uploads in `writing`
  // (live, or abandoned within the grace period) and packs the backend saw written after
  // `cutoff` (PackInfo::last_modified), aborts the backend's pending writes (an S3 multipart
  // upload a killed store left) that are not in `writing` and started before `cutoff`, and
  // rewrites packs whose live chunks fill less than kCompactPackBelowLiveFraction of them.
  //
  // Called with gc_mu() held (one pass at a time) and WITHOUT mu_: listing a bucket, aborting
  // uploads, deleting objects and uploading compacted packs are network round trips that commits
  // must not wait for. Only the decisions take mu_, and they are made there against the state
  // of that moment, never against the listing's: a pack is removed only if, under mu_, no chunk
  // location names it and it is no live upload's pack. That stays true after mu_ is released,
  // because a commit only ever records locations in its own upload's pack (live until the commit
  // ends, under mu_) and only GC (serialized by gc_mu()) writes other packs. So a pack that a
  // commit landing during the listing names is seen named, and kept.
  //
  // A pack or pending write whose time the backend does not know (an S3 listing entry without
  // LastModified or Initiated) counts as young: kept, and counted in `unknown_age`. One failed
  // abort, removal, deletion or compaction is logged, counted, and the pass goes on; a later
  // pass retries it.
  absl::StatusOr<ReclaimOutcome> ReclaimPacks(absl::flat_hash_set<uint64_t> writing,
                                              absl::Time cutoff) ABSL_LOCKS_EXCLUDED(mu_);

  // Every committed chunk location, by pack, and the live bytes of each pack.
  absl::StatusOr<absl::flat_hash_map<uint64_t, int64_t>> ReadLiveLocations(
      absl::flat_hash_map<uint64_t, std::vector<std::pair<std::string, PackLocation>>>& live)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // Copies the live chunks of pack `pack_id` to a new pack (in their order; a chunk on a 4096- or
  // 64-byte boundary stays on one, so tensors stay mappable, at the price of padding a chunk that
  // sat on a page by chance) and syncs it, outside mu_; then, under mu_, moves the locations that
  // still name the old copy (a commit may have moved a chunk to its own pack meanwhile: that
  // location stands) and removes the old pack, which nothing can name any more.
  absl::Status CompactPack(uint64_t pack_id,
                           std::vector<std::pair<std::string, PackLocation>>& chunks)
      ABSL_LOCKS_EXCLUDED(mu_);

  // Held by GarbageCollect for a whole pass, so that passes never overlap (ReclaimPacks relies on
  // being the only writer of packs other than uploads' own).
  absl::Mutex& gc_mu() { return gc_mu_; }

  // ---- Uploads (internal/rocksdb_store_core.cc; their chunks are pinned by PinAndStoreChunk and
  // PinStoredChunk above).

  // A fresh upload id; its number also names the upload's pack file.
  uint64_t NewUploadNumber();

  void AddLiveUpload(const std::string& upload_id);

  // Ends a live upload: its pins go.
  void EndUploadLocked(const std::string& upload_id, const absl::flat_hash_set<std::string>& pinned)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  void EndUpload(const std::string& upload_id, const absl::flat_hash_set<std::string>& pinned);

  // ---- Parted uploads (CheckpointStore::JoinUpload). Each part is an upload of its own (its own
  // id, record, pack and pins), so an unfinished or orphaned part is reclaimed exactly as any
  // abandoned upload is; a finished part waits here, still live, for its parent's commit.

  // One range of a finished part: its chunks, in order, as a one-writer upload would list them.
  struct FinishedRange {
    UploadRange range;
    std::vector<v1::ChunkRef> chunks;
  };
  struct FinishedPart {
    std::string upload_id;  // the part's own.
    std::vector<FinishedRange> ranges;
    absl::flat_hash_map<std::string, PackLocation> written;  // chunks it stored, and where.
    absl::flat_hash_set<std::string> pinned;
  };

  // Lets writers join a live upload of `header` under `name` (its id, or the name its client chose:
  // CommitOptions::joinable_as); a copy of the header is kept for them. ALREADY_EXISTS when another
  // live upload has that name.
  absl::Status AddJoinableUpload(const std::string& name, const v1::Manifest& header);
  // The header of the upload joinable as `name`; NOT_FOUND when none is live.
  absl::StatusOr<std::shared_ptr<const v1::Manifest>> JoinableHeader(const std::string& name);
  // Hands a finished part to the upload joinable as `name`; FAILED_PRECONDITION (the part left to
  // the caller) when that upload has ended.
  absl::Status AdoptPart(const std::string& name, FinishedPart& part);
  // The parts finished for the upload joinable as `name` so far, removed from here: the caller
  // ends them.
  std::vector<FinishedPart> TakeParts(const std::string& name);
  // The upload joinable as `name` ended: no writer may join it any more, and the parts finished
  // for it and not taken by a commit end as uploads of their own (their records left for GC).
  void EndJoinableLocked(const std::string& name) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void EndJoinable(const std::string& name);

  int64_t LiveUploadCount();

  // ---- Audit log (rocksdb_checkpoint_store_audit.cc).

  // Sequence numbers are handed out, and records written, under `mu`, so the log's key order is
  // the order calls began, and times never go backwards along it.
  struct AuditLog {
    absl::Mutex mu;
    int64_t last_sequence ABSL_GUARDED_BY(mu) = 0;     // of the newest record; 0 when none.
    int64_t last_unix_micros ABSL_GUARDED_BY(mu) = 0;  // ... and its time.
  };
  AuditLog& audit_log() { return audit_log_; }

  // Called once by Open, after LoadAuditLog and LoadHistory (rocksdb_checkpoint_store_audit.cc):
  // no call is in progress yet, so a PENDING record belongs to a call during which the store
  // stopped, or whose outcome could not be written (a full disk). Each gets an outcome from the
  // registry history, which every change appends to in the change's own batch.
  absl::Status ReconcilePendingAudit();

  // Called once by Open: sequence numbers continue after the newest record on disk, so a number
  // is never reused across restarts (or after a crash).
  absl::Status LoadAuditLog();

  // ---- Registry history and annotations (rocksdb_checkpoint_store_history.cc).

  // Gives `event` the next sequence number and the time, and adds it to `batch`, which the
  // caller writes under mu() (so history keys become visible in sequence order, and a watcher
  // that has read up to N never later finds an event below N). After the write succeeds, the
  // caller calls PublishHistory with the returned sequence. An empty identity is "unknown".
  int64_t AppendEvent(rocksdb::WriteBatch& batch, v1::RegistryEvent event,
                      const ChangeAttribution& attribution) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // Wakes WaitForHistory callers: events up to `sequence` are written.
  void PublishHistory(int64_t sequence);

  // True once an event after `after_sequence` is published; false at `deadline`.
  bool AwaitHistory(int64_t after_sequence, absl::Time deadline);

  // Called once by Open: sequence numbers continue after the newest event on disk.
  absl::Status LoadHistory();

  // The sequence of the newest event `snapshot` sees; 0 when none.
  absl::StatusOr<int64_t> LastEventSequence(const rocksdb::Snapshot* snapshot) const;

  // MODEL@version's annotations; empty when it has none.
  absl::StatusOr<v1::VersionAnnotations> ReadAnnotations(absl::string_view model, int64_t version,
                                                         const rocksdb::Snapshot* snapshot) const;

  absl::Mutex& mu() ABSL_LOCK_RETURNED(mu_) { return mu_; }
  const absl::flat_hash_set<std::string>& live_uploads() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return live_uploads_;
  }
  const absl::flat_hash_map<std::string, int>& pinned_chunks() const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return pinned_chunks_;
  }

 private:
  const StoreOptions options_;
  const bool skip_hashing_;
  const std::unique_ptr<StoreDb> store_db_;
  rocksdb::DB* const db_;
  const std::shared_ptr<ChunkBackend> packs_;
  absl::Mutex readers_mu_;
  int64_t next_reader_id_ ABSL_GUARDED_BY(readers_mu_) = 0;
  // Registered reader -> the latest sequence number when it registered.
  std::map<int64_t, uint64_t> readers_ ABSL_GUARDED_BY(readers_mu_);
  uint64_t upload_id_base_ = 0;
  std::atomic<uint64_t> next_upload_serial_{0};

  // Serializes every read-modify-write of metadata: commits, alias moves, deletes, retention, GC.
  absl::Mutex mu_;
  absl::flat_hash_set<std::string> live_uploads_ ABSL_GUARDED_BY(mu_);
  // Uploads that writers may join: their headers and the parts finished for them.
  struct Joinable {
    std::shared_ptr<const v1::Manifest> header;
    std::vector<FinishedPart> parts;
  };
  absl::flat_hash_map<std::string, Joinable> joinable_ ABSL_GUARDED_BY(mu_);
  int64_t history_last_sequence_ ABSL_GUARDED_BY(mu_) = 0;     // newest event handed out.
  int64_t history_last_unix_micros_ ABSL_GUARDED_BY(mu_) = 0;  // ... and its time.
  absl::Mutex history_visible_mu_;
  int64_t history_visible_sequence_ ABSL_GUARDED_BY(history_visible_mu_) = 0;  // newest written.
  // Chunk -> number of live uploads that stored it or rely on it being present.
  absl::flat_hash_map<std::string, int> pinned_chunks_ ABSL_GUARDED_BY(mu_);

  AuditLog audit_log_;
  absl::Mutex gc_mu_;  // ordered before mu_.

  // The change log (internal/rocksdb_store_core_changes.cc).
  absl::Status LogAndWrite(rocksdb::WriteBatch& batch, absl::string_view what)
      ABSL_LOCKS_EXCLUDED(change_mu_);
  // Applies `changes` (in order, after last_change_) to the index; `sync` once at the end.
  absl::Status ApplyChanges(const std::vector<LoggedChange>& changes, bool sync)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(change_mu_);
  // Applies every record after last_change_; how many.
  absl::StatusOr<int64_t> CatchUpLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(change_mu_);
  // After an append whose outcome is unknown: reads what the log holds after last_change_ and
  // applies it if it is this writer's, or fences this writer if it is another's.
  absl::Status ResolveChangeTail() ABSL_EXCLUSIVE_LOCKS_REQUIRED(change_mu_);
  absl::Status Fence(int64_t sequence, absl::string_view why) ABSL_EXCLUSIVE_LOCKS_REQUIRED(change_mu_);
  // `record` numbered `sequence`, signed with this writer and the time, framed for the log.
  std::string StampedFrame(store::ChangeRecord& record, int64_t sequence,
                           absl::string_view what) const;
  // A record of the whole index as `at` sees it, numbered `sequence`: the first record of an
  // index that kept no log, or a snapshot of the log (ChangeLog::PutSnapshot).
  absl::StatusOr<std::string> SnapshotRecord(const rocksdb::Snapshot* at, int64_t sequence,
                                             absl::string_view what) const;
  // After change `sequence` was written: starts writing a snapshot of the index as of it, in the
  // background, when StoreOptions::change_log_snapshot_every changes passed since the last.
  void MaybeStartSnapshot(int64_t sequence) ABSL_EXCLUSIVE_LOCKS_REQUIRED(change_mu_);
  // Loads snapshot `sequence` into an empty index (a rebuild), after checking that the log
  // holds the record it names.
  absl::Status LoadSnapshot(int64_t sequence) ABSL_EXCLUSIVE_LOCKS_REQUIRED(change_mu_);
  absl::StatusOr<store::ChangeRecord> RecordFromBatch(rocksdb::WriteBatch& batch) const;
  absl::Status BatchFromRecord(const store::ChangeRecord& record, rocksdb::WriteBatch& batch) const;

  std::unique_ptr<ChangeLog> change_log_;
  const std::string writer_id_;  // host:pid:random, in every record this process writes.
  // Ordered after mu_ and the audit log's mutex (writes happen under them).
  absl::Mutex change_mu_;
  int64_t last_change_ ABSL_GUARDED_BY(change_mu_) = 0;
  bool change_tail_unknown_ ABSL_GUARDED_BY(change_mu_) = false;
  absl::Status fenced_ ABSL_GUARDED_BY(change_mu_);
  // A batch in the log whose write to the index failed (a full disk): applied before the next.
  std::optional<rocksdb::WriteBatch> unapplied_ ABSL_GUARDED_BY(change_mu_);
  bool follower_ ABSL_GUARDED_BY(change_mu_) = false;
  std::string writer_address_ ABSL_GUARDED_BY(change_mu_);  // where followers send changes.
  int64_t last_snapshot_ ABSL_GUARDED_BY(change_mu_) = 0;   // the newest snapshot's number.
  bool snapshot_running_ ABSL_GUARDED_BY(change_mu_) = false;
  std::thread snapshot_thread_;  // started and joined under change_mu_, and by ~Core.
};

}  // namespace ckpt

#endif  // CKPT_LIBS_STORE_INTERNAL_ROCKSDB_STORE_CORE_H_

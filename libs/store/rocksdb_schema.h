#ifndef CKPT_LIBS_STORE_ROCKSDB_SCHEMA_H_
#define CKPT_LIBS_STORE_ROCKSDB_SCHEMA_H_

// The checkpoint store's RocksDB layout: column families, key encodings and options.
//
//   column family  key                                     value
//   -------------  --------------------------------------  --------------------------------------
//   default        "schema_version"                        "1"
//   models         MODEL                                   store.ModelRecord
//   versions       MODEL '\0' uint64 big-endian VERSION    v1.Manifest (with chunks, hashes)
//   aliases        MODEL '\0' ALIAS                        uint64 big-endian VERSION
//   chunks         SHA-256 (32 raw bytes)                  the chunk's bytes (schema 1 only)
//   packed_chunks  SHA-256 (32 raw bytes)                  store.PackedChunk (pack, offset)
//   refs           SHA-256 (32 raw bytes)                  store.ChunkRecord (refcount, length,
//                                                          xxh3)
//   uploads        UPLOAD_ID (16 hex digits)               store.UploadRecord
//   uploads        UPLOAD_ID SHA-256                       uint64 big-endian chunk length
//   audit          uint64 big-endian SEQUENCE              v1.AuditRecord (who changed what)
//   history        uint64 big-endian SEQUENCE              v1.RegistryEvent (each change made)
//   annotations    MODEL '\0' uint64 big-endian VERSION    v1.VersionAnnotations
//
// '\0' cannot occur in model names (version_ref.h), so "a\0..." and "ab\0..." never interleave,
// and big-endian versions iterate in numeric order, so the newest version of a model is the last
// key with its prefix. Chunk bytes live in pack files (chunk_pack.h) under <db>/packs; stores
// written by schema 1 kept them as values of `chunks`, which are still read. Chunks live apart from
// their refcounts so that counting, GC scans and existence checks touch only the small `refs`
// records, never multi-MB values.
//
// Example (what a test does to corrupt a chunk on purpose):
//   ASSIGN_OR_RETURN(std::unique_ptr<StoreDb> db, StoreDb::Open(path,
//   /*create_if_missing=*/false)); db->db()->Get(rocksdb::ReadOptions(),
//   db->cf(ColumnFamily::kPackedChunks), sha256, &location);
//   // ... then overwrite bytes of that pack file.

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "rocksdb/db.h"
#include "rocksdb/env.h"
#include "rocksdb/file_system.h"
#include "rocksdb/options.h"

namespace ckpt {

enum class ColumnFamily : int {
  kDefault = 0,
  kModels,
  kVersions,
  kAliases,
  kChunks,
  kRefs,
  kUploads,
  kPackedChunks,
  // Added without a schema version change: RocksDB creates it when a store written before it is
  // opened (create_missing_column_families). Builds from before it refuse to open a store that
  // has it ("column families not opened: audit") rather than silently ignore its records.
  kAudit,
  // Added the same way: the registry's history (events written in the batch of their change) and
  // the annotations of versions (keyed like `versions`).
  kHistory,
  kAnnotations,
};
inline constexpr int kColumnFamilyCount = 11;

// RocksDB's name for `cf` ("default", "models", ...).
absl::string_view ColumnFamilyName(ColumnFamily cf);

// The on-disk schema version this build reads and writes, stored under "schema_version" in the
// default column family.
inline constexpr absl::string_view kSchemaVersionKey = "schema_version";
// Version 1 stores (chunk bytes inline in `chunks`) are upgraded in place on open: their chunks
// stay readable where they are.
inline constexpr absl::string_view kSchemaVersion = "2";
inline constexpr absl::string_view kSchemaVersionInlineChunks = "1";

// The number of the last acknowledged write, kept in the default column family by every
// acknowledged write's own batch (StoreDb::WriteAcknowledged). Absent in stores from before it.
inline constexpr absl::string_view kAcknowledgedWriteKey = "acknowledged_write";
// Every audit record up to this sequence (8 bytes, big-endian) is finished: Open's reconciliation
// of PENDING records (rocksdb_checkpoint_store_audit.cc) starts after it. Written unsynced: a
// lost update only means scanning again.
inline constexpr absl::string_view kAuditReconciledThroughKey = "audit_reconciled_through";
// The number of the last change-log record (change_log.h) this index has applied, 8 bytes
// big-endian, written in the batch of that record's change. Absent in an index that never had a
// change log (or an empty one that is to be rebuilt from its log).
inline constexpr absl::string_view kChangeLogAppliedKey = "change_log_applied";
// The file beside the database that remembers the same number outside RocksDB.
inline constexpr absl::string_view kAcknowledgedMarkerFile = "CKPT-ACKNOWLEDGED";

// Upload ids are 16 lowercase hex digits.
inline constexpr size_t kUploadIdLength = 16;

// 8 bytes, big-endian, so byte order is numeric order.
std::string EncodeBigEndian64(uint64_t value);
// INVALID_ARGUMENT (DATA_LOSS is the caller's call) unless `bytes` is exactly 8 bytes.
absl::StatusOr<uint64_t> DecodeBigEndian64(absl::string_view bytes);

// MODEL '\0': every key of a model in `versions` and `aliases` starts with it.
std::string ModelPrefix(absl::string_view model);
std::string VersionKey(absl::string_view model, int64_t version);
// The version of a `versions` key that starts with ModelPrefix(model); DATA_LOSS otherwise.
absl::StatusOr<int64_t> VersionFromKey(absl::string_view key, absl::string_view model);
std::string AliasKey(absl::string_view model, absl::string_view alias);
// The alias of an `aliases` key that starts with ModelPrefix(model).
absl::string_view AliasFromKey(absl::string_view key, absl::string_view model);
std::string UploadChunkKey(absl::string_view upload_id, absl::string_view sha256);
// In the default column family: "commit_key" '\0' MODEL '\0' KEY -> the version (8 bytes,
// big-endian) committed with CommitOptions::idempotency_key KEY. Written in the commit's batch.
std::string IdempotencyKeyKey(absl::string_view model, absl::string_view idempotency_key);
// Audit records sort by sequence number, so the log reads oldest first and the newest record is
// the last key.
std::string AuditKey(int64_t sequence);
// Registry events sort by sequence number the same way.
std::string HistoryKey(int64_t sequence);

// DB-wide options: 2 background jobs (the build and serving machines have 2 cores), WAL and
// blob-file writeback smoothed with *_bytes_per_sync, memtables capped store-wide.
rocksdb::DBOptions MakeDbOptions(bool create_if_missing);

// Per column family options; see rocksdb_schema.cc for the reasons behind each.
rocksdb::ColumnFamilyOptions MakeColumnFamilyOptions(ColumnFamily cf);

// An open store database: the DB and one handle per column family. Owns both; closes on
// destruction. Thread-safe as rocksdb::DB is.
class StoreDb {
 public:
  // Opens (or with `create_if_missing`, creates) the database at `path` with every column family
  // of the schema. NOT_FOUND when `path` holds no database and !create_if_missing; DATA_LOSS
  // (naming the damage and the remedy) when it holds one whose files are corrupt or missing;
  // FAILED_PRECONDITION when it holds a database of another schema version; other RocksDB
  // errors as FromRocksDbStatus maps them (a second process holding the lock: UNAVAILABLE).
  // `file_system`: the RocksDB file system the database's own files go through (the pack files
  // do not); null for the default one. Tests pass one that records or injects faults.
  static absl::StatusOr<std::unique_ptr<StoreDb>> Open(
      const std::string& path, bool create_if_missing,
      std::shared_ptr<rocksdb::FileSystem> file_system = nullptr);
  ~StoreDb();
  StoreDb(const StoreDb&) = delete;
  StoreDb& operator=(const StoreDb&) = delete;

  rocksdb::DB* db() const { return db_.get(); }
  rocksdb::ColumnFamilyHandle* cf(ColumnFamily cf) const { return handles_[static_cast<int>(cf)]; }
  const std::string& path() const { return path_; }

  // Writes `batch` synced, as a write the store acknowledges, and numbers it: the batch also sets
  // kAcknowledgedWriteKey to the next number, and once the write is durable the number goes to
  // the marker file kAcknowledgedMarkerFile. Open compares the two (and refuses a damaged marker
  // with DATA_LOSS, as it refuses a lost write), which is how a write-ahead
  // log that lost acknowledged writes is told from one that lost only an unacknowledged torn
  // tail: RocksDB cannot tell them apart (a live WAL truncated at a record boundary, or deleted,
  // opens cleanly without its last commits), and the WAL is the only copy of recent commits.
  // The marker is not synced: it only ever holds a number whose batch is already durable, so a
  // power cut can leave it behind the database (a missed detection) but never ahead of it (a
  // false alarm). Acknowledged writes are serialized here (they were, but for the audit log's).
  // A failure to update the marker is reported on stderr and does not fail the write.
  absl::Status WriteAcknowledged(rocksdb::WriteBatch& batch, absl::string_view what);
  // Writes the marker afresh (synced) with the number of the last acknowledged write the
  // database holds: `ckpt repair`, after it checked the marker against the database.
  absl::Status RewriteAcknowledgedMarker();
  // The number of the last acknowledged write the database holds (0 when none).
  uint64_t last_acknowledged() {
    absl::MutexLock lock(&acknowledged_mu_);
    return last_acknowledged_;
  }

 private:
  StoreDb() = default;
  std::string path_;
  // Built over a caller's file system; outlives db_ (declared before it).
  std::unique_ptr<rocksdb::Env> env_;
  std::unique_ptr<rocksdb::DB> db_;
  std::vector<rocksdb::ColumnFamilyHandle*> handles_;
  absl::Mutex acknowledged_mu_;
  uint64_t last_acknowledged_ ABSL_GUARDED_BY(acknowledged_mu_) = 0;
  int marker_fd_ ABSL_GUARDED_BY(acknowledged_mu_) = -1;
};

// What the acknowledged-writes marker of a store says.
struct AcknowledgedMarker {
  // The number of the last acknowledged write, from an intact copy; nullopt when there is no
  // marker (a store from before it, or an empty file: a power cut right after it was created)
  // or no copy is intact.
  std::optional<uint64_t> number;
  // What is wrong with it ("89 bytes, 1 of its 2 checksummed copies intact (#12)", "it cannot be
  // read: ..."); empty when it is intact or absent. The marker is rewritten in place with one
  // pwrite of the same length (one sector), so damage is not what a power cut leaves.
  std::string damage;
};

// Reads the acknowledged-writes marker of the store at `db_path`. Markers of the earlier
// one-line format are read as intact.
AcknowledgedMarker ReadAcknowledgedMarker(const std::string& db_path);

}  // namespace ckpt

#endif  // CKPT_LIBS_STORE_ROCKSDB_SCHEMA_H_

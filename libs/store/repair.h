#ifndef CKPT_LIBS_STORE_REPAIR_H_
#define CKPT_LIBS_STORE_REPAIR_H_

// Repairing an embedded checkpoint store whose RocksDB files are damaged (a missing CURRENT, a
// corrupt MANIFEST, a truncated SST or WAL): the store then refuses to open with DATA_LOSS
// (rocksdb_schema.h), and this is the way back that keeps every intact version.
//
// A store that keeps a change log beside its packs (every store this build creates; see
// RepairOptions::rebuild_from_change_log) is repaired by rebuilding its index from the log,
// which loses nothing that was acknowledged. What follows is the repair of a store without one.
//
// RepairStore copies the database's own files (not the pack files, which it never changes) to a
// backup directory, runs RocksDB's RepairDB (which rebuilds the MANIFEST from the SST files and
// the WAL, skipping what fails its checksums), and then makes the store's records agree with
// the manifests that survived: model records (version counts, latest, sizes) are rebuilt,
// aliases and annotations of versions that are gone are removed, chunk refcounts are recounted.
// Every surviving version is then verified chunk by chunk (re-hashed from its pack file); a
// version with any problem is deleted (its manifest stays in the backup), so what remains reads
// back exactly as it was committed. A version whose manifest RocksDB could not recover is gone
// without a trace in the repaired database; the report counts such versions per model where the
// model's record remembers how many it had.
//
// Not thread-safe against other users of the store: the store must not be open anywhere (the
// RocksDB lock enforces it: UNAVAILABLE).
//
// Example:
//   RepairOptions options;
//   options.db_path = "/data/ckpt";
//   ASSIGN_OR_RETURN(RepairReport report, RepairStore(options));
//   for (const RepairedVersion& v : report.dropped) std::cerr << v.ref << ": " << v.reason;

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "proto/ckpt/v1/checkpoint_store.pb.h"

namespace ckpt {

struct RepairOptions {
  // The store's directory (what --store_dir names). Required.
  std::string db_path;
  // Where the damaged database files are copied before anything is changed; must not exist.
  // Empty (the default): "<db_path>.before-repair-<UTC time>" beside the store.
  std::string backup_dir;
  // A store with a change log beside its packs (<db_path>/changes, change_log.h) is repaired by
  // rebuilding its index from the log: the database files go to backup_dir and every change is
  // replayed, so nothing acknowledged is lost and no version is dropped unless its chunks fail
  // verification. False: RocksDB's RepairDB as for a store without a log (below). Default true.
  bool rebuild_from_change_log = true;
};

// A version the repair kept or dropped.
struct RepairedVersion {
  std::string ref;     // "MODEL@VERSION"
  std::string reason;  // why it was dropped; empty for kept versions.
};

struct RepairReport {
  std::string backup_dir;
  std::vector<std::string> backed_up;  // file names copied to backup_dir.
  // Every version present after the repair; each passed its verification.
  std::vector<RepairedVersion> intact;
  // Versions whose manifest was recovered but unusable (unreadable, or chunks missing or
  // failing their hashes); deleted by the repair.
  std::vector<RepairedVersion> dropped;
  // Versions the model records counted before the repair but whose manifests RocksDB could not
  // recover, summed over models (0 when no record told).
  int64_t versions_unrecovered = 0;
  // Acknowledged writes (commits, deletions, alias and registry changes, audit records) that
  // the write-ahead log lost: the number in the store's marker (rocksdb_schema.h,
  // StoreDb::WriteAcknowledged) minus the last one the repaired database holds. What they did is
  // gone (a version they committed is not listed, a version they deleted may be back); 0 when
  // nothing was lost or the store kept no marker.
  uint64_t acknowledged_writes_lost = 0;
  // What else was changed to make the records agree (rebuilt model records, removed aliases,
  // recounted refcounts), one line each.
  std::vector<std::string> notes;
  // The whole-store verification after the repair; problems_size() is 0 on success.
  v1::VerifyResponse verify;
};

// Repairs the store at options.db_path as described above. INVALID_ARGUMENT for an empty
// db_path; NOT_FOUND when it holds no database files; ALREADY_EXISTS when backup_dir exists;
// UNAVAILABLE when the store is open in another process; DATA_LOSS when RocksDB's repair or
// the reopened store still fails. The backup is made before any change, so an error after it
// leaves the damaged files in backup_dir.
absl::StatusOr<RepairReport> RepairStore(const RepairOptions& options);

}  // namespace ckpt

#endif  // CKPT_LIBS_STORE_REPAIR_H_

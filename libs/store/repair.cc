#include "libs/store/repair.h"

#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <system_error>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/string_view.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "libs/status/rocksdb_status.h"
#include "libs/status/status_macros.h"
#include "libs/store/change_log_directory.h"
#include "libs/store/rocksdb_checkpoint_store.h"
#include "libs/store/rocksdb_schema.h"
#include "libs/store/store_records.pb.h"
#include "libs/store/version_ref.h"
#include "rocksdb/db.h"
#include "rocksdb/env.h"
#include "rocksdb/sst_file_writer.h"
#include "rocksdb/write_batch.h"

namespace ckpt {
namespace {

namespace fs = std::filesystem;

// Sorts after every key the store writes (model names, hex ids, big-endian numbers, SHA-256s
// would need 16 leading 0xff bytes).
constexpr absl::string_view kColumnFamilyMarkerKey =
    "\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff"
    "ckpt-repair-column-family";

absl::string_view View(const rocksdb::Slice& slice) {
  return absl::string_view(slice.data(), slice.size());
}

int64_t LogicalBytes(const v1::Manifest& manifest) {
  int64_t total = 0;
  for (const v1::TensorMeta& meta : manifest.tensors()) total += meta.byte_length();
  for (const v1::TensorMeta& meta : manifest.state_tensors()) total += meta.byte_length();
  return total;
}

// MODEL '\0' VERSION (rocksdb_schema.h) split into its parts; nullopt for a malformed key.
std::optional<std::pair<std::string, int64_t>> SplitVersionKey(absl::string_view key) {
  const size_t zero = key.find('\0');
  if (zero == absl::string_view::npos || zero == 0) return std::nullopt;
  absl::StatusOr<uint64_t> version = DecodeBigEndian64(key.substr(zero + 1));
  if (!version.ok() || *version == 0 || *version > static_cast<uint64_t>(INT64_MAX)) {
    return std::nullopt;
  }
  return std::make_pair(std::string(key.substr(0, zero)), static_cast<int64_t>(*version));
}

std::string DefaultBackupDir(const std::string& db_path) {
  std::string path = db_path;
  while (path.size() > 1 && path.back() == '/') path.pop_back();
  return absl::StrCat(path, ".before-repair-",
                      absl::FormatTime("%Y%m%dT%H%M%SZ", absl::Now(), absl::UTCTimeZone()));
}

// Copies the database's own files (every regular file at the top of `db_path`: SSTs, WAL,
// MANIFEST, CURRENT, OPTIONS, logs) to `backup_dir`. The pack files under packs/ are left where
// they are: nothing in the repair writes them.
absl::StatusOr<std::vector<std::string>> BackUp(const std::string& db_path,
                                                const std::string& backup_dir) {
  std::error_code error;
  if (fs::exists(backup_dir, error)) {
    return absl::AlreadyExistsError(
        absl::StrCat("the repair's backup directory '", backup_dir, "' exists already"));
  }
  if (!fs::create_directories(backup_dir, error)) {
    return absl::InternalError(absl::StrCat("creating the repair's backup directory '", backup_dir,
                                            "': ", error.message()));
  }
  std::vector<std::string> copied;
  for (const fs::directory_entry& entry : fs::directory_iterator(db_path, error)) {
    if (!entry.is_regular_file(error)) continue;
    const std::string name = entry.path().filename().string();
    if (name == "LOCK") continue;
    if (!fs::copy_file(entry.path(), fs::path(backup_dir) / name, error)) {
      return absl::InternalError(absl::StrCat("backing up '", entry.path().string(), "' to '",
                                              backup_dir, "': ", error.message()));
    }
    copied.push_back(name);
  }
  if (error) {
    return absl::InternalError(absl::StrCat("listing '", db_path, "': ", error.message()));
  }
  std::sort(copied.begin(), copied.end());
  return copied;
}

// Fails with UNAVAILABLE while another process has the store open, before anything is copied.
absl::Status CheckNotOpen(const std::string& db_path) {
  rocksdb::Env* env = rocksdb::Env::Default();
  rocksdb::FileLock* lock = nullptr;
  rocksdb::Status locked = env->LockFile(db_path + "/LOCK", &lock);
  if (!locked.ok()) {
    return absl::UnavailableError(absl::StrCat("the store at '", db_path,
                                               "' is in use (stop the process that has it open "
                                               "before repairing it): ",
                                               locked.ToString()));
  }
  return FromRocksDbStatus(env->UnlockFile(lock), "releasing the store's lock");
}

// RepairDB learns column families (their ids and names) only from the properties of SST files,
// and drops every WAL write batch that touches a family it has not learnt: a commit batch that
// also wrote a family never flushed before (the first alias of a store, say) would be lost
// although the log holds it intact. So before RepairDB runs, one small SST per column family --
// a single deletion of a key no record can have, with sequence number 0, so it hides nothing --
// names each family with the id it has in the store. Ids follow the ColumnFamily order: the
// store creates its families in that order, and new ones are only ever appended (rocksdb_schema.h).
// The ids come from a scratch database created the same way.
absl::Status SeedColumnFamilyTables(const std::string& db_path, RepairReport& report) {
  uint64_t next_number = 1;
  std::error_code error;
  for (const fs::directory_entry& entry : fs::directory_iterator(db_path, error)) {
    const std::string name = entry.path().filename().string();
    const std::string digits = name.substr(0, name.find_first_not_of("0123456789"));
    const std::string number_text =
        name.rfind("MANIFEST-", 0) == 0 ? name.substr(9) : (digits.empty() ? "" : digits);
    uint64_t number = 0;
    if (!number_text.empty() && absl::SimpleAtoi(number_text, &number)) {
      next_number = std::max(next_number, number + 1);
    }
  }
  const std::string scratch =
      (fs::temp_directory_path() / absl::StrCat("ckpt-repair-", ::getpid(), "-", next_number))
          .string();
  fs::remove_all(scratch, error);
  struct RemoveScratch {
    std::string path;
    ~RemoveScratch() {
      std::error_code ignored;
      fs::remove_all(path, ignored);
    }
  } remove_scratch{scratch};
  ASSIGN_OR_RETURN(std::unique_ptr<StoreDb> fresh, StoreDb::Open(scratch, true));
  for (int i = 0; i < kColumnFamilyCount; ++i) {
    const ColumnFamily cf = static_cast<ColumnFamily>(i);
    if (fresh->cf(cf)->GetID() != static_cast<uint32_t>(i)) {
      return absl::InternalError(absl::StrCat("column family ", ColumnFamilyName(cf), " has id ",
                                              fresh->cf(cf)->GetID(), " in a new store, not ", i));
    }
    rocksdb::SstFileWriter writer(
        rocksdb::EnvOptions(), rocksdb::Options(MakeDbOptions(false), MakeColumnFamilyOptions(cf)),
        fresh->cf(cf));
    const std::string file = absl::StrFormat("%s/%06d.sst", db_path, next_number++);
    rocksdb::Status written = writer.Open(file);
    if (written.ok())
      written = writer.Delete(
          rocksdb::Slice(kColumnFamilyMarkerKey.data(), kColumnFamilyMarkerKey.size()));
    if (written.ok()) written = writer.Finish();
    RETURN_IF_ERROR(FromRocksDbStatus(written, absl::StrCat("writing ", file)));
  }
  report.notes.push_back(
      absl::StrCat("named the ", kColumnFamilyCount, " column families for RocksDB's repair"));
  return absl::OkStatus();
}

struct ModelState {
  std::optional<store::ModelRecord> record;  // as found; nullopt when absent or unreadable.
  std::map<int64_t, v1::Manifest> manifests;
};

// Makes the records agree with the manifests RocksDB recovered: unreadable manifests go, model
// records are rebuilt from the manifests, aliases and annotations of absent versions go,
// refcounts are recounted. One synced batch.
absl::Status ReconcileRecords(const std::string& db_path, std::optional<uint64_t> marker,
                              RepairReport& report) {
  ASSIGN_OR_RETURN(std::unique_ptr<StoreDb> db, StoreDb::Open(db_path, false));
  if (marker.has_value() && *marker > db->last_acknowledged()) {
    report.acknowledged_writes_lost = *marker - db->last_acknowledged();
    report.notes.push_back(absl::StrCat(
        "the write-ahead log lost acknowledged writes #", db->last_acknowledged() + 1, " to #",
        *marker, ": the commits, deletions and alias changes among them are gone"));
  }
  rocksdb::ReadOptions read;
  read.verify_checksums = true;
  rocksdb::WriteBatch batch;
  std::map<std::string, ModelState> models;

  {
    std::unique_ptr<rocksdb::Iterator> it(
        db->db()->NewIterator(read, db->cf(ColumnFamily::kVersions)));
    for (it->SeekToFirst(); it->Valid(); it->Next()) {
      const absl::string_view key = View(it->key());
      std::optional<std::pair<std::string, int64_t>> parts = SplitVersionKey(key);
      v1::Manifest manifest;
      if (!parts.has_value()) {
        report.notes.push_back("removed a manifest under a malformed key");
        batch.Delete(db->cf(ColumnFamily::kVersions), it->key());
        continue;
      }
      const std::string ref = FormatVersionRef(parts->first, parts->second);
      if (!manifest.ParseFromArray(it->value().data(), static_cast<int>(it->value().size())) ||
          manifest.version() != parts->second) {
        report.dropped.push_back({ref, "its manifest is unreadable"});
        batch.Delete(db->cf(ColumnFamily::kVersions), it->key());
        continue;
      }
      models[parts->first].manifests.emplace(parts->second, std::move(manifest));
    }
    RETURN_IF_ERROR(FromRocksDbStatus(it->status(), "reading the recovered manifests"));
  }
  {
    std::unique_ptr<rocksdb::Iterator> it(
        db->db()->NewIterator(read, db->cf(ColumnFamily::kModels)));
    for (it->SeekToFirst(); it->Valid(); it->Next()) {
      store::ModelRecord record;
      ModelState& state = models[it->key().ToString()];
      if (record.ParseFromArray(it->value().data(), static_cast<int>(it->value().size()))) {
        state.record = std::move(record);
      } else {
        report.notes.push_back(
            absl::StrCat("model '", View(it->key()), "': unreadable record, rebuilt"));
      }
    }
    RETURN_IF_ERROR(FromRocksDbStatus(it->status(), "reading the recovered model records"));
  }

  absl::flat_hash_map<std::string, std::pair<int64_t, const v1::ChunkRef*>> references;
  for (auto& [name, state] : models) {
    const bool deleted = state.record.has_value() && state.record->deleted();
    if (deleted) {
      // A deleted model's manifests can only be back because the deletion's records were lost.
      for (const auto& [version, manifest] : state.manifests) {
        report.dropped.push_back({FormatVersionRef(name, version),
                                  "its model was deleted (the deletion's records were lost)"});
        batch.Delete(db->cf(ColumnFamily::kVersions), VersionKey(name, version));
      }
      state.manifests.clear();
      continue;
    }
    store::ModelRecord record = state.record.value_or(store::ModelRecord());
    if (!state.record.has_value()) {
      record.set_created_unix_micros(absl::ToUnixMicros(absl::Now()));
      report.notes.push_back(
          absl::StrCat("model '", name,
                       "': its record was lost and is rebuilt from its manifests (the "
                       "model's details are empty)"));
    }
    const int64_t counted = record.version_count();
    int64_t logical_bytes = 0;
    for (const auto& [version, manifest] : state.manifests) {
      logical_bytes += LogicalBytes(manifest);
      auto count = [&](const v1::TensorMeta& meta) {
        for (const v1::ChunkRef& chunk : meta.chunks()) {
          auto [it, first] = references.try_emplace(chunk.sha256(), 0, &chunk);
          ++it->second.first;
        }
      };
      for (const v1::TensorMeta& meta : manifest.tensors()) count(meta);
      for (const v1::TensorMeta& meta : manifest.state_tensors()) count(meta);
    }
    const int64_t found = static_cast<int64_t>(state.manifests.size());
    if (state.record.has_value() && counted > found) {
      report.versions_unrecovered += counted - found;
      report.notes.push_back(absl::StrCat("model '", name, "': its record counted ", counted,
                                          " versions, ", found, " manifests were recovered"));
    }
    const int64_t latest = state.manifests.empty() ? 0 : state.manifests.rbegin()->first;
    record.set_version_count(found);
    record.set_latest_version(latest);
    record.set_logical_bytes(logical_bytes);
    // Never hand out a number that a recovered (or lost) version had.
    record.set_next_version(std::max<int64_t>(record.next_version(), latest + 1));
    if (!state.record.has_value() ||
        record.SerializeAsString() != state.record->SerializeAsString()) {
      batch.Put(db->cf(ColumnFamily::kModels), name, record.SerializeAsString());
    }
  }

  // Aliases and annotations of versions that are not there.
  for (ColumnFamily cf : {ColumnFamily::kAliases, ColumnFamily::kAnnotations}) {
    std::unique_ptr<rocksdb::Iterator> it(db->db()->NewIterator(read, db->cf(cf)));
    for (it->SeekToFirst(); it->Valid(); it->Next()) {
      const absl::string_view key = View(it->key());
      const size_t zero = key.find('\0');
      const std::string model(key.substr(0, zero == absl::string_view::npos ? 0 : zero));
      int64_t version = 0;
      if (cf == ColumnFamily::kAliases) {
        absl::StatusOr<uint64_t> decoded = DecodeBigEndian64(View(it->value()));
        if (decoded.ok()) version = static_cast<int64_t>(*decoded);
      } else if (std::optional<std::pair<std::string, int64_t>> parts = SplitVersionKey(key)) {
        version = parts->second;
      }
      auto model_it = models.find(model);
      const bool present = zero != absl::string_view::npos && model_it != models.end() &&
                           model_it->second.manifests.count(version) > 0;
      if (present) continue;
      batch.Delete(db->cf(cf), it->key());
      if (cf == ColumnFamily::kAliases) {
        report.notes.push_back(absl::StrCat(
            "removed alias '", model, "@", key.substr(std::min(key.size(), zero + 1)),
            "': it pointed at version ", version, ", which is not in the repaired store"));
      }
    }
    RETURN_IF_ERROR(FromRocksDbStatus(it->status(), "reading the recovered aliases"));
  }

  // Refcounts: exactly the ChunkRefs of the surviving manifests.
  int64_t recounted = 0;
  {
    std::unique_ptr<rocksdb::Iterator> it(db->db()->NewIterator(read, db->cf(ColumnFamily::kRefs)));
    for (it->SeekToFirst(); it->Valid(); it->Next()) {
      const std::string sha256 = it->key().ToString();
      store::ChunkRecord record;
      const bool readable =
          record.ParseFromArray(it->value().data(), static_cast<int>(it->value().size()));
      auto found = references.find(sha256);
      const int64_t expected = found == references.end() ? 0 : found->second.first;
      if (found != references.end()) {
        record.set_length(found->second.second->length());
        record.set_xxh3_64(found->second.second->xxh3_64());
        references.erase(found);
      }
      if (readable && record.refcount() == expected) continue;
      if (!readable && expected == 0) {
        // Nothing names it: the record goes, and with it GC's only claim on the bytes.
        batch.Delete(db->cf(ColumnFamily::kRefs), sha256);
        ++recounted;
        continue;
      }
      record.set_refcount(expected);
      batch.Put(db->cf(ColumnFamily::kRefs), sha256, record.SerializeAsString());
      ++recounted;
    }
    RETURN_IF_ERROR(FromRocksDbStatus(it->status(), "reading the recovered refcounts"));
  }
  for (const auto& [sha256, count] : references) {
    store::ChunkRecord record;
    record.set_refcount(count.first);
    record.set_length(count.second->length());
    record.set_xxh3_64(count.second->xxh3_64());
    record.set_created_unix_micros(absl::ToUnixMicros(absl::Now()));
    batch.Put(db->cf(ColumnFamily::kRefs), sha256, record.SerializeAsString());
    ++recounted;
  }
  if (recounted > 0) {
    report.notes.push_back(absl::StrCat("recounted the references of ", recounted, " chunks"));
  }
  rocksdb::WriteOptions write;
  write.sync = true;
  RETURN_IF_ERROR(
      FromRocksDbStatus(db->db()->Write(write, &batch), "writing the repaired records"));
  // The database is what survives now: the marker says so again (the old one, damaged or ahead
  // of the database, is in the backup and in the notes above).
  return db->RewriteAcknowledgedMarker();
}

// Verifies every version of the opened `store` chunk by chunk, deletes those with any problem
// (reported in report.dropped), and verifies the whole store into report.verify.
absl::Status VerifyEveryVersion(RocksDbCheckpointStore& store, RepairReport& report) {
    const ChangeAttribution attribution{"ckpt repair", "damaged: dropped by the store repair"};
  ASSIGN_OR_RETURN(std::vector<v1::ModelInfo> models, store.ListModels());
  for (const v1::ModelInfo& model : models) {
    ASSIGN_OR_RETURN(std::vector<v1::VersionInfo> versions, store.ListVersions(model.name()));
    for (const v1::VersionInfo& info : versions) {
      const std::string ref = FormatVersionRef(model.name(), info.version());
      absl::StatusOr<v1::VerifyResponse> verified = store.Verify(model.name(), info.version());
      std::string reason;
      if (!verified.ok()) {
        reason = std::string(verified.status().message());
      } else if (verified->problems_size() > 0) {
        reason = verified->problems(0).message();
        if (verified->problems_size() > 1) {
          absl::StrAppend(&reason, " (and ", verified->problems_size() - 1, " more problems)");
        }
      }
      if (reason.empty()) {
        report.intact.push_back({ref, ""});
        continue;
      }
      RETURN_IF_ERROR(
          store.DeleteVersion(model.name(), info.version(), /*force=*/true, attribution).status());
      report.dropped.push_back({ref, reason});
    }
  }
  ASSIGN_OR_RETURN(report.verify, store.Verify("", 0));
  return absl::OkStatus();
}

// The number of records in the change log beside the packs (<db_path>/changes); 0 when there
// is none.
absl::StatusOr<int64_t> LoggedChanges(const std::string& db_path) {
  const std::string dir = absl::StrCat(db_path, "/changes");
  std::error_code error;
  if (!fs::is_directory(dir, error)) return 0;
  ASSIGN_OR_RETURN(std::unique_ptr<DirectoryChangeLog> log, DirectoryChangeLog::Open(dir));
  return log->last_sequence();
}

// The index is a cache of the change log: the damaged database files go to the backup (copied,
// then removed), and the store opened on the emptied directory replays every record. Nothing is
// dropped unless its chunks fail verification.
absl::StatusOr<RepairReport> RebuildFromChangeLog(const std::string& db_path,
                                                  int64_t logged_changes, RepairReport& report) {
  ASSIGN_OR_RETURN(report.backed_up, BackUp(db_path, report.backup_dir));
  for (const std::string& name : report.backed_up) {
    std::error_code error;
    fs::remove(fs::path(db_path) / name, error);
    if (error) {
      return absl::InternalError(absl::StrCat("removing the damaged '", name, "' from '", db_path,
                                              "' (a copy is in ", report.backup_dir,
                                              "): ", error.message()));
    }
  }
  report.notes.push_back(absl::StrCat("rebuilt the index from its change log (", logged_changes,
                                      " changes in ", db_path, "/changes); the damaged database "
                                      "files are in ", report.backup_dir));
  StoreOptions store_options;
  store_options.db_path = db_path;
  ASSIGN_OR_RETURN(std::unique_ptr<RocksDbCheckpointStore> store,
                   RocksDbCheckpointStore::Open(store_options));
  RETURN_IF_ERROR(VerifyEveryVersion(*store, report));
  return report;
}

}  // namespace

absl::StatusOr<RepairReport> RepairStore(const RepairOptions& options) {
  if (options.db_path.empty()) return absl::InvalidArgumentError("RepairOptions.db_path is empty");
  std::error_code error;
  if (!fs::is_directory(options.db_path, error)) {
    return absl::NotFoundError(absl::StrCat("no checkpoint store at '", options.db_path, "'"));
  }
  bool has_database_files = false;
  for (const fs::directory_entry& entry : fs::directory_iterator(options.db_path, error)) {
    const std::string name = entry.path().filename().string();
    if (name == "CURRENT" || name.rfind("MANIFEST-", 0) == 0 ||
        (name.size() > 4 &&
         (name.substr(name.size() - 4) == ".sst" || name.substr(name.size() - 4) == ".log"))) {
      has_database_files = true;
    }
  }
  if (!has_database_files) {
    return absl::NotFoundError(absl::StrCat("'", options.db_path,
                                            "' holds no checkpoint store database files "
                                            "(CURRENT, MANIFEST-*, *.sst, *.log)"));
  }
  RETURN_IF_ERROR(CheckNotOpen(options.db_path));

  RepairReport report;
  report.backup_dir =
      options.backup_dir.empty() ? DefaultBackupDir(options.db_path) : options.backup_dir;
  ASSIGN_OR_RETURN(const int64_t logged_changes, LoggedChanges(options.db_path));
  if (logged_changes > 0 && options.rebuild_from_change_log) {
    return RebuildFromChangeLog(options.db_path, logged_changes, report);
  }
  ASSIGN_OR_RETURN(report.backed_up, BackUp(options.db_path, report.backup_dir));

  std::vector<rocksdb::ColumnFamilyDescriptor> descriptors;
  for (int i = 0; i < kColumnFamilyCount; ++i) {
    const ColumnFamily cf = static_cast<ColumnFamily>(i);
    descriptors.emplace_back(std::string(ColumnFamilyName(cf)), MakeColumnFamilyOptions(cf));
  }
  // The marker would refuse the repaired database (its number is beyond what the WAL kept, or
  // it is damaged); it is in the backup, and ReconcileRecords writes a new one.
  const AcknowledgedMarker marker = ReadAcknowledgedMarker(options.db_path);
  if (!marker.damage.empty()) {
    report.notes.push_back(absl::StrCat("the acknowledged-writes marker was damaged (",
                                        marker.damage, "); it was rebuilt from the database"));
  }
  std::error_code removed;
  fs::remove(fs::path(options.db_path) / std::string(kAcknowledgedMarkerFile), removed);
  if (removed) {
    return absl::InternalError(absl::StrCat("removing ", kAcknowledgedMarkerFile, " from '",
                                            options.db_path, "': ", removed.message()));
  }
  RETURN_IF_ERROR(SeedColumnFamilyTables(options.db_path, report));
  const rocksdb::Status repaired =
      rocksdb::RepairDB(options.db_path, MakeDbOptions(/*create_if_missing=*/false), descriptors);
  if (!repaired.ok()) {
    return absl::DataLossError(absl::StrCat("RocksDB could not repair '", options.db_path,
                                            "': ", repaired.ToString(),
                                            "; the damaged files are in ", report.backup_dir));
  }
  RETURN_IF_ERROR(ReconcileRecords(options.db_path, marker.number, report));

  StoreOptions store_options;
  store_options.db_path = options.db_path;
  store_options.create_if_missing = false;
  // A store that kept no log gets one at its next ordinary open; the repair changes only what
  // it reports.
  store_options.keep_change_log = logged_changes > 0;
  ASSIGN_OR_RETURN(std::unique_ptr<RocksDbCheckpointStore> store,
                   RocksDbCheckpointStore::Open(store_options));
  RETURN_IF_ERROR(VerifyEveryVersion(*store, report));
  return report;
}

}  // namespace ckpt

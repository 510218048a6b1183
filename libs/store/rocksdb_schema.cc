#include "libs/store/rocksdb_schema.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdarg>
#include <cstdio>
#include <cstring>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "libs/status/rocksdb_status.h"
#include "rocksdb/convenience.h"
#include "rocksdb/filter_policy.h"
#include "rocksdb/table.h"
#include "xxhash.h"

namespace ckpt {
namespace {

constexpr absl::string_view kColumnFamilyNames[kColumnFamilyCount] = {
    "default", "models",        "versions", "aliases", "chunks",      "refs",
    "uploads", "packed_chunks", "audit",    "history", "annotations",
};

constexpr uint64_t kKiB = 1024;
constexpr uint64_t kMiB = 1024 * kKiB;

bool ZstdSupported() {
  const std::vector<rocksdb::CompressionType> supported = rocksdb::GetSupportedCompressions();
  return std::find(supported.begin(), supported.end(), rocksdb::kZSTD) != supported.end();
}

// Point lookups by SHA-256 (does this chunk exist?) dominate `refs`: a bloom filter answers
// "absent" without reading a block. Random hashes do not compress; leave compression off.
void UseBloomFilter(rocksdb::ColumnFamilyOptions& options) {
  rocksdb::BlockBasedTableOptions table;
  table.filter_policy.reset(rocksdb::NewBloomFilterPolicy(10));
  options.table_factory.reset(rocksdb::NewBlockBasedTableFactory(table));
}

// RocksDB's messages (warnings and errors: info_log_level) go to this process's stderr rather than
// to DB/LOG. The LOG file sits on the store's disk, and when that disk fills, RocksDB 7.8's file
// logger keeps writing through a writer that has failed: its next message (e.g. the disk-space
// poller saying the error cleared) aborts the process on writable_file_writer.h's
// `sync_without_flush_called_` assertion, which Debian's build keeps. A full disk must be a
// RESOURCE_EXHAUSTED status, never an abort.
class StderrLogger final : public rocksdb::Logger {
 public:
  explicit StderrLogger(rocksdb::InfoLogLevel level) : rocksdb::Logger(level) {}

  using rocksdb::Logger::Logv;
  void Logv(const char* format, va_list ap) override {
    char line[1024];
    const int n = std::vsnprintf(line, sizeof(line), format, ap);
    if (n < 0) return;
    // One fprintf per message: stdio locks the stream, so concurrent messages do not interleave.
    std::fprintf(stderr, "rocksdb: %s\n", line);
  }
};

bool FileExists(const std::string& path) {
  struct stat info;
  return ::stat(path.c_str(), &info) == 0;
}

// A file of a RocksDB database in `path` (a MANIFEST, an SST or a WAL), "" when there is none.
// Without CURRENT such files are a damaged database: creating a new one over them would purge
// them as obsolete.
std::string DatabaseFileIn(const std::string& path) {
  DIR* dir = ::opendir(path.c_str());
  if (dir == nullptr) return "";
  std::string found;
  while (const dirent* entry = ::readdir(dir)) {
    const absl::string_view name = entry->d_name;
    if (absl::StartsWith(name, "MANIFEST-") || absl::EndsWith(name, ".sst") ||
        absl::EndsWith(name, ".log")) {
      found = std::string(name);
      break;
    }
  }
  ::closedir(dir);
  return found;
}

absl::Status DamagedStoreError(const std::string& path, absl::string_view finding) {
  return absl::DataLossError(absl::StrCat(
      "the checkpoint store at '", path, "' is damaged and could not be opened (", finding,
      "). Nothing was changed. Run `ckpt repair --store_dir=", path,
      "`: it copies the damaged files to a backup first, rebuilds the database from what is "
      "intact and reports which versions survived. Or restore the directory from a backup and "
      "run `ckpt verify` on it"));
}

// The marker: the same record twice, each "ckpt-acknowledged-v2 <20 digits> <16 hex>\n" where the
// hex is the XXH3-64 of everything before it on the line (tag included, so a record whose
// checksum holds but whose tag is unknown is another format, not damage). Always the same
// length, so each update overwrites the whole file in one pwrite of one sector; two copies, so a
// damaged byte leaves the number readable for the lost-write check. Stores written before v2
// hold one line "ckpt-acknowledged <20 digits> <XXH3-64 of the digits>\n", still read.
constexpr absl::string_view kMarkerTag = "ckpt-acknowledged-v2";
constexpr absl::string_view kMarkerTagV1 = "ckpt-acknowledged";

std::string MarkerRecord(uint64_t number) {
  const std::string body = absl::StrCat(kMarkerTag, " ", absl::StrFormat("%020u", number));
  return absl::StrCat(body, " ", absl::StrFormat("%016x", XXH3_64bits(body.data(), body.size())),
                      "\n");
}

std::string FormatMarker(uint64_t number) {
  const std::string record = MarkerRecord(number);
  return record + record;
}

// The number of one record (a line without its "\n"), or nullopt when it is not intact.
std::optional<uint64_t> ParseMarkerRecord(absl::string_view line) {
  uint64_t number = 0;
  if (line.size() == MarkerRecord(0).size() - 1 && absl::StartsWith(line, kMarkerTag) &&
      absl::SimpleAtoi(line.substr(kMarkerTag.size() + 1, 20), &number) &&
      absl::StrCat(line, "\n") == MarkerRecord(number)) {
    return number;
  }
  // v1: one line, the checksum over the digits only.
  const std::string digits = absl::StrFormat("%020u", 0);
  if (line.size() == kMarkerTagV1.size() + 1 + digits.size() + 1 + 16 &&
      absl::StartsWith(line, absl::StrCat(kMarkerTagV1, " ")) &&
      absl::SimpleAtoi(line.substr(kMarkerTagV1.size() + 1, 20), &number)) {
    const std::string v1_digits = absl::StrFormat("%020u", number);
    if (line ==
        absl::StrCat(kMarkerTagV1, " ", v1_digits, " ",
                     absl::StrFormat("%016x", XXH3_64bits(v1_digits.data(), v1_digits.size())))) {
      return number;
    }
  }
  return std::nullopt;
}

std::string MarkerPath(const std::string& db_path) {
  return absl::StrCat(db_path, "/", kAcknowledgedMarkerFile);
}

}  // namespace

AcknowledgedMarker ReadAcknowledgedMarker(const std::string& db_path) {
  AcknowledgedMarker marker;
  const std::string path = MarkerPath(db_path);
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    if (errno != ENOENT) {
      marker.damage = absl::StrCat("it cannot be read: ", std::strerror(errno));
    }
    return marker;
  }
  char buffer[512];
  const ssize_t n = ::read(fd, buffer, sizeof(buffer));
  const int read_errno = errno;
  ::close(fd);
  if (n < 0) {
    marker.damage = absl::StrCat("it cannot be read: ", std::strerror(read_errno));
    return marker;
  }
  // Empty: a power cut between creating the file and its first write (it is not synced).
  if (n == 0) return marker;
  const absl::string_view text(buffer, static_cast<size_t>(n));
  std::vector<absl::string_view> lines = absl::StrSplit(text, '\n');
  const bool ends_in_newline = !lines.empty() && lines.back().empty();
  if (ends_in_newline) lines.pop_back();
  int intact = 0;
  for (absl::string_view line : lines) {
    if (std::optional<uint64_t> number = ParseMarkerRecord(line)) {
      ++intact;
      marker.number = std::max(marker.number.value_or(0), *number);
    }
  }
  const bool v1 = intact == 1 && lines.size() == 1 && absl::StartsWith(text, kMarkerTagV1) &&
                  !absl::StartsWith(text, kMarkerTag);
  if (!ends_in_newline || (!v1 && (lines.size() != 2 || intact != 2))) {
    marker.damage =
        absl::StrCat(n, " bytes, ", intact, " of its ", v1 ? 1 : 2, " checksummed copies intact",
                     marker.number.has_value() ? absl::StrCat(" (#", *marker.number, ")") : "");
  }
  return marker;
}

absl::string_view ColumnFamilyName(ColumnFamily cf) {
  return kColumnFamilyNames[static_cast<int>(cf)];
}

std::string EncodeBigEndian64(uint64_t value) {
  std::string bytes(8, '\0');
  for (int i = 7; i >= 0; --i) {
    bytes[i] = static_cast<char>(value & 0xff);
    value >>= 8;
  }
  return bytes;
}

absl::StatusOr<uint64_t> DecodeBigEndian64(absl::string_view bytes) {
  if (bytes.size() != 8) {
    return absl::InvalidArgumentError(
        absl::StrCat("expected an 8-byte big-endian integer, found ", bytes.size(), " bytes"));
  }
  uint64_t value = 0;
  for (unsigned char c : bytes) value = (value << 8) | c;
  return value;
}

std::string ModelPrefix(absl::string_view model) {
  std::string prefix(model);
  prefix.push_back('\0');
  return prefix;
}

std::string VersionKey(absl::string_view model, int64_t version) {
  return absl::StrCat(ModelPrefix(model), EncodeBigEndian64(static_cast<uint64_t>(version)));
}

absl::StatusOr<int64_t> VersionFromKey(absl::string_view key, absl::string_view model) {
  if (key.size() != model.size() + 9 || key.substr(0, model.size()) != model ||
      key[model.size()] != '\0') {
    return absl::DataLossError(
        absl::StrCat("malformed version key for model '", model, "' (", key.size(), " bytes)"));
  }
  absl::StatusOr<uint64_t> version = DecodeBigEndian64(key.substr(model.size() + 1));
  if (!version.ok()) return absl::DataLossError(version.status().message());
  return static_cast<int64_t>(*version);
}

std::string AliasKey(absl::string_view model, absl::string_view alias) {
  return absl::StrCat(ModelPrefix(model), alias);
}

absl::string_view AliasFromKey(absl::string_view key, absl::string_view model) {
  return key.size() > model.size() + 1 ? key.substr(model.size() + 1) : absl::string_view();
}

std::string IdempotencyKeyKey(absl::string_view model, absl::string_view idempotency_key) {
  return absl::StrCat(ModelPrefix("commit_key"), ModelPrefix(model), idempotency_key);
}

std::string UploadChunkKey(absl::string_view upload_id, absl::string_view sha256) {
  return absl::StrCat(upload_id, sha256);
}

std::string AuditKey(int64_t sequence) {
  return EncodeBigEndian64(static_cast<uint64_t>(sequence));
}

std::string HistoryKey(int64_t sequence) {
  return EncodeBigEndian64(static_cast<uint64_t>(sequence));
}

rocksdb::DBOptions MakeDbOptions(bool create_if_missing) {
  rocksdb::DBOptions options;
  options.create_if_missing = create_if_missing;
  options.create_missing_column_families = true;
  // Refuse to open, rather than silently drop, a database whose files fail their checksums.
  options.paranoid_checks = true;
  // Every commit is a synced write, so a record that fails its checksum before the log's end is
  // damage, not a torn last write: refuse to open (`ckpt repair` salvages the records around it)
  // instead of RocksDB's default point-in-time recovery, which silently drops every later
  // acknowledged commit. An incomplete last record (a crash mid-write) is still tolerated.
  options.wal_recovery_mode = rocksdb::WALRecoveryMode::kTolerateCorruptedTailRecords;
  // One flush and one compaction at a time: the machines have 2 cores, and chunk writes and
  // SHA-256 hashing need them too.
  options.max_background_jobs = 2;
  // Chunk bytes no longer pass through the WAL (pack files hold them); only small records do.
  // Bound the WAL anyway so old logs are released by flushing the column families that pin them.
  options.max_total_wal_size = 256 * kMiB;
  // Write back blob / SST files and the WAL in 1 MiB steps, so the synced commit and flushes do
  // not stall behind hundreds of MB of dirty pages.
  options.bytes_per_sync = 1 * kMiB;
  options.wal_bytes_per_sync = 1 * kMiB;
  // All memtables together; the chunks CF's 64 MiB buffers dominate.
  options.db_write_buffer_size = 256 * kMiB;
  options.keep_log_file_num = 4;
  options.max_manifest_file_size = 64 * kMiB;
  options.info_log_level = rocksdb::InfoLogLevel::WARN_LEVEL;
  options.info_log = std::make_shared<StderrLogger>(options.info_log_level);
  return options;
}

rocksdb::ColumnFamilyOptions MakeColumnFamilyOptions(ColumnFamily cf) {
  rocksdb::ColumnFamilyOptions options;
  switch (cf) {
    case ColumnFamily::kChunks:
      // Schema 1 only (new chunks go to pack files). Tensor chunks: up to 4 MiB each, written once,
      // read whole, never overwritten with other content (the key is their hash). Integrated blob
      // files keep them out of the LSM tree, so compaction moves 40-byte blob indexes instead of
      // rewriting MBs of tensor bytes.
      options.enable_blob_files = true;
      // Everything but tiny tensors' chunks (biases, scalars) goes to blob files; values under
      // 64 KiB are cheaper inline in SST blocks.
      options.min_blob_size = 64 * kKiB;
      options.blob_file_size = 256 * kMiB;
      // Float tensor bytes are near-random: compression would cost CPU and save ~nothing.
      options.blob_compression_type = rocksdb::kNoCompression;
      options.compression = rocksdb::kNoCompression;
      // Space of deleted chunks comes back through blob GC during compaction: live blobs in the
      // oldest quarter of blob files are relocated, and once half of those files is garbage a
      // compaction is forced to reclaim them.
      options.enable_blob_garbage_collection = true;
      options.blob_garbage_collection_age_cutoff = 0.25;
      options.blob_garbage_collection_force_threshold = 0.5;
      options.blob_compaction_readahead_size = 2 * kMiB;
      // 16 chunks per memtable: few, large, sequential blob file writes on flush.
      options.write_buffer_size = 64 * kMiB;
      options.max_write_buffer_number = 3;
      break;
    case ColumnFamily::kVersions:
      // Manifests: keys, shapes and chunk hashes. Key strings repeat across versions; zstd
      // shrinks them where the build has it.
      options.compression = ZstdSupported() ? rocksdb::kZSTD : rocksdb::kNoCompression;
      options.write_buffer_size = 16 * kMiB;
      break;
    case ColumnFamily::kRefs:
    case ColumnFamily::kPackedChunks:
      UseBloomFilter(options);
      options.compression = rocksdb::kNoCompression;
      options.write_buffer_size = 16 * kMiB;
      break;
    case ColumnFamily::kDefault:
    case ColumnFamily::kModels:
    case ColumnFamily::kAliases:
    case ColumnFamily::kUploads:
    case ColumnFamily::kAudit:
    case ColumnFamily::kHistory:
    case ColumnFamily::kAnnotations:
      // Small and few records (audit records and registry events: one or two per change, a few
      // hundred bytes each; annotations: one per annotated version).
      options.compression = rocksdb::kNoCompression;
      options.write_buffer_size = 4 * kMiB;
      break;
  }
  return options;
}

absl::StatusOr<std::unique_ptr<StoreDb>> StoreDb::Open(
    const std::string& path, bool create_if_missing,
    std::shared_ptr<rocksdb::FileSystem> file_system) {
  const bool existed = FileExists(path + "/CURRENT");
  if (!existed) {
    if (const std::string orphan = DatabaseFileIn(path); !orphan.empty()) {
      return DamagedStoreError(path, absl::StrCat("CURRENT is missing, but ", orphan, " is there"));
    }
  }
  if (!create_if_missing && !existed) {
    return absl::NotFoundError(
        absl::StrCat("no checkpoint store at '", path, "' (and create_if_missing is false)"));
  }
  std::vector<rocksdb::ColumnFamilyDescriptor> descriptors;
  for (int i = 0; i < kColumnFamilyCount; ++i) {
    const ColumnFamily cf = static_cast<ColumnFamily>(i);
    descriptors.emplace_back(std::string(ColumnFamilyName(cf)), MakeColumnFamilyOptions(cf));
  }
  // RocksDB creates the directory itself, but first logs an error for listing it (StderrLogger
  // would print it on every new store).
  if (create_if_missing) ::mkdir(path.c_str(), 0755);
  std::unique_ptr<StoreDb> store(new StoreDb());
  store->path_ = path;
  rocksdb::DBOptions db_options = MakeDbOptions(create_if_missing);
  if (file_system != nullptr) {
    store->env_ = rocksdb::NewCompositeEnv(file_system);
    db_options.env = store->env_.get();
  }
  rocksdb::DB* db = nullptr;
  rocksdb::Status opened = rocksdb::DB::Open(db_options, path, descriptors, &store->handles_, &db);
  if (!opened.ok()) {
    // CURRENT names the database's files: once it exists, a file RocksDB cannot find or parse is
    // damage, not an absent store, and the user needs to hear what to do about it.
    if (existed && (opened.IsCorruption() || opened.IsNotFound() || opened.IsPathNotFound())) {
      return DamagedStoreError(path, absl::StrCat("RocksDB: ", opened.ToString()));
    }
    return FromRocksDbStatus(opened, absl::StrCat("opening checkpoint store '", path, "'"));
  }
  store->db_.reset(db);

  rocksdb::ColumnFamilyHandle* meta = store->cf(ColumnFamily::kDefault);
  std::string schema_version;
  rocksdb::Status read =
      db->Get(rocksdb::ReadOptions(), meta, std::string(kSchemaVersionKey), &schema_version);
  if (read.IsNotFound()) {
    rocksdb::WriteOptions sync;
    sync.sync = true;
    rocksdb::Status written =
        db->Put(sync, meta, std::string(kSchemaVersionKey), std::string(kSchemaVersion));
    if (!written.ok()) return FromRocksDbStatus(written, "writing the schema version");
  } else if (!read.ok()) {
    return FromRocksDbStatus(read, "reading the schema version");
  } else if (schema_version == kSchemaVersionInlineChunks) {
    // Version 1 kept every chunk's bytes in `chunks`; those stay readable there, and new chunks
    // go to pack files. The `packed_chunks` column family was created on open above.
    rocksdb::WriteOptions sync;
    sync.sync = true;
    rocksdb::Status written =
        db->Put(sync, meta, std::string(kSchemaVersionKey), std::string(kSchemaVersion));
    if (!written.ok()) return FromRocksDbStatus(written, "upgrading the schema version");
  } else if (schema_version != kSchemaVersion) {
    return absl::FailedPreconditionError(absl::StrCat(
        "checkpoint store '", path, "' has schema version ", schema_version,
        "; this build reads versions ", kSchemaVersionInlineChunks, " and ", kSchemaVersion));
  }
  // A WAL that lost acknowledged writes (their batches set acknowledged_write to at least the
  // marker's number) opens without an error in RocksDB; refuse it here, before anything writes.
  std::string acknowledged_bytes;
  read = db->Get(rocksdb::ReadOptions(), meta, std::string(kAcknowledgedWriteKey),
                 &acknowledged_bytes);
  if (read.ok()) {
    absl::StatusOr<uint64_t> number = DecodeBigEndian64(acknowledged_bytes);
    if (!number.ok()) {
      return DamagedStoreError(path, absl::StrCat("its acknowledged_write record is ",
                                                  acknowledged_bytes.size(), " bytes, not 8"));
    }
    store->last_acknowledged_ = *number;
  } else if (!read.IsNotFound()) {
    return FromRocksDbStatus(read, "reading the number of the last acknowledged write");
  }
  const AcknowledgedMarker marker = ReadAcknowledgedMarker(path);
  const std::string damaged_marker =
      marker.damage.empty()
          ? std::string()
          : absl::StrCat("its acknowledged-writes marker ", kAcknowledgedMarkerFile,
                         " is damaged (", marker.damage,
                         "), so a loss of acknowledged commits could go unnoticed; `ckpt repair` "
                         "checks the write-ahead log against the database and rebuilds it");
  if (marker.number.has_value() && *marker.number > store->last_acknowledged_) {
    return DamagedStoreError(
        path, absl::StrCat("the store acknowledged write #", *marker.number,
                           ", but its database holds writes up to #", store->last_acknowledged_,
                           " only: its write-ahead log (the *.log file) lost acknowledged "
                           "commits, truncated or deleted",
                           damaged_marker.empty() ? "" : "; and ", damaged_marker));
  }
  if (!damaged_marker.empty()) return DamagedStoreError(path, damaged_marker);
  return store;
}

absl::Status StoreDb::WriteAcknowledged(rocksdb::WriteBatch& batch, absl::string_view what) {
  absl::MutexLock lock(&acknowledged_mu_);
  const uint64_t number = last_acknowledged_ + 1;
  batch.Put(cf(ColumnFamily::kDefault), std::string(kAcknowledgedWriteKey),
            EncodeBigEndian64(number));
  rocksdb::WriteOptions write;
  write.sync = true;
  const rocksdb::Status written = db_->Write(write, &batch);
  // A failed synced write may still have reached the log: never hand its number out again.
  last_acknowledged_ = number;
  if (!written.ok()) return FromRocksDbStatus(written, what);
  const std::string marker = FormatMarker(number);
  if (marker_fd_ < 0) {
    marker_fd_ = ::open(MarkerPath(path_).c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
  }
  if (marker_fd_ < 0 || ::pwrite(marker_fd_, marker.data(), marker.size(), 0) !=
                            static_cast<ssize_t>(marker.size())) {
    std::fprintf(stderr,
                 "ckpt store: %s is durable, but updating %s failed (%s): a later loss of the "
                 "write-ahead log may go undetected\n",
                 std::string(what).c_str(), MarkerPath(path_).c_str(), std::strerror(errno));
  }
  return absl::OkStatus();
}

absl::Status StoreDb::RewriteAcknowledgedMarker() {
  absl::MutexLock lock(&acknowledged_mu_);
  const std::string marker = FormatMarker(last_acknowledged_);
  const std::string path = MarkerPath(path_);
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0 ||
      ::pwrite(fd, marker.data(), marker.size(), 0) != static_cast<ssize_t>(marker.size()) ||
      ::fsync(fd) != 0) {
    const int error = errno;
    if (fd >= 0) ::close(fd);
    return absl::InternalError(
        absl::StrCat("writing the acknowledged-writes marker ", path, ": ", std::strerror(error)));
  }
  ::close(fd);
  return absl::OkStatus();
}

StoreDb::~StoreDb() {
  {
    absl::MutexLock lock(&acknowledged_mu_);
    if (marker_fd_ >= 0) ::close(marker_fd_);
  }
  if (db_ != nullptr) {
    for (rocksdb::ColumnFamilyHandle* handle : handles_) {
      db_->DestroyColumnFamilyHandle(handle);
    }
    db_->Close();
  }
}

}  // namespace ckpt

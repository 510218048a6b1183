#include "libs/store/rocksdb_checkpoint_store.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <deque>
#include <future>
#include <limits>
#include <map>
#include <optional>
#include <random>
#include <set>
#include <thread>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "libs/io/prefault.h"
#include "libs/status/rocksdb_status.h"
#include "libs/status/status_macros.h"
#include "libs/store/chunk_hasher.h"
#include "libs/store/chunk_pack.h"
#include "libs/store/manifest_validation.h"
#include "libs/store/rocksdb_schema.h"
#include "libs/store/store_records.pb.h"
#include "libs/store/version_ref.h"
#include "rocksdb/write_batch.h"

namespace ckpt {
namespace {

using store::ChunkRecord;
using store::ModelRecord;
using store::PackedChunk;
using store::UploadRecord;

rocksdb::Slice ToSlice(absl::string_view bytes) { return rocksdb::Slice(bytes.data(), bytes.size()); }
absl::string_view ToView(const rocksdb::Slice& slice) {
  return absl::string_view(slice.data(), slice.size());
}
bool StartsWith(const rocksdb::Slice& key, absl::string_view prefix) {
  return key.size() >= prefix.size() && ToView(key).substr(0, prefix.size()) == prefix;
}

int64_t NowMicros() { return absl::ToUnixMicros(absl::Now()); }

template <typename Proto>
absl::Status ParseRecord(absl::string_view bytes, Proto& record, absl::string_view what) {
  if (!record.ParseFromArray(bytes.data(), static_cast<int>(bytes.size()))) {
    return absl::DataLossError(absl::StrCat("unreadable ", what, " record"));
  }
  return absl::OkStatus();
}

int64_t LogicalBytes(const v1::Manifest& manifest) {
  int64_t total = 0;
  for (const v1::TensorMeta& meta : manifest.tensors()) total += meta.byte_length();
  for (const v1::TensorMeta& meta : manifest.state_tensors()) total += meta.byte_length();
  return total;
}

std::string Hex64(uint64_t value) { return absl::StrFormat("%016x", value); }

// Where a tensor's first chunk starts in its pack: tensors of 1 MiB or more on a page (padding
// costs < 0.4%), smaller ones on 64 bytes (element alignment for every dtype, at most 63 bytes
// of padding each), so readers can hand out tensors that point into a mapping of the pack.
constexpr int64_t kPageAlignFromBytes = int64_t{1} << 20;
int64_t TensorAlignment(int64_t byte_length) {
  return byte_length >= kPageAlignFromBytes ? 4096 : 64;
}
// Readers map tensors at least this large and copy smaller ones.
constexpr int64_t kMapInPlaceMinBytes = kPageAlignFromBytes;

// An upload writes the records of the chunks it stored (kUploads) in batches of this many, not
// one RocksDB write each: those writes were ~40% of the writing thread's time for 10,000 small
// tensors (perf, tools/bench). After a crash fewer than this many stored chunks have no record; their
// bytes are in the upload's own pack, which GarbageCollect removes once no location names it,
// so only the abandoned upload's bytes_freed count is short.
constexpr int kUploadRecordBatch = 256;

// A pack whose live chunks fill less than this share of it is rewritten by GarbageCollect.
constexpr double kCompactPackBelowLiveFraction = 0.5;
// ... and only when that frees at least this much (small packs are mostly alignment padding).
constexpr int64_t kCompactPackMinDeadBytes = int64_t{1} << 20;

std::string EncodeLocation(const PackLocation& location) {
  PackedChunk record;
  record.set_pack_id(location.pack_id);
  record.set_offset(location.offset);
  record.set_length(location.length);
  return record.SerializeAsString();
}

// Per-chunk refcount changes, summed over everything one batch does.
struct RefDelta {
  int64_t delta = 0;
  int64_t length = 0;
  uint64_t xxh3_64 = 0;
};
using RefDeltas = absl::flat_hash_map<std::string, RefDelta>;

void AddTensorRefs(const v1::TensorMeta& meta, int64_t sign, RefDeltas& deltas) {
  for (const v1::ChunkRef& chunk : meta.chunks()) {
    RefDelta& delta = deltas[chunk.sha256()];
    delta.delta += sign;
    delta.length = chunk.length();
    delta.xxh3_64 = chunk.xxh3_64();
  }
}

void AddManifestRefs(const v1::Manifest& manifest, int64_t sign, RefDeltas& deltas) {
  for (const v1::TensorMeta& meta : manifest.tensors()) AddTensorRefs(meta, sign, deltas);
  for (const v1::TensorMeta& meta : manifest.state_tensors()) AddTensorRefs(meta, sign, deltas);
}

void CollectTensorRefs(const v1::Value& value, absl::flat_hash_set<std::string>& keys) {
  switch (value.kind_case()) {
    case v1::Value::kListValue:
      for (const v1::Value& item : value.list_value().items()) CollectTensorRefs(item, keys);
      break;
    case v1::Value::kTupleValue:
      for (const v1::Value& item : value.tuple_value().items()) CollectTensorRefs(item, keys);
      break;
    case v1::Value::kDictValue:
      for (const v1::DictEntry& entry : value.dict_value().entries()) {
        CollectTensorRefs(entry.value(), keys);
      }
      break;
    case v1::Value::kTensorValue:
      keys.insert(value.tensor_value().key());
      break;
    case v1::Value::kOpaqueValue:
      CollectTensorRefs(value.opaque_value().args(), keys);
      CollectTensorRefs(value.opaque_value().state(), keys);
      break;
    default:
      break;
  }
}

// Removes the optimizer state of `manifest` and the state tensors only it references; returns
// those tensors.
std::vector<v1::TensorMeta> DropOptimizerState(v1::Manifest& manifest) {
  absl::flat_hash_set<std::string> optimizer_keys, kept_keys;
  CollectTensorRefs(manifest.optimizer_state(), optimizer_keys);
  CollectTensorRefs(manifest.scheduler_state(), kept_keys);
  CollectTensorRefs(manifest.extra_state(), kept_keys);
  std::vector<v1::TensorMeta> removed;
  google::protobuf::RepeatedPtrField<v1::TensorMeta> kept;
  for (v1::TensorMeta& meta : *manifest.mutable_state_tensors()) {
    if (optimizer_keys.contains(meta.key()) && !kept_keys.contains(meta.key())) {
      removed.push_back(std::move(meta));
    } else {
      *kept.Add() = std::move(meta);
    }
  }
  manifest.mutable_state_tensors()->Swap(&kept);
  manifest.clear_optimizer_state();
  manifest.clear_optimizer_param_names();
  manifest.add_warnings(absl::StrCat("optimizer state dropped by retention at ",
                                     absl::FormatTime(absl::Now(), absl::UTCTimeZone())));
  return removed;
}

// Releases a RocksDB snapshot when it goes out of scope.
class SnapshotHolder {
 public:
  explicit SnapshotHolder(rocksdb::DB* db) : db_(db), snapshot_(db->GetSnapshot()) {}
  ~SnapshotHolder() { db_->ReleaseSnapshot(snapshot_); }
  SnapshotHolder(const SnapshotHolder&) = delete;
  SnapshotHolder& operator=(const SnapshotHolder&) = delete;
  const rocksdb::Snapshot* get() const { return snapshot_; }

 private:
  rocksdb::DB* db_;
  const rocksdb::Snapshot* snapshot_;
};

}  // namespace

// The whole-pack mappings one reader shares among the tensors it maps, and the regions it has
// handed out.
struct PackMappings {
  absl::Mutex mu;
  absl::flat_hash_map<uint64_t, std::shared_ptr<MappedPackRegion>> packs ABSL_GUARDED_BY(mu);
  // Per pack, the byte ranges handed out (start -> end), which never overlap.
  absl::flat_hash_map<uint64_t, std::map<int64_t, int64_t>> handed_out ABSL_GUARDED_BY(mu);

  // Claims bytes [start, end) of pack `pack_id`; false when they overlap bytes handed out
  // before (a deduplicated chunk can lie inside another tensor's run, or runs can touch).
  bool Claim(uint64_t pack_id, int64_t start, int64_t end) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    std::map<int64_t, int64_t>& ranges = handed_out[pack_id];
    auto next = ranges.lower_bound(start);
    if (next != ranges.end() && next->first < end) return false;
    if (next != ranges.begin() && std::prev(next)->second > start) return false;
    ranges.emplace(start, end);
    return true;
  }
};

class RocksDbCheckpointStore::Core {
 public:
  Core(StoreOptions options, std::unique_ptr<StoreDb> db, std::unique_ptr<PackDirectory> packs)
      : options_(std::move(options)),
        store_db_(std::move(db)),
        db_(store_db_->db()),
        packs_(std::move(packs)) {
    std::random_device random;
    upload_id_base_ = (static_cast<uint64_t>(random()) << 32) ^ random();
  }

  const StoreOptions& options() const { return options_; }
  rocksdb::DB* db() const { return db_; }
  PackDirectory& packs() const { return *packs_; }

  // Readers register before they take their snapshot, with the latest sequence number then (their
  // snapshot sees at least that much). GarbageCollect closes a removed pack's descriptor once
  // every registered reader started after the batch that stopped naming the pack.
  int64_t AddReader() {
    absl::MutexLock lock(&readers_mu_);
    const int64_t id = next_reader_id_++;
    readers_.emplace(id, db_->GetLatestSequenceNumber());
    return id;
  }
  void RemoveReader(int64_t id) {
    absl::MutexLock lock(&readers_mu_);
    readers_.erase(id);
  }
  // The oldest sequence number a registered reader may see; the newest when there is none.
  uint64_t OldestReaderSequence() {
    absl::MutexLock lock(&readers_mu_);
    uint64_t oldest = db_->GetLatestSequenceNumber();
    for (const auto& [id, sequence] : readers_) oldest = std::min(oldest, sequence);
    return oldest;
  }
  rocksdb::ColumnFamilyHandle* cf(ColumnFamily cf) const { return store_db_->cf(cf); }

  rocksdb::ReadOptions Read(const rocksdb::Snapshot* snapshot = nullptr) const {
    rocksdb::ReadOptions read;
    read.snapshot = snapshot;
    read.verify_checksums = true;
    return read;
  }

  absl::Status Write(rocksdb::WriteBatch& batch, absl::string_view what, bool sync) {
    rocksdb::WriteOptions write;
    write.sync = sync && options_.sync_commits;
    return FromRocksDbStatus(db_->Write(write, &batch), what);
  }

  // Synced whatever sync_commits says: for batches after which files are removed (GC), whose loss
  // in a power failure would bring back locations naming deleted packs.
  absl::Status WriteDurably(rocksdb::WriteBatch& batch, absl::string_view what) {
    rocksdb::WriteOptions write;
    write.sync = true;
    return FromRocksDbStatus(db_->Write(write, &batch), what);
  }

  // ---- Records.

  absl::StatusOr<std::optional<ModelRecord>> ReadModel(absl::string_view model,
                                                       const rocksdb::Snapshot* snapshot) const {
    std::string bytes;
    rocksdb::Status read = db_->Get(Read(snapshot), cf(ColumnFamily::kModels), ToSlice(model),
                                    &bytes);
    if (read.IsNotFound()) return std::nullopt;
    RETURN_IF_ERROR(FromRocksDbStatus(read, absl::StrCat("reading model '", model, "'")));
    ModelRecord record;
    RETURN_IF_ERROR(ParseRecord(bytes, record, absl::StrCat("model '", model, "'")));
    return record;
  }

  absl::StatusOr<ModelRecord> ReadExistingModel(absl::string_view model,
                                                const rocksdb::Snapshot* snapshot,
                                                absl::string_view ref_text) const {
    ASSIGN_OR_RETURN(std::optional<ModelRecord> record, ReadModel(model, snapshot));
    if (!record.has_value()) {
      return absl::NotFoundError(absl::StrCat(ref_text.empty() ? "" : absl::StrCat(ref_text, ": "),
                                              "no model '", model, "' in the store"));
    }
    return *record;
  }

  // The version `ref` names.
  absl::StatusOr<int64_t> ResolveVersion(const v1::VersionRef& ref,
                                         const rocksdb::Snapshot* snapshot) const {
    RETURN_IF_ERROR(ValidateModelName(ref.model()));
    const std::string ref_text = FormatVersionRef(ref);
    ASSIGN_OR_RETURN(ModelRecord record, ReadExistingModel(ref.model(), snapshot, ref_text));
    if (ref.ref_case() == v1::VersionRef::kVersion) {
      if (ref.version() < 1) {
        return absl::InvalidArgumentError(
            absl::StrCat(ref_text, ": versions are numbered from 1"));
      }
      return ref.version();
    }
    if (ref.alias().empty() || ref.alias() == kLatestAlias) {
      if (record.latest_version() == 0) {
        return absl::NotFoundError(absl::StrCat(ref_text, " not found: model '", ref.model(),
                                                "' has no versions"));
      }
      return record.latest_version();
    }
    std::string bytes;
    rocksdb::Status read = db_->Get(Read(snapshot), cf(ColumnFamily::kAliases),
                                    AliasKey(ref.model(), ref.alias()), &bytes);
    if (read.IsNotFound()) {
      return absl::NotFoundError(absl::StrCat(ref_text, " not found: model '", ref.model(),
                                              "' has no alias '", ref.alias(), "'"));
    }
    RETURN_IF_ERROR(FromRocksDbStatus(read, absl::StrCat("reading alias ", ref_text)));
    absl::StatusOr<uint64_t> version = DecodeBigEndian64(bytes);
    if (!version.ok()) return absl::DataLossError(absl::StrCat("alias ", ref_text, ": unreadable"));
    return static_cast<int64_t>(*version);
  }

  absl::StatusOr<v1::Manifest> ReadManifest(absl::string_view model, int64_t version,
                                            const rocksdb::Snapshot* snapshot) const {
    std::string bytes;
    const std::string ref_text = FormatVersionRef(model, version);
    rocksdb::Status read = db_->Get(Read(snapshot), cf(ColumnFamily::kVersions),
                                    VersionKey(model, version), &bytes);
    if (read.IsNotFound()) return absl::NotFoundError(absl::StrCat(ref_text, " not found"));
    RETURN_IF_ERROR(FromRocksDbStatus(read, absl::StrCat("reading ", ref_text)));
    v1::Manifest manifest;
    RETURN_IF_ERROR(ParseRecord(bytes, manifest, absl::StrCat("manifest of ", ref_text)));
    return manifest;
  }

  // version -> aliases (by name) of `model`.
  absl::StatusOr<std::map<int64_t, std::vector<std::string>>> ReadAliases(
      absl::string_view model, const rocksdb::Snapshot* snapshot) const {
    std::map<int64_t, std::vector<std::string>> aliases;
    const std::string prefix = ModelPrefix(model);
    std::unique_ptr<rocksdb::Iterator> it(
        db_->NewIterator(Read(snapshot), cf(ColumnFamily::kAliases)));
    for (it->Seek(prefix); it->Valid() && StartsWith(it->key(), prefix); it->Next()) {
      absl::StatusOr<uint64_t> version = DecodeBigEndian64(ToView(it->value()));
      if (!version.ok()) {
        return absl::DataLossError(absl::StrCat("unreadable alias of model '", model, "'"));
      }
      aliases[static_cast<int64_t>(*version)].emplace_back(
          AliasFromKey(ToView(it->key()), model));
    }
    RETURN_IF_ERROR(FromRocksDbStatus(it->status(), absl::StrCat("listing aliases of ", model)));
    return aliases;
  }

  // Every (version, manifest) of `model`, oldest first.
  absl::StatusOr<std::vector<std::pair<int64_t, v1::Manifest>>> ReadAllManifests(
      absl::string_view model, const rocksdb::Snapshot* snapshot) const {
    std::vector<std::pair<int64_t, v1::Manifest>> manifests;
    const std::string prefix = ModelPrefix(model);
    std::unique_ptr<rocksdb::Iterator> it(
        db_->NewIterator(Read(snapshot), cf(ColumnFamily::kVersions)));
    for (it->Seek(prefix); it->Valid() && StartsWith(it->key(), prefix); it->Next()) {
      ASSIGN_OR_RETURN(int64_t version, VersionFromKey(ToView(it->key()), model));
      v1::Manifest manifest;
      RETURN_IF_ERROR(ParseRecord(ToView(it->value()), manifest,
                                  absl::StrCat("manifest of ", FormatVersionRef(model, version))));
      manifests.emplace_back(version, std::move(manifest));
    }
    RETURN_IF_ERROR(FromRocksDbStatus(it->status(), absl::StrCat("listing versions of ", model)));
    return manifests;
  }

  // Every model name.
  absl::StatusOr<std::vector<std::pair<std::string, ModelRecord>>> ReadAllModels(
      const rocksdb::Snapshot* snapshot) const {
    std::vector<std::pair<std::string, ModelRecord>> models;
    std::unique_ptr<rocksdb::Iterator> it(
        db_->NewIterator(Read(snapshot), cf(ColumnFamily::kModels)));
    for (it->SeekToFirst(); it->Valid(); it->Next()) {
      ModelRecord record;
      RETURN_IF_ERROR(ParseRecord(ToView(it->value()), record,
                                  absl::StrCat("model '", ToView(it->key()), "'")));
      models.emplace_back(it->key().ToString(), std::move(record));
    }
    RETURN_IF_ERROR(FromRocksDbStatus(it->status(), "listing models"));
    return models;
  }

  // Newest version of `model` other than those in `excluded`; 0 if none.
  absl::StatusOr<int64_t> NewestVersionExcept(absl::string_view model,
                                              const std::set<int64_t>& excluded) const {
    const std::string prefix = ModelPrefix(model);
    std::unique_ptr<rocksdb::Iterator> it(
        db_->NewIterator(Read(), cf(ColumnFamily::kVersions)));
    for (it->SeekForPrev(absl::StrCat(prefix, EncodeBigEndian64(~uint64_t{0})));
         it->Valid() && StartsWith(it->key(), prefix); it->Prev()) {
      ASSIGN_OR_RETURN(int64_t version, VersionFromKey(ToView(it->key()), model));
      if (!excluded.count(version)) return version;
    }
    RETURN_IF_ERROR(FromRocksDbStatus(it->status(), absl::StrCat("listing versions of ", model)));
    return 0;
  }

  // Applies summed refcount changes to `batch`. Adds to `*released_bytes` the bytes of chunks
  // whose count reaches zero and to `*new_bytes` those of chunks counted for the first time.
  absl::Status ApplyRefDeltas(const RefDeltas& deltas, rocksdb::WriteBatch& batch,
                              int64_t* released_bytes, int64_t* new_bytes)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    const int64_t now = NowMicros();
    for (const auto& [sha256, delta] : deltas) {
      if (delta.delta == 0) continue;
      std::string bytes;
      rocksdb::Status read = db_->Get(Read(), cf(ColumnFamily::kRefs), sha256, &bytes);
      ChunkRecord record;
      if (read.IsNotFound()) {
        if (delta.delta < 0) {
          return absl::DataLossError(absl::StrCat(
              "chunk ", HexEncode(sha256),
              " has no refcount record but a manifest references it; run verify"));
        }
        record.set_length(delta.length);
        record.set_xxh3_64(delta.xxh3_64);
        record.set_created_unix_micros(now);
        if (new_bytes != nullptr) *new_bytes += delta.length;
      } else {
        RETURN_IF_ERROR(FromRocksDbStatus(read, "reading a chunk refcount"));
        RETURN_IF_ERROR(ParseRecord(bytes, record, absl::StrCat("refcount of chunk ",
                                                                HexEncode(sha256))));
      }
      const int64_t count = record.refcount() + delta.delta;
      if (count < 0) {
        return absl::DataLossError(absl::StrCat("refcount of chunk ", HexEncode(sha256),
                                                " would drop to ", count, "; run verify"));
      }
      if (count == 0 && record.refcount() > 0 && released_bytes != nullptr) {
        *released_bytes += record.length();
      }
      record.set_refcount(count);
      batch.Put(cf(ColumnFamily::kRefs), sha256, record.SerializeAsString());
    }
    return absl::OkStatus();
  }

  // ---- Chunks.

  // Reads chunk `chunk` into `destination` (chunk.length() bytes) from its pack, or from the
  // `chunks` column family for schema-1 data. NOT_FOUND when the store holds neither; DATA_LOSS
  // when the stored length disagrees. Checks nothing else: callers verify the xxh3.
  absl::Status ReadChunkInto(const v1::ChunkRef& chunk, const rocksdb::Snapshot* snapshot,
                             char* destination) const {
    std::string location_bytes;
    rocksdb::Status read = db_->Get(Read(snapshot), cf(ColumnFamily::kPackedChunks),
                                    chunk.sha256(), &location_bytes);
    if (read.ok()) {
      PackedChunk record;
      RETURN_IF_ERROR(ParseRecord(location_bytes, record, "chunk location"));
      if (record.length() != chunk.length()) {
        return absl::DataLossError(absl::StrCat("stored ", record.length(),
                                                " bytes; the manifest says ", chunk.length()));
      }
      return packs_->Read({record.pack_id(), record.offset(), record.length()}, destination);
    }
    if (!read.IsNotFound()) return FromRocksDbStatus(read, "looking up a chunk location");
    rocksdb::PinnableSlice value;
    read = db_->Get(Read(snapshot), cf(ColumnFamily::kChunks), chunk.sha256(), &value);
    if (read.IsNotFound()) return absl::NotFoundError("missing from the store");
    RETURN_IF_ERROR(FromRocksDbStatus(read, "reading an inline chunk"));
    if (static_cast<int64_t>(value.size()) != chunk.length()) {
      return absl::DataLossError(absl::StrCat("stored ", value.size(),
                                              " bytes; the manifest says ", chunk.length()));
    }
    std::memcpy(destination, value.data(), value.size());
    return absl::OkStatus();
  }

  // Where `chunk` lives in a pack; nullopt for a schema-1 inline chunk or a missing one.
  absl::StatusOr<std::optional<PackLocation>> FindPackLocation(
      const v1::ChunkRef& chunk, const rocksdb::Snapshot* snapshot) const {
    std::string location_bytes;
    rocksdb::Status read = db_->Get(Read(snapshot), cf(ColumnFamily::kPackedChunks),
                                    chunk.sha256(), &location_bytes);
    if (read.IsNotFound()) return std::nullopt;
    RETURN_IF_ERROR(FromRocksDbStatus(read, "looking up a chunk location"));
    PackedChunk record;
    RETURN_IF_ERROR(ParseRecord(location_bytes, record, "chunk location"));
    // ReadChunkInto reports a location that cannot be right (packs_->Read checks the extent).
    if (record.length() != chunk.length() || record.offset() < 0 || record.length() < 0 ||
        record.offset() > std::numeric_limits<int64_t>::max() - record.length()) {
      return std::nullopt;
    }
    return PackLocation{record.pack_id(), record.offset(), record.length()};
  }

  static std::string ChunkName(const v1::TensorMeta& meta, const v1::ChunkRef& chunk,
                               int64_t offset, absl::string_view where) {
    return absl::StrCat("chunk ", HexEncode(chunk.sha256()), " of tensor '", meta.key(), "'",
                        where.empty() ? "" : absl::StrCat(" of ", where), " (bytes ", offset,
                        "..", offset + chunk.length(), ")");
  }

  static absl::Status CheckChunkBytes(const v1::TensorMeta& meta, const v1::ChunkRef& chunk,
                                      int64_t offset, absl::string_view where,
                                      absl::string_view bytes) {
    const uint64_t xxh3 = Xxh3(bytes);
    if (xxh3 != chunk.xxh3_64()) {
      return absl::DataLossError(absl::StrCat(
          ChunkName(meta, chunk, offset, where), " fails its xxh3 checksum (expected ",
          Hex64(chunk.xxh3_64()), ", computed ", Hex64(xxh3),
          "): the stored bytes are corrupt and were not returned"));
    }
    return absl::OkStatus();
  }

  absl::Status CheckChunkLayout(const v1::TensorMeta& meta) const {
    int64_t total = 0;
    for (const v1::ChunkRef& chunk : meta.chunks()) {
      if (chunk.length() < 0 || chunk.length() > kChunkBytes) {
        return absl::DataLossError(absl::StrCat("tensor '", meta.key(), "': a chunk of ",
                                                chunk.length(), " bytes"));
      }
      total += chunk.length();
    }
    if (total != meta.byte_length()) {
      return absl::DataLossError(absl::StrCat("tensor '", meta.key(), "': chunks hold ", total,
                                              " bytes, byte_length is ", meta.byte_length()));
    }
    return absl::OkStatus();
  }

  // Reads every chunk of `meta` into `destination` (byte_length bytes), checking each.
  absl::Status ReadTensorInto(const v1::TensorMeta& meta, char* destination,
                              const rocksdb::Snapshot* snapshot, absl::string_view where) const {
    RETURN_IF_ERROR(CheckChunkLayout(meta));
    int64_t offset = 0;
    for (const v1::ChunkRef& chunk : meta.chunks()) {
      absl::Status read = ReadChunkInto(chunk, snapshot, destination + offset);
      if (!read.ok()) return ChunkReadError(meta, chunk, offset, where, read);
      RETURN_IF_ERROR(CheckChunkBytes(meta, chunk, offset, where,
                                      absl::string_view(destination + offset, chunk.length())));
      offset += chunk.length();
    }
    return absl::OkStatus();
  }

  // Maps `meta`'s bytes in place when its chunks lie back to back in one pack (how an upload
  // writes a tensor it did not deduplicate), checking every chunk; data is null when they do not,
  // or when `mappings` already handed out any of these bytes (a deduplicated twin, or a chunk
  // inside another tensor's run: two tensors must not share memory, or a write to one would show
  // in the other).
  absl::StatusOr<VersionReader::MappedBytes> MapTensor(const v1::TensorMeta& meta,
                                                       const rocksdb::Snapshot* snapshot,
                                                       absl::string_view where,
                                                       PackMappings& mappings) const {
    RETURN_IF_ERROR(CheckChunkLayout(meta));
    VersionReader::MappedBytes mapped;
    if (meta.chunks_size() == 0) return mapped;
    std::optional<PackLocation> whole;
    for (const v1::ChunkRef& chunk : meta.chunks()) {
      ASSIGN_OR_RETURN(std::optional<PackLocation> location, FindPackLocation(chunk, snapshot));
      if (!location.has_value()) return mapped;
      if (!whole.has_value()) {
        whole = location;
      } else if (location->pack_id != whole->pack_id ||
                 location->offset != whole->offset + whole->length) {
        return mapped;
      } else {
        whole->length += location->length;
      }
    }
    if (whole->offset % 64 != 0) return mapped;  // element alignment
    std::shared_ptr<MappedPackRegion> region;
    {
      absl::MutexLock lock(&mappings.mu);
      if (!mappings.Claim(whole->pack_id, whole->offset, whole->offset + whole->length)) {
        return mapped;
      }
      std::shared_ptr<MappedPackRegion>& pack = mappings.packs[whole->pack_id];
      if (pack == nullptr || pack->size() < whole->offset + whole->length) {
        absl::StatusOr<std::shared_ptr<MappedPackRegion>> mapping =
            packs_->MapWhole(whole->pack_id);
        if (!mapping.ok()) {
          return ChunkReadError(meta, meta.chunks(0), 0, where, mapping.status());
        }
        pack = *std::move(mapping);
      }
      region = pack;
    }
    if (region->size() < whole->offset + whole->length) {
      // Never touched: a mapping past the end of the file is SIGBUS on first access.
      return ChunkReadError(
          meta, meta.chunks(0), 0, where,
          absl::DataLossError(absl::StrCat("pack ", PackFileName(whole->pack_id), " bytes ",
                                           whole->offset, "..", whole->offset + whole->length,
                                           " lie beyond the end of the ", region->size(),
                                           "-byte file")));
    }
    char* data = region->data() + whole->offset;
    // Checking every chunk touches every page: map them in one call, not a fault per page.
    PrefaultForRead(data, static_cast<size_t>(whole->length));
    int64_t offset = 0;
    for (const v1::ChunkRef& chunk : meta.chunks()) {
      RETURN_IF_ERROR(CheckChunkBytes(meta, chunk, offset, where,
                                      absl::string_view(data + offset, chunk.length())));
      offset += chunk.length();
    }
    mapped.data = data;
    mapped.owner = std::move(region);
    return mapped;
  }

  static absl::Status ChunkReadError(const v1::TensorMeta& meta, const v1::ChunkRef& chunk,
                                     int64_t offset, absl::string_view where,
                                     const absl::Status& status) {
    const std::string name = ChunkName(meta, chunk, offset, where);
    if (absl::IsNotFound(status)) {
      return absl::DataLossError(absl::StrCat(name, " is missing from the store"));
    }
    return absl::Status(status.code(), absl::StrCat(name, ": ", status.message()));
  }

  // Streams the chunks of `meta`, checking each. `where` names the version for messages.
  absl::Status ReadChunks(const v1::TensorMeta& meta, const ChunkCallback& callback,
                          const rocksdb::Snapshot* snapshot, absl::string_view where) const {
    RETURN_IF_ERROR(CheckChunkLayout(meta));
    // One chunk buffer per thread, reused: a fresh 4 MiB per call costs a page fault per 4 KiB.
    // (A callback that reads again on this thread gets a buffer of its own.)
    thread_local std::string reused;
    thread_local bool reused_busy = false;
    std::string own;
    std::string& buffer = reused_busy ? own : reused;
    const bool took_reused = !reused_busy;
    reused_busy = true;
    struct Release {
      bool active;
      ~Release() {
        if (active) reused_busy = false;
      }
    } release{took_reused};
    int64_t offset = 0;
    for (const v1::ChunkRef& chunk : meta.chunks()) {
      if (buffer.size() < static_cast<size_t>(chunk.length())) buffer.resize(chunk.length());
      absl::Status read = ReadChunkInto(chunk, snapshot, buffer.data());
      if (!read.ok()) return ChunkReadError(meta, chunk, offset, where, read);
      const absl::string_view bytes(buffer.data(), chunk.length());
      RETURN_IF_ERROR(CheckChunkBytes(meta, chunk, offset, where, bytes));
      RETURN_IF_ERROR(callback(offset, bytes));
      offset += chunk.length();
    }
    return absl::OkStatus();
  }

  // Re-reads one chunk and re-hashes it; "" when it is sound, else what is wrong.
  std::string CheckChunk(const v1::ChunkRef& chunk, const rocksdb::Snapshot* snapshot) const {
    if (chunk.length() < 0 || chunk.length() > kChunkBytes) {
      return absl::StrCat("the manifest gives the chunk ", chunk.length(), " bytes");
    }
    std::string buffer(chunk.length(), '\0');
    absl::Status read = ReadChunkInto(chunk, snapshot, buffer.data());
    if (absl::IsNotFound(read)) return "chunk is missing from the store";
    if (!read.ok()) return absl::StrCat("chunk unreadable: ", read.message());
    const uint64_t xxh3 = Xxh3(buffer);
    if (xxh3 != chunk.xxh3_64()) {
      return absl::StrCat("xxh3 mismatch: expected ", Hex64(chunk.xxh3_64()), ", computed ",
                          Hex64(xxh3));
    }
    const std::string sha256 = Sha256(buffer);
    if (sha256 != chunk.sha256()) {
      return absl::StrCat("SHA-256 mismatch: the stored bytes hash to ", HexEncode(sha256));
    }
    return "";
  }

  // Pins `digest` for an upload (GC leaves it alone) and stores the chunk unless the store already
  // holds it committed or this upload wrote it.
  // New chunks are appended to `pack` (the upload's own pack file); `written` maps each chunk the
  // upload stored to its location, which Commit records in its synced batch.
  // The upload record of each stored chunk goes into `records`, which the session writes in
  // batches (UploadRecordBatch).
  absl::Status PinAndStoreChunk(absl::string_view upload_id, const ChunkDigest& digest,
                                absl::string_view bytes, int64_t alignment, PackWriter& pack,
                                absl::flat_hash_set<std::string>& pinned,
                                absl::flat_hash_map<std::string, PackLocation>& written,
                                rocksdb::WriteBatch& records) {
    if (pinned.insert(digest.sha256).second) {
      absl::MutexLock lock(&mu_);
      ++pinned_chunks_[digest.sha256];
    }
    if (written.contains(digest.sha256)) return absl::OkStatus();
    // Pinned first, then checked: GC either ran before the pin (and its deletion is visible now)
    // or runs after it and skips this chunk.
    std::string record;
    rocksdb::Status read = db_->Get(Read(), cf(ColumnFamily::kRefs), digest.sha256, &record);
    if (read.ok()) return absl::OkStatus();
    if (!read.IsNotFound()) return FromRocksDbStatus(read, "looking up a chunk");
    ASSIGN_OR_RETURN(const int64_t offset, pack.Append(bytes, alignment));
    const PackLocation location{pack.pack_id(), offset, digest.length};
    // The location is recorded by Commit, after the pack is synced: `packed_chunks` only ever
    // names durable bytes. Until then the upload record (written in batches, see
    // kUploadRecordBatch) accounts for the chunk in GarbageCollect.
    records.Put(cf(ColumnFamily::kUploads), UploadChunkKey(upload_id, digest.sha256),
                EncodeBigEndian64(static_cast<uint64_t>(digest.length)));
    written.emplace(digest.sha256, location);
    return absl::OkStatus();
  }

  // ---- Pack space.

  // Removes pack files that no committed location names, except the packs of uploads in
  // `writing` (live, or abandoned within the grace period), and rewrites packs whose live chunks
  // fill less than kCompactPackBelowLiveFraction of them. Under mu_, so no commit records
  // locations meanwhile; uploads only append to their own packs, which are never touched.
  absl::Status ReclaimPacks(const absl::flat_hash_set<uint64_t>& writing)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    absl::flat_hash_map<uint64_t, std::vector<std::pair<std::string, PackLocation>>> live;
    absl::flat_hash_map<uint64_t, int64_t> live_bytes;
    {
      std::unique_ptr<rocksdb::Iterator> it(
          db_->NewIterator(Read(), cf(ColumnFamily::kPackedChunks)));
      for (it->SeekToFirst(); it->Valid(); it->Next()) {
        PackedChunk record;
        RETURN_IF_ERROR(ParseRecord(ToView(it->value()), record, "chunk location"));
        live[record.pack_id()].emplace_back(
            it->key().ToString(), PackLocation{record.pack_id(), record.offset(), record.length()});
        live_bytes[record.pack_id()] += record.length();
      }
      RETURN_IF_ERROR(FromRocksDbStatus(it->status(), "listing chunk locations"));
    }
    ASSIGN_OR_RETURN(auto files, packs_->List());
    for (const auto& [pack_id, size] : files) {
      if (writing.contains(pack_id)) continue;
      auto found = live_bytes.find(pack_id);
      if (found == live_bytes.end()) {
        RETURN_IF_ERROR(packs_->Remove(pack_id, db_->GetLatestSequenceNumber()));
      } else if (found->second < kCompactPackBelowLiveFraction * static_cast<double>(size) &&
                 size - found->second >= kCompactPackMinDeadBytes) {
        RETURN_IF_ERROR(CompactPack(pack_id, live[pack_id]));
      }
    }
    // Readers on an older snapshot may still read removed packs through their descriptors.
    packs_->ReleaseRemoved(OldestReaderSequence());
    return absl::OkStatus();
  }

  // Copies the live chunks of pack `pack_id` to a new pack (in their order; a chunk on a 4096- or
  // 64-byte boundary stays on one, so tensors stay mappable, at the price of padding a chunk that
  // sat on a page by chance), syncs it, moves their locations, removes the old pack.
  absl::Status CompactPack(uint64_t pack_id,
                           std::vector<std::pair<std::string, PackLocation>>& chunks)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    std::sort(chunks.begin(), chunks.end(), [](const auto& a, const auto& b) {
      return a.second.offset < b.second.offset;
    });
    ASSIGN_OR_RETURN(std::unique_ptr<PackWriter> writer, packs_->NewPack(NewUploadNumber()));
    rocksdb::WriteBatch batch;
    std::string buffer;
    for (const auto& [sha256, location] : chunks) {
      buffer.resize(static_cast<size_t>(location.length));
      RETURN_IF_ERROR(packs_->Read(location, buffer.data()));
      const int64_t alignment =
          location.offset % 4096 == 0 ? 4096 : location.offset % 64 == 0 ? 64 : 1;
      ASSIGN_OR_RETURN(const int64_t offset, writer->Append(buffer, alignment));
      batch.Put(cf(ColumnFamily::kPackedChunks), sha256,
                EncodeLocation({writer->pack_id(), offset, location.length}));
    }
    RETURN_IF_ERROR(writer->Sync());
    RETURN_IF_ERROR(WriteDurably(batch, absl::StrCat("relocating the chunks of pack ",
                                                     PackFileName(pack_id))));
    return packs_->Remove(pack_id, db_->GetLatestSequenceNumber());
  }

  // ---- Uploads.

  // A fresh upload id; its number also names the upload's pack file.
  uint64_t NewUploadNumber() {
    const uint64_t serial = next_upload_serial_.fetch_add(1);
    return upload_id_base_ + serial * 0x9e3779b97f4a7c15ull;
  }

  void AddLiveUpload(const std::string& upload_id) {
    absl::MutexLock lock(&mu_);
    live_uploads_.insert(upload_id);
  }

  void EndUploadLocked(const std::string& upload_id,
                       const absl::flat_hash_set<std::string>& pinned)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    live_uploads_.erase(upload_id);
    for (const std::string& sha256 : pinned) {
      auto it = pinned_chunks_.find(sha256);
      if (it != pinned_chunks_.end() && --it->second == 0) pinned_chunks_.erase(it);
    }
  }

  void EndUpload(const std::string& upload_id, const absl::flat_hash_set<std::string>& pinned) {
    absl::MutexLock lock(&mu_);
    EndUploadLocked(upload_id, pinned);
  }

  int64_t LiveUploadCount() {
    absl::MutexLock lock(&mu_);
    return static_cast<int64_t>(live_uploads_.size());
  }

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
  const std::unique_ptr<StoreDb> store_db_;
  rocksdb::DB* const db_;
  const std::unique_ptr<PackDirectory> packs_;
  absl::Mutex readers_mu_;
  int64_t next_reader_id_ ABSL_GUARDED_BY(readers_mu_) = 0;
  // Registered reader -> the latest sequence number when it registered.
  std::map<int64_t, uint64_t> readers_ ABSL_GUARDED_BY(readers_mu_);
  uint64_t upload_id_base_ = 0;
  std::atomic<uint64_t> next_upload_serial_{0};

  // Serializes every read-modify-write of metadata: commits, alias moves, deletes, retention, GC.
  absl::Mutex mu_;
  absl::flat_hash_set<std::string> live_uploads_ ABSL_GUARDED_BY(mu_);
  // Chunk -> number of live uploads that stored it or rely on it being present.
  absl::flat_hash_map<std::string, int> pinned_chunks_ ABSL_GUARDED_BY(mu_);
};

namespace {

using Core = RocksDbCheckpointStore::Core;

class RocksDbUploadSession final : public UploadSession {
 public:
  RocksDbUploadSession(std::shared_ptr<Core> core, std::string upload_id, uint64_t pack_id,
                       v1::Manifest header, CommitOptions options,
                       std::vector<std::string> warnings)
      : core_(std::move(core)),
        upload_id_(std::move(upload_id)),
        header_(std::move(header)),
        options_(std::move(options)),
        warnings_(std::move(warnings)),
        streams_(header_.tensors_size() + header_.state_tensors_size()),
        pack_id_(pack_id) {}

  ~RocksDbUploadSession() override {
    {
      absl::MutexLock lock(&pipeline_mu_);  // the queued rest is skipped, not stored.
      if (pipeline_error_.ok()) pipeline_error_ = absl::CancelledError("upload abandoned");
    }
    StopPipeline();
    // Abandoned: the upload record stays for GarbageCollect; only the in-memory pins go.
    if (!finished_) {
      (void)WriteUploadRecords();  // best effort: GarbageCollect reclaims the pack regardless.
      core_->EndUpload(upload_id_, pinned_);
    }
  }

  const v1::Manifest& header() const override { return header_; }
  int tensor_count() const override { return static_cast<int>(streams_.size()); }
  const std::vector<std::string>& warnings() const override { return warnings_; }

  absl::Status AddStableTensorData(int tensor_index, int64_t offset,
                                   absl::string_view bytes) override {
    RETURN_IF_ERROR(CheckUsable());
    RETURN_IF_ERROR(CheckData(tensor_index, offset, bytes.size()));
    Stream& stream = streams_[tensor_index];
    const int64_t size = static_cast<int64_t>(bytes.size());
    const bool complete = stream.received + size == Meta(tensor_index).byte_length();
    // Only whole chunks from a chunk boundary go to the background; the rest needs `pending`.
    if (size == 0 || !stream.pending.empty() || (!complete && size % kChunkBytes != 0)) {
      return AddTensorData(tensor_index, offset, bytes);
    }
    stream.received += size;
    StartPipeline();
    absl::MutexLock lock(&pipeline_mu_);
    pieces_.push_back(Piece{tensor_index, bytes, complete});
    ++outstanding_pieces_;
    return absl::OkStatus();
  }

  absl::Status AddTensorData(int tensor_index, int64_t offset, absl::string_view bytes) override {
    RETURN_IF_ERROR(CheckUsable());
    RETURN_IF_ERROR(DrainPipeline());
    RETURN_IF_ERROR(CheckData(tensor_index, offset, bytes.size()));
    v1::TensorMeta& meta = Meta(tensor_index);
    Stream& stream = streams_[tensor_index];
    const int64_t size = static_cast<int64_t>(bytes.size());
    if (size == 0) return absl::OkStatus();
    stream.received += size;
    const bool complete = stream.received == meta.byte_length();

    absl::string_view rest = bytes;
    if (!stream.pending.empty()) {
      const size_t take = std::min<size_t>(rest.size(), kChunkBytes - stream.pending.size());
      stream.pending.append(rest.data(), take);
      rest.remove_prefix(take);
      if (static_cast<int64_t>(stream.pending.size()) == kChunkBytes || complete) {
        RETURN_IF_ERROR(StoreChunks(tensor_index, stream.pending));
        stream.pending.clear();
      }
    }
    // Whole chunks straight from the caller's bytes; the tail of an incomplete tensor waits in
    // `pending` for the next call.
    const size_t whole = complete ? rest.size() : rest.size() - rest.size() % kChunkBytes;
    if (whole > 0) {
      RETURN_IF_ERROR(StoreChunks(tensor_index, rest.substr(0, whole)));
      rest.remove_prefix(whole);
    }
    if (!rest.empty()) {
      if (stream.pending.capacity() < static_cast<size_t>(kChunkBytes)) {
        stream.pending.reserve(std::min(kChunkBytes, meta.byte_length()));
      }
      stream.pending.append(rest.data(), rest.size());
    }
    if (complete) {
      std::string().swap(stream.pending);
      RETURN_IF_ERROR(Fail(FinishTensor(tensor_index)));
    }
    return absl::OkStatus();
  }

  absl::StatusOr<CommitResult> Commit() override {
    absl::Status usable = CheckUsable();
    if (usable.ok()) usable = DrainPipeline();
    // Whatever happens, no background thread reads the caller's bytes after Commit returns.
    if (!usable.ok()) {
      {
        absl::MutexLock lock(&pipeline_mu_);
        if (pipeline_error_.ok()) pipeline_error_ = absl::CancelledError("commit failed");
      }
      StopPipeline();
      return usable;
    }
    StopPipeline();
    std::vector<std::string> incomplete;
    for (int i = 0; i < tensor_count(); ++i) {
      const v1::TensorMeta& meta = Meta(i);
      if (streams_[i].received != meta.byte_length()) {
        incomplete.push_back(absl::StrCat(Name(i), " got ", streams_[i].received, " of ",
                                          meta.byte_length(), " bytes"));
      } else if (meta.byte_length() == 0) {
        RETURN_IF_ERROR(Fail(FinishTensor(i)));
      }
    }
    if (!incomplete.empty()) {
      const size_t shown = std::min<size_t>(incomplete.size(), 3);
      return Fail(absl::InvalidArgumentError(absl::StrCat(
          "upload to '", header_.model(), "' is incomplete: ",
          absl::StrJoin(incomplete.begin(), incomplete.begin() + shown, "; "),
          incomplete.size() > shown ? absl::StrCat(" (and ", incomplete.size() - shown, " more)")
                                    : "")));
    }

    // The pack's bytes become durable before the batch that names them (the WAL sync does not
    // cover files outside RocksDB). Outside the lock: other commits need not wait for this one.
    if (pack_ != nullptr) {
      absl::Status synced = pack_->Sync();
      if (!synced.ok()) return Fail(synced);
    }

    RefDeltas deltas;
    AddManifestRefs(header_, +1, deltas);
    const int64_t logical_bytes = LogicalBytes(header_);
    const std::string& model = header_.model();

    CommitResult result;
    absl::Status committed = [&]() -> absl::Status {
      absl::MutexLock lock(&core_->mu());
      ASSIGN_OR_RETURN(std::optional<ModelRecord> existing, core_->ReadModel(model, nullptr));
      ModelRecord record = existing.value_or(ModelRecord());
      if (!existing.has_value()) {
        record.set_next_version(1);
        record.set_created_unix_micros(NowMicros());
      }
      if (options_.expected_latest_version > 0 &&
          record.latest_version() != options_.expected_latest_version) {
        return absl::FailedPreconditionError(absl::StrCat(
            "commit to '", model, "' expected latest version ", options_.expected_latest_version,
            " but it is ", record.latest_version(), " now"));
      }
      const int64_t version = record.next_version();
      header_.set_version(version);
      header_.mutable_metadata()->set_created_unix_micros(NowMicros());

      rocksdb::WriteBatch batch;
      int64_t new_bytes = 0;
      RETURN_IF_ERROR(core_->ApplyRefDeltas(deltas, batch, nullptr, &new_bytes));
      for (const std::string& alias : options_.aliases) {
        batch.Put(core_->cf(ColumnFamily::kAliases), AliasKey(model, alias),
                  EncodeBigEndian64(static_cast<uint64_t>(version)));
      }
      batch.Put(core_->cf(ColumnFamily::kVersions), VersionKey(model, version),
                header_.SerializeAsString());
      record.set_latest_version(version);
      record.set_next_version(version + 1);
      record.set_version_count(record.version_count() + 1);
      record.set_logical_bytes(record.logical_bytes() + logical_bytes);
      batch.Put(core_->cf(ColumnFamily::kModels), model, record.SerializeAsString());
      batch.Delete(core_->cf(ColumnFamily::kUploads), upload_id_);
      for (const auto& [sha256, location] : written_) {
        batch.Delete(core_->cf(ColumnFamily::kUploads), UploadChunkKey(upload_id_, sha256));
        // This upload's copy is durable now. (Another upload may have committed the same chunk
        // meanwhile from its own pack; either copy is sound.)
        batch.Put(core_->cf(ColumnFamily::kPackedChunks), sha256, EncodeLocation(location));
      }
      RETURN_IF_ERROR(core_->Write(batch, absl::StrCat("committing ",
                                                       FormatVersionRef(model, version)),
                                   /*sync=*/true));
      core_->EndUploadLocked(upload_id_, pinned_);
      upload_records_.Clear();
      finished_ = true;
      result.version = MakeVersionRef(model, version);
      result.new_bytes = new_bytes;
      return absl::OkStatus();
    }();
    if (!committed.ok()) return Fail(committed);
    result.logical_bytes = logical_bytes;
    result.warnings = warnings_;
    return result;
  }

 private:
  struct Stream {
    int64_t received = 0;
    std::string pending;  // bytes of the tensor's current, not yet full, chunk.
    ContentHasher content;  // over the chunks stored so far.
  };

  v1::TensorMeta& Meta(int index) {
    return index < header_.tensors_size()
               ? *header_.mutable_tensors(index)
               : *header_.mutable_state_tensors(index - header_.tensors_size());
  }

  std::string Name(int index) {
    return absl::StrCat(index < header_.tensors_size() ? "tensor '" : "state tensor '",
                        Meta(index).key(), "' (index ", index, ")");
  }

  absl::Status CheckUsable() {
    if (finished_) return absl::FailedPreconditionError("the upload is already committed");
    if (failed_.ok()) {
      // The first call to see a background failure returns it with its own code (a full disk
      // stays RESOURCE_EXHAUSTED); later calls say the session failed.
      absl::MutexLock lock(&pipeline_mu_);
      if (!pipeline_error_.ok()) {
        failed_ = pipeline_error_;
        return pipeline_error_;
      }
    }
    if (!failed_.ok()) {
      return absl::FailedPreconditionError(
          absl::StrCat("the upload failed earlier: ", failed_.message()));
    }
    return absl::OkStatus();
  }

  // INVALID_ARGUMENT (failing the session) unless `size` bytes at `offset` continue tensor
  // `index` within its byte_length.
  absl::Status CheckData(int index, int64_t offset, size_t size) {
    if (index < 0 || index >= tensor_count()) {
      return Fail(absl::InvalidArgumentError(
          absl::StrCat("tensor index ", index, " is out of range: the upload has ",
                       tensor_count(), " tensors")));
    }
    const Stream& stream = streams_[index];
    if (offset != stream.received) {
      return Fail(absl::InvalidArgumentError(absl::StrCat(
          Name(index), ": data at offset ", offset, ", expected offset ", stream.received,
          " (a tensor's bytes must arrive in order)")));
    }
    if (static_cast<int64_t>(size) > Meta(index).byte_length() - stream.received) {
      return Fail(absl::InvalidArgumentError(
          absl::StrCat(Name(index), ": ", stream.received + static_cast<int64_t>(size),
                       " bytes sent but its byte_length is ", Meta(index).byte_length())));
    }
    return absl::OkStatus();
  }

  // ---- The background pipeline of AddStableTensorData: hashing threads (one per core, up to
  // four) take the pieces' chunks in order and hash them in parallel; a writing thread stores them
  // in that order. Hashing is the slowest stage (SHA-256 at ~1.4 GiB/s a core, writes to the page
  // cache at ~2 GiB/s here), so one hashing thread left the save bound by it (tools/bench R6).
  // While the pipeline runs, only the writing thread touches the manifest's chunk lists, the
  // content hashers, the pack and the pin sets; every other path drains it first.

  struct Piece {
    int index = 0;
    absl::string_view bytes;
    bool completes_tensor = false;
  };
  struct HashedChunk {
    int index = 0;
    absl::string_view bytes;
    ChunkDigest digest;
    bool ends_piece = false;
    bool completes_tensor = false;
  };

  void StartPipeline() {
    if (writer_.joinable()) return;
    const int hashers = std::clamp(static_cast<int>(std::thread::hardware_concurrency()), 1, 4);
    {
      absl::MutexLock lock(&pipeline_mu_);
      hashers_running_ = hashers;
    }
    for (int i = 0; i < hashers; ++i) hashers_.emplace_back([this] { RunHasher(); });
    writer_ = std::thread([this] { RunWriter(); });
  }

  absl::Status DrainPipeline() {
    if (!writer_.joinable()) return absl::OkStatus();
    absl::MutexLock lock(&pipeline_mu_);
    pipeline_mu_.Await(absl::Condition(
        +[](int* outstanding) { return *outstanding == 0; }, &outstanding_pieces_));
    if (!pipeline_error_.ok()) return Fail(pipeline_error_);
    return absl::OkStatus();
  }

  void StopPipeline() {
    if (!writer_.joinable()) return;
    {
      absl::MutexLock lock(&pipeline_mu_);
      closing_ = true;
    }
    for (std::thread& hasher : hashers_) hasher.join();
    hashers_.clear();
    writer_.join();
  }

  // Takes the next chunk of the front piece, hashes it (unlocked), files it by sequence number.
  void RunHasher() {
    while (true) {
      HashedChunk chunk;
      int64_t sequence = 0;
      bool failed = false;
      {
        absl::MutexLock lock(&pipeline_mu_);
        pipeline_mu_.Await(absl::Condition(this, &RocksDbUploadSession::HasPieceOrClosing));
        if (pieces_.empty()) break;
        const Piece& piece = pieces_.front();  // never empty: AddStableTensorData skips those.
        chunk.index = piece.index;
        chunk.bytes = piece.bytes.substr(piece_cursor_, kChunkBytes);
        piece_cursor_ += chunk.bytes.size();
        chunk.ends_piece = piece_cursor_ >= piece.bytes.size();
        chunk.completes_tensor = chunk.ends_piece && piece.completes_tensor;
        if (chunk.ends_piece) {
          pieces_.pop_front();
          piece_cursor_ = 0;
        }
        sequence = next_hash_sequence_++;
        failed = !pipeline_error_.ok();
      }
      if (!failed) chunk.digest = Digest(chunk.bytes);  // the slow part, unlocked.
      absl::MutexLock lock(&pipeline_mu_);
      hashed_.emplace(sequence, std::move(chunk));
    }
    absl::MutexLock lock(&pipeline_mu_);
    --hashers_running_;
  }

  void RunWriter() {
    while (true) {
      HashedChunk chunk;
      bool failed = false;
      {
        absl::MutexLock lock(&pipeline_mu_);
        pipeline_mu_.Await(absl::Condition(this, &RocksDbUploadSession::HasNextHashedOrDone));
        if (hashed_.empty()) break;
        auto next = hashed_.begin();
        chunk = std::move(next->second);
        hashed_.erase(next);
        ++next_write_sequence_;
        failed = !pipeline_error_.ok();
      }
      absl::Status stored;
      if (!failed) {
        stored = StoreHashedChunk(chunk.index, chunk.digest, chunk.bytes);
        if (stored.ok() && chunk.completes_tensor) stored = FinishTensor(chunk.index);
      }
      absl::MutexLock lock(&pipeline_mu_);
      if (!stored.ok() && pipeline_error_.ok()) pipeline_error_ = stored;
      if (chunk.ends_piece) --outstanding_pieces_;
    }
  }

  bool HasPieceOrClosing() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(pipeline_mu_) {
    return !pieces_.empty() || closing_;
  }
  // The chunk that is next in order has been hashed, or every hasher has ended (and with them
  // every chunk: a hasher files its chunk before it looks for another).
  bool HasNextHashedOrDone() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(pipeline_mu_) {
    if (!hashed_.empty() && hashed_.begin()->first == next_write_sequence_) return true;
    return hashers_running_ == 0;
  }

  absl::Status Fail(absl::Status status) {
    if (!status.ok()) failed_ = status;
    return status;
  }

  ChunkDigest Digest(absl::string_view bytes) {
    if (!core_->options().benchmark_only_skip_hashing) return HashChunk(bytes);
    ChunkDigest digest;
    digest.sha256 = Sha256(absl::StrCat(upload_id_, unhashed_chunks_++));
    digest.length = static_cast<int64_t>(bytes.size());
    return digest;
  }

  // Writes the upload records of the chunks stored since the last call (unsynced, like each
  // record was before they were batched).
  absl::Status WriteUploadRecords() {
    if (upload_records_.Count() == 0) return absl::OkStatus();
    absl::Status written = core_->Write(upload_records_, "recording an upload's chunks",
                                        /*sync=*/false);
    if (written.ok()) upload_records_.Clear();  // else kept for the next try.
    return written;
  }

  // Appends the chunk `digest` of `bytes` to tensor `index`: stored unless the store has it,
  // named in the manifest, added to the content hash. Errors are returned, not recorded.
  absl::Status StoreHashedChunk(int index, const ChunkDigest& digest, absl::string_view bytes) {
    v1::TensorMeta& meta = Meta(index);
    if (pack_ == nullptr) {
      ASSIGN_OR_RETURN(pack_, core_->packs().NewPack(pack_id_));
    }
    // A tensor's first chunk starts aligned (TensorAlignment); the rest follow back to back.
    const int64_t alignment = meta.chunks_size() == 0 ? TensorAlignment(meta.byte_length()) : 1;
    RETURN_IF_ERROR(core_->PinAndStoreChunk(upload_id_, digest, bytes, alignment, *pack_,
                                            pinned_, written_, upload_records_));
    if (upload_records_.Count() >= kUploadRecordBatch) RETURN_IF_ERROR(WriteUploadRecords());
    v1::ChunkRef* chunk = meta.add_chunks();
    chunk->set_sha256(digest.sha256);
    chunk->set_length(digest.length);
    chunk->set_xxh3_64(digest.xxh3_64);
    streams_[index].content.AddChunk(digest);
    return absl::OkStatus();
  }

  // Stores `bytes` (whole chunks, the last one possibly short) as the next chunks of tensor
  // `index`. Hashing chunk i+1 runs on a second thread while chunk i is written.
  absl::Status StoreChunks(int index, absl::string_view bytes) {
    std::vector<absl::string_view> pieces;
    for (size_t offset = 0; offset < bytes.size(); offset += kChunkBytes) {
      pieces.push_back(bytes.substr(offset, kChunkBytes));
    }
    std::future<ChunkDigest> next;
    ChunkDigest digest = Digest(pieces[0]);
    for (size_t i = 0; i < pieces.size(); ++i) {
      if (i > 0) digest = next.get();
      if (i + 1 < pieces.size()) {
        next = std::async(std::launch::async, [this, piece = pieces[i + 1]] {
          return Digest(piece);
        });
      }
      absl::Status stored = StoreHashedChunk(index, digest, pieces[i]);
      if (!stored.ok()) {
        if (next.valid()) next.wait();
        return Fail(stored);
      }
    }
    return absl::OkStatus();
  }

  // Not Fail(): the pipeline's writing thread calls it too (the caller records errors).
  absl::Status FinishTensor(int index) {
    v1::TensorMeta& meta = Meta(index);
    std::string content_hash = streams_[index].content.Finish();
    if (!meta.content_hash().empty() && meta.content_hash() != content_hash) {
      return absl::DataLossError(absl::StrCat(
          Name(index), ": the bytes received hash to ", HexEncode(content_hash),
          " but the header's content_hash is ", HexEncode(meta.content_hash())));
    }
    meta.set_content_hash(std::move(content_hash));
    return absl::OkStatus();
  }

  const std::shared_ptr<Core> core_;
  const std::string upload_id_;
  v1::Manifest header_;
  const CommitOptions options_;
  const std::vector<std::string> warnings_;
  std::vector<Stream> streams_;
  const uint64_t pack_id_;
  std::unique_ptr<PackWriter> pack_;  // created with the first chunk this upload stores.
  std::atomic<int64_t> unhashed_chunks_{0};  // StoreOptions::benchmark_only_skip_hashing.
  absl::flat_hash_set<std::string> pinned_;  // chunks this upload stored or relies on.
  // Chunks this upload stored (upload record keys), and where.
  absl::flat_hash_map<std::string, PackLocation> written_;
  // Upload records of stored chunks not written yet. (Commit deletes every record of the upload,
  // so the ones still here at Commit are never written.)
  rocksdb::WriteBatch upload_records_;

  absl::Mutex pipeline_mu_;
  std::deque<Piece> pieces_ ABSL_GUARDED_BY(pipeline_mu_);
  size_t piece_cursor_ ABSL_GUARDED_BY(pipeline_mu_) = 0;  // bytes of the front piece taken.
  int64_t next_hash_sequence_ ABSL_GUARDED_BY(pipeline_mu_) = 0;
  int64_t next_write_sequence_ ABSL_GUARDED_BY(pipeline_mu_) = 0;
  // Hashed chunks by sequence number, waiting for the writer to reach them.
  std::map<int64_t, HashedChunk> hashed_ ABSL_GUARDED_BY(pipeline_mu_);
  int outstanding_pieces_ ABSL_GUARDED_BY(pipeline_mu_) = 0;  // queued, not yet stored.
  bool closing_ ABSL_GUARDED_BY(pipeline_mu_) = false;
  int hashers_running_ ABSL_GUARDED_BY(pipeline_mu_) = 0;
  absl::Status pipeline_error_ ABSL_GUARDED_BY(pipeline_mu_);
  std::vector<std::thread> hashers_;
  std::thread writer_;
  absl::Status failed_;
  bool finished_ = false;
};

class RocksDbVersionReader final : public VersionReader {
 public:
  RocksDbVersionReader(std::shared_ptr<Core> core, int64_t registration,
                       const rocksdb::Snapshot* snapshot, v1::Manifest manifest)
      : core_(std::move(core)),
        registration_(registration),
        snapshot_(snapshot),
        manifest_(std::move(manifest)),
        where_(FormatVersionRef(manifest_.model(), manifest_.version())) {}
  ~RocksDbVersionReader() override {
    core_->db()->ReleaseSnapshot(snapshot_);
    core_->RemoveReader(registration_);
  }

  const v1::Manifest& manifest() const override { return manifest_; }

  absl::Status ReadTensorChunks(const v1::TensorMeta& meta,
                                const ChunkCallback& callback) const override {
    return core_->ReadChunks(meta, callback, snapshot_, where_);
  }

  absl::Status ReadTensorInto(const v1::TensorMeta& meta, char* destination) const override {
    return core_->ReadTensorInto(meta, destination, snapshot_, where_);
  }

  absl::StatusOr<MappedBytes> MapTensorBytes(const v1::TensorMeta& meta) const override {
    // Small tensors are copied: tools/bench measured 10,000 tensors of 4-64 KiB loading at
    // 1.2 GiB/s as mappings (a page fault per tensor at least) and 2.0 GiB/s copied.
    if (!core_->options().map_tensors_on_load || meta.byte_length() < kMapInPlaceMinBytes) {
      return MappedBytes();
    }
    return core_->MapTensor(meta, snapshot_, where_, mappings_);
  }

 private:
  mutable PackMappings mappings_;
  const std::shared_ptr<Core> core_;
  const int64_t registration_;  // Core::AddReader
  const rocksdb::Snapshot* const snapshot_;
  const v1::Manifest manifest_;
  const std::string where_;
};

// Reads the manifest `ref` names at `snapshot`, with its aliases filled.
absl::StatusOr<v1::Manifest> ReadVersion(const Core& core, const v1::VersionRef& ref,
                                         const rocksdb::Snapshot* snapshot) {
  ASSIGN_OR_RETURN(int64_t version, core.ResolveVersion(ref, snapshot));
  absl::StatusOr<v1::Manifest> manifest = core.ReadManifest(ref.model(), version, snapshot);
  if (absl::IsNotFound(manifest.status()) && ref.ref_case() != v1::VersionRef::kVersion) {
    return absl::DataLossError(absl::StrCat(FormatVersionRef(ref), " points at version ", version,
                                            ", which does not exist"));
  }
  if (!manifest.ok()) return manifest.status();
  ASSIGN_OR_RETURN(auto aliases, core.ReadAliases(ref.model(), snapshot));
  manifest->clear_aliases();
  for (const std::string& alias : aliases[version]) manifest->add_aliases(alias);
  return manifest;
}

}  // namespace

RocksDbCheckpointStore::RocksDbCheckpointStore(std::shared_ptr<Core> core)
    : core_(std::move(core)) {}

RocksDbCheckpointStore::~RocksDbCheckpointStore() = default;

absl::StatusOr<std::unique_ptr<RocksDbCheckpointStore>> RocksDbCheckpointStore::Open(
    const StoreOptions& options) {
  if (options.db_path.empty()) {
    return absl::InvalidArgumentError("StoreOptions.db_path is empty");
  }
  if (options.abandoned_upload_grace < absl::ZeroDuration()) {
    return absl::InvalidArgumentError("StoreOptions.abandoned_upload_grace is negative");
  }
  ASSIGN_OR_RETURN(std::unique_ptr<StoreDb> db,
                   StoreDb::Open(options.db_path, options.create_if_missing));
  // After the database: its lock keeps a second process from writing the same packs.
  ASSIGN_OR_RETURN(std::unique_ptr<PackDirectory> packs,
                   PackDirectory::Open(absl::StrCat(options.db_path, "/packs")));
  return std::unique_ptr<RocksDbCheckpointStore>(new RocksDbCheckpointStore(
      std::make_shared<Core>(options, std::move(db), std::move(packs))));
}

const std::string& RocksDbCheckpointStore::db_path() const { return core_->options().db_path; }

absl::StatusOr<std::unique_ptr<UploadSession>> RocksDbCheckpointStore::BeginUpload(
    absl::string_view model, v1::Manifest header, const CommitOptions& options) {
  RETURN_IF_ERROR(ValidateModelName(model));
  if (!header.model().empty() && header.model() != model) {
    return absl::InvalidArgumentError(absl::StrCat("upload to model '", model,
                                                   "' has a header for model '", header.model(),
                                                   "'"));
  }
  for (const std::string& alias : options.aliases) RETURN_IF_ERROR(ValidateAliasName(alias));
  if (options.expected_latest_version < 0) {
    return absl::InvalidArgumentError("expected_latest_version is negative");
  }
  ASSIGN_OR_RETURN(std::vector<std::string> validation, ValidateManifestHeader(header));
  std::vector<std::string> warnings(header.warnings().begin(), header.warnings().end());
  warnings.insert(warnings.end(), validation.begin(), validation.end());
  header.set_model(std::string(model));
  header.set_version(0);
  header.clear_aliases();
  header.clear_warnings();
  for (const std::string& warning : warnings) header.add_warnings(warning);

  // Fail fast, before any bytes flow; Commit checks again atomically.
  if (options.expected_latest_version > 0) {
    ASSIGN_OR_RETURN(std::optional<store::ModelRecord> record, core_->ReadModel(model, nullptr));
    const int64_t latest = record.has_value() ? record->latest_version() : 0;
    if (latest != options.expected_latest_version) {
      return absl::FailedPreconditionError(absl::StrCat(
          "upload to '", model, "' expects latest version ", options.expected_latest_version,
          " but it is ", latest));
    }
  }

  const uint64_t upload_number = core_->NewUploadNumber();
  const std::string upload_id = Hex64(upload_number);
  store::UploadRecord record;
  record.set_model(std::string(model));
  record.set_started_unix_micros(NowMicros());
  rocksdb::WriteBatch batch;
  batch.Put(core_->cf(ColumnFamily::kUploads), upload_id, record.SerializeAsString());
  // Registered live first: the record must never look abandoned while the session exists.
  core_->AddLiveUpload(upload_id);
  absl::Status written = core_->Write(batch, "recording an upload", /*sync=*/false);
  if (!written.ok()) {
    core_->EndUpload(upload_id, {});
    return written;
  }
  return std::unique_ptr<UploadSession>(new RocksDbUploadSession(
      core_, upload_id, upload_number, std::move(header), options, std::move(warnings)));
}

absl::StatusOr<std::vector<std::string>> RocksDbCheckpointStore::FindMissingChunks(
    const std::vector<std::string>& sha256s) {
  std::vector<std::string> missing;
  for (const std::string& sha256 : sha256s) {
    if (sha256.size() != kSha256Bytes) {
      return absl::InvalidArgumentError(absl::StrCat("chunk address has ", sha256.size(),
                                                     " bytes; a SHA-256 has ", kSha256Bytes));
    }
    std::string record;
    rocksdb::Status read =
        core_->db()->Get(core_->Read(), core_->cf(ColumnFamily::kRefs), sha256, &record);
    if (read.IsNotFound()) {
      missing.push_back(sha256);
    } else {
      RETURN_IF_ERROR(FromRocksDbStatus(read, "looking up a chunk"));
    }
  }
  return missing;
}

absl::StatusOr<v1::Manifest> RocksDbCheckpointStore::GetManifest(const v1::VersionRef& ref) {
  SnapshotHolder snapshot(core_->db());
  return ReadVersion(*core_, ref, snapshot.get());
}

absl::StatusOr<std::unique_ptr<VersionReader>> RocksDbCheckpointStore::OpenVersion(
    const v1::VersionRef& ref) {
  const int64_t registration = core_->AddReader();  // before the snapshot: see AddReader.
  const rocksdb::Snapshot* snapshot = core_->db()->GetSnapshot();
  absl::StatusOr<v1::Manifest> manifest = ReadVersion(*core_, ref, snapshot);
  if (!manifest.ok()) {
    core_->db()->ReleaseSnapshot(snapshot);
    core_->RemoveReader(registration);
    return manifest.status();
  }
  return std::unique_ptr<VersionReader>(
      new RocksDbVersionReader(core_, registration, snapshot, *std::move(manifest)));
}

absl::Status RocksDbCheckpointStore::ReadTensorChunks(const v1::TensorMeta& meta,
                                                      const ChunkCallback& callback) {
  const int64_t registration = core_->AddReader();
  absl::Status read = core_->ReadChunks(meta, callback, nullptr, "");
  core_->RemoveReader(registration);
  return read;
}

absl::StatusOr<std::vector<v1::ModelInfo>> RocksDbCheckpointStore::ListModels() {
  SnapshotHolder snapshot(core_->db());
  ASSIGN_OR_RETURN(auto models, core_->ReadAllModels(snapshot.get()));
  std::vector<v1::ModelInfo> infos;
  for (const auto& [name, record] : models) {
    v1::ModelInfo& info = infos.emplace_back();
    info.set_name(name);
    info.set_latest_version(record.latest_version());
    info.set_version_count(record.version_count());
    info.set_logical_bytes(record.logical_bytes());
    ASSIGN_OR_RETURN(auto aliases, core_->ReadAliases(name, snapshot.get()));
    for (const auto& [version, names] : aliases) {
      for (const std::string& alias : names) (*info.mutable_aliases())[alias] = version;
    }
  }
  return infos;
}

absl::StatusOr<std::vector<v1::VersionInfo>> RocksDbCheckpointStore::ListVersions(
    absl::string_view model) {
  RETURN_IF_ERROR(ValidateModelName(model));
  SnapshotHolder snapshot(core_->db());
  RETURN_IF_ERROR(core_->ReadExistingModel(model, snapshot.get(), "").status());
  ASSIGN_OR_RETURN(auto aliases, core_->ReadAliases(model, snapshot.get()));
  ASSIGN_OR_RETURN(auto manifests, core_->ReadAllManifests(model, snapshot.get()));
  std::vector<v1::VersionInfo> infos;
  for (const auto& [version, manifest] : manifests) {
    v1::VersionInfo& info = infos.emplace_back();
    info.set_version(version);
    *info.mutable_metadata() = manifest.metadata();
    for (const std::string& alias : aliases[version]) info.add_aliases(alias);
    info.set_logical_bytes(LogicalBytes(manifest));
    info.set_tensor_count(manifest.tensors_size());
    info.set_has_optimizer_state(manifest.has_optimizer_state());
    info.set_has_scheduler_state(manifest.has_scheduler_state());
  }
  return infos;
}

absl::StatusOr<int64_t> RocksDbCheckpointStore::SetAlias(absl::string_view model,
                                                         absl::string_view alias, int64_t version,
                                                         int64_t expected_current_version) {
  RETURN_IF_ERROR(ValidateModelName(model));
  RETURN_IF_ERROR(ValidateAliasName(alias));
  if (version < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("alias '", alias, "' of '", model, "': versions are numbered from 1"));
  }
  absl::MutexLock lock(&core_->mu());
  RETURN_IF_ERROR(core_->ReadExistingModel(model, nullptr, "").status());
  RETURN_IF_ERROR(core_->ReadManifest(model, version, nullptr).status());
  std::string bytes;
  rocksdb::Status read = core_->db()->Get(core_->Read(), core_->cf(ColumnFamily::kAliases),
                                          AliasKey(model, alias), &bytes);
  int64_t previous = 0;
  if (!read.IsNotFound()) {
    RETURN_IF_ERROR(FromRocksDbStatus(read, "reading an alias"));
    absl::StatusOr<uint64_t> decoded = DecodeBigEndian64(bytes);
    if (!decoded.ok()) return absl::DataLossError(absl::StrCat("alias ", model, "@", alias,
                                                               " is unreadable"));
    previous = static_cast<int64_t>(*decoded);
  }
  if (expected_current_version > 0 && previous != expected_current_version) {
    return absl::FailedPreconditionError(absl::StrCat(
        "alias ", model, "@", alias, " ",
        previous == 0 ? std::string("does not exist") : absl::StrCat("points at version ", previous),
        "; expected version ", expected_current_version));
  }
  rocksdb::WriteBatch batch;
  batch.Put(core_->cf(ColumnFamily::kAliases), AliasKey(model, alias),
            EncodeBigEndian64(static_cast<uint64_t>(version)));
  RETURN_IF_ERROR(core_->Write(batch, "setting an alias", /*sync=*/true));
  return previous;
}

absl::Status RocksDbCheckpointStore::DeleteAlias(absl::string_view model,
                                                 absl::string_view alias) {
  RETURN_IF_ERROR(ValidateModelName(model));
  RETURN_IF_ERROR(ValidateAliasName(alias));
  absl::MutexLock lock(&core_->mu());
  std::string bytes;
  rocksdb::Status read = core_->db()->Get(core_->Read(), core_->cf(ColumnFamily::kAliases),
                                          AliasKey(model, alias), &bytes);
  if (read.IsNotFound()) {
    return absl::NotFoundError(absl::StrCat("model '", model, "' has no alias '", alias, "'"));
  }
  RETURN_IF_ERROR(FromRocksDbStatus(read, "reading an alias"));
  rocksdb::WriteBatch batch;
  batch.Delete(core_->cf(ColumnFamily::kAliases), AliasKey(model, alias));
  return core_->Write(batch, "deleting an alias", /*sync=*/true);
}

absl::StatusOr<int64_t> RocksDbCheckpointStore::DeleteVersion(absl::string_view model,
                                                              int64_t version, bool force) {
  RETURN_IF_ERROR(ValidateModelName(model));
  const std::string ref_text = FormatVersionRef(model, version);
  absl::MutexLock lock(&core_->mu());
  ASSIGN_OR_RETURN(ModelRecord record, core_->ReadExistingModel(model, nullptr, ref_text));
  ASSIGN_OR_RETURN(v1::Manifest manifest, core_->ReadManifest(model, version, nullptr));
  ASSIGN_OR_RETURN(auto aliases, core_->ReadAliases(model, nullptr));
  const std::vector<std::string>& pointing = aliases[version];
  if (!pointing.empty() && !force) {
    return absl::FailedPreconditionError(
        absl::StrCat(ref_text, " has aliases ", absl::StrJoin(pointing, ", "),
                     "; move or delete them first, or force the delete"));
  }
  rocksdb::WriteBatch batch;
  RefDeltas deltas;
  AddManifestRefs(manifest, -1, deltas);
  int64_t released = 0;
  RETURN_IF_ERROR(core_->ApplyRefDeltas(deltas, batch, &released, nullptr));
  batch.Delete(core_->cf(ColumnFamily::kVersions), VersionKey(model, version));
  for (const std::string& alias : pointing) {
    batch.Delete(core_->cf(ColumnFamily::kAliases), AliasKey(model, alias));
  }
  record.set_version_count(record.version_count() - 1);
  record.set_logical_bytes(record.logical_bytes() - LogicalBytes(manifest));
  if (record.latest_version() == version) {
    ASSIGN_OR_RETURN(int64_t newest, core_->NewestVersionExcept(model, {version}));
    record.set_latest_version(newest);
  }
  batch.Put(core_->cf(ColumnFamily::kModels), ToSlice(model), record.SerializeAsString());
  RETURN_IF_ERROR(core_->Write(batch, absl::StrCat("deleting ", ref_text), /*sync=*/true));
  return released;
}

absl::StatusOr<v1::ApplyRetentionResponse> RocksDbCheckpointStore::ApplyRetention(
    absl::string_view model, const v1::RetentionPolicy& policy, bool dry_run) {
  RETURN_IF_ERROR(ValidateModelName(model));
  if (policy.keep_last() < 0 || policy.keep_every() < 0 ||
      policy.drop_optimizer_state_older_than() < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "retention policy numbers must be >= 0; got keep_last ", policy.keep_last(),
        ", keep_every ", policy.keep_every(), ", drop_optimizer_state_older_than ",
        policy.drop_optimizer_state_older_than()));
  }
  absl::MutexLock lock(&core_->mu());
  ASSIGN_OR_RETURN(ModelRecord record, core_->ReadExistingModel(model, nullptr, ""));
  ASSIGN_OR_RETURN(auto aliases, core_->ReadAliases(model, nullptr));
  ASSIGN_OR_RETURN(auto manifests, core_->ReadAllManifests(model, nullptr));

  // Newest first.
  std::reverse(manifests.begin(), manifests.end());
  v1::ApplyRetentionResponse response;
  std::vector<size_t> to_delete, to_drop;
  for (size_t rank = 0; rank < manifests.size(); ++rank) {
    const int64_t version = manifests[rank].first;
    const bool aliased = aliases.count(version) > 0 && !aliases[version].empty();
    const bool protected_version = aliased || version == record.latest_version();
    const bool kept = policy.keep_last() == 0 ||
                      rank < static_cast<size_t>(policy.keep_last()) ||
                      (policy.keep_every() > 0 && version % policy.keep_every() == 0) ||
                      protected_version;
    if (!kept) {
      to_delete.push_back(rank);
      continue;
    }
    if (policy.drop_optimizer_state_older_than() > 0 && !protected_version &&
        rank >= static_cast<size_t>(policy.drop_optimizer_state_older_than()) &&
        manifests[rank].second.has_optimizer_state()) {
      to_drop.push_back(rank);
    }
  }
  for (auto it = to_delete.rbegin(); it != to_delete.rend(); ++it) {
    response.add_deleted_versions(manifests[*it].first);
  }
  for (auto it = to_drop.rbegin(); it != to_drop.rend(); ++it) {
    response.add_optimizer_state_dropped(manifests[*it].first);
  }
  if (dry_run || (to_delete.empty() && to_drop.empty())) return response;

  rocksdb::WriteBatch batch;
  RefDeltas deltas;
  for (size_t rank : to_delete) {
    const auto& [version, manifest] = manifests[rank];
    AddManifestRefs(manifest, -1, deltas);
    batch.Delete(core_->cf(ColumnFamily::kVersions), VersionKey(model, version));
    record.set_version_count(record.version_count() - 1);
    record.set_logical_bytes(record.logical_bytes() - LogicalBytes(manifest));
  }
  for (size_t rank : to_drop) {
    auto& [version, manifest] = manifests[rank];
    for (const v1::TensorMeta& removed : DropOptimizerState(manifest)) {
      AddTensorRefs(removed, -1, deltas);
      record.set_logical_bytes(record.logical_bytes() - removed.byte_length());
    }
    batch.Put(core_->cf(ColumnFamily::kVersions), VersionKey(model, version),
              manifest.SerializeAsString());
  }
  RETURN_IF_ERROR(core_->ApplyRefDeltas(deltas, batch, nullptr, nullptr));
  batch.Put(core_->cf(ColumnFamily::kModels), ToSlice(model), record.SerializeAsString());
  RETURN_IF_ERROR(core_->Write(batch, absl::StrCat("applying retention to '", model, "'"),
                               /*sync=*/true));
  return response;
}

absl::StatusOr<v1::GarbageCollectResponse> RocksDbCheckpointStore::GarbageCollect(bool dry_run) {
  absl::MutexLock lock(&core_->mu());
  rocksdb::DB* db = core_->db();
  absl::flat_hash_set<std::string> protected_chunks;
  for (const auto& [sha256, count] : core_->pinned_chunks()) protected_chunks.insert(sha256);

  // Upload records: id -> (record, pinned chunk -> length).
  struct Upload {
    std::optional<store::UploadRecord> record;
    std::vector<std::pair<std::string, int64_t>> chunks;
  };
  std::map<std::string, Upload> uploads;
  {
    std::unique_ptr<rocksdb::Iterator> it(
        db->NewIterator(core_->Read(), core_->cf(ColumnFamily::kUploads)));
    for (it->SeekToFirst(); it->Valid(); it->Next()) {
      const absl::string_view key = ToView(it->key());
      if (key.size() < kUploadIdLength) continue;
      Upload& upload = uploads[std::string(key.substr(0, kUploadIdLength))];
      if (key.size() == kUploadIdLength) {
        store::UploadRecord record;
        RETURN_IF_ERROR(ParseRecord(ToView(it->value()), record, "upload"));
        upload.record = std::move(record);
      } else {
        absl::StatusOr<uint64_t> length = DecodeBigEndian64(ToView(it->value()));
        upload.chunks.emplace_back(std::string(key.substr(kUploadIdLength)),
                                   length.ok() ? static_cast<int64_t>(*length) : 0);
      }
    }
    RETURN_IF_ERROR(FromRocksDbStatus(it->status(), "listing uploads"));
  }
  const int64_t cutoff = absl::ToUnixMicros(absl::Now() - core_->options().abandoned_upload_grace);
  std::vector<const std::string*> abandoned;
  for (const auto& [id, upload] : uploads) {
    const bool live = core_->live_uploads().contains(id);
    // Pins without a header record belong to an upload whose record is already gone.
    const int64_t started = upload.record.has_value() ? upload.record->started_unix_micros() : 0;
    if (!live && started <= cutoff) {
      abandoned.push_back(&id);
    } else {
      for (const auto& [sha256, length] : upload.chunks) protected_chunks.insert(sha256);
    }
  }

  rocksdb::WriteBatch batch;
  absl::flat_hash_map<std::string, int64_t> freed;
  {
    std::unique_ptr<rocksdb::Iterator> it(
        db->NewIterator(core_->Read(), core_->cf(ColumnFamily::kRefs)));
    for (it->SeekToFirst(); it->Valid(); it->Next()) {
      ChunkRecord record;
      RETURN_IF_ERROR(ParseRecord(ToView(it->value()), record, "chunk refcount"));
      if (record.refcount() != 0) continue;
      std::string sha256 = it->key().ToString();
      if (protected_chunks.contains(sha256)) continue;
      batch.Delete(core_->cf(ColumnFamily::kRefs), sha256);
      batch.Delete(core_->cf(ColumnFamily::kChunks), sha256);
      batch.Delete(core_->cf(ColumnFamily::kPackedChunks), sha256);
      freed.emplace(std::move(sha256), record.length());
    }
    RETURN_IF_ERROR(FromRocksDbStatus(it->status(), "listing chunk refcounts"));
  }
  for (const std::string* id : abandoned) {
    const Upload& upload = uploads[*id];
    for (const auto& [sha256, length] : upload.chunks) {
      batch.Delete(core_->cf(ColumnFamily::kUploads), UploadChunkKey(*id, sha256));
      if (protected_chunks.contains(sha256) || freed.contains(sha256)) continue;
      std::string record;
      rocksdb::Status read = db->Get(core_->Read(), core_->cf(ColumnFamily::kRefs), sha256, &record);
      if (read.ok()) continue;  // committed by some version since: not ours to free.
      if (!read.IsNotFound()) return FromRocksDbStatus(read, "looking up a chunk");
      batch.Delete(core_->cf(ColumnFamily::kChunks), sha256);
      batch.Delete(core_->cf(ColumnFamily::kPackedChunks), sha256);
      freed.emplace(sha256, length);
    }
    batch.Delete(core_->cf(ColumnFamily::kUploads), *id);
  }

  v1::GarbageCollectResponse response;
  response.set_chunks_freed(static_cast<int64_t>(freed.size()));
  int64_t bytes = 0;
  for (const auto& [sha256, length] : freed) bytes += length;
  response.set_bytes_freed(bytes);
  response.set_abandoned_uploads_reclaimed(static_cast<int64_t>(abandoned.size()));
  if (dry_run) return response;
  if (batch.Count() > 0) {
    // Deleted schema-1 chunk values leave blob files as garbage; blob GC during compaction
    // returns that space (rocksdb_schema.cc). Pack space comes back below.
    RETURN_IF_ERROR(core_->WriteDurably(batch, "collecting garbage"));
  }
  absl::flat_hash_set<uint64_t> writing;
  for (const auto& [id, upload] : uploads) {
    uint64_t number = 0;
    if (absl::SimpleHexAtoi(id, &number)) writing.insert(number);
  }
  for (const std::string* id : abandoned) {
    uint64_t number = 0;
    if (absl::SimpleHexAtoi(*id, &number)) writing.erase(number);
  }
  for (const std::string& id : core_->live_uploads()) {
    uint64_t number = 0;
    if (absl::SimpleHexAtoi(id, &number)) writing.insert(number);
  }
  RETURN_IF_ERROR(core_->ReclaimPacks(writing));
  return response;
}

absl::StatusOr<v1::VerifyResponse> RocksDbCheckpointStore::Verify(absl::string_view model,
                                                                  int64_t version) {
  // Registered before the snapshot, as OpenVersion does: GC keeps removed packs readable.
  struct Unregister {
    Core* core;
    int64_t registration;
    ~Unregister() { core->RemoveReader(registration); }
  } unregister{core_.get(), core_->AddReader()};
  SnapshotHolder snapshot(core_->db());
  const rocksdb::Snapshot* snap = snapshot.get();
  const bool whole_store = model.empty();
  if (version < 0) return absl::InvalidArgumentError("Verify: version must be >= 0");
  if (whole_store && version != 0) {
    return absl::InvalidArgumentError("Verify: a version needs a model");
  }

  std::vector<std::string> models;
  if (whole_store) {
    ASSIGN_OR_RETURN(auto records, core_->ReadAllModels(snap));
    for (auto& [name, record] : records) models.push_back(name);
  } else {
    RETURN_IF_ERROR(ValidateModelName(model));
    RETURN_IF_ERROR(core_->ReadExistingModel(model, snap, "").status());
    models.emplace_back(model);
  }

  v1::VerifyResponse response;
  absl::flat_hash_map<std::string, std::string> checked;  // chunk -> problem ("" if sound).
  absl::flat_hash_map<std::string, int64_t> references;   // chunk -> ChunkRefs seen.
  auto add_problem = [&](absl::string_view model_name, int64_t problem_version,
                         absl::string_view tensor_key, absl::string_view sha256,
                         std::string message) {
    v1::VerifyProblem* problem = response.add_problems();
    problem->set_model(std::string(model_name));
    problem->set_version(problem_version);
    problem->set_tensor_key(std::string(tensor_key));
    problem->set_chunk_sha256(std::string(sha256));
    problem->set_message(std::move(message));
  };
  auto verify_manifest = [&](const std::string& model_name, int64_t manifest_version,
                             const v1::Manifest& manifest) {
    const std::string where = FormatVersionRef(model_name, manifest_version);
    auto verify_tensor = [&](const v1::TensorMeta& meta) {
      int64_t total = 0;
      for (const v1::ChunkRef& chunk : meta.chunks()) {
        total += chunk.length();
        ++references[chunk.sha256()];
        auto [it, first] = checked.try_emplace(chunk.sha256());
        if (first) {
          it->second = core_->CheckChunk(chunk, snap);
          response.set_chunks_checked(response.chunks_checked() + 1);
          response.set_bytes_checked(response.bytes_checked() + chunk.length());
        }
        if (!it->second.empty()) {
          add_problem(model_name, manifest_version, meta.key(), chunk.sha256(),
                      absl::StrCat(where, " tensor '", meta.key(), "' chunk ",
                                   HexEncode(chunk.sha256()), ": ", it->second));
        }
      }
      if (total != meta.byte_length()) {
        add_problem(model_name, manifest_version, meta.key(), "",
                    absl::StrCat(where, " tensor '", meta.key(), "': chunks hold ", total,
                                 " bytes, byte_length is ", meta.byte_length()));
      }
    };
    for (const v1::TensorMeta& meta : manifest.tensors()) verify_tensor(meta);
    for (const v1::TensorMeta& meta : manifest.state_tensors()) verify_tensor(meta);
  };

  for (const std::string& model_name : models) {
    if (version > 0) {
      ASSIGN_OR_RETURN(v1::Manifest manifest, core_->ReadManifest(model_name, version, snap));
      verify_manifest(model_name, version, manifest);
      continue;
    }
    ASSIGN_OR_RETURN(auto manifests, core_->ReadAllManifests(model_name, snap));
    for (const auto& [manifest_version, manifest] : manifests) {
      verify_manifest(model_name, manifest_version, manifest);
    }
  }

  if (whole_store) {
    // Refcounts must equal the ChunkRefs of all manifests.
    std::unique_ptr<rocksdb::Iterator> it(
        core_->db()->NewIterator(core_->Read(snap), core_->cf(ColumnFamily::kRefs)));
    for (it->SeekToFirst(); it->Valid(); it->Next()) {
      const std::string sha256 = it->key().ToString();
      ChunkRecord record;
      if (!ParseRecord(ToView(it->value()), record, "refcount").ok()) {
        add_problem("", 0, "", sha256,
                    absl::StrCat("chunk ", HexEncode(sha256), ": unreadable refcount record"));
        continue;
      }
      auto found = references.find(sha256);
      const int64_t expected = found == references.end() ? 0 : found->second;
      if (record.refcount() != expected) {
        add_problem("", 0, "", sha256,
                    absl::StrCat("chunk ", HexEncode(sha256), ": refcount ", record.refcount(),
                                 " recorded, but manifests reference it ", expected, " times"));
      }
      if (found != references.end()) references.erase(found);
    }
    RETURN_IF_ERROR(FromRocksDbStatus(it->status(), "listing chunk refcounts"));
    for (const auto& [sha256, count] : references) {
      add_problem("", 0, "", sha256,
                  absl::StrCat("chunk ", HexEncode(sha256), ": manifests reference it ", count,
                               " times, but it has no refcount record"));
    }
  }
  return response;
}

absl::StatusOr<v1::StoreStats> RocksDbCheckpointStore::GetStats() {
  SnapshotHolder snapshot(core_->db());
  v1::StoreStats stats;
  ASSIGN_OR_RETURN(auto models, core_->ReadAllModels(snapshot.get()));
  for (const auto& [name, record] : models) {
    stats.set_models(stats.models() + 1);
    stats.set_versions(stats.versions() + record.version_count());
    stats.set_logical_bytes(stats.logical_bytes() + record.logical_bytes());
  }
  std::unique_ptr<rocksdb::Iterator> it(
      core_->db()->NewIterator(core_->Read(snapshot.get()), core_->cf(ColumnFamily::kRefs)));
  for (it->SeekToFirst(); it->Valid(); it->Next()) {
    ChunkRecord record;
    RETURN_IF_ERROR(ParseRecord(ToView(it->value()), record, "chunk refcount"));
    stats.set_chunks(stats.chunks() + 1);
    stats.set_physical_bytes(stats.physical_bytes() + record.length());
  }
  RETURN_IF_ERROR(FromRocksDbStatus(it->status(), "listing chunk refcounts"));
  stats.set_uploads_in_progress(core_->LiveUploadCount());
  return stats;
}

}  // namespace ckpt

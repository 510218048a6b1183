#ifndef CKPT_LIBS_STORE_INTERNAL_ROCKSDB_STORE_CORE_H_
#define CKPT_LIBS_STORE_INTERNAL_ROCKSDB_STORE_CORE_H_

// RocksDbCheckpointStore's private core, shared by its files (listed in srcs only): Core -- the
// store's RocksDB handle, record reads and writes, chunk I/O over its ChunkBackend (pack files
// or an object store, chunk_backend.h), pack space,
// readers' registrations and live uploads. The public API
// is rocksdb_checkpoint_store.h; the upload session is internal/rocksdb_upload_session.h.
//
// The files, by concern (as RocksDB splits db_impl.cc):
//   rocksdb_checkpoint_store.cc              open, begin upload, reads, versions and aliases
//   rocksdb_checkpoint_store_maintenance.cc  retention, garbage collection, verify, stats
//   rocksdb_checkpoint_store_audit.cc        the audit log: begin, finish, list
//   internal/rocksdb_upload_session.cc       the upload session and its hashing pipeline
//   internal/rocksdb_store_core.h            this file
//   internal/rocksdb_store_records.h         small helpers every file uses

#include <cstdio>

#include "libs/store/chunk_layout.h"
#include "libs/store/internal/rocksdb_store_records.h"

namespace ckpt {

// The helpers above are this store's own; its files use them unqualified.
using namespace rocksdb_store_internal;  // NOLINT(build/namespaces): a private header.

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
  Core(StoreOptions options, std::unique_ptr<StoreDb> db, std::shared_ptr<ChunkBackend> packs,
       bool skip_hashing)
      : options_(std::move(options)),
        skip_hashing_(skip_hashing),
        store_db_(std::move(db)),
        db_(store_db_->db()),
        packs_(std::move(packs)) {
    std::random_device random;
    upload_id_base_ = (static_cast<uint64_t>(random()) << 32) ^ random();
  }

  const StoreOptions& options() const { return options_; }
  // StoreBenchmarkSeams::OpenWithoutHashing: chunks get serial addresses, nothing is hashed.
  bool skip_hashing() const { return skip_hashing_; }
  rocksdb::DB* db() const { return db_; }
  ChunkBackend& packs() const { return *packs_; }

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

  // A synced write (sync, and StoreOptions::sync_commits) is an acknowledged one: numbered, so
  // that a write-ahead log that later loses it is refused on open (StoreDb::WriteAcknowledged).
  absl::Status Write(rocksdb::WriteBatch& batch, absl::string_view what, bool sync) {
    if (sync && options_.sync_commits) return store_db_->WriteAcknowledged(batch, what);
    rocksdb::WriteOptions write;
    return FromRocksDbStatus(db_->Write(write, &batch), what);
  }

  // Synced whatever sync_commits says: for batches after which files are removed (GC), whose loss
  // in a power failure would bring back locations naming deleted packs.
  absl::Status WriteDurably(rocksdb::WriteBatch& batch, absl::string_view what) {
    return store_db_->WriteAcknowledged(batch, what);
  }

  // ---- Records.

  absl::StatusOr<std::optional<ModelRecord>> ReadModel(absl::string_view model,
                                                       const rocksdb::Snapshot* snapshot) const {
    std::string bytes;
    rocksdb::Status read =
        db_->Get(Read(snapshot), cf(ColumnFamily::kModels), ToSlice(model), &bytes);
    if (read.IsNotFound()) return std::nullopt;
    RETURN_IF_ERROR(FromRocksDbStatus(read, absl::StrCat("reading model '", model, "'")));
    ModelRecord record;
    RETURN_IF_ERROR(ParseRecord(bytes, record, absl::StrCat("model '", model, "'")));
    return record;
  }

  // A deleted model's record (ModelRecord.deleted) is returned like any other: its version counter
  // still counts. ReadExistingModel and ReadAllModels leave deleted models out.
  absl::StatusOr<ModelRecord> ReadExistingModel(absl::string_view model,
                                                const rocksdb::Snapshot* snapshot,
                                                absl::string_view ref_text) const {
    ASSIGN_OR_RETURN(std::optional<ModelRecord> record, ReadModel(model, snapshot));
    if (!record.has_value() || record->deleted()) {
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
        return absl::InvalidArgumentError(absl::StrCat(ref_text, ": versions are numbered from 1"));
      }
      return ref.version();
    }
    if (ref.alias().empty() || ref.alias() == kLatestAlias) {
      if (record.latest_version() == 0) {
        return absl::NotFoundError(
            absl::StrCat(ref_text, " not found: model '", ref.model(), "' has no versions"));
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
    rocksdb::Status read =
        db_->Get(Read(snapshot), cf(ColumnFamily::kVersions), VersionKey(model, version), &bytes);
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
      aliases[static_cast<int64_t>(*version)].emplace_back(AliasFromKey(ToView(it->key()), model));
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

  // Every model that is not deleted, by name.
  absl::StatusOr<std::vector<std::pair<std::string, ModelRecord>>> ReadAllModels(
      const rocksdb::Snapshot* snapshot) const {
    std::vector<std::pair<std::string, ModelRecord>> models;
    std::unique_ptr<rocksdb::Iterator> it(
        db_->NewIterator(Read(snapshot), cf(ColumnFamily::kModels)));
    for (it->SeekToFirst(); it->Valid(); it->Next()) {
      ModelRecord record;
      RETURN_IF_ERROR(ParseRecord(ToView(it->value()), record,
                                  absl::StrCat("model '", ToView(it->key()), "'")));
      if (record.deleted()) continue;
      models.emplace_back(it->key().ToString(), std::move(record));
    }
    RETURN_IF_ERROR(FromRocksDbStatus(it->status(), "listing models"));
    return models;
  }

  // `model`'s ModelInfo: counts, details and aliases as `snapshot` sees them.
  absl::StatusOr<v1::ModelInfo> BuildModelInfo(const std::string& model, const ModelRecord& record,
                                               const rocksdb::Snapshot* snapshot) const {
    v1::ModelInfo info;
    info.set_name(model);
    info.set_latest_version(record.latest_version());
    info.set_version_count(record.version_count());
    info.set_logical_bytes(record.logical_bytes());
    *info.mutable_details() = record.details();
    ASSIGN_OR_RETURN(auto aliases, ReadAliases(model, snapshot));
    for (const auto& [version, names] : aliases) {
      for (const std::string& alias : names) (*info.mutable_aliases())[alias] = version;
    }
    return info;
  }

  // Adds the removal of `manifest`'s version of `model` to `batch` -- its manifest, annotations
  // and the aliases `pointing` at it -- and its chunk references to `deltas` (which the caller
  // applies once, with ApplyRefDeltas, for all the versions of one batch), and takes its counts
  // out of `record`. `record.latest_version` is the caller's to fix.
  void StageVersionDelete(absl::string_view model, const v1::Manifest& manifest,
                          const std::vector<std::string>& pointing, ModelRecord& record,
                          RefDeltas& deltas, rocksdb::WriteBatch& batch) const {
    AddManifestRefs(manifest, -1, deltas);
    batch.Delete(cf(ColumnFamily::kVersions), VersionKey(model, manifest.version()));
    batch.Delete(cf(ColumnFamily::kAnnotations), VersionKey(model, manifest.version()));
    for (const std::string& alias : pointing) {
      batch.Delete(cf(ColumnFamily::kAliases), AliasKey(model, alias));
    }
    record.set_version_count(record.version_count() - 1);
    record.set_logical_bytes(record.logical_bytes() - LogicalBytes(manifest));
  }

  // Newest version of `model` other than those in `excluded`; 0 if none.
  absl::StatusOr<int64_t> NewestVersionExcept(absl::string_view model,
                                              const std::set<int64_t>& excluded) const {
    const std::string prefix = ModelPrefix(model);
    std::unique_ptr<rocksdb::Iterator> it(db_->NewIterator(Read(), cf(ColumnFamily::kVersions)));
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
          return absl::DataLossError(
              absl::StrCat("chunk ", HexEncode(sha256),
                           " has no refcount record but a manifest references it; run verify"));
        }
        record.set_length(delta.length);
        record.set_xxh3_64(delta.xxh3_64);
        record.set_created_unix_micros(now);
        if (new_bytes != nullptr) *new_bytes += delta.length;
      } else {
        RETURN_IF_ERROR(FromRocksDbStatus(read, "reading a chunk refcount"));
        RETURN_IF_ERROR(
            ParseRecord(bytes, record, absl::StrCat("refcount of chunk ", HexEncode(sha256))));
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
    rocksdb::Status read =
        db_->Get(Read(snapshot), cf(ColumnFamily::kPackedChunks), chunk.sha256(), &location_bytes);
    if (read.ok()) {
      PackedChunk record;
      RETURN_IF_ERROR(ParseRecord(location_bytes, record, "chunk location"));
      if (record.length() != chunk.length()) {
        return absl::DataLossError(
            absl::StrCat("stored ", record.length(), " bytes; the manifest says ", chunk.length()));
      }
      return packs_->Read({record.pack_id(), record.offset(), record.length()}, destination);
    }
    if (!read.IsNotFound()) return FromRocksDbStatus(read, "looking up a chunk location");
    rocksdb::PinnableSlice value;
    read = db_->Get(Read(snapshot), cf(ColumnFamily::kChunks), chunk.sha256(), &value);
    if (read.IsNotFound()) return absl::NotFoundError("missing from the store");
    RETURN_IF_ERROR(FromRocksDbStatus(read, "reading an inline chunk"));
    if (static_cast<int64_t>(value.size()) != chunk.length()) {
      return absl::DataLossError(
          absl::StrCat("stored ", value.size(), " bytes; the manifest says ", chunk.length()));
    }
    std::memcpy(destination, value.data(), value.size());
    return absl::OkStatus();
  }

  // Where `chunk` lives in a pack; nullopt for a schema-1 inline chunk or a missing one.
  absl::StatusOr<std::optional<PackLocation>> FindPackLocation(
      const v1::ChunkRef& chunk, const rocksdb::Snapshot* snapshot) const {
    std::string location_bytes;
    rocksdb::Status read =
        db_->Get(Read(snapshot), cf(ColumnFamily::kPackedChunks), chunk.sha256(), &location_bytes);
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
                        where.empty() ? "" : absl::StrCat(" of ", where), " (bytes ", offset, "..",
                        offset + chunk.length(), ")");
  }

  static absl::Status CheckChunkBytes(const v1::TensorMeta& meta, const v1::ChunkRef& chunk,
                                      int64_t offset, absl::string_view where,
                                      absl::string_view bytes) {
    const uint64_t xxh3 = Xxh3(bytes);
    if (xxh3 != chunk.xxh3_64()) {
      return absl::DataLossError(
          absl::StrCat(ChunkName(meta, chunk, offset, where), " fails its xxh3 checksum (expected ",
                       Hex64(chunk.xxh3_64()), ", computed ", Hex64(xxh3),
                       "): the stored bytes are corrupt and were not returned"));
    }
    return absl::OkStatus();
  }

  // Reads every chunk of `meta` into `destination` (byte_length bytes), checking each one's
  // length and location and, with `check_xxh3`, its checksum (see
  // VersionReader::ReadTensorIntoForCheckingReceiver for who may skip that).
  absl::Status ReadTensorInto(const v1::TensorMeta& meta, char* destination,
                              const rocksdb::Snapshot* snapshot, absl::string_view where,
                              bool check_xxh3 = true) const {
    RETURN_IF_ERROR(CheckChunkLayout(meta));
    int64_t offset = 0;
    for (const v1::ChunkRef& chunk : meta.chunks()) {
      absl::Status read = ReadChunkInto(chunk, snapshot, destination + offset);
      if (!read.ok()) return ChunkReadError(meta, chunk, offset, where, read);
      if (check_xxh3) {
        RETURN_IF_ERROR(CheckChunkBytes(meta, chunk, offset, where,
                                        absl::string_view(destination + offset, chunk.length())));
      }
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
    // A backend that cannot map (an object store): the caller reads the tensor instead.
    if (meta.chunks_size() == 0 || !packs_->CanMap()) return mapped;
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
      return ChunkReadError(meta, meta.chunks(0), 0, where,
                            absl::DataLossError(absl::StrCat(
                                "pack ", PackFileName(whole->pack_id), " bytes ", whole->offset,
                                "..", whole->offset + whole->length, " lie beyond the end of the ",
                                region->size(), "-byte file")));
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
                                absl::string_view bytes, int64_t alignment, ChunkWriter& pack,
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

  // Pins the committed chunk `sha256` for an upload that references it without its bytes
  // (UploadSession::AddStoredChunk) and returns its digest from the chunk's record. NOT_FOUND when
  // the store holds no committed chunk of that address. The pin stays either way (released with
  // the upload's others): GC may not take the chunk between this look-up and the commit.
  absl::StatusOr<ChunkDigest> PinStoredChunk(absl::string_view sha256,
                                             absl::flat_hash_set<std::string>& pinned) {
    if (pinned.insert(std::string(sha256)).second) {
      absl::MutexLock lock(&mu_);
      ++pinned_chunks_[std::string(sha256)];
    }
    std::string bytes;
    rocksdb::Status read = db_->Get(Read(), cf(ColumnFamily::kRefs),
                                    rocksdb::Slice(sha256.data(), sha256.size()), &bytes);
    if (read.IsNotFound()) {
      return absl::NotFoundError(absl::StrCat("the store holds no committed chunk ",
                                              HexEncode(sha256), ": send its bytes"));
    }
    RETURN_IF_ERROR(FromRocksDbStatus(read, "looking up a chunk"));
    ChunkRecord record;
    RETURN_IF_ERROR(
        ParseRecord(bytes, record, absl::StrCat("refcount of chunk ", HexEncode(sha256))));
    ChunkDigest digest;
    digest.sha256 = std::string(sha256);
    digest.length = record.length();
    digest.xxh3_64 = record.xxh3_64();
    return digest;
  }

  // ---- Pack space.

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
                                              absl::Time cutoff) ABSL_LOCKS_EXCLUDED(mu_) {
    ReclaimOutcome outcome;
    auto report = [&](absl::string_view what, const absl::Status& status) {
      ++outcome.removals_failed;
      std::fprintf(stderr, "ckpt store gc: %s failed (left for a later pass): %s\n",
                   std::string(what).c_str(), status.ToString().c_str());
    };
    auto unknown_age = [&](absl::string_view what) {
      ++outcome.unknown_age;
      std::fprintf(stderr, "ckpt store gc: %s has no time in %s's listing: kept as young\n",
                   std::string(what).c_str(), packs_->Describe().c_str());
    };
    // Uploads begun since the caller computed `writing` are live: their packs are kept too.
    auto add_live_uploads = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      for (const std::string& id : live_uploads_) {
        uint64_t number = 0;
        if (absl::SimpleHexAtoi(id, &number)) writing.insert(number);
      }
    };

    ASSIGN_OR_RETURN(const std::vector<PendingPack> pending, packs_->ListPending());
    {
      absl::MutexLock lock(&mu_);
      add_live_uploads();
    }
    // An upload begun after this point started after `cutoff` (taken before the pass), so the
    // age test keeps it.
    for (const PendingPack& write : pending) {
      if (writing.contains(write.pack_id)) continue;
      const std::string what =
          absl::StrCat("pending write ", write.handle, " of pack ", PackFileName(write.pack_id));
      if (write.started == absl::InfinitePast()) {
        unknown_age(what);
        continue;
      }
      if (write.started > cutoff) continue;
      absl::Status aborted = packs_->AbortPending(write);
      if (!aborted.ok()) report(absl::StrCat("aborting ", what), aborted);
    }
    ASSIGN_OR_RETURN(const std::vector<PackInfo> files, packs_->List());

    std::vector<std::pair<uint64_t, std::vector<std::pair<std::string, PackLocation>>>> compact;
    {
      absl::MutexLock lock(&mu_);
      add_live_uploads();
      absl::flat_hash_map<uint64_t, std::vector<std::pair<std::string, PackLocation>>> live;
      ASSIGN_OR_RETURN(const auto live_bytes, ReadLiveLocations(live));
      for (const PackInfo& file : files) {
        const uint64_t pack_id = file.pack_id;
        const int64_t size = file.size;
        if (writing.contains(pack_id)) continue;
        auto found = live_bytes.find(pack_id);
        const bool unnamed = found == live_bytes.end();
        const bool sparse =
            !unnamed && found->second < kCompactPackBelowLiveFraction * static_cast<double>(size) &&
            size - found->second >= kCompactPackMinDeadBytes;
        if (!unnamed && !sparse) continue;  // in use and dense: its age does not matter.
        if (file.last_modified.has_value()) {
          if (*file.last_modified == absl::InfinitePast()) {
            unknown_age(absl::StrCat("pack ", PackFileName(pack_id)));
            continue;
          }
          if (*file.last_modified > cutoff) continue;
        }
        if (unnamed) {
          absl::Status removed = packs_->Remove(pack_id, db_->GetLatestSequenceNumber());
          if (!removed.ok()) report(absl::StrCat("removing pack ", PackFileName(pack_id)), removed);
        } else {
          compact.emplace_back(pack_id, std::move(live[pack_id]));
        }
      }
    }
    for (auto& [pack_id, chunks] : compact) {
      absl::Status compacted = CompactPack(pack_id, chunks);
      if (!compacted.ok())
        report(absl::StrCat("compacting pack ", PackFileName(pack_id)), compacted);
    }
    // Readers on an older snapshot may still read removed packs through their descriptors.
    outcome.removals_failed += packs_->ReleaseRemoved(OldestReaderSequence());
    return outcome;
  }

  // Every committed chunk location, by pack, and the live bytes of each pack.
  absl::StatusOr<absl::flat_hash_map<uint64_t, int64_t>> ReadLiveLocations(
      absl::flat_hash_map<uint64_t, std::vector<std::pair<std::string, PackLocation>>>& live)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    absl::flat_hash_map<uint64_t, int64_t> live_bytes;
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
    return live_bytes;
  }

  // Copies the live chunks of pack `pack_id` to a new pack (in their order; a chunk on a 4096- or
  // 64-byte boundary stays on one, so tensors stay mappable, at the price of padding a chunk that
  // sat on a page by chance) and syncs it, outside mu_; then, under mu_, moves the locations that
  // still name the old copy (a commit may have moved a chunk to its own pack meanwhile: that
  // location stands) and removes the old pack, which nothing can name any more.
  absl::Status CompactPack(uint64_t pack_id,
                           std::vector<std::pair<std::string, PackLocation>>& chunks)
      ABSL_LOCKS_EXCLUDED(mu_) {
    std::sort(chunks.begin(), chunks.end(),
              [](const auto& a, const auto& b) { return a.second.offset < b.second.offset; });
    ASSIGN_OR_RETURN(std::unique_ptr<ChunkWriter> writer, packs_->NewPack(NewUploadNumber()));
    std::vector<PackLocation> moved;
    moved.reserve(chunks.size());
    std::string buffer;
    for (const auto& [sha256, location] : chunks) {
      buffer.resize(static_cast<size_t>(location.length));
      RETURN_IF_ERROR(packs_->Read(location, buffer.data()));
      const int64_t alignment = location.offset % 4096 == 0 ? 4096
                                : location.offset % 64 == 0 ? 64
                                                            : 1;
      ASSIGN_OR_RETURN(const int64_t offset, writer->Append(buffer, alignment));
      moved.push_back(PackLocation{writer->pack_id(), offset, location.length});
    }
    RETURN_IF_ERROR(writer->Sync());
    absl::MutexLock lock(&mu_);
    rocksdb::WriteBatch batch;
    for (size_t i = 0; i < chunks.size(); ++i) {
      const auto& [sha256, location] = chunks[i];
      std::string value;
      rocksdb::Status read = db_->Get(Read(), cf(ColumnFamily::kPackedChunks), sha256, &value);
      if (read.IsNotFound()) continue;
      RETURN_IF_ERROR(FromRocksDbStatus(read, "reading a chunk location"));
      PackedChunk record;
      RETURN_IF_ERROR(ParseRecord(value, record, "chunk location"));
      if (record.pack_id() != location.pack_id || record.offset() != location.offset) continue;
      batch.Put(cf(ColumnFamily::kPackedChunks), sha256, EncodeLocation(moved[i]));
    }
    if (batch.Count() > 0) {
      RETURN_IF_ERROR(WriteDurably(
          batch, absl::StrCat("relocating the chunks of pack ", PackFileName(pack_id))));
    } else {
      // Every chunk moved elsewhere meanwhile: the copy is named by nothing either.
      RETURN_IF_ERROR(packs_->Remove(writer->pack_id(), db_->GetLatestSequenceNumber()));
    }
    return packs_->Remove(pack_id, db_->GetLatestSequenceNumber());
  }

  // Held by GarbageCollect for a whole pass, so that passes never overlap (ReclaimPacks relies on
  // being the only writer of packs other than uploads' own).
  absl::Mutex& gc_mu() { return gc_mu_; }

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

  void EndUploadLocked(const std::string& upload_id, const absl::flat_hash_set<std::string>& pinned)
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
  absl::Status LoadAuditLog() {
    std::unique_ptr<rocksdb::Iterator> it(db_->NewIterator(Read(), cf(ColumnFamily::kAudit)));
    it->SeekToLast();
    int64_t last_sequence = 0, last_unix_micros = 0;
    if (it->Valid()) {
      absl::StatusOr<uint64_t> sequence = DecodeBigEndian64(ToView(it->key()));
      if (!sequence.ok()) {
        return absl::DataLossError(absl::StrCat("the newest audit record's key has ",
                                                it->key().size(), " bytes; keys have 8"));
      }
      v1::AuditRecord record;
      RETURN_IF_ERROR(
          ParseRecord(ToView(it->value()), record, absl::StrCat("audit record ", *sequence)));
      last_sequence = static_cast<int64_t>(*sequence);
      last_unix_micros = record.unix_micros();
    }
    RETURN_IF_ERROR(FromRocksDbStatus(it->status(), "finding the newest audit record"));
    absl::MutexLock lock(&audit_log_.mu);
    audit_log_.last_sequence = last_sequence;
    audit_log_.last_unix_micros = last_unix_micros;
    return absl::OkStatus();
  }

  // ---- Registry history and annotations (rocksdb_checkpoint_store_registry.cc).

  // Gives `event` the next sequence number and the time, and adds it to `batch`, which the
  // caller writes under mu() (so history keys become visible in sequence order, and a watcher
  // that has read up to N never later finds an event below N). After the write succeeds, the
  // caller calls PublishHistory with the returned sequence. An empty identity is "unknown".
  int64_t AppendEvent(rocksdb::WriteBatch& batch, v1::RegistryEvent event,
                      const ChangeAttribution& attribution) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    const int64_t sequence = ++history_last_sequence_;  // not reused if the write fails.
    history_last_unix_micros_ = std::max(NowMicros(), history_last_unix_micros_);
    event.set_sequence(sequence);
    event.set_unix_micros(history_last_unix_micros_);
    event.set_identity(attribution.identity.empty() ? "unknown" : attribution.identity);
    event.set_reason(attribution.reason);
    batch.Put(cf(ColumnFamily::kHistory), HistoryKey(sequence), event.SerializeAsString());
    return sequence;
  }

  // Wakes WaitForHistory callers: events up to `sequence` are written.
  void PublishHistory(int64_t sequence) {
    absl::MutexLock lock(&history_visible_mu_);
    history_visible_sequence_ = std::max(history_visible_sequence_, sequence);
  }

  // True once an event after `after_sequence` is published; false at `deadline`.
  bool AwaitHistory(int64_t after_sequence, absl::Time deadline) {
    absl::MutexLock lock(&history_visible_mu_);
    auto published = [this, after_sequence]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(history_visible_mu_) {
      return history_visible_sequence_ > after_sequence;
    };
    return history_visible_mu_.AwaitWithDeadline(absl::Condition(&published), deadline);
  }

  // Called once by Open: sequence numbers continue after the newest event on disk.
  absl::Status LoadHistory() {
    std::unique_ptr<rocksdb::Iterator> it(db_->NewIterator(Read(), cf(ColumnFamily::kHistory)));
    it->SeekToLast();
    int64_t last_sequence = 0, last_unix_micros = 0;
    if (it->Valid()) {
      absl::StatusOr<uint64_t> sequence = DecodeBigEndian64(ToView(it->key()));
      if (!sequence.ok()) {
        return absl::DataLossError(absl::StrCat("the newest registry event's key has ",
                                                it->key().size(), " bytes; keys have 8"));
      }
      v1::RegistryEvent event;
      RETURN_IF_ERROR(
          ParseRecord(ToView(it->value()), event, absl::StrCat("registry event ", *sequence)));
      last_sequence = static_cast<int64_t>(*sequence);
      last_unix_micros = event.unix_micros();
    }
    RETURN_IF_ERROR(FromRocksDbStatus(it->status(), "finding the newest registry event"));
    absl::MutexLock lock(&mu_);
    history_last_sequence_ = last_sequence;
    history_last_unix_micros_ = last_unix_micros;
    PublishHistory(last_sequence);
    return absl::OkStatus();
  }

  // The sequence of the newest event `snapshot` sees; 0 when none.
  absl::StatusOr<int64_t> LastEventSequence(const rocksdb::Snapshot* snapshot) const {
    std::unique_ptr<rocksdb::Iterator> it(
        db_->NewIterator(Read(snapshot), cf(ColumnFamily::kHistory)));
    it->SeekToLast();
    int64_t last = 0;
    if (it->Valid()) {
      ASSIGN_OR_RETURN(uint64_t sequence, DecodeBigEndian64(ToView(it->key())));
      last = static_cast<int64_t>(sequence);
    }
    RETURN_IF_ERROR(FromRocksDbStatus(it->status(), "finding the newest registry event"));
    return last;
  }

  // MODEL@version's annotations; empty when it has none.
  absl::StatusOr<v1::VersionAnnotations> ReadAnnotations(absl::string_view model, int64_t version,
                                                         const rocksdb::Snapshot* snapshot) const {
    std::string bytes;
    rocksdb::Status read = db_->Get(Read(snapshot), cf(ColumnFamily::kAnnotations),
                                    VersionKey(model, version), &bytes);
    v1::VersionAnnotations annotations;
    if (read.IsNotFound()) return annotations;
    const std::string ref_text = FormatVersionRef(model, version);
    RETURN_IF_ERROR(FromRocksDbStatus(read, absl::StrCat("reading annotations of ", ref_text)));
    RETURN_IF_ERROR(ParseRecord(bytes, annotations, absl::StrCat("annotations of ", ref_text)));
    return annotations;
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
  int64_t history_last_sequence_ ABSL_GUARDED_BY(mu_) = 0;     // newest event handed out.
  int64_t history_last_unix_micros_ ABSL_GUARDED_BY(mu_) = 0;  // ... and its time.
  absl::Mutex history_visible_mu_;
  int64_t history_visible_sequence_ ABSL_GUARDED_BY(history_visible_mu_) = 0;  // newest written.
  // Chunk -> number of live uploads that stored it or rely on it being present.
  absl::flat_hash_map<std::string, int> pinned_chunks_ ABSL_GUARDED_BY(mu_);

  AuditLog audit_log_;
  absl::Mutex gc_mu_;  // ordered before mu_.
};

}  // namespace ckpt

#endif  // CKPT_LIBS_STORE_INTERNAL_ROCKSDB_STORE_CORE_H_

// RocksDbCheckpointStore::Core: model, version and alias records, and the refcount changes of
// versions (see internal/rocksdb_store_core.h for how the store's files divide).

#include <utility>

#include "libs/store/internal/rocksdb_store_core.h"

namespace ckpt {

using namespace rocksdb_store_internal;  // NOLINT(build/namespaces): the store's own helpers.
using Core = RocksDbCheckpointStore::Core;

absl::StatusOr<std::optional<ModelRecord>> Core::ReadModel(
    absl::string_view model, const rocksdb::Snapshot* snapshot) const {
  std::string bytes;
  rocksdb::Status read =
      db_->Get(Read(snapshot), cf(ColumnFamily::kModels), ToSlice(model), &bytes);
  if (read.IsNotFound()) return std::nullopt;
  RETURN_IF_ERROR(FromRocksDbStatus(read, absl::StrCat("reading model '", model, "'")));
  ModelRecord record;
  RETURN_IF_ERROR(ParseRecord(bytes, record, absl::StrCat("model '", model, "'")));
  return record;
}

absl::StatusOr<std::optional<int64_t>> Core::ReadIdempotentCommit(absl::string_view model,
                                                                  absl::string_view key) const {
  std::string bytes;
  const rocksdb::Status read = db_->Get(Read(nullptr), cf(ColumnFamily::kDefault),
                                        IdempotencyKeyKey(model, key), &bytes);
  if (read.IsNotFound()) return std::nullopt;
  RETURN_IF_ERROR(FromRocksDbStatus(
      read, absl::StrCat("reading the commit of '", model, "' with idempotency key '", key, "'")));
  absl::StatusOr<uint64_t> version = DecodeBigEndian64(bytes);
  if (!version.ok()) {
    return absl::DataLossError(absl::StrCat("the commit of '", model, "' with idempotency key '",
                                            key, "' is recorded as ", bytes.size(),
                                            " bytes, not a version number"));
  }
  return static_cast<int64_t>(*version);
}

absl::StatusOr<ModelRecord> Core::ReadExistingModel(absl::string_view model,
                                                    const rocksdb::Snapshot* snapshot,
                                                    absl::string_view ref_text) const {
  ASSIGN_OR_RETURN(std::optional<ModelRecord> record, ReadModel(model, snapshot));
  if (!record.has_value() || record->deleted()) {
    return absl::NotFoundError(absl::StrCat(ref_text.empty() ? "" : absl::StrCat(ref_text, ": "),
                                            "no model '", model, "' in the store"));
  }
  return *record;
}

absl::StatusOr<int64_t> Core::ResolveVersion(const v1::VersionRef& ref,
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

absl::StatusOr<v1::Manifest> Core::ReadManifest(absl::string_view model, int64_t version,
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

absl::StatusOr<std::map<int64_t, std::vector<std::string>>> Core::ReadAliases(
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

absl::StatusOr<std::vector<std::pair<int64_t, v1::Manifest>>> Core::ReadAllManifests(
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

absl::StatusOr<std::vector<std::pair<std::string, ModelRecord>>> Core::ReadAllModels(
    const rocksdb::Snapshot* snapshot) const {
  std::vector<std::pair<std::string, ModelRecord>> models;
  std::unique_ptr<rocksdb::Iterator> it(
      db_->NewIterator(Read(snapshot), cf(ColumnFamily::kModels)));
  for (it->SeekToFirst(); it->Valid(); it->Next()) {
    ModelRecord record;
    RETURN_IF_ERROR(
        ParseRecord(ToView(it->value()), record, absl::StrCat("model '", ToView(it->key()), "'")));
    if (record.deleted()) continue;
    models.emplace_back(it->key().ToString(), std::move(record));
  }
  RETURN_IF_ERROR(FromRocksDbStatus(it->status(), "listing models"));
  return models;
}

absl::StatusOr<v1::ModelInfo> Core::BuildModelInfo(const std::string& model,
                                                   const ModelRecord& record,
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

void Core::StageVersionDelete(absl::string_view model, const v1::Manifest& manifest,
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

absl::StatusOr<int64_t> Core::NewestVersionExcept(absl::string_view model,
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

absl::Status Core::ApplyRefDeltas(const RefDeltas& deltas, rocksdb::WriteBatch& batch,
                                  int64_t* released_bytes, int64_t* new_bytes) {
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

}  // namespace ckpt

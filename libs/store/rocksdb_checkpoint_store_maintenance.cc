// RocksDbCheckpointStore: retention, garbage collection, verification and statistics (the
// maintenance half; see internal/rocksdb_store_core.h for how the store's files divide).

#include "libs/store/chunk_layout.h"
#include "libs/store/internal/failpoint.h"
#include "libs/store/internal/rocksdb_store_core.h"
#include "libs/store/rocksdb_checkpoint_store.h"

namespace ckpt {

using namespace rocksdb_store_internal;  // NOLINT(build/namespaces): the store's own helpers.

absl::StatusOr<v1::ApplyRetentionResponse> RocksDbCheckpointStore::ApplyRetention(
    absl::string_view model, const v1::RetentionPolicy& policy, bool dry_run,
    const ChangeAttribution& attribution) {
  RETURN_IF_ERROR(ValidateModelName(model));
  if (policy.keep_last() < 0 || policy.keep_every() < 0 ||
      policy.drop_optimizer_state_older_than() < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("retention policy numbers must be >= 0; got keep_last ", policy.keep_last(),
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
    const bool kept = policy.keep_last() == 0 || rank < static_cast<size_t>(policy.keep_last()) ||
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
  std::vector<v1::RegistryEvent> events;
  for (auto it = to_delete.rbegin(); it != to_delete.rend(); ++it) {  // oldest first.
    const auto& [version, manifest] = manifests[*it];
    // Never aliased (see above): no aliases go with it.
    core_->StageVersionDelete(model, manifest, {}, record, deltas, batch);
    events.push_back(VersionDeletedEvent(model, version, {}));
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
  for (auto it = to_drop.rbegin(); it != to_drop.rend(); ++it) {
    v1::RegistryEvent& event = events.emplace_back();
    event.set_kind(v1::RegistryEvent::OPTIMIZER_STATE_DROPPED);
    event.set_model(std::string(model));
    event.set_version(manifests[*it].first);
  }
  RETURN_IF_ERROR(core_->ApplyRefDeltas(deltas, batch, nullptr, nullptr));
  batch.Put(core_->cf(ColumnFamily::kModels), ToSlice(model), record.SerializeAsString());
  int64_t sequence = 0;
  for (v1::RegistryEvent& event : events) {
    sequence = core_->AppendEvent(batch, std::move(event), attribution);
  }
  RETURN_IF_ERROR(core_->Write(batch, absl::StrCat("applying retention to '", model, "'"),
                               /*sync=*/true));
  core_->PublishHistory(sequence);
  return response;
}

absl::StatusOr<v1::GarbageCollectResponse> RocksDbCheckpointStore::GarbageCollect(bool dry_run) {
  absl::MutexLock gc_lock(&core_->gc_mu());  // one pass at a time (ReclaimPacks says why).
  // mu_ for the index's own work; released before the pack space's (network) I/O below.
  std::optional<absl::MutexLock> lock(std::in_place, &core_->mu());
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
      rocksdb::Status read =
          db->Get(core_->Read(), core_->cf(ColumnFamily::kRefs), sha256, &record);
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
  CKPT_FAILPOINT("gc.after_batch");  // chunks forgotten, their pack files still there.
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
  lock.reset();  // commits go on while packs are listed, aborted, deleted and compacted.
  ASSIGN_OR_RETURN(const Core::ReclaimOutcome reclaimed,
                   core_->ReclaimPacks(std::move(writing), absl::FromUnixMicros(cutoff)));
  response.set_pack_removals_failed(reclaimed.removals_failed);
  response.set_packs_of_unknown_age_kept(reclaimed.unknown_age);
  CKPT_FAILPOINT("gc.after_pack_removal");
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
      for (const v1::ChunkRef& chunk : meta.chunks()) {
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
      if (absl::Status layout = CheckChunkLayout(meta, where); !layout.ok()) {
        add_problem(model_name, manifest_version, meta.key(), "", std::string(layout.message()));
      }
    };
    for (const v1::TensorMeta& meta : manifest.tensors()) verify_tensor(meta);
    for (const v1::TensorMeta& meta : manifest.state_tensors()) verify_tensor(meta);
  };

  response.set_whole_store(whole_store);
  for (const std::string& model_name : models) {
    response.add_models(model_name);
    if (version > 0) {
      ASSIGN_OR_RETURN(v1::Manifest manifest, core_->ReadManifest(model_name, version, snap));
      verify_manifest(model_name, version, manifest);
      response.set_versions_checked(response.versions_checked() + 1);
      continue;
    }
    ASSIGN_OR_RETURN(auto manifests, core_->ReadAllManifests(model_name, snap));
    for (const auto& [manifest_version, manifest] : manifests) {
      verify_manifest(model_name, manifest_version, manifest);
    }
    response.set_versions_checked(response.versions_checked() +
                                  static_cast<int64_t>(manifests.size()));
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

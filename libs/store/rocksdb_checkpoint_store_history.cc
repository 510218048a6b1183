// RocksDbCheckpointStore: the model registry -- model details, rename and delete, version
// annotations, the history and what Watch needs (see internal/rocksdb_store_core.h for how the
// store's files divide). Every change here appends its v1::RegistryEvent in its own batch.

#include <algorithm>
#include <cmath>

#include "libs/store/internal/rocksdb_store_core.h"
#include "libs/store/rocksdb_checkpoint_store.h"

namespace ckpt {

using namespace rocksdb_store_internal;  // NOLINT(build/namespaces): the store's own helpers.

namespace {

absl::Status ValidateTagKeys(const google::protobuf::Map<std::string, std::string>& tags,
                             absl::string_view owner) {
  for (const auto& [key, value] : tags) {
    if (key.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(owner, ": a tag needs a name"));
    }
  }
  return absl::OkStatus();
}

absl::Status ValidateAnnotationChange(const v1::AnnotationChange& change,
                                      absl::string_view ref_text) {
  for (const auto& [name, value] : change.set_metrics()) {
    if (name.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(ref_text, ": a metric needs a name"));
    }
    if (!std::isfinite(value)) {
      return absl::InvalidArgumentError(
          absl::StrCat(ref_text, ": metric '", name, "' is ", value, "; metrics must be finite"));
    }
  }
  return ValidateTagKeys(change.set_tags(), ref_text);
}

void ApplyAnnotationChange(const v1::AnnotationChange& change,
                           v1::VersionAnnotations& annotations) {
  for (const std::string& name : change.remove_metrics())
    annotations.mutable_metrics()->erase(name);
  for (const std::string& key : change.remove_tags()) annotations.mutable_tags()->erase(key);
  for (const auto& [name, value] : change.set_metrics()) {
    (*annotations.mutable_metrics())[name] = value;
  }
  for (const auto& [key, value] : change.set_tags()) (*annotations.mutable_tags())[key] = value;
  if (change.has_description()) annotations.set_description(change.description());
}

bool HistoryMatches(const HistoryQuery& query, const v1::RegistryEvent& event) {
  if (!query.model.empty() && event.model() != query.model &&
      !(event.kind() == v1::RegistryEvent::MODEL_RENAMED && event.new_name() == query.model)) {
    return false;
  }
  if (!query.alias.empty()) {
    const bool alias_event = event.kind() == v1::RegistryEvent::ALIAS_SET ||
                             event.kind() == v1::RegistryEvent::ALIAS_DELETED;
    if (!alias_event || event.alias() != query.alias) return false;
  }
  return query.since == absl::InfinitePast() ||
         event.unix_micros() >= absl::ToUnixMicros(query.since);
}

}  // namespace

// ---- The history: how every change appends its event, and how Open and Watch read it.

int64_t RocksDbCheckpointStore::Core::AppendEvent(rocksdb::WriteBatch& batch,
                                                  v1::RegistryEvent event,
                                                  const ChangeAttribution& attribution) {
  const int64_t sequence = ++history_last_sequence_;  // not reused if the write fails.
  history_last_unix_micros_ = std::max(NowMicros(), history_last_unix_micros_);
  event.set_sequence(sequence);
  event.set_unix_micros(history_last_unix_micros_);
  event.set_identity(attribution.identity.empty() ? "unknown" : attribution.identity);
  event.set_reason(attribution.reason);
  batch.Put(cf(ColumnFamily::kHistory), HistoryKey(sequence), event.SerializeAsString());
  return sequence;
}

void RocksDbCheckpointStore::Core::PublishHistory(int64_t sequence) {
  absl::MutexLock lock(&history_visible_mu_);
  history_visible_sequence_ = std::max(history_visible_sequence_, sequence);
}

bool RocksDbCheckpointStore::Core::AwaitHistory(int64_t after_sequence, absl::Time deadline) {
  absl::MutexLock lock(&history_visible_mu_);
  auto published = [this, after_sequence]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(history_visible_mu_) {
    return history_visible_sequence_ > after_sequence;
  };
  return history_visible_mu_.AwaitWithDeadline(absl::Condition(&published), deadline);
}

absl::Status RocksDbCheckpointStore::Core::LoadHistory() {
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

absl::StatusOr<int64_t> RocksDbCheckpointStore::Core::LastEventSequence(
    const rocksdb::Snapshot* snapshot) const {
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

absl::StatusOr<v1::VersionAnnotations> RocksDbCheckpointStore::Core::ReadAnnotations(
    absl::string_view model, int64_t version, const rocksdb::Snapshot* snapshot) const {
  std::string bytes;
  rocksdb::Status read =
      db_->Get(Read(snapshot), cf(ColumnFamily::kAnnotations), VersionKey(model, version), &bytes);
  v1::VersionAnnotations annotations;
  if (read.IsNotFound()) return annotations;
  const std::string ref_text = FormatVersionRef(model, version);
  RETURN_IF_ERROR(FromRocksDbStatus(read, absl::StrCat("reading annotations of ", ref_text)));
  RETURN_IF_ERROR(ParseRecord(bytes, annotations, absl::StrCat("annotations of ", ref_text)));
  return annotations;
}

// ---- The registry calls.

absl::StatusOr<v1::ModelInfo> RocksDbCheckpointStore::CreateModel(
    absl::string_view model, const v1::ModelDetails& details,
    const ChangeAttribution& attribution) {
  RETURN_IF_ERROR(ValidateModelName(model));
  RETURN_IF_ERROR(ValidateTagKeys(details.tags(), absl::StrCat("model '", model, "'")));
  absl::MutexLock lock(&core_->mu());
  ASSIGN_OR_RETURN(std::optional<ModelRecord> existing, core_->ReadModel(model, nullptr));
  if (existing.has_value() && !existing->deleted()) {
    return absl::AlreadyExistsError(absl::StrCat("model '", model, "' already exists"));
  }
  // A deleted name comes back with its version counter (never reused).
  ModelRecord record;
  record.set_next_version(existing.has_value() ? existing->next_version() : 1);
  record.set_created_unix_micros(NowMicros());
  v1::ModelDetails& stored = *record.mutable_details();
  stored.set_description(details.description());
  stored.set_owner(details.owner());
  *stored.mutable_tags() = details.tags();
  stored.set_created_unix_micros(record.created_unix_micros());
  rocksdb::WriteBatch batch;
  batch.Put(core_->cf(ColumnFamily::kModels), ToSlice(model), record.SerializeAsString());
  v1::RegistryEvent event;
  event.set_kind(v1::RegistryEvent::MODEL_CREATED);
  event.set_model(std::string(model));
  *event.mutable_details() = stored;
  const int64_t sequence = core_->AppendEvent(batch, std::move(event), attribution);
  RETURN_IF_ERROR(core_->Write(batch, absl::StrCat("creating model '", model, "'"), /*sync=*/true));
  core_->PublishHistory(sequence);
  return core_->BuildModelInfo(std::string(model), record, nullptr);
}

absl::StatusOr<v1::ModelInfo> RocksDbCheckpointStore::UpdateModel(
    absl::string_view model, const v1::ModelDetailsChange& change,
    const ChangeAttribution& attribution) {
  RETURN_IF_ERROR(ValidateModelName(model));
  RETURN_IF_ERROR(ValidateTagKeys(change.set_tags(), absl::StrCat("model '", model, "'")));
  absl::MutexLock lock(&core_->mu());
  ASSIGN_OR_RETURN(ModelRecord record, core_->ReadExistingModel(model, nullptr, ""));
  v1::ModelDetails& details = *record.mutable_details();
  if (change.has_description()) details.set_description(change.description());
  if (change.has_owner()) details.set_owner(change.owner());
  for (const std::string& key : change.remove_tags()) details.mutable_tags()->erase(key);
  for (const auto& [key, value] : change.set_tags()) (*details.mutable_tags())[key] = value;
  if (details.created_unix_micros() == 0) {
    details.set_created_unix_micros(record.created_unix_micros());
  }
  details.set_updated_unix_micros(NowMicros());
  details.set_updated_by(attribution.identity.empty() ? "unknown" : attribution.identity);
  rocksdb::WriteBatch batch;
  batch.Put(core_->cf(ColumnFamily::kModels), ToSlice(model), record.SerializeAsString());
  v1::RegistryEvent event;
  event.set_kind(v1::RegistryEvent::MODEL_UPDATED);
  event.set_model(std::string(model));
  *event.mutable_details() = details;
  const int64_t sequence = core_->AppendEvent(batch, std::move(event), attribution);
  RETURN_IF_ERROR(core_->Write(batch, absl::StrCat("updating model '", model, "'"), /*sync=*/true));
  core_->PublishHistory(sequence);
  return core_->BuildModelInfo(std::string(model), record, nullptr);
}

absl::Status RocksDbCheckpointStore::RenameModel(absl::string_view model,
                                                 absl::string_view new_name,
                                                 const ChangeAttribution& attribution) {
  RETURN_IF_ERROR(ValidateModelName(model));
  RETURN_IF_ERROR(ValidateModelName(new_name));
  absl::MutexLock lock(&core_->mu());
  ASSIGN_OR_RETURN(ModelRecord record, core_->ReadExistingModel(model, nullptr, ""));
  ASSIGN_OR_RETURN(std::optional<ModelRecord> target, core_->ReadModel(new_name, nullptr));
  if (target.has_value()) {
    return absl::AlreadyExistsError(absl::StrCat(
        "cannot rename '", model, "' to '", new_name, "': ",
        target->deleted() ? "that name was a model before, and its version numbers must not be "
                            "handed out again"
                          : "that model exists"));
  }
  ASSIGN_OR_RETURN(auto manifests, core_->ReadAllManifests(model, nullptr));
  ASSIGN_OR_RETURN(auto aliases, core_->ReadAliases(model, nullptr));
  rocksdb::WriteBatch batch;
  for (auto& [version, manifest] : manifests) {
    manifest.set_model(std::string(new_name));
    batch.Put(core_->cf(ColumnFamily::kVersions), VersionKey(new_name, version),
              manifest.SerializeAsString());
    batch.Delete(core_->cf(ColumnFamily::kVersions), VersionKey(model, version));
    ASSIGN_OR_RETURN(v1::VersionAnnotations annotations,
                     core_->ReadAnnotations(model, version, nullptr));
    if (annotations.ByteSizeLong() > 0) {
      batch.Put(core_->cf(ColumnFamily::kAnnotations), VersionKey(new_name, version),
                annotations.SerializeAsString());
      batch.Delete(core_->cf(ColumnFamily::kAnnotations), VersionKey(model, version));
    }
  }
  for (const auto& [version, names] : aliases) {
    for (const std::string& alias : names) {
      batch.Put(core_->cf(ColumnFamily::kAliases), AliasKey(new_name, alias),
                EncodeBigEndian64(static_cast<uint64_t>(version)));
      batch.Delete(core_->cf(ColumnFamily::kAliases), AliasKey(model, alias));
    }
  }
  batch.Put(core_->cf(ColumnFamily::kModels), ToSlice(new_name), record.SerializeAsString());
  ModelRecord tombstone;
  tombstone.set_deleted(true);
  tombstone.set_next_version(record.next_version());
  batch.Put(core_->cf(ColumnFamily::kModels), ToSlice(model), tombstone.SerializeAsString());
  v1::RegistryEvent event;
  event.set_kind(v1::RegistryEvent::MODEL_RENAMED);
  event.set_model(std::string(model));
  event.set_new_name(std::string(new_name));
  const int64_t sequence = core_->AppendEvent(batch, std::move(event), attribution);
  RETURN_IF_ERROR(core_->Write(batch, absl::StrCat("renaming '", model, "' to '", new_name, "'"),
                               /*sync=*/true));
  core_->PublishHistory(sequence);
  return absl::OkStatus();
}

absl::StatusOr<v1::DeleteModelResponse> RocksDbCheckpointStore::DeleteModel(
    absl::string_view model, bool force, const ChangeAttribution& attribution) {
  RETURN_IF_ERROR(ValidateModelName(model));
  absl::MutexLock lock(&core_->mu());
  ASSIGN_OR_RETURN(ModelRecord record, core_->ReadExistingModel(model, nullptr, ""));
  ASSIGN_OR_RETURN(auto manifests, core_->ReadAllManifests(model, nullptr));
  if (!manifests.empty() && !force) {
    return absl::FailedPreconditionError(absl::StrCat(
        "model '", model, "' has ", manifests.size(), " version(s), ", manifests.front().first,
        " to ", manifests.back().first, "; delete them first, or force the delete"));
  }
  ASSIGN_OR_RETURN(auto aliases, core_->ReadAliases(model, nullptr));
  rocksdb::WriteBatch batch;
  RefDeltas deltas;
  std::vector<v1::RegistryEvent> events;
  for (const auto& [version, manifest] : manifests) {
    const std::vector<std::string>& pointing = aliases[version];
    core_->StageVersionDelete(model, manifest, pointing, record, deltas, batch);
    events.push_back(VersionDeletedEvent(model, version, pointing));
  }
  v1::DeleteModelResponse response;
  response.set_versions_deleted(static_cast<int64_t>(manifests.size()));
  int64_t released = 0;
  RETURN_IF_ERROR(core_->ApplyRefDeltas(deltas, batch, &released, nullptr));
  response.set_bytes_released(released);
  ModelRecord tombstone;
  tombstone.set_deleted(true);
  tombstone.set_next_version(record.next_version());
  batch.Put(core_->cf(ColumnFamily::kModels), ToSlice(model), tombstone.SerializeAsString());
  v1::RegistryEvent& deleted = events.emplace_back();
  deleted.set_kind(v1::RegistryEvent::MODEL_DELETED);
  deleted.set_model(std::string(model));
  int64_t sequence = 0;
  for (v1::RegistryEvent& event : events) {
    sequence = core_->AppendEvent(batch, std::move(event), attribution);
  }
  RETURN_IF_ERROR(core_->Write(batch, absl::StrCat("deleting model '", model, "'"), /*sync=*/true));
  core_->PublishHistory(sequence);
  return response;
}

absl::StatusOr<v1::VersionAnnotations> RocksDbCheckpointStore::AnnotateVersion(
    absl::string_view model, int64_t version, const v1::AnnotationChange& change,
    const ChangeAttribution& attribution) {
  RETURN_IF_ERROR(ValidateModelName(model));
  const std::string ref_text = FormatVersionRef(model, version);
  RETURN_IF_ERROR(ValidateAnnotationChange(change, ref_text));
  absl::MutexLock lock(&core_->mu());
  RETURN_IF_ERROR(core_->ReadExistingModel(model, nullptr, ref_text).status());
  RETURN_IF_ERROR(core_->ReadManifest(model, version, nullptr).status());
  ASSIGN_OR_RETURN(v1::VersionAnnotations annotations,
                   core_->ReadAnnotations(model, version, nullptr));
  ApplyAnnotationChange(change, annotations);
  annotations.set_updated_unix_micros(NowMicros());
  annotations.set_updated_by(attribution.identity.empty() ? "unknown" : attribution.identity);
  rocksdb::WriteBatch batch;
  batch.Put(core_->cf(ColumnFamily::kAnnotations), VersionKey(model, version),
            annotations.SerializeAsString());
  v1::RegistryEvent event;
  event.set_kind(v1::RegistryEvent::VERSION_ANNOTATED);
  event.set_model(std::string(model));
  event.set_version(version);
  *event.mutable_annotations() = annotations;
  const int64_t sequence = core_->AppendEvent(batch, std::move(event), attribution);
  RETURN_IF_ERROR(core_->Write(batch, absl::StrCat("annotating ", ref_text), /*sync=*/true));
  core_->PublishHistory(sequence);
  return annotations;
}

absl::StatusOr<std::vector<v1::RegistryEvent>> RocksDbCheckpointStore::ListHistory(
    const HistoryQuery& query) {
  if (!query.model.empty()) RETURN_IF_ERROR(ValidateModelName(query.model));
  if (!query.alias.empty()) {
    if (query.model.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("the history of alias '", query.alias, "' needs its model"));
    }
    RETURN_IF_ERROR(ValidateAliasName(query.alias));
  }
  if (query.after_sequence < 0 || query.limit < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("history queries take after_sequence >= 0 and limit >= 0; got ",
                     query.after_sequence, " and ", query.limit));
  }
  std::vector<v1::RegistryEvent> events;
  std::unique_ptr<rocksdb::Iterator> it(
      core_->db()->NewIterator(core_->Read(), core_->cf(ColumnFamily::kHistory)));
  for (it->Seek(HistoryKey(query.after_sequence + 1)); it->Valid(); it->Next()) {
    v1::RegistryEvent event;
    RETURN_IF_ERROR(ParseRecord(ToView(it->value()), event, "a registry event"));
    if (!HistoryMatches(query, event)) continue;
    events.push_back(std::move(event));
    if (query.limit > 0 && static_cast<int64_t>(events.size()) >= query.limit) break;
  }
  RETURN_IF_ERROR(FromRocksDbStatus(it->status(), "reading the registry's history"));
  return events;
}

absl::StatusOr<RegistryState> RocksDbCheckpointStore::GetRegistryState(
    const std::vector<std::string>& models) {
  for (const std::string& model : models) RETURN_IF_ERROR(ValidateModelName(model));
  SnapshotHolder snapshot(core_->db());
  RegistryState state;
  ASSIGN_OR_RETURN(state.sequence, core_->LastEventSequence(snapshot.get()));
  if (models.empty()) {
    ASSIGN_OR_RETURN(auto all, core_->ReadAllModels(snapshot.get()));
    for (const auto& [name, record] : all) {
      ASSIGN_OR_RETURN(state.models.emplace_back(),
                       core_->BuildModelInfo(name, record, snapshot.get()));
    }
    return state;
  }
  for (const std::string& model : models) {
    ASSIGN_OR_RETURN(std::optional<ModelRecord> record, core_->ReadModel(model, snapshot.get()));
    if (!record.has_value() || record->deleted()) continue;
    ASSIGN_OR_RETURN(state.models.emplace_back(),
                     core_->BuildModelInfo(model, *record, snapshot.get()));
  }
  return state;
}

absl::StatusOr<bool> RocksDbCheckpointStore::WaitForHistory(int64_t after_sequence,
                                                            absl::Time deadline) {
  return core_->AwaitHistory(after_sequence, deadline);
}

}  // namespace ckpt

#include "libs/store/rocksdb_checkpoint_store.h"

#include <cstdio>
#include <utility>

#include "libs/store/internal/rocksdb_store_core.h"
#include "libs/store/internal/rocksdb_upload_session.h"

namespace ckpt {

using namespace rocksdb_store_internal;  // NOLINT(build/namespaces): the store's own helpers.

namespace {

using Core = RocksDbCheckpointStore::Core;

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

  absl::Status ReadTensorIntoForCheckingReceiver(const v1::TensorMeta& meta,
                                                 char* destination) const override {
    return core_->ReadTensorInto(meta, destination, snapshot_, where_, /*check_xxh3=*/false);
  }

  absl::StatusOr<MappedBytes> MapTensorBytes(const v1::TensorMeta& meta) const override {
    // Small tensors are copied: tools/bench measured 10,000 tensors of 4-64 KiB loading at
    // 1.2 GiB/s as mappings (a page fault per tensor at least) and 2.0 GiB/s copied.
    if (!core_->options().map_tensors_on_load || meta.byte_length() < kMapInPlaceMinBytes) {
      return MappedBytes();
    }
    return core_->MapTensor(meta, snapshot_, where_, mappings_);
  }

  absl::StatusOr<std::optional<FileRegion>> LocateTensorBytes(
      const v1::TensorMeta& meta) const override {
    std::optional<PackLocation> whole;
    for (const v1::ChunkRef& chunk : meta.chunks()) {
      ASSIGN_OR_RETURN(std::optional<PackLocation> location,
                       core_->FindPackLocation(chunk, snapshot_));
      if (!location.has_value()) return std::nullopt;
      if (!whole.has_value()) {
        whole = location;
      } else if (location->pack_id != whole->pack_id ||
                 location->offset != whole->offset + whole->length) {
        return std::nullopt;
      } else {
        whole->length += location->length;
      }
    }
    if (!whole.has_value() || whole->length != meta.byte_length()) return std::nullopt;
    // Packs in an object store are no local file to hand over.
    std::optional<std::string> path = core_->packs().LocalFilePath(whole->pack_id);
    if (!path.has_value()) return std::nullopt;
    return FileRegion{*std::move(path), whole->offset};
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
  ASSIGN_OR_RETURN(*manifest->mutable_annotations(),
                   core.ReadAnnotations(ref.model(), version, snapshot));
  return manifest;
}

}  // namespace

RocksDbCheckpointStore::RocksDbCheckpointStore(std::shared_ptr<Core> core)
    : core_(std::move(core)) {}

RocksDbCheckpointStore::~RocksDbCheckpointStore() = default;

absl::StatusOr<std::unique_ptr<RocksDbCheckpointStore>> RocksDbCheckpointStore::Open(
    const StoreOptions& options) {
  return Open(options, /*skip_hashing=*/false);
}

absl::StatusOr<std::unique_ptr<RocksDbCheckpointStore>> RocksDbCheckpointStore::Open(
    const StoreOptions& options, bool skip_hashing) {
  if (options.db_path.empty()) {
    return absl::InvalidArgumentError("StoreOptions.db_path is empty");
  }
  if (options.abandoned_upload_grace < absl::ZeroDuration()) {
    return absl::InvalidArgumentError("StoreOptions.abandoned_upload_grace is negative");
  }
  ASSIGN_OR_RETURN(
      std::unique_ptr<StoreDb> db,
      StoreDb::Open(options.db_path, options.create_if_missing, options.rocksdb_file_system));
  // After the database: its lock keeps a second process from writing the same packs.
  std::shared_ptr<ChunkBackend> packs = options.chunk_backend;
  if (packs == nullptr) {
    ASSIGN_OR_RETURN(packs, PackDirectory::Open(absl::StrCat(options.db_path, "/packs")));
  }
  std::unique_ptr<ChangeLog> change_log;
  if (options.keep_change_log) {
    ASSIGN_OR_RETURN(change_log, packs->OpenChangeLog());
  }
  auto core = std::make_shared<Core>(options, std::move(db), std::move(packs), skip_hashing);
  if (options.start_as_follower) {
    if (change_log == nullptr) {
      return absl::InvalidArgumentError("a follower needs a change log to follow");
    }
    core->StepDown("");
  }
  if (change_log != nullptr) RETURN_IF_ERROR(core->AttachChangeLog(std::move(change_log)));
  RETURN_IF_ERROR(core->LoadAuditLog());
  RETURN_IF_ERROR(core->LoadHistory());
  // A store that cannot write now (a full disk) still opens: the records stay PENDING until an
  // open that can. A follower leaves them to the writer (TakeOverAsWriter reconciles).
  if (absl::Status reconciled =
          options.start_as_follower ? absl::OkStatus() : core->ReconcilePendingAudit();
      !reconciled.ok()) {
    std::fprintf(stderr, "ckpt store: audit records left PENDING stay so for now: %s\n",
                 reconciled.ToString().c_str());
  }
  return std::unique_ptr<RocksDbCheckpointStore>(new RocksDbCheckpointStore(std::move(core)));
}

const std::string& RocksDbCheckpointStore::db_path() const { return core_->options().db_path; }

absl::StatusOr<int64_t> RocksDbCheckpointStore::FollowChangeLog() { return core_->ApplyNewChanges(); }

absl::Status RocksDbCheckpointStore::TakeOverAsWriter() { return core_->TakeOver(); }

void RocksDbCheckpointStore::StepDown(std::string writer_address) {
  core_->StepDown(std::move(writer_address));
}

bool RocksDbCheckpointStore::is_follower() const { return core_->is_follower(); }

int64_t RocksDbCheckpointStore::last_change() const { return core_->last_change(); }

absl::StatusOr<std::unique_ptr<UploadSession>> RocksDbCheckpointStore::BeginUpload(
    absl::string_view model, v1::Manifest header, const CommitOptions& options) {
  RETURN_IF_ERROR(ValidateModelName(model));
  // Refused before any bytes flow: the commit would be.
  if (core_->is_follower()) {
    return absl::UnavailableError(absl::StrCat(
        "an upload to '", model, "' cannot commit here: this store follows the writer"));
  }
  if (!header.model().empty() && header.model() != model) {
    return absl::InvalidArgumentError(absl::StrCat(
        "upload to model '", model, "' has a header for model '", header.model(), "'"));
  }
  for (const std::string& alias : options.aliases) RETURN_IF_ERROR(ValidateAliasName(alias));
  if (options.expected_latest_version < 0) {
    return absl::InvalidArgumentError("expected_latest_version is negative");
  }
  RETURN_IF_ERROR(ValidateIdempotencyKey(options.idempotency_key));
  ASSIGN_OR_RETURN(std::vector<std::string> validation, ValidateManifestHeader(header));
  std::vector<std::string> warnings(header.warnings().begin(), header.warnings().end());
  warnings.insert(warnings.end(), validation.begin(), validation.end());
  header.set_model(std::string(model));
  header.set_version(0);
  header.clear_aliases();
  header.clear_annotations();  // added after commit (AnnotateVersion), never with it.
  header.clear_warnings();
  for (const std::string& warning : warnings) header.add_warnings(warning);

  // Fail fast, before any bytes flow; Commit checks again atomically.
  if (options.expected_latest_version > 0) {
    ASSIGN_OR_RETURN(std::optional<store::ModelRecord> record, core_->ReadModel(model, nullptr));
    const int64_t latest = record.has_value() ? record->latest_version() : 0;
    if (latest != options.expected_latest_version) {
      return absl::FailedPreconditionError(
          absl::StrCat("upload to '", model, "' expects latest version ",
                       options.expected_latest_version, " but it is ", latest));
    }
  }

  const uint64_t upload_number = core_->NewUploadNumber();
  const std::string upload_id = Hex64(upload_number);
  // Joinable before it is recorded: a name taken is refused with nothing recorded.
  const std::string join_name = options.joinable_as.empty() ? upload_id : options.joinable_as;
  RETURN_IF_ERROR(core_->AddJoinableUpload(join_name, header));
  if (absl::Status recorded = RecordUpload(model, upload_id); !recorded.ok()) {
    core_->EndJoinable(join_name);
    return recorded;
  }
  return NewRocksDbUploadSession(core_, upload_id, upload_number, std::move(header), options,
                                 std::move(warnings), join_name);
}

absl::Status RocksDbCheckpointStore::RecordUpload(absl::string_view model,
                                                  const std::string& upload_id) {
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
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<UploadPart>> RocksDbCheckpointStore::JoinUpload(
    absl::string_view upload_id, std::vector<UploadRange> ranges) {
  ASSIGN_OR_RETURN(std::shared_ptr<const v1::Manifest> header,
                   core_->JoinableHeader(std::string(upload_id)));
  RETURN_IF_ERROR(CheckUploadRanges(*header, ranges));
  // The part is an upload of its own (record, pack, pins): reclaimed as one if it never finishes
  // or its parent never commits.
  const uint64_t part_number = core_->NewUploadNumber();
  RETURN_IF_ERROR(RecordUpload(header->model(), Hex64(part_number)));
  return NewRocksDbUploadPart(core_, Hex64(part_number), part_number, std::string(upload_id),
                              std::move(header), std::move(ranges));
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
    ASSIGN_OR_RETURN(infos.emplace_back(), core_->BuildModelInfo(name, record, snapshot.get()));
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
    ASSIGN_OR_RETURN(*info.mutable_annotations(),
                     core_->ReadAnnotations(model, version, snapshot.get()));
  }
  return infos;
}

absl::StatusOr<int64_t> RocksDbCheckpointStore::SetAlias(absl::string_view model,
                                                         absl::string_view alias, int64_t version,
                                                         int64_t expected_current_version,
                                                         const ChangeAttribution& attribution) {
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
    if (!decoded.ok())
      return absl::DataLossError(absl::StrCat("alias ", model, "@", alias, " is unreadable"));
    previous = static_cast<int64_t>(*decoded);
  }
  if (expected_current_version < kAliasMustNotExist) {
    return absl::InvalidArgumentError(absl::StrCat(
        "alias ", model, "@", alias, ": expected_current_version ", expected_current_version,
        " is neither a version, 0 nor ", kAliasMustNotExist, " (must not exist)"));
  }
  if (expected_current_version == kAliasMustNotExist && previous != 0) {
    return absl::FailedPreconditionError(absl::StrCat("alias ", model, "@", alias,
                                                      " points at version ", previous,
                                                      "; expected it not to exist"));
  }
  if (expected_current_version > 0 && previous != expected_current_version) {
    return absl::FailedPreconditionError(
        absl::StrCat("alias ", model, "@", alias, " ",
                     previous == 0 ? std::string("does not exist")
                                   : absl::StrCat("points at version ", previous),
                     "; expected version ", expected_current_version));
  }
  rocksdb::WriteBatch batch;
  batch.Put(core_->cf(ColumnFamily::kAliases), AliasKey(model, alias),
            EncodeBigEndian64(static_cast<uint64_t>(version)));
  v1::RegistryEvent event;
  event.set_kind(v1::RegistryEvent::ALIAS_SET);
  event.set_model(std::string(model));
  event.set_alias(std::string(alias));
  event.set_version(version);
  event.set_previous_version(previous);
  const int64_t sequence = core_->AppendEvent(batch, std::move(event), attribution);
  RETURN_IF_ERROR(core_->Write(batch, "setting an alias", /*sync=*/true));
  core_->PublishHistory(sequence);
  return previous;
}

absl::Status RocksDbCheckpointStore::DeleteAlias(absl::string_view model, absl::string_view alias,
                                                 const ChangeAttribution& attribution) {
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
  absl::StatusOr<uint64_t> previous = DecodeBigEndian64(bytes);
  if (!previous.ok()) {
    return absl::DataLossError(absl::StrCat("alias ", model, "@", alias, " is unreadable"));
  }
  rocksdb::WriteBatch batch;
  batch.Delete(core_->cf(ColumnFamily::kAliases), AliasKey(model, alias));
  v1::RegistryEvent event;
  event.set_kind(v1::RegistryEvent::ALIAS_DELETED);
  event.set_model(std::string(model));
  event.set_alias(std::string(alias));
  event.set_previous_version(static_cast<int64_t>(*previous));
  const int64_t sequence = core_->AppendEvent(batch, std::move(event), attribution);
  RETURN_IF_ERROR(core_->Write(batch, "deleting an alias", /*sync=*/true));
  core_->PublishHistory(sequence);
  return absl::OkStatus();
}

absl::StatusOr<int64_t> RocksDbCheckpointStore::DeleteVersion(
    absl::string_view model, int64_t version, bool force, const ChangeAttribution& attribution) {
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
  core_->StageVersionDelete(model, manifest, pointing, record, deltas, batch);
  int64_t released = 0;
  RETURN_IF_ERROR(core_->ApplyRefDeltas(deltas, batch, &released, nullptr));
  if (record.latest_version() == version) {
    ASSIGN_OR_RETURN(int64_t newest, core_->NewestVersionExcept(model, {version}));
    record.set_latest_version(newest);
  }
  batch.Put(core_->cf(ColumnFamily::kModels), ToSlice(model), record.SerializeAsString());
  const int64_t sequence =
      core_->AppendEvent(batch, VersionDeletedEvent(model, version, pointing), attribution);
  RETURN_IF_ERROR(core_->Write(batch, absl::StrCat("deleting ", ref_text), /*sync=*/true));
  core_->PublishHistory(sequence);
  return released;
}

}  // namespace ckpt

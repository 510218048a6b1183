#include "libs/store/internal/rocksdb_upload_session.h"

#include <utility>

#include "libs/store/internal/chunk_pipeline.h"
#include "libs/store/internal/failpoint.h"

namespace ckpt {

using namespace rocksdb_store_internal;  // NOLINT(build/namespaces): the store's own helpers.

namespace {

using Core = RocksDbCheckpointStore::Core;

class RocksDbUploadSession final : public UploadSession {
 public:
  // `parent_id` is empty for an upload of its own, joinable as `join_name` (already registered
  // in `core`); else this session writes a part of the upload joinable as `parent_id`, each of
  // whose ranges is a tensor of `header`, and ends with FinishPart.
  RocksDbUploadSession(std::shared_ptr<Core> core, std::string upload_id, uint64_t pack_id,
                       v1::Manifest header, CommitOptions options,
                       std::vector<std::string> warnings, std::string join_name,
                       std::string parent_id = "")
      : core_(std::move(core)),
        upload_id_(std::move(upload_id)),
        join_name_(std::move(join_name)),
        parent_id_(std::move(parent_id)),
        header_(std::move(header)),
        options_(std::move(options)),
        warnings_(std::move(warnings)),
        streams_(header_.tensors_size() + header_.state_tensors_size()),
        pack_id_(pack_id) {}

  ~RocksDbUploadSession() override {
    pipeline_.Cancel(absl::CancelledError("upload abandoned"));  // the queued rest is skipped.
    pipeline_.Stop();
    if (!finished_) Abandon();
  }

  std::string upload_id() const override { return parent_id_.empty() ? join_name_ : parent_id_; }

  // A part's end (see the constructor): every range complete, its pack synced, its chunk records
  // written, and the part handed to the parent upload, which from then on owns its pins and its
  // live registration (until the parent commits or ends).
  absl::Status FinishPart() {
    absl::Status usable = CheckUsable();
    if (usable.ok()) usable = DrainPipeline();
    pipeline_.Stop();
    RETURN_IF_ERROR(usable);
    for (int i = 0; i < tensor_count(); ++i) {
      if (streams_[i].received != Meta(i).byte_length()) {
        return Fail(absl::InvalidArgumentError(
            absl::StrCat("a part of upload '", parent_id_, "' is incomplete: ", Name(i), " got ",
                         streams_[i].received, " of ", Meta(i).byte_length(), " bytes")));
      }
    }
    if (pack_ != nullptr) RETURN_IF_ERROR(Fail(pack_->Sync()));
    RETURN_IF_ERROR(Fail(WriteUploadRecords()));
    return absl::OkStatus();
  }

  // After FinishPart: the part, for Core::AdoptPart. `ranges` are its ranges, in tensor order.
  Core::FinishedPart TakeFinishedPart(const std::vector<UploadRange>& ranges) {
    Core::FinishedPart part;
    part.upload_id = upload_id_;
    for (int i = 0; i < tensor_count(); ++i) {
      Core::FinishedRange range;
      range.range = ranges[i];
      range.chunks.assign(Meta(i).chunks().begin(), Meta(i).chunks().end());
      part.ranges.push_back(std::move(range));
    }
    part.written = written_;
    part.pinned = pinned_;
    return part;
  }

  // The part was adopted (its pins and registration are the parent's) or not (still this
  // session's, released when it is destroyed).
  void SetAdopted() { finished_ = true; }

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
    pipeline_.Add(tensor_index, bytes, complete);
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

  absl::Status AddStoredChunk(int tensor_index, int64_t offset, absl::string_view sha256,
                              int64_t length) override {
    RETURN_IF_ERROR(CheckUsable());
    RETURN_IF_ERROR(DrainPipeline());
    RETURN_IF_ERROR(CheckData(tensor_index, offset, length < 0 ? 0 : length));
    v1::TensorMeta& meta = Meta(tensor_index);
    RETURN_IF_ERROR(Fail(CheckStoredChunkPlace(meta, Name(tensor_index), offset, sha256, length)));
    // Pinned before it is looked up, as PinAndStoreChunk does: GC cannot take it before Commit
    // counts this version's reference.
    absl::StatusOr<ChunkDigest> stored = core_->PinStoredChunk(sha256, pinned_);
    if (!stored.ok()) return Fail(stored.status());
    const ChunkDigest& digest = *stored;
    if (digest.length != length) {
      return Fail(absl::InvalidArgumentError(absl::StrCat(Name(tensor_index), ": the stored chunk ",
                                                          HexEncode(sha256), " holds ",
                                                          digest.length, " bytes, not ", length)));
    }
    v1::ChunkRef* chunk = meta.add_chunks();
    chunk->set_sha256(digest.sha256);
    chunk->set_length(digest.length);
    chunk->set_xxh3_64(digest.xxh3_64);
    Stream& stream = streams_[tensor_index];
    stream.content.AddChunk(digest);
    stream.received += length;
    if (stream.received == meta.byte_length()) RETURN_IF_ERROR(Fail(FinishTensor(tensor_index)));
    return absl::OkStatus();
  }

  absl::StatusOr<CommitResult> Commit() override {
    absl::Status usable = CheckUsable();
    if (usable.ok()) usable = DrainPipeline();
    // Whatever happens, no background thread reads the caller's bytes after Commit returns.
    if (!usable.ok()) {
      pipeline_.Cancel(absl::CancelledError("commit failed"));
      pipeline_.Stop();
      return usable;
    }
    pipeline_.Stop();
    if (!parent_id_.empty()) {
      return Fail(absl::FailedPreconditionError("a part of an upload is finished, not committed"));
    }
    RETURN_IF_ERROR(Fail(AdoptFinishedParts()));
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
          "upload to '", header_.model(),
          "' is incomplete: ", absl::StrJoin(incomplete.begin(), incomplete.begin() + shown, "; "),
          incomplete.size() > shown ? absl::StrCat(" (and ", incomplete.size() - shown, " more)")
                                    : "")));
    }

    // The pack's bytes become durable before the batch that names them (the WAL sync does not
    // cover files outside RocksDB). Outside the lock: other commits need not wait for this one.
    CKPT_FAILPOINT("commit.before_pack_sync");  // chunks written, nothing synced.
    if (pack_ != nullptr) {
      absl::Status synced = pack_->Sync();
      if (!synced.ok()) return Fail(synced);
    }
    CKPT_FAILPOINT("commit.after_pack_sync");

    RefDeltas deltas;
    AddManifestRefs(header_, +1, deltas);
    const int64_t logical_bytes = LogicalBytes(header_);
    const std::string& model = header_.model();

    CommitResult result;
    bool replayed = false;
    absl::Status committed = [&]() -> absl::Status {
      absl::MutexLock lock(&core_->mu());
      if (!options_.idempotency_key.empty()) {
        ASSIGN_OR_RETURN(std::optional<int64_t> earlier,
                         core_->ReadIdempotentCommit(model, options_.idempotency_key));
        if (earlier.has_value()) {
          ASSIGN_OR_RETURN(result, ReplayedCommit(model, *earlier));
          replayed = true;
          return absl::OkStatus();
        }
      }
      ASSIGN_OR_RETURN(std::optional<ModelRecord> existing, core_->ReadModel(model, nullptr));
      ModelRecord record = existing.value_or(ModelRecord());
      // A deleted model's name comes back to life with its version counter, so no MODEL@N is
      // ever handed out twice.
      const bool created = !existing.has_value() || existing->deleted();
      if (created) {
        if (!existing.has_value()) record.set_next_version(1);
        record.clear_deleted();
        record.clear_details();
        record.set_created_unix_micros(NowMicros());
        record.mutable_details()->set_created_unix_micros(record.created_unix_micros());
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
      const ChangeAttribution& attribution = options_.attribution;
      if (created) {
        v1::RegistryEvent event;
        event.set_kind(v1::RegistryEvent::MODEL_CREATED);
        event.set_model(model);
        *event.mutable_details() = record.details();
        core_->AppendEvent(batch, std::move(event), attribution);
      }
      v1::RegistryEvent committed_event;
      committed_event.set_kind(v1::RegistryEvent::VERSION_COMMITTED);
      committed_event.set_model(model);
      committed_event.set_version(version);
      committed_event.set_alias(absl::StrJoin(options_.aliases, ","));
      int64_t sequence = core_->AppendEvent(batch, std::move(committed_event), attribution);
      ASSIGN_OR_RETURN(auto aliases, core_->ReadAliases(model, nullptr));
      for (const std::string& alias : options_.aliases) {
        batch.Put(core_->cf(ColumnFamily::kAliases), AliasKey(model, alias),
                  EncodeBigEndian64(static_cast<uint64_t>(version)));
        v1::RegistryEvent moved;
        moved.set_kind(v1::RegistryEvent::ALIAS_SET);
        moved.set_model(model);
        moved.set_alias(alias);
        moved.set_version(version);
        for (const auto& [pointed, names] : aliases) {
          if (std::find(names.begin(), names.end(), alias) != names.end()) {
            moved.set_previous_version(pointed);
          }
        }
        sequence = core_->AppendEvent(batch, std::move(moved), attribution);
      }
      batch.Put(core_->cf(ColumnFamily::kVersions), VersionKey(model, version),
                header_.SerializeAsString());
      if (!options_.idempotency_key.empty()) {
        batch.Put(core_->cf(ColumnFamily::kDefault),
                  IdempotencyKeyKey(model, options_.idempotency_key),
                  EncodeBigEndian64(static_cast<uint64_t>(version)));
      }
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
      // The parts' chunks likewise (their packs were synced when they finished).
      for (const Core::FinishedPart& part : adopted_) {
        batch.Delete(core_->cf(ColumnFamily::kUploads), part.upload_id);
        for (const auto& [sha256, location] : part.written) {
          batch.Delete(core_->cf(ColumnFamily::kUploads), UploadChunkKey(part.upload_id, sha256));
          batch.Put(core_->cf(ColumnFamily::kPackedChunks), sha256, EncodeLocation(location));
        }
      }
      RETURN_IF_ERROR(core_->Write(batch,
                                   absl::StrCat("committing ", FormatVersionRef(model, version)),
                                   /*sync=*/true));
      CKPT_FAILPOINT("commit.after_batch");  // durable, not yet acknowledged.
      core_->PublishHistory(sequence);
      core_->EndUploadLocked(upload_id_, pinned_);
      core_->EndJoinableLocked(join_name_);
      for (const Core::FinishedPart& part : adopted_) {
        core_->EndUploadLocked(part.upload_id, part.pinned);
      }
      adopted_.clear();
      upload_records_.Clear();
      finished_ = true;
      result.version = MakeVersionRef(model, version);
      result.new_bytes = new_bytes;
      return absl::OkStatus();
    }();
    if (!committed.ok()) return Fail(committed);
    if (replayed) {
      // Nothing of this attempt is kept: it ends as an abandoned upload (GC takes its pack).
      Abandon();
      finished_ = true;
      return result;
    }
    result.logical_bytes = logical_bytes;
    result.warnings = warnings_;
    return result;
  }

 private:
  struct Stream {
    int64_t received = 0;
    std::string pending;    // bytes of the tensor's current, not yet full, chunk.
    ContentHasher content;  // over the chunks stored so far.
  };

  // Takes the parts finished for this upload so far and fills each tensor that got none of its
  // bytes here from their ranges, which must tile it from 0 to byte_length without gap or
  // overlap. Taken parts are this session's from then on: committed or ended with it.
  absl::Status AdoptFinishedParts() {
    for (Core::FinishedPart& part : core_->TakeParts(join_name_)) {
      adopted_.push_back(std::move(part));
    }
    if (adopted_.empty()) return absl::OkStatus();
    std::vector<std::vector<const Core::FinishedRange*>> by_tensor(tensor_count());
    for (const Core::FinishedPart& part : adopted_) {
      for (const Core::FinishedRange& range : part.ranges) {
        by_tensor[range.range.tensor_index].push_back(&range);
      }
    }
    for (int i = 0; i < tensor_count(); ++i) {
      std::vector<const Core::FinishedRange*>& ranges = by_tensor[i];
      if (ranges.empty()) continue;
      if (streams_[i].received > 0) {
        return absl::InvalidArgumentError(
            absl::StrCat(Name(i), ": its bytes came both through the upload and from parts of it"));
      }
      std::sort(ranges.begin(), ranges.end(),
                [](const auto* a, const auto* b) { return a->range.begin < b->range.begin; });
      v1::TensorMeta& meta = Meta(i);
      int64_t covered = 0;
      for (const Core::FinishedRange* range : ranges) {
        if (range->range.begin != covered) {
          return absl::InvalidArgumentError(
              range->range.begin > covered ? absl::StrCat(Name(i), ": no part holds its bytes ",
                                                          covered, "..", range->range.begin)
                                           : absl::StrCat(Name(i), ": two parts hold its bytes ",
                                                          range->range.begin, "..", covered));
        }
        covered = range->range.end;
      }
      if (covered != meta.byte_length()) {
        return absl::InvalidArgumentError(
            absl::StrCat(Name(i), ": no part holds its bytes ", covered, "..", meta.byte_length()));
      }
      for (const Core::FinishedRange* range : ranges) {
        for (const v1::ChunkRef& chunk : range->chunks) {
          *meta.add_chunks() = chunk;
          ChunkDigest digest;
          digest.sha256 = chunk.sha256();
          digest.xxh3_64 = chunk.xxh3_64();
          digest.length = chunk.length();
          streams_[i].content.AddChunk(digest);
        }
      }
      streams_[i].received = meta.byte_length();
      RETURN_IF_ERROR(FinishTensor(i));
    }
    return absl::OkStatus();
  }

  // Abandoned: the upload record stays for GarbageCollect; only the in-memory pins go. So for
  // the parts it had taken: each is an abandoned upload of its own now.
  void Abandon() {
    (void)WriteUploadRecords();  // best effort: GarbageCollect reclaims the pack regardless.
    core_->EndUpload(upload_id_, pinned_);
    for (const Core::FinishedPart& part : adopted_) core_->EndUpload(part.upload_id, part.pinned);
    adopted_.clear();
    if (parent_id_.empty()) core_->EndJoinable(join_name_);
  }

  // What Commit answers when its idempotency key committed `version` of `model` before: that
  // version, if it holds the tensors this upload does (keys and content hashes, in order).
  absl::StatusOr<CommitResult> ReplayedCommit(const std::string& model, int64_t version) {
    const std::string ref = FormatVersionRef(model, version);
    absl::StatusOr<v1::Manifest> earlier = core_->ReadManifest(model, version, nullptr);
    if (absl::IsNotFound(earlier.status())) {
      return absl::FailedPreconditionError(
          absl::StrCat("idempotency key '", options_.idempotency_key, "' committed ", ref,
                       ", which has since been deleted; nothing was committed again"));
    }
    RETURN_IF_ERROR(earlier.status());
    const auto same_tensors = [](const auto& a, const auto& b) {
      return std::equal(a.begin(), a.end(), b.begin(), b.end(),
                        [](const v1::TensorMeta& x, const v1::TensorMeta& y) {
                          return x.key() == y.key() && x.content_hash() == y.content_hash();
                        });
    };
    if (!same_tensors(earlier->tensors(), header_.tensors()) ||
        !same_tensors(earlier->state_tensors(), header_.state_tensors())) {
      return absl::AlreadyExistsError(
          absl::StrCat("idempotency key '", options_.idempotency_key, "' already committed ", ref,
                       ", which holds other tensors than this upload: a key names one commit"));
    }
    CommitResult result;
    result.version = MakeVersionRef(model, version);
    result.logical_bytes = LogicalBytes(*earlier);
    result.warnings.assign(earlier->warnings().begin(), earlier->warnings().end());
    result.replayed = true;
    return result;
  }

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
      if (absl::Status pipeline = pipeline_.error(); !pipeline.ok()) {
        failed_ = pipeline;
        return pipeline;
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
      return Fail(absl::InvalidArgumentError(absl::StrCat("tensor index ", index,
                                                          " is out of range: the upload has ",
                                                          tensor_count(), " tensors")));
    }
    const Stream& stream = streams_[index];
    if (offset != stream.received) {
      return Fail(absl::InvalidArgumentError(
          absl::StrCat(Name(index), ": data at offset ", offset, ", expected offset ",
                       stream.received, " (a tensor's bytes must arrive in order)")));
    }
    if (static_cast<int64_t>(size) > Meta(index).byte_length() - stream.received) {
      return Fail(absl::InvalidArgumentError(
          absl::StrCat(Name(index), ": ", stream.received + static_cast<int64_t>(size),
                       " bytes sent but its byte_length is ", Meta(index).byte_length())));
    }
    return absl::OkStatus();
  }

  // While the pipeline runs (AddStableTensorData), only its writing thread touches the manifest's
  // chunk lists, the content hashers, the pack and the pin sets; every other path drains it first.
  absl::Status DrainPipeline() { return Fail(pipeline_.Drain()); }

  absl::Status Fail(absl::Status status) {
    if (!status.ok()) failed_ = status;
    return status;
  }

  ChunkDigest Digest(absl::string_view bytes) {
    if (!core_->skip_hashing()) return HashChunk(bytes);
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
    RETURN_IF_ERROR(core_->PinAndStoreChunk(upload_id_, digest, bytes, alignment, *pack_, pinned_,
                                            written_, upload_records_));
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
        next =
            std::async(std::launch::async, [this, piece = pieces[i + 1]] { return Digest(piece); });
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
      return absl::DataLossError(
          absl::StrCat(Name(index), ": the bytes received hash to ", HexEncode(content_hash),
                       " but the header's content_hash is ", HexEncode(meta.content_hash())));
    }
    meta.set_content_hash(std::move(content_hash));
    return absl::OkStatus();
  }

  const std::shared_ptr<Core> core_;
  const std::string upload_id_;
  const std::string join_name_;  // what writers join this upload by (not for a part).
  const std::string parent_id_;  // a part's parent upload; empty for an upload of its own.
  v1::Manifest header_;
  const CommitOptions options_;
  const std::vector<std::string> warnings_;
  std::vector<Stream> streams_;
  const uint64_t pack_id_;
  std::unique_ptr<ChunkWriter> pack_;        // created with the first chunk this upload stores.
  std::atomic<int64_t> unhashed_chunks_{0};  // StoreBenchmarkSeams::OpenWithoutHashing.
  absl::flat_hash_set<std::string> pinned_;  // chunks this upload stored or relies on.
  // Chunks this upload stored (upload record keys), and where.
  absl::flat_hash_map<std::string, PackLocation> written_;
  // Upload records of stored chunks not written yet. (Commit deletes every record of the upload,
  // so the ones still here at Commit are never written.)
  rocksdb::WriteBatch upload_records_;

  absl::Status failed_;
  bool finished_ = false;
  std::vector<Core::FinishedPart> adopted_;  // parts taken by Commit, not yet committed.
  // Last: its threads, which use the members above, end before those are destroyed.
  ChunkPipeline pipeline_{[this](absl::string_view bytes) { return Digest(bytes); },
                          [this](int index, const ChunkDigest& digest, absl::string_view bytes,
                                 bool completes_tensor) -> absl::Status {
                            RETURN_IF_ERROR(StoreHashedChunk(index, digest, bytes));
                            return completes_tensor ? FinishTensor(index) : absl::OkStatus();
                          }};
};

// A writer's part of another upload: a session whose tensors are the part's ranges.
class RocksDbUploadPart final : public UploadPart {
 public:
  RocksDbUploadPart(std::shared_ptr<Core> core, std::string parent_id,
                    std::shared_ptr<const v1::Manifest> parent_header,
                    std::vector<UploadRange> ranges, std::unique_ptr<RocksDbUploadSession> session)
      : core_(std::move(core)),
        parent_id_(std::move(parent_id)),
        parent_header_(std::move(parent_header)),
        ranges_(std::move(ranges)),
        session_(std::move(session)) {}

  const v1::Manifest& header() const override { return *parent_header_; }
  const std::vector<UploadRange>& ranges() const override { return ranges_; }

  absl::Status AddRangeData(int range_index, int64_t offset, absl::string_view bytes) override {
    return session_->AddTensorData(range_index, offset, bytes);
  }

  absl::Status Finish() override {
    RETURN_IF_ERROR(session_->FinishPart());
    Core::FinishedPart part = session_->TakeFinishedPart(ranges_);
    RETURN_IF_ERROR(core_->AdoptPart(parent_id_, part));
    session_->SetAdopted();
    return absl::OkStatus();
  }

 private:
  const std::shared_ptr<Core> core_;
  const std::string parent_id_;
  const std::shared_ptr<const v1::Manifest> parent_header_;
  const std::vector<UploadRange> ranges_;
  const std::unique_ptr<RocksDbUploadSession> session_;
};

}  // namespace

std::unique_ptr<UploadSession> NewRocksDbUploadSession(
    std::shared_ptr<RocksDbCheckpointStore::Core> core, std::string upload_id, uint64_t pack_id,
    v1::Manifest header, CommitOptions options, std::vector<std::string> warnings,
    std::string join_name) {
  return std::make_unique<RocksDbUploadSession>(std::move(core), std::move(upload_id), pack_id,
                                                std::move(header), std::move(options),
                                                std::move(warnings), std::move(join_name));
}

std::unique_ptr<UploadPart> NewRocksDbUploadPart(std::shared_ptr<RocksDbCheckpointStore::Core> core,
                                                 std::string part_id, uint64_t pack_id,
                                                 std::string parent_id,
                                                 std::shared_ptr<const v1::Manifest> parent_header,
                                                 std::vector<UploadRange> ranges) {
  // Each range is a tensor of the part's own header, chunked from its begin: as the range begins
  // on a chunk boundary of its tensor, these are that tensor's chunks.
  v1::Manifest header;
  header.set_model(parent_header->model());
  const int model_tensors = parent_header->tensors_size();
  for (const UploadRange& range : ranges) {
    const v1::TensorMeta& whole =
        range.tensor_index < model_tensors
            ? parent_header->tensors(range.tensor_index)
            : parent_header->state_tensors(range.tensor_index - model_tensors);
    v1::TensorMeta* meta = header.add_tensors();
    meta->set_key(absl::StrCat(whole.key(), " bytes ", range.begin, "..", range.end));
    meta->set_dtype(v1::DTYPE_UINT8);
    meta->add_shape(range.end - range.begin);
    meta->set_byte_length(range.end - range.begin);
  }
  auto session = std::make_unique<RocksDbUploadSession>(
      core, std::move(part_id), pack_id, std::move(header), CommitOptions(),
      std::vector<std::string>(), /*join_name=*/"", parent_id);
  return std::make_unique<RocksDbUploadPart>(std::move(core), std::move(parent_id),
                                             std::move(parent_header), std::move(ranges),
                                             std::move(session));
}

}  // namespace ckpt

// RocksDbCheckpointStore::Core: the change log (change_log.h; internal/rocksdb_store_core.h).
//
// Every acknowledged batch becomes one store.ChangeRecord: its ops by column family name, so a
// record applies to any index of this schema (column family ids differ between databases). The
// record is created in the log first, then the batch (with kChangeLogAppliedKey set to the
// record's number) is written here. Hence, after any crash, the log holds every acknowledged
// change, and the index holds a prefix of the log, which Open completes.

#include <cstdio>
#include <utility>

#include "libs/store/internal/rocksdb_store_core.h"

namespace ckpt {

using namespace rocksdb_store_internal;  // NOLINT(build/namespaces): the store's own helpers.
using Core = RocksDbCheckpointStore::Core;

namespace {

// Records read from the log per round trip while replaying.
constexpr int kReplayPage = 500;

// The column families a record may name, by RocksDB's name.
std::optional<ColumnFamily> ColumnFamilyByName(absl::string_view name) {
  for (int i = 0; i < kColumnFamilyCount; ++i) {
    const ColumnFamily cf = static_cast<ColumnFamily>(i);
    if (ColumnFamilyName(cf) == name) return cf;
  }
  return std::nullopt;
}

// Keys of the default column family that describe this index, not the store: never logged.
bool IsLocalKey(ColumnFamily cf, absl::string_view key) {
  return cf == ColumnFamily::kDefault &&
         (key == kAcknowledgedWriteKey || key == kChangeLogAppliedKey);
}

class RecordBuilder : public rocksdb::WriteBatch::Handler {
 public:
  RecordBuilder(const StoreDb& db, store::ChangeRecord& record) : record_(record) {
    for (int i = 0; i < kColumnFamilyCount; ++i) {
      const ColumnFamily cf = static_cast<ColumnFamily>(i);
      by_id_.emplace(db.cf(cf)->GetID(), cf);
    }
  }

  rocksdb::Status PutCF(uint32_t id, const rocksdb::Slice& key,
                        const rocksdb::Slice& value) override {
    return Add(id, store::ChangeOp::PUT, key, value);
  }
  rocksdb::Status DeleteCF(uint32_t id, const rocksdb::Slice& key) override {
    return Add(id, store::ChangeOp::DELETE, key, rocksdb::Slice());
  }
  rocksdb::Status SingleDeleteCF(uint32_t id, const rocksdb::Slice& key) override {
    return Add(id, store::ChangeOp::SINGLE_DELETE, key, rocksdb::Slice());
  }
  rocksdb::Status DeleteRangeCF(uint32_t id, const rocksdb::Slice& begin,
                                const rocksdb::Slice& end) override {
    return Add(id, store::ChangeOp::DELETE_RANGE, begin, end);
  }
  rocksdb::Status MergeCF(uint32_t id, const rocksdb::Slice& key,
                          const rocksdb::Slice& value) override {
    return Add(id, store::ChangeOp::MERGE, key, value);
  }
  void LogData(const rocksdb::Slice&) override {}

 private:
  rocksdb::Status Add(uint32_t id, store::ChangeOp::Kind kind, const rocksdb::Slice& key,
                      const rocksdb::Slice& value) {
    auto it = by_id_.find(id);
    if (it == by_id_.end()) {
      return rocksdb::Status::InvalidArgument("a batch names an unknown column family");
    }
    if (IsLocalKey(it->second, ToView(key))) return rocksdb::Status::OK();
    store::ChangeOp* op = record_.add_ops();
    op->set_column_family(std::string(ColumnFamilyName(it->second)));
    op->set_kind(kind);
    op->set_key(key.data(), key.size());
    if (value.size() > 0) op->set_value(value.data(), value.size());
    return rocksdb::Status::OK();
  }

  store::ChangeRecord& record_;
  absl::flat_hash_map<uint32_t, ColumnFamily> by_id_;
};

}  // namespace

absl::StatusOr<store::ChangeRecord> Core::RecordFromBatch(rocksdb::WriteBatch& batch) const {
  store::ChangeRecord record;
  RecordBuilder builder(*store_db_, record);
  RETURN_IF_ERROR(FromRocksDbStatus(batch.Iterate(&builder), "recording a change"));
  return record;
}

absl::Status Core::BatchFromRecord(const store::ChangeRecord& record,
                                   rocksdb::WriteBatch& batch) const {
  for (const store::ChangeOp& op : record.ops()) {
    const std::optional<ColumnFamily> cf = ColumnFamilyByName(op.column_family());
    if (!cf.has_value()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "change ", record.sequence(), " names column family '", op.column_family(),
          "', which this build does not know (written by a newer one?)"));
    }
    rocksdb::ColumnFamilyHandle* handle = this->cf(*cf);
    rocksdb::Status added;
    switch (op.kind()) {
      case store::ChangeOp::PUT:
        added = batch.Put(handle, ToSlice(op.key()), ToSlice(op.value()));
        break;
      case store::ChangeOp::DELETE:
        added = batch.Delete(handle, ToSlice(op.key()));
        break;
      case store::ChangeOp::SINGLE_DELETE:
        added = batch.SingleDelete(handle, ToSlice(op.key()));
        break;
      case store::ChangeOp::DELETE_RANGE:
        added = batch.DeleteRange(handle, ToSlice(op.key()), ToSlice(op.value()));
        break;
      case store::ChangeOp::MERGE:
        added = batch.Merge(handle, ToSlice(op.key()), ToSlice(op.value()));
        break;
      default:
        return absl::FailedPreconditionError(absl::StrCat(
            "change ", record.sequence(), " holds an operation of unknown kind ", op.kind()));
    }
    RETURN_IF_ERROR(FromRocksDbStatus(added, "replaying a change"));
  }
  return absl::OkStatus();
}

std::string Core::StampedFrame(store::ChangeRecord& record, int64_t sequence,
                               absl::string_view what) const {
  record.set_sequence(sequence);
  record.set_writer(writer_id_);
  record.set_unix_micros(NowMicros());
  record.set_what(std::string(what));
  return EncodeChangeFrame(record.SerializeAsString());
}

Core::~Core() {
  std::thread snapshot;
  {
    absl::MutexLock lock(&change_mu_);
    snapshot = std::move(snapshot_thread_);
  }
  if (snapshot.joinable()) snapshot.join();
}

absl::StatusOr<std::string> Core::SnapshotRecord(const rocksdb::Snapshot* snapshot,
                                                 int64_t sequence, absl::string_view what) const {
  store::ChangeRecord record;
  record.set_snapshot(true);
  for (int i = 0; i < kColumnFamilyCount; ++i) {
    const ColumnFamily family = static_cast<ColumnFamily>(i);
    // Uploads in flight are this process's, as they are for every later record.
    if (family == ColumnFamily::kUploads) continue;
    std::unique_ptr<rocksdb::Iterator> it(db_->NewIterator(Read(snapshot), cf(family)));
    for (it->SeekToFirst(); it->Valid(); it->Next()) {
      if (IsLocalKey(family, ToView(it->key()))) continue;
      store::ChangeOp* op = record.add_ops();
      op->set_column_family(std::string(ColumnFamilyName(family)));
      op->set_kind(store::ChangeOp::PUT);
      op->set_key(it->key().data(), it->key().size());
      op->set_value(it->value().data(), it->value().size());
    }
    RETURN_IF_ERROR(FromRocksDbStatus(it->status(), absl::StrCat("reading the index for ", what)));
  }
  return StampedFrame(record, sequence, what);
}

void Core::MaybeStartSnapshot(int64_t sequence) {
  const int64_t every = options_.change_log_snapshot_every;
  if (every <= 0 || snapshot_running_ || sequence - last_snapshot_ < every) return;
  snapshot_running_ = true;
  last_snapshot_ = sequence;
  if (snapshot_thread_.joinable()) snapshot_thread_.join();  // finished: snapshot_running_ was off.
  // The index as it is now, right after change `sequence`: the commits that follow do not wait
  // for the scan and the upload.
  const rocksdb::Snapshot* at = db_->GetSnapshot();
  snapshot_thread_ = std::thread([this, at, sequence] {
    const absl::Time start = absl::Now();
    absl::StatusOr<std::string> frame =
        SnapshotRecord(at, sequence, absl::StrCat("a snapshot of the index at change ", sequence));
    db_->ReleaseSnapshot(at);
    absl::Status put = frame.ok() ? change_log_->PutSnapshot(sequence, *frame) : frame.status();
    if (put.ok()) {
      std::fprintf(stderr, "ckpt store: a snapshot of the index at change %lld (%zu bytes) is in "
                   "its %s (%.2f s)\n", static_cast<long long>(sequence), frame->size(),
                   change_log_->Describe().c_str(), absl::ToDoubleSeconds(absl::Now() - start));
    } else {
      // Nothing is lost: the log holds every change; a rebuild replays more of it.
      std::fprintf(stderr, "ckpt store: no snapshot of the index at change %lld: %s\n",
                   static_cast<long long>(sequence), put.ToString().c_str());
    }
    absl::MutexLock lock(&change_mu_);
    snapshot_running_ = false;
  });
}

absl::Status Core::LoadSnapshot(int64_t sequence) {
  const std::string where = absl::StrCat("the snapshot of the index at change ", sequence,
                                         " beside its ", change_log_->Describe());
  // A snapshot of this log: the record it was taken after is there.
  ASSIGN_OR_RETURN(std::vector<LoggedChange> named, change_log_->ReadAfter(sequence - 1, 1));
  if (named.empty() || named[0].sequence != sequence) {
    return absl::DataLossError(absl::StrCat(where, " was taken after a change the log does not "
                                            "hold: it belongs to another log"));
  }
  ASSIGN_OR_RETURN(std::string bytes, change_log_->ReadSnapshot(sequence));
  ASSIGN_OR_RETURN(absl::string_view payload, DecodeChangeFrame(bytes, where));
  store::ChangeRecord record;
  if (!record.ParseFromArray(payload.data(), static_cast<int>(payload.size())) ||
      !record.snapshot() || record.sequence() != sequence) {
    return absl::DataLossError(absl::StrCat(where, " does not parse as a snapshot of change ",
                                            sequence));
  }
  rocksdb::WriteBatch batch;
  RETURN_IF_ERROR(BatchFromRecord(record, batch));
  batch.Put(cf(ColumnFamily::kDefault), std::string(kChangeLogAppliedKey),
            EncodeBigEndian64(static_cast<uint64_t>(sequence)));
  RETURN_IF_ERROR(store_db_->WriteAcknowledged(batch, absl::StrCat("loading ", where)));
  std::fprintf(stderr, "ckpt store: loaded %s (%d entries)\n", where.c_str(), record.ops_size());
  return absl::OkStatus();
}

absl::Status Core::AttachChangeLog(std::unique_ptr<ChangeLog> log) {
  change_log_ = std::move(log);
  absl::MutexLock lock(&change_mu_);
  std::string applied_bytes;
  const rocksdb::Status read = db_->Get(Read(), cf(ColumnFamily::kDefault),
                                        std::string(kChangeLogAppliedKey), &applied_bytes);
  if (!read.ok() && !read.IsNotFound()) {
    return FromRocksDbStatus(read, "reading which change the index applied last");
  }
  int64_t applied = 0;
  if (read.ok()) {
    absl::StatusOr<uint64_t> decoded = DecodeBigEndian64(applied_bytes);
    if (!decoded.ok()) {
      return absl::DataLossError(absl::StrCat("the index's '", kChangeLogAppliedKey, "' has ",
                                              applied_bytes.size(), " bytes; it has 8"));
    }
    applied = static_cast<int64_t>(*decoded);
  }
  ASSIGN_OR_RETURN(std::vector<LoggedChange> first, change_log_->ReadAfter(0, 1));
  ASSIGN_OR_RETURN(last_snapshot_, change_log_->LatestSnapshot());
  if (!read.ok()) {
    // No record applied: an index to rebuild from the log, a new store, or one from before logs.
    bool empty = true;
    for (int i = 1; i < kColumnFamilyCount && empty; ++i) {
      const ColumnFamily family = static_cast<ColumnFamily>(i);
      if (family == ColumnFamily::kUploads) continue;
      std::unique_ptr<rocksdb::Iterator> it(db_->NewIterator(Read(), cf(family)));
      it->SeekToFirst();
      if (it->Valid()) empty = false;
      RETURN_IF_ERROR(FromRocksDbStatus(it->status(), "looking for records in the index"));
    }
    if (!empty && !first.empty()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "the index in ", options_.db_path, " holds versions that are not in its ",
          change_log_->Describe(), ", and that log already holds changes of another store: "
          "open this index with its own log, or move it aside to rebuild from this one"));
    }
    if (!empty) {
      const rocksdb::Snapshot* at = db_->GetSnapshot();
      absl::StatusOr<std::string> snapshot = SnapshotRecord(
          at, 1, "the whole index of a store that kept no change log before");
      db_->ReleaseSnapshot(at);
      RETURN_IF_ERROR(snapshot.status());
      RETURN_IF_ERROR(change_log_->Append(1, *snapshot));
      rocksdb::WriteBatch batch;
      batch.Put(cf(ColumnFamily::kDefault), std::string(kChangeLogAppliedKey),
                EncodeBigEndian64(1));
      RETURN_IF_ERROR(store_db_->WriteAcknowledged(batch, "recording the index in its change log"));
      std::fprintf(stderr, "ckpt store: the whole index of %s is the first record of its %s\n",
                   options_.db_path.c_str(), change_log_->Describe().c_str());
      last_change_ = 1;
      return absl::OkStatus();
    }
    // A rebuild: from the newest snapshot, if the log has one, then the records after it.
    if (!first.empty() && last_snapshot_ > 1) {
      RETURN_IF_ERROR(LoadSnapshot(last_snapshot_));
      applied = last_snapshot_;
    }
  } else if (applied > 0) {
    // The log must still hold what the index applied: a log that lost records (a bucket
    // emptied, a directory replaced) would fence nothing and rebuild less than is here.
    ASSIGN_OR_RETURN(std::vector<LoggedChange> last_applied,
                     change_log_->ReadAfter(applied - 1, 1));
    if (last_applied.empty()) {
      return absl::DataLossError(absl::StrCat(
          "the index in ", options_.db_path, " has applied change ", applied, " but its ",
          change_log_->Describe(), " ends before it: the log was lost or replaced. Its records "
          "are the store's only copy outside this disk; point the store at the right log"));
    }
  }
  last_change_ = applied;
  // Catch up: the records appended after the index's last (a crash between the two writes of a
  // change; a rebuild; another writer's changes).
  int64_t replayed = 0;
  absl::Time next_report = absl::Now() + absl::Seconds(10);
  const absl::Time start = absl::Now();
  while (true) {
    ASSIGN_OR_RETURN(std::vector<LoggedChange> page,
                     change_log_->ReadAfter(last_change_, kReplayPage));
    if (page.empty()) break;
    RETURN_IF_ERROR(ApplyChanges(page, /*sync=*/false));
    replayed += static_cast<int64_t>(page.size());
    if (absl::Now() >= next_report) {
      std::fprintf(stderr, "ckpt store: replaying %s: %lld changes applied, at change %lld\n",
                   change_log_->Describe().c_str(), static_cast<long long>(replayed),
                   static_cast<long long>(last_change_));
      next_report = absl::Now() + absl::Seconds(10);
    }
  }
  if (replayed > 0) {
    // One sync for the whole replay: a crash before it replays again.
    RETURN_IF_ERROR(FromRocksDbStatus(db_->FlushWAL(/*sync=*/true), "syncing the replayed changes"));
    std::fprintf(stderr, "ckpt store: applied %lld changes from its %s in %.2f s (now at %lld)\n",
                 static_cast<long long>(replayed), change_log_->Describe().c_str(),
                 absl::ToDoubleSeconds(absl::Now() - start), static_cast<long long>(last_change_));
  }
  return absl::OkStatus();
}

absl::Status Core::ApplyChanges(const std::vector<LoggedChange>& changes, bool sync) {
  for (const LoggedChange& change : changes) {
    if (change.sequence != last_change_ + 1) {
      return absl::DataLossError(absl::StrCat("change ", change.sequence, " read from ",
                                              change_log_->Describe(), " where change ",
                                              last_change_ + 1, " was due"));
    }
    const std::string where = absl::StrCat("change ", change.sequence, " in ", change_log_->Describe());
    ASSIGN_OR_RETURN(absl::string_view payload, DecodeChangeFrame(change.bytes, where));
    store::ChangeRecord record;
    if (!record.ParseFromArray(payload.data(), static_cast<int>(payload.size())) ||
        record.sequence() != change.sequence) {
      return absl::DataLossError(absl::StrCat(where, " does not parse as change ", change.sequence));
    }
    rocksdb::WriteBatch batch;
    RETURN_IF_ERROR(BatchFromRecord(record, batch));
    batch.Put(cf(ColumnFamily::kDefault), std::string(kChangeLogAppliedKey),
              EncodeBigEndian64(static_cast<uint64_t>(change.sequence)));
    rocksdb::WriteOptions write;
    write.sync = sync;
    RETURN_IF_ERROR(FromRocksDbStatus(db_->Write(write, &batch), absl::StrCat("applying ", where)));
    last_change_ = change.sequence;
  }
  return absl::OkStatus();
}

int64_t Core::last_change() {
  absl::MutexLock lock(&change_mu_);
  return last_change_;
}

absl::Status Core::Fence(int64_t sequence, absl::string_view why) {
  std::string other = "another store";
  absl::StatusOr<std::vector<LoggedChange>> taken = change_log_->ReadAfter(sequence - 1, 1);
  if (taken.ok() && !taken->empty()) {
    absl::StatusOr<absl::string_view> payload = DecodeChangeFrame((*taken)[0].bytes, "");
    store::ChangeRecord record;
    if (payload.ok() && record.ParseFromArray(payload->data(), static_cast<int>(payload->size()))) {
      other = absl::StrCat("store ", record.writer());
    }
  }
  fenced_ = absl::UnavailableError(absl::StrCat(
      "this store (", writer_id_, ") is no longer the writer of its ", change_log_->Describe(),
      ": change ", sequence, " was written by ", other, " (", why,
      "); it takes no more changes, so send them to the store that took over"));
  std::fprintf(stderr, "ckpt store: %s\n", std::string(fenced_.message()).c_str());
  follower_ = true;  // whatever drives the roles (libs/ha) sees it and gives up its lease.
  if (writer_address_.empty()) writer_address_ = other;
  return fenced_;
}

absl::Status Core::ResolveChangeTail() {
  ASSIGN_OR_RETURN(std::vector<LoggedChange> after, change_log_->ReadAfter(last_change_, 1));
  if (after.empty()) {
    change_tail_unknown_ = false;  // the failed append did not land.
    return absl::OkStatus();
  }
  const std::string where = absl::StrCat("change ", after[0].sequence, " in ", change_log_->Describe());
  ASSIGN_OR_RETURN(absl::string_view payload, DecodeChangeFrame(after[0].bytes, where));
  store::ChangeRecord record;
  if (!record.ParseFromArray(payload.data(), static_cast<int>(payload.size()))) {
    return absl::DataLossError(absl::StrCat(where, " does not parse"));
  }
  if (record.writer() != writer_id_) return Fence(after[0].sequence, "found after a failed append");
  // The append whose answer failed did land: the change happened, though its caller was told it
  // failed (the audit log's "outcome unknown"). The index follows the log.
  RETURN_IF_ERROR(ApplyChanges(after, /*sync=*/options_.sync_commits));
  change_tail_unknown_ = false;
  return absl::OkStatus();
}

absl::Status Core::LogAndWrite(rocksdb::WriteBatch& batch, absl::string_view what) {
  absl::MutexLock lock(&change_mu_);
  if (follower_) return FollowerRefusal(what);
  RETURN_IF_ERROR(fenced_);
  if (change_tail_unknown_) RETURN_IF_ERROR(ResolveChangeTail());
  if (unapplied_.has_value()) {
    RETURN_IF_ERROR(options_.sync_commits
                        ? store_db_->WriteAcknowledged(*unapplied_, "applying a logged change")
                        : FromRocksDbStatus(db_->Write(rocksdb::WriteOptions(), &*unapplied_),
                                            "applying a logged change"));
    unapplied_.reset();
  }
  ASSIGN_OR_RETURN(store::ChangeRecord record, RecordFromBatch(batch));
  const int64_t sequence = last_change_ + 1;
  const absl::Status appended = change_log_->Append(sequence, StampedFrame(record, sequence, what));
  if (absl::IsAlreadyExists(appended)) return Fence(sequence, std::string(appended.message()));
  if (!appended.ok()) {
    change_tail_unknown_ = true;
    return absl::Status(appended.code(),
                        absl::StrCat(what, ": the change could not be recorded in the store's ",
                                     change_log_->Describe(), ", so it was not made: ",
                                     appended.message()));
  }
  last_change_ = sequence;
  batch.Put(cf(ColumnFamily::kDefault), std::string(kChangeLogAppliedKey),
            EncodeBigEndian64(static_cast<uint64_t>(sequence)));
  const absl::Status written = options_.sync_commits
                             ? store_db_->WriteAcknowledged(batch, what)
                             : FromRocksDbStatus(db_->Write(rocksdb::WriteOptions(), &batch), what);
  if (!written.ok()) {
    unapplied_ = batch;
    return absl::Status(
        written.code(),
        absl::StrCat(written.message(), "; the change is recorded in the store's ",
                     change_log_->Describe(), " and is applied at the next change or open"));
  }
  MaybeStartSnapshot(sequence);
  return absl::OkStatus();
}

absl::StatusOr<int64_t> Core::CatchUpLocked() {
  int64_t applied = 0;
  while (true) {
    ASSIGN_OR_RETURN(std::vector<LoggedChange> page,
                     change_log_->ReadAfter(last_change_, kReplayPage));
    if (page.empty()) break;
    RETURN_IF_ERROR(ApplyChanges(page, /*sync=*/false));
    applied += static_cast<int64_t>(page.size());
  }
  return applied;
}

absl::StatusOr<int64_t> Core::ApplyNewChanges() {
  if (change_log_ == nullptr) {
    return absl::FailedPreconditionError("this store keeps no change log to follow");
  }
  int64_t applied = 0;
  {
    absl::MutexLock lock(&change_mu_);
    if (!follower_) {
      return absl::FailedPreconditionError(
          "this store is the writer of its change log: nothing to follow");
    }
    ASSIGN_OR_RETURN(applied, CatchUpLocked());
  }
  if (applied > 0) {
    // Watchers wake for the events that arrived; audit numbers continue after them.
    RETURN_IF_ERROR(LoadHistory());
    RETURN_IF_ERROR(LoadAuditLog());
  }
  return applied;
}

bool Core::is_follower() {
  absl::MutexLock lock(&change_mu_);
  return follower_;
}

absl::Status Core::FollowerRefusal(absl::string_view what) {
  return absl::UnavailableError(absl::StrCat(
      what.empty() ? "this change" : what, ": this store follows its ", change_log_->Describe(),
      " and takes no changes; the writer ",
      writer_address_.empty() ? "is being elected" : absl::StrCat("is at ", writer_address_)));
}

void Core::StepDown(std::string writer) {
  absl::MutexLock lock(&change_mu_);
  if (!follower_ && change_log_ != nullptr) {
    std::fprintf(stderr, "ckpt store: %s steps down as the writer of its %s%s\n",
                 writer_id_.c_str(), change_log_ == nullptr ? "store" : change_log_->Describe().c_str(),
                 writer.empty() ? "" : absl::StrCat("; the writer is at ", writer).c_str());
  }
  follower_ = true;
  writer_address_ = std::move(writer);
}

absl::Status Core::TakeOver() {
  if (change_log_ == nullptr) {
    return absl::FailedPreconditionError("a store without a change log cannot take over writes");
  }
  constexpr int kAttempts = 100;
  {
    absl::MutexLock lock(&change_mu_);
    int attempt = 0;
    for (;; ++attempt) {
      if (attempt == kAttempts) {
        return absl::UnavailableError(absl::StrCat(
            "taking over ", change_log_->Describe(), ": another writer kept appending through ",
            kAttempts, " attempts"));
      }
      RETURN_IF_ERROR(CatchUpLocked().status());
      // The takeover record: after it, every earlier writer finds its next number taken.
      rocksdb::WriteBatch batch;
      batch.Put(cf(ColumnFamily::kDefault), "change_log_writer", writer_id_);
      ASSIGN_OR_RETURN(store::ChangeRecord record, RecordFromBatch(batch));
      const int64_t sequence = last_change_ + 1;
      const absl::Status appended =
          change_log_->Append(sequence, StampedFrame(record, sequence, "taking over as the writer"));
      if (absl::IsAlreadyExists(appended)) continue;  // the old writer got there first.
      RETURN_IF_ERROR(appended);
      last_change_ = sequence;
      batch.Put(cf(ColumnFamily::kDefault), std::string(kChangeLogAppliedKey),
                EncodeBigEndian64(static_cast<uint64_t>(sequence)));
      RETURN_IF_ERROR(store_db_->WriteAcknowledged(batch, "taking over as the writer"));
      break;
    }
    follower_ = false;
    fenced_ = absl::OkStatus();
    change_tail_unknown_ = false;
    unapplied_.reset();
    writer_address_.clear();
    std::fprintf(stderr, "ckpt store: %s is the writer of its %s from change %lld\n",
                 writer_id_.c_str(), change_log_->Describe().c_str(),
                 static_cast<long long>(last_change_));
  }
  RETURN_IF_ERROR(LoadHistory());
  RETURN_IF_ERROR(LoadAuditLog());
  // The calls the old writer left PENDING get their outcome from the history, as at an open.
  if (absl::Status reconciled = ReconcilePendingAudit(); !reconciled.ok()) {
    std::fprintf(stderr, "ckpt store: audit records left PENDING stay so for now: %s\n",
                 reconciled.ToString().c_str());
  }
  return absl::OkStatus();
}

}  // namespace ckpt

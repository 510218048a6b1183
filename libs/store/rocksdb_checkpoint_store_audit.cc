// RocksDbCheckpointStore: the audit log (see internal/rocksdb_store_core.h for how the store's
// files divide). Records are v1::AuditRecord under AuditKey(sequence) in the `audit` column
// family.

#include <algorithm>
#include <vector>

#include "absl/strings/str_join.h"
#include "libs/store/internal/rocksdb_store_core.h"
#include "libs/store/rocksdb_checkpoint_store.h"

namespace ckpt {

using namespace rocksdb_store_internal;  // NOLINT(build/namespaces): the store's own helpers.

namespace {

// The registry events a change of `action` appends in its own batch; empty for garbage_collect,
// which changes no version, alias or model.
std::vector<v1::RegistryEvent::Kind> EventKindsOf(absl::string_view action) {
  using Kind = v1::RegistryEvent;
  if (action == kAuditCommit) return {Kind::VERSION_COMMITTED};
  if (action == kAuditSetAlias) return {Kind::ALIAS_SET};
  if (action == kAuditDeleteAlias) return {Kind::ALIAS_DELETED};
  if (action == kAuditDeleteVersion) return {Kind::VERSION_DELETED};
  if (action == kAuditApplyRetention) {
    return {Kind::VERSION_DELETED, Kind::OPTIMIZER_STATE_DROPPED};
  }
  if (action == kAuditCreateModel) return {Kind::MODEL_CREATED};
  if (action == kAuditUpdateModel) return {Kind::MODEL_UPDATED};
  if (action == kAuditRenameModel) return {Kind::MODEL_RENAMED};
  if (action == kAuditDeleteModel) return {Kind::MODEL_DELETED};
  if (action == kAuditAnnotate) return {Kind::VERSION_ANNOTATED};
  return {};
}

// Whether `event` is the change the call of `record` made: same caller, model, kind, version and
// alias where the record names them, and not before the call began.
bool IsChangeOf(const v1::AuditRecord& record, const v1::RegistryEvent& event) {
  const std::vector<v1::RegistryEvent::Kind> kinds = EventKindsOf(record.action());
  if (std::find(kinds.begin(), kinds.end(), event.kind()) == kinds.end()) return false;
  if (event.identity() != record.identity() || event.model() != record.model()) return false;
  if (event.unix_micros() < record.unix_micros()) return false;
  // A commit's record names the version only once it is finished; a retention's, never.
  const bool names_version = record.action() != kAuditCommit &&
                             record.action() != kAuditApplyRetention && record.version() > 0;
  if (names_version && event.version() != record.version()) return false;
  const bool names_alias =
      record.action() == kAuditSetAlias || record.action() == kAuditDeleteAlias;
  if (names_alias && event.alias() != record.alias()) return false;
  return true;
}

}  // namespace

absl::Status RocksDbCheckpointStore::Core::LoadAuditLog() {
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

absl::Status RocksDbCheckpointStore::Core::ReconcilePendingAudit() {
  std::string through_bytes;
  int64_t through = 0;
  rocksdb::Status read = db_->Get(Read(), cf(ColumnFamily::kDefault),
                                  std::string(kAuditReconciledThroughKey), &through_bytes);
  if (read.ok()) {
    ASSIGN_OR_RETURN(const uint64_t decoded, DecodeBigEndian64(through_bytes));
    through = static_cast<int64_t>(decoded);
  } else if (!read.IsNotFound()) {
    return FromRocksDbStatus(read, "reading how far the audit log was reconciled");
  }
  int64_t last_sequence = 0;
  {
    absl::MutexLock lock(&audit_log_.mu);
    last_sequence = audit_log_.last_sequence;
  }
  if (last_sequence <= through) return absl::OkStatus();

  std::vector<v1::AuditRecord> pending;
  {
    std::unique_ptr<rocksdb::Iterator> it(db_->NewIterator(Read(), cf(ColumnFamily::kAudit)));
    for (it->Seek(AuditKey(through + 1)); it->Valid(); it->Next()) {
      v1::AuditRecord record;
      RETURN_IF_ERROR(ParseRecord(ToView(it->value()), record, "audit"));
      if (record.outcome() == v1::AuditRecord::PENDING) pending.push_back(std::move(record));
    }
    RETURN_IF_ERROR(FromRocksDbStatus(it->status(), "reading the audit log"));
  }
  rocksdb::WriteBatch batch;
  if (!pending.empty()) {
    // The events since the oldest pending call began, oldest first.
    std::vector<v1::RegistryEvent> events;
    {
      std::unique_ptr<rocksdb::Iterator> it(db_->NewIterator(Read(), cf(ColumnFamily::kHistory)));
      for (it->SeekToLast(); it->Valid(); it->Prev()) {
        v1::RegistryEvent event;
        RETURN_IF_ERROR(ParseRecord(ToView(it->value()), event, "registry event"));
        if (event.unix_micros() < pending.front().unix_micros()) break;
        events.push_back(std::move(event));
      }
      RETURN_IF_ERROR(FromRocksDbStatus(it->status(), "reading the registry history"));
      std::reverse(events.begin(), events.end());
    }
    std::vector<bool> claimed(events.size(), false);
    for (v1::AuditRecord& record : pending) {
      std::vector<int64_t> changes;
      for (size_t i = 0; i < events.size(); ++i) {
        if (claimed[i] || !IsChangeOf(record, events[i])) continue;
        claimed[i] = true;
        changes.push_back(events[i].sequence());
        if (events[i].version() > 0 && record.version() == 0) {
          record.set_version(events[i].version());
        }
        // A retention may delete several versions; every other call makes one change.
        if (record.action() != kAuditApplyRetention) break;
      }
      const std::string was =
          "the store stopped, or could not record the outcome, before the "
          "call finished; reconciled at open";
      if (!changes.empty()) {
        record.set_outcome(v1::AuditRecord::OK);
        record.set_detail(absl::StrCat(record.detail(), record.detail().empty() ? "" : "; ",
                                       "applied (", was, " with history event",
                                       changes.size() > 1 ? "s #" : " #",
                                       absl::StrJoin(changes, ", #"), ")"));
      } else {
        record.set_outcome(v1::AuditRecord::FAILED);
        record.set_error_code(static_cast<int32_t>(absl::StatusCode::kAborted));
        record.set_error_message(
            EventKindsOf(record.action()).empty()
                ? absl::StrCat("interrupted: ", was,
                               "; garbage collection changes no version, and a later pass frees "
                               "what this one did not")
                : absl::StrCat("not applied: ", was,
                               ", and the registry history holds no change of it"));
      }
      batch.Put(cf(ColumnFamily::kAudit), AuditKey(record.sequence()), record.SerializeAsString());
    }
  }
  batch.Put(cf(ColumnFamily::kDefault), std::string(kAuditReconciledThroughKey),
            EncodeBigEndian64(static_cast<uint64_t>(last_sequence)));
  return Write(batch,
               absl::StrCat("reconciling ", pending.size(), " unfinished audit records at open"),
               /*sync=*/!pending.empty());
}

absl::StatusOr<int64_t> RocksDbCheckpointStore::BeginAudit(v1::AuditRecord record) {
  if (record.identity().empty()) {
    return absl::InvalidArgumentError(absl::StrCat("an audit record of a '", record.action(),
                                                   "' call needs the identity of its caller"));
  }
  if (!IsAuditAction(record.action())) {
    return absl::InvalidArgumentError(absl::StrCat("unknown audit action '", record.action(),
                                                   "'; expected one of ",
                                                   absl::StrJoin(kAuditActions, ", ")));
  }
  // Whatever the caller put there: these are the store's to say.
  record.set_outcome(v1::AuditRecord::PENDING);
  record.clear_error_code();
  record.clear_error_message();

  Core::AuditLog& log = core_->audit_log();
  absl::MutexLock lock(&log.mu);
  const int64_t sequence = log.last_sequence + 1;
  // Never before the previous record, even if the clock steps back: `since` queries then see a
  // log ordered in time as well as by sequence.
  const int64_t unix_micros = std::max(NowMicros(), log.last_unix_micros);
  record.set_sequence(sequence);
  record.set_unix_micros(unix_micros);
  rocksdb::WriteBatch batch;
  batch.Put(core_->cf(ColumnFamily::kAudit), AuditKey(sequence), record.SerializeAsString());
  // A failed write may still have reached the log; the number is not handed out again.
  log.last_sequence = sequence;
  log.last_unix_micros = unix_micros;
  RETURN_IF_ERROR(core_->Write(
      batch, absl::StrCat("recording audit record ", sequence, " (", record.action(), ")"),
      /*sync=*/true));
  return sequence;
}

absl::Status RocksDbCheckpointStore::FinishAudit(int64_t sequence, const absl::Status& outcome,
                                                 absl::string_view detail, int64_t version) {
  if (sequence < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("audit sequence numbers start at 1; got ", sequence));
  }
  Core::AuditLog& log = core_->audit_log();
  // Under the log's lock, so two finishes of one record cannot both see it PENDING.
  absl::MutexLock lock(&log.mu);
  std::string bytes;
  rocksdb::Status read =
      core_->db()->Get(core_->Read(), core_->cf(ColumnFamily::kAudit), AuditKey(sequence), &bytes);
  if (read.IsNotFound()) {
    return absl::NotFoundError(absl::StrCat("no audit record ", sequence, " in the store"));
  }
  RETURN_IF_ERROR(FromRocksDbStatus(read, absl::StrCat("reading audit record ", sequence)));
  v1::AuditRecord record;
  RETURN_IF_ERROR(ParseRecord(bytes, record, absl::StrCat("audit record ", sequence)));
  if (record.outcome() != v1::AuditRecord::PENDING) {
    return absl::FailedPreconditionError(
        absl::StrCat("audit record ", sequence, " (", record.action(),
                     ") is already finished: ", v1::AuditRecord::Outcome_Name(record.outcome())));
  }
  if (outcome.ok()) {
    record.set_outcome(v1::AuditRecord::OK);
  } else {
    record.set_outcome(v1::AuditRecord::FAILED);
    record.set_error_code(static_cast<int32_t>(outcome.code()));
    record.set_error_message(std::string(outcome.message()));
  }
  if (!detail.empty()) record.set_detail(std::string(detail));
  if (version > 0) record.set_version(version);
  rocksdb::WriteBatch batch;
  batch.Put(core_->cf(ColumnFamily::kAudit), AuditKey(sequence), record.SerializeAsString());
  return core_->Write(batch,
                      absl::StrCat("finishing audit record ", sequence, " (", record.action(), ")"),
                      /*sync=*/true);
}

absl::StatusOr<std::vector<v1::AuditRecord>> RocksDbCheckpointStore::ListAudit(
    const AuditQuery& query) {
  if (!query.model.empty()) RETURN_IF_ERROR(ValidateModelName(query.model));
  if (query.after_sequence < 0 || query.limit < 0) {
    return absl::InvalidArgumentError(absl::StrCat("audit query: after_sequence (",
                                                   query.after_sequence, ") and limit (",
                                                   query.limit, ") must not be negative"));
  }
  const int64_t since = absl::ToUnixMicros(query.since);
  std::vector<v1::AuditRecord> records;
  std::unique_ptr<rocksdb::Iterator> it(
      core_->db()->NewIterator(core_->Read(), core_->cf(ColumnFamily::kAudit)));
  for (it->Seek(AuditKey(query.after_sequence + 1)); it->Valid(); it->Next()) {
    if (query.limit > 0 && static_cast<int64_t>(records.size()) >= query.limit) break;
    v1::AuditRecord record;
    RETURN_IF_ERROR(ParseRecord(ToView(it->value()), record, "audit"));
    if (!query.model.empty() && record.model() != query.model) continue;
    if (record.unix_micros() < since) continue;
    records.push_back(std::move(record));
  }
  RETURN_IF_ERROR(FromRocksDbStatus(it->status(), "listing the audit log"));
  return records;
}

}  // namespace ckpt

// RocksDbCheckpointStore: the audit log (see internal/rocksdb_store_core.h for how the store's
// files divide). Records are v1::AuditRecord under AuditKey(sequence) in the `audit` column
// family.

#include "libs/store/internal/rocksdb_store_core.h"
#include "libs/store/rocksdb_checkpoint_store.h"

namespace ckpt {

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

// RocksDbCheckpointStore::Core: construction, readers' registrations, writes and live uploads
// (see internal/rocksdb_store_core.h for how the store's files divide).

#include "libs/store/internal/rocksdb_store_core.h"

#include <unistd.h>

#include <algorithm>
#include <random>
#include <utility>

namespace ckpt {

using namespace rocksdb_store_internal;  // NOLINT(build/namespaces): the store's own helpers.
using Core = RocksDbCheckpointStore::Core;

namespace {

// host:pid:random: which process wrote a change-log record.
std::string NewWriterId() {
  char host[256] = {};
  if (::gethostname(host, sizeof(host) - 1) != 0) host[0] = '\0';
  std::random_device random;
  return absl::StrFormat("%s:%d:%08x", host, static_cast<int>(::getpid()), random());
}

}  // namespace

Core::Core(StoreOptions options, std::unique_ptr<StoreDb> db, std::shared_ptr<ChunkBackend> packs,
           bool skip_hashing)
    : options_(std::move(options)),
      skip_hashing_(skip_hashing),
      store_db_(std::move(db)),
      db_(store_db_->db()),
      packs_(std::move(packs)),
      writer_id_(NewWriterId()) {
  std::random_device random;
  upload_id_base_ = (static_cast<uint64_t>(random()) << 32) ^ random();
}

int64_t Core::AddReader() {
  absl::MutexLock lock(&readers_mu_);
  const int64_t id = next_reader_id_++;
  readers_.emplace(id, db_->GetLatestSequenceNumber());
  return id;
}

void Core::RemoveReader(int64_t id) {
  absl::MutexLock lock(&readers_mu_);
  readers_.erase(id);
}

uint64_t Core::OldestReaderSequence() {
  absl::MutexLock lock(&readers_mu_);
  uint64_t oldest = db_->GetLatestSequenceNumber();
  for (const auto& [id, sequence] : readers_) oldest = std::min(oldest, sequence);
  return oldest;
}

absl::Status Core::Write(rocksdb::WriteBatch& batch, absl::string_view what, bool sync) {
  if (sync && change_log_ != nullptr) return LogAndWrite(batch, what);
  if (sync && options_.sync_commits) return store_db_->WriteAcknowledged(batch, what);
  rocksdb::WriteOptions write;
  return FromRocksDbStatus(db_->Write(write, &batch), what);
}

absl::Status Core::WriteDurably(rocksdb::WriteBatch& batch, absl::string_view what) {
  if (change_log_ != nullptr) return LogAndWrite(batch, what);
  return store_db_->WriteAcknowledged(batch, what);
}

uint64_t Core::NewUploadNumber() {
  const uint64_t serial = next_upload_serial_.fetch_add(1);
  return upload_id_base_ + serial * 0x9e3779b97f4a7c15ull;
}

void Core::AddLiveUpload(const std::string& upload_id) {
  absl::MutexLock lock(&mu_);
  live_uploads_.insert(upload_id);
}

void Core::EndUploadLocked(const std::string& upload_id,
                           const absl::flat_hash_set<std::string>& pinned) {
  live_uploads_.erase(upload_id);
  for (const std::string& sha256 : pinned) {
    auto it = pinned_chunks_.find(sha256);
    if (it != pinned_chunks_.end() && --it->second == 0) pinned_chunks_.erase(it);
  }
}

void Core::EndUpload(const std::string& upload_id, const absl::flat_hash_set<std::string>& pinned) {
  absl::MutexLock lock(&mu_);
  EndUploadLocked(upload_id, pinned);
}

absl::Status Core::AddJoinableUpload(const std::string& name, const v1::Manifest& header) {
  auto copy = std::make_shared<const v1::Manifest>(header);
  absl::MutexLock lock(&mu_);
  if (!joinable_.try_emplace(name, Joinable{std::move(copy), {}}).second) {
    return absl::AlreadyExistsError(
        absl::StrCat("an upload joinable as '", name, "' is already in progress"));
  }
  return absl::OkStatus();
}

void Core::EndJoinableLocked(const std::string& name) {
  auto joinable = joinable_.find(name);
  if (joinable == joinable_.end()) return;
  std::vector<FinishedPart> orphans = std::move(joinable->second.parts);
  joinable_.erase(joinable);
  for (const FinishedPart& part : orphans) EndUploadLocked(part.upload_id, part.pinned);
}

void Core::EndJoinable(const std::string& name) {
  absl::MutexLock lock(&mu_);
  EndJoinableLocked(name);
}

absl::StatusOr<std::shared_ptr<const v1::Manifest>> Core::JoinableHeader(const std::string& name) {
  absl::MutexLock lock(&mu_);
  auto joinable = joinable_.find(name);
  if (joinable == joinable_.end()) {
    return absl::NotFoundError(
        absl::StrCat("no upload '", name, "' is in progress in this store to join"));
  }
  return joinable->second.header;
}

absl::Status Core::AdoptPart(const std::string& name, FinishedPart& part) {
  absl::MutexLock lock(&mu_);
  auto joinable = joinable_.find(name);
  if (joinable == joinable_.end()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "upload '", name, "' ended (committed or abandoned) before this part finished"));
  }
  joinable->second.parts.push_back(std::move(part));
  return absl::OkStatus();
}

std::vector<Core::FinishedPart> Core::TakeParts(const std::string& name) {
  absl::MutexLock lock(&mu_);
  auto joinable = joinable_.find(name);
  if (joinable == joinable_.end()) return {};
  return std::exchange(joinable->second.parts, {});
}

int64_t Core::LiveUploadCount() {
  absl::MutexLock lock(&mu_);
  return static_cast<int64_t>(live_uploads_.size());
}

}  // namespace ckpt

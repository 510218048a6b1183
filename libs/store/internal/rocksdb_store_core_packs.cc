// RocksDbCheckpointStore::Core: pack space -- removing packs nothing names, aborting stale pending
// writes, compacting sparse packs (see internal/rocksdb_store_core.h for how the store's files
// divide).

#include <algorithm>
#include <cstdio>
#include <utility>

#include "libs/store/internal/rocksdb_store_core.h"

namespace ckpt {

using namespace rocksdb_store_internal;  // NOLINT(build/namespaces): the store's own helpers.
using Core = RocksDbCheckpointStore::Core;

absl::StatusOr<Core::ReclaimOutcome> Core::ReclaimPacks(absl::flat_hash_set<uint64_t> writing,
                                                        absl::Time cutoff) {
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
    if (!compacted.ok()) report(absl::StrCat("compacting pack ", PackFileName(pack_id)), compacted);
  }
  // Readers on an older snapshot may still read removed packs through their descriptors.
  outcome.removals_failed += packs_->ReleaseRemoved(OldestReaderSequence());
  return outcome;
}

absl::StatusOr<absl::flat_hash_map<uint64_t, int64_t>> Core::ReadLiveLocations(
    absl::flat_hash_map<uint64_t, std::vector<std::pair<std::string, PackLocation>>>& live) {
  absl::flat_hash_map<uint64_t, int64_t> live_bytes;
  std::unique_ptr<rocksdb::Iterator> it(db_->NewIterator(Read(), cf(ColumnFamily::kPackedChunks)));
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

absl::Status Core::CompactPack(uint64_t pack_id,
                               std::vector<std::pair<std::string, PackLocation>>& chunks) {
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
    RETURN_IF_ERROR(
        WriteDurably(batch, absl::StrCat("relocating the chunks of pack ", PackFileName(pack_id))));
  } else {
    // Every chunk moved elsewhere meanwhile: the copy is named by nothing either.
    RETURN_IF_ERROR(packs_->Remove(writer->pack_id(), db_->GetLatestSequenceNumber()));
  }
  return packs_->Remove(pack_id, db_->GetLatestSequenceNumber());
}

}  // namespace ckpt

#include "libs/loader/chunk_cache.h"

#include <algorithm>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace ckpt {

std::string ChunkCacheStats::ToString() const {
  return absl::StrCat("hits=", hits, " misses=", misses, " shared_fills=", shared_fills,
                      " uncached_reads=", uncached_reads, " evictions=", evictions,
                      " bytes_from_store=", bytes_from_store,
                      " bytes_from_cache=", bytes_from_cache, " entries=", entries,
                      " resident_bytes=", resident_bytes,
                      " peak_resident_bytes=", peak_resident_bytes);
}

ChunkCache::ChunkCache(int64_t capacity_bytes)
    : capacity_bytes_(std::max<int64_t>(0, capacity_bytes)) {}

absl::Status ChunkCache::ReadTensorChunks(const VersionReader& reader, const v1::TensorMeta& meta,
                                          const ChunkCallback& callback) {
  return ReadTensorSharedChunks(
      reader, meta,
      [&callback](int64_t offset, absl::string_view bytes, const std::shared_ptr<const void>&) {
        return callback(offset, bytes);
      });
}

absl::Status ChunkCache::ReadTensorSharedChunks(const VersionReader& reader,
                                                const v1::TensorMeta& meta,
                                                const SharedChunkCallback& callback) {
  const std::shared_ptr<const void> no_owner;  // for bytes valid only during the call.
  const int count = meta.chunks_size();
  std::vector<std::shared_ptr<Slot>> slots(count);
  std::vector<bool> mine(count, false);
  bool any_mine = false;
  {
    absl::MutexLock lock(&mu_);
    for (int i = 0; i < count; ++i) {
      const std::string& sha256 = meta.chunks(i).sha256();
      auto it = slots_.find(sha256);
      if (it != slots_.end()) {
        slots[i] = it->second;
        Slot& slot = *it->second;
        ++stats_.hits;
        if (!slot.done) {
          ++stats_.shared_fills;
        } else if (slot.in_lru) {
          lru_.splice(lru_.begin(), lru_, slot.lru_position);  // most recently used.
        }
        continue;
      }
      auto slot = std::make_shared<Slot>();
      slot->sha256 = sha256;
      slots_.emplace(sha256, slot);
      slots[i] = std::move(slot);
      mine[i] = true;
      any_mine = true;
      ++stats_.misses;
    }
  }

  if (!any_mine) {
    // Everything is cached or being filled by others: gather the bytes, then hand them out. (A
    // fill that fails leaves nothing to hand out, and the callback must see every byte once.)
    std::vector<std::shared_ptr<const std::string>> chunks(count);
    bool all_filled = true;
    {
      absl::MutexLock lock(&mu_);
      for (int i = 0; i < count; ++i) {
        Slot* slot = slots[i].get();
        mu_.Await(absl::Condition(&slot->done));
        if (slot->bytes == nullptr) {
          all_filled = false;
          break;
        }
        chunks[i] = slot->bytes;
      }
      if (all_filled) {
        stats_.bytes_from_cache += meta.byte_length();
      } else {
        ++stats_.uncached_reads;
      }
    }
    if (!all_filled) {
      return reader.ReadTensorChunks(meta, [&](int64_t offset, absl::string_view bytes) {
        return callback(offset, bytes, no_owner);
      });
    }
    int64_t offset = 0;
    for (const auto& chunk : chunks) {
      absl::Status status = callback(offset, *chunk, chunk);
      if (!status.ok()) return status;
      offset += static_cast<int64_t>(chunk->size());
    }
    return absl::OkStatus();
  }

  // Read the tensor from the store once; publish the chunks this reader claimed as they complete.
  // Pieces may not line up with chunks (a remote reader delivers message-sized pieces), so they
  // are reassembled into whole chunks before being cached and handed on.
  int current = 0;          // chunk being assembled.
  int64_t chunk_start = 0;  // its offset in the tensor.
  std::string pending;
  absl::Status status =
      reader.ReadTensorChunks(meta, [&](int64_t offset, absl::string_view bytes) -> absl::Status {
        while (!bytes.empty()) {
          if (current >= count) {
            return absl::DataLossError(absl::StrCat("tensor '", meta.key(), "': the store sent ",
                                                    "bytes beyond its chunk list"));
          }
          const int64_t length = meta.chunks(current).length();
          const size_t take = static_cast<size_t>(
              std::min<int64_t>(length - static_cast<int64_t>(pending.size()), bytes.size()));
          if (pending.empty() && static_cast<int64_t>(take) == length && !mine[current]) {
            // A whole chunk nobody waits on from us: pass it through without a copy.
            absl::Status sent = callback(chunk_start, bytes.substr(0, take), no_owner);
            if (!sent.ok()) return sent;
          } else {
            pending.append(bytes.data(), take);
            if (static_cast<int64_t>(pending.size()) < length) return absl::OkStatus();
            auto filled = std::make_shared<const std::string>(std::move(pending));
            pending = std::string();
            if (mine[current]) {
              Publish(slots[current], filled);
              mine[current] = false;
            }
            absl::Status sent = callback(chunk_start, *filled, filled);
            if (!sent.ok()) return sent;
          }
          bytes.remove_prefix(take);
          chunk_start += length;
          ++current;
        }
        return absl::OkStatus();
      });
  if (status.ok() && current != count) {
    status =
        absl::DataLossError(absl::StrCat("tensor '", meta.key(), "': the store sent ", chunk_start,
                                         " bytes, its chunks hold ", meta.byte_length()));
  }
  for (int i = 0; i < count; ++i) {
    if (mine[i]) {
      Fail(slots[i], status.ok() ? absl::InternalError("chunk was not delivered") : status);
    }
  }
  return status;
}

void ChunkCache::Publish(const std::shared_ptr<Slot>& slot,
                         std::shared_ptr<const std::string> bytes) {
  absl::MutexLock lock(&mu_);
  const int64_t size = static_cast<int64_t>(bytes->size());
  stats_.bytes_from_store += size;
  slot->bytes = std::move(bytes);
  slot->done = true;
  auto it = slots_.find(slot->sha256);
  if (it == slots_.end() || it->second != slot) return;
  if (size > capacity_bytes_) {
    // Waiters hold the slot and get the bytes; the cache does not keep them.
    slots_.erase(it);
    return;
  }
  lru_.push_front(slot->sha256);
  slot->lru_position = lru_.begin();
  slot->in_lru = true;
  stats_.resident_bytes += size;
  ++stats_.entries;
  EvictToCapacity();
  stats_.peak_resident_bytes = std::max(stats_.peak_resident_bytes, stats_.resident_bytes);
}

void ChunkCache::Fail(const std::shared_ptr<Slot>& slot, const absl::Status& status) {
  absl::MutexLock lock(&mu_);
  slot->status = status;
  slot->done = true;
  auto it = slots_.find(slot->sha256);
  if (it != slots_.end() && it->second == slot) slots_.erase(it);
}

void ChunkCache::EvictToCapacity() {
  while (stats_.resident_bytes > capacity_bytes_ && !lru_.empty()) {
    auto it = slots_.find(lru_.back());
    lru_.pop_back();
    if (it == slots_.end()) continue;
    stats_.resident_bytes -= static_cast<int64_t>(it->second->bytes->size());
    --stats_.entries;
    ++stats_.evictions;
    it->second->in_lru = false;
    slots_.erase(it);
  }
}

ChunkCacheStats ChunkCache::stats() const {
  absl::MutexLock lock(&mu_);
  return stats_;
}

namespace {

class CachingReader final : public VersionReader {
 public:
  CachingReader(std::unique_ptr<VersionReader> reader, ChunkCache* cache)
      : owned_(std::move(reader)), reader_(*owned_), cache_(*cache) {}
  CachingReader(const VersionReader& reader, ChunkCache* cache) : reader_(reader), cache_(*cache) {}

  const v1::Manifest& manifest() const override { return reader_.manifest(); }

  absl::Status ReadTensorChunks(const v1::TensorMeta& meta,
                                const ChunkCallback& callback) const override {
    return cache_.ReadTensorChunks(reader_, meta, callback);
  }

  // Ranges go to the reader itself: the cache holds whole tensors' chunks for whole loads.
  absl::Status ReadTensorRange(const v1::TensorMeta& meta, int64_t begin, int64_t end,
                               char* destination) const override {
    return reader_.ReadTensorRange(meta, begin, end, destination);
  }

 private:
  const std::unique_ptr<VersionReader> owned_;  // null when borrowed.
  const VersionReader& reader_;
  ChunkCache& cache_;
};

}  // namespace

std::unique_ptr<VersionReader> CachedVersionReader(std::unique_ptr<VersionReader> reader,
                                                   ChunkCache* cache) {
  return std::make_unique<CachingReader>(std::move(reader), cache);
}

std::unique_ptr<VersionReader> CachedVersionReader(const VersionReader& reader, ChunkCache* cache) {
  return std::make_unique<CachingReader>(reader, cache);
}

}  // namespace ckpt

#include "libs/loader/chunk_cache.h"

#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "ATen/core/Tensor.h"
#include "ATen/ops/arange.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "libs/status/status_matchers.h"
#include "libs/store/checkpoint_contents.h"
#include "libs/store/rocksdb_checkpoint_store.h"
#include "libs/store/version_ref.h"

namespace ckpt {
namespace {

using ::ckpt::testing::StatusIs;

bool BytesEqual(const at::Tensor& a, const at::Tensor& b) {
  if (a.scalar_type() != b.scalar_type() || a.sizes() != b.sizes()) return false;
  return std::memcmp(a.contiguous().data_ptr(), b.contiguous().data_ptr(), a.nbytes()) == 0;
}

class ChunkCacheTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const char* tmp = std::getenv("TEST_TMPDIR");
    StoreOptions options;
    options.db_path = std::string(tmp != nullptr ? tmp : "/tmp") + "/" +
                      ::testing::UnitTest::GetInstance()->current_test_info()->name();
    ASSERT_OK_AND_ASSIGN(store_, RocksDbCheckpointStore::Open(options));
    // 10 MiB: three chunks (4 + 4 + 2 MiB), plus a small tensor of one chunk.
    big_ = at::arange(int64_t{10} << 18, at::kFloat);  // 2.5 Mi floats
    small_ = at::arange(16, at::kFloat);
    CheckpointContents contents;
    ASSERT_OK(contents.model.Insert("big", big_));
    ASSERT_OK(contents.model.Insert("small", small_));
    ASSERT_OK_AND_ASSIGN(CommitResult committed, CommitCheckpoint(*store_, "m", contents));
    ref_ = committed.version;
  }

  std::unique_ptr<RocksDbCheckpointStore> store_;
  at::Tensor big_, small_;
  v1::VersionRef ref_;
};

TEST_F(ChunkCacheTest, SecondReadIsServedFromTheCache) {
  ChunkCache cache(int64_t{64} << 20);
  for (int round = 0; round < 2; ++round) {
    ASSERT_OK_AND_ASSIGN(std::unique_ptr<VersionReader> reader, store_->OpenVersion(ref_));
    std::unique_ptr<VersionReader> cached = CachedVersionReader(std::move(reader), &cache);
    ASSERT_OK_AND_ASSIGN(at::Tensor big, ReadTensor(*cached, "big"));
    ASSERT_OK_AND_ASSIGN(at::Tensor small, ReadTensor(*cached, "small"));
    EXPECT_TRUE(BytesEqual(big, big_));
    EXPECT_TRUE(BytesEqual(small, small_));
  }
  const ChunkCacheStats stats = cache.stats();
  EXPECT_EQ(stats.misses, 4);
  EXPECT_EQ(stats.hits, 4);
  EXPECT_EQ(stats.entries, 4);
  EXPECT_EQ(stats.resident_bytes, (int64_t{10} << 20) + 64);
  EXPECT_EQ(stats.bytes_from_store, (int64_t{10} << 20) + 64);
  EXPECT_EQ(stats.bytes_from_cache, (int64_t{10} << 20) + 64);
}

TEST_F(ChunkCacheTest, ConcurrentReadersShareOneFillPerChunk) {
  ChunkCache cache(int64_t{64} << 20);
  constexpr int kReaders = 8;
  std::vector<std::thread> threads;
  std::vector<bool> equal(kReaders, false);
  for (int i = 0; i < kReaders; ++i) {
    threads.emplace_back([&, i] {
      absl::StatusOr<std::unique_ptr<VersionReader>> reader = store_->OpenVersion(ref_);
      if (!reader.ok()) return;
      std::unique_ptr<VersionReader> cached = CachedVersionReader(*std::move(reader), &cache);
      absl::StatusOr<at::Tensor> big = ReadTensor(*cached, "big");
      equal[i] = big.ok() && BytesEqual(*big, big_);
    });
  }
  for (std::thread& thread : threads) thread.join();
  for (int i = 0; i < kReaders; ++i) EXPECT_TRUE(equal[i]) << "reader " << i;
  const ChunkCacheStats stats = cache.stats();
  // Each of the 3 chunks is read from the store once, whoever got there first.
  EXPECT_EQ(stats.misses, 3);
  EXPECT_EQ(stats.hits, 3 * (kReaders - 1));
  EXPECT_EQ(stats.bytes_from_store, int64_t{10} << 20);
  EXPECT_EQ(stats.uncached_reads, 0);
}

TEST_F(ChunkCacheTest, StaysWithinCapacityByEvictingLeastRecentlyUsed) {
  ChunkCache cache(int64_t{5} << 20);  // room for one 4 MiB chunk (plus the small one).
  for (int round = 0; round < 2; ++round) {
    ASSERT_OK_AND_ASSIGN(std::unique_ptr<VersionReader> reader, store_->OpenVersion(ref_));
    std::unique_ptr<VersionReader> cached = CachedVersionReader(std::move(reader), &cache);
    ASSERT_OK_AND_ASSIGN(at::Tensor big, ReadTensor(*cached, "big"));
    EXPECT_TRUE(BytesEqual(big, big_));
  }
  const ChunkCacheStats stats = cache.stats();
  EXPECT_LE(stats.peak_resident_bytes, int64_t{5} << 20);
  EXPECT_LE(stats.resident_bytes, int64_t{5} << 20);
  EXPECT_GT(stats.evictions, 0);
  EXPECT_EQ(stats.misses + stats.hits, 6);
}

TEST_F(ChunkCacheTest, ZeroCapacityCachesNothingButStillServesBytes) {
  ChunkCache cache(0);
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<VersionReader> reader, store_->OpenVersion(ref_));
  std::unique_ptr<VersionReader> cached = CachedVersionReader(std::move(reader), &cache);
  ASSERT_OK_AND_ASSIGN(at::Tensor big, ReadTensor(*cached, "big"));
  EXPECT_TRUE(BytesEqual(big, big_));
  EXPECT_EQ(cache.stats().resident_bytes, 0);
  EXPECT_EQ(cache.stats().entries, 0);
}

TEST_F(ChunkCacheTest, CallbackErrorStopsTheReadAndLeavesNothingHalfFilled) {
  ChunkCache cache(int64_t{64} << 20);
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<VersionReader> reader, store_->OpenVersion(ref_));
  const v1::TensorMeta& meta = reader->manifest().tensors(0);
  EXPECT_THAT(cache.ReadTensorChunks(*reader, meta,
                                     [](int64_t offset, absl::string_view) {
                                       return offset > 0 ? absl::CancelledError("client went away")
                                                         : absl::OkStatus();
                                     }),
              StatusIs(absl::StatusCode::kCancelled, "client went away"));
  // The chunk after the failure was never filled; a fresh read fills it and returns every byte.
  std::unique_ptr<VersionReader> cached = CachedVersionReader(std::move(reader), &cache);
  ASSERT_OK_AND_ASSIGN(at::Tensor big, ReadTensor(*cached, "big"));
  EXPECT_TRUE(BytesEqual(big, big_));
}

// What one ReadTensorSharedChunks call handed out.
struct SharedPiece {
  int64_t offset;
  absl::string_view bytes;
  std::shared_ptr<const void> owner;
};

std::vector<SharedPiece> ReadShared(ChunkCache& cache, const VersionReader& reader,
                                    const v1::TensorMeta& meta) {
  std::vector<SharedPiece> pieces;
  const absl::Status status = cache.ReadTensorSharedChunks(
      reader, meta,
      [&](int64_t offset, absl::string_view bytes, const std::shared_ptr<const void>& owner) {
        pieces.push_back({offset, bytes, owner});
        return absl::OkStatus();
      });
  EXPECT_TRUE(status.ok()) << status;
  return pieces;
}

// Each piece's bytes, read after the call (so only valid through their owners), are the
// tensor's bytes at their offsets, and together they cover it.
void ExpectOwnedPiecesHold(const std::vector<SharedPiece>& pieces, const at::Tensor& expected) {
  const char* data = static_cast<const char*>(expected.data_ptr());
  int64_t covered = 0;
  for (const SharedPiece& piece : pieces) {
    ASSERT_NE(piece.owner, nullptr) << "piece at " << piece.offset;
    EXPECT_EQ(piece.offset, covered);
    EXPECT_EQ(std::memcmp(piece.bytes.data(), data + piece.offset, piece.bytes.size()), 0)
        << "piece at " << piece.offset;
    covered += static_cast<int64_t>(piece.bytes.size());
  }
  EXPECT_EQ(covered, static_cast<int64_t>(expected.nbytes()));
}

TEST_F(ChunkCacheTest, SharedChunksAreTheCachesOwnMemoryAndOutliveEviction) {
  ChunkCache cache(int64_t{64} << 20);
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<VersionReader> reader, store_->OpenVersion(ref_));
  const v1::TensorMeta& meta = reader->manifest().tensors(0);
  ASSERT_EQ(meta.key(), "big");
  const std::vector<SharedPiece> filled = ReadShared(cache, *reader, meta);  // the fills.
  const std::vector<SharedPiece> cached = ReadShared(cache, *reader, meta);  // hits.
  ASSERT_EQ(filled.size(), 3u);
  ASSERT_EQ(cached.size(), 3u);
  for (size_t i = 0; i < filled.size(); ++i) {
    EXPECT_EQ(cached[i].bytes.data(), filled[i].bytes.data()) << "a hit was copied: chunk " << i;
  }
  ExpectOwnedPiecesHold(filled, big_);

  // A small cache evicts the 4 MiB chunks as the next ones fill; the owners keep them.
  ChunkCache small_cache(int64_t{5} << 20);
  const std::vector<SharedPiece> evicted = ReadShared(small_cache, *reader, meta);
  EXPECT_GT(small_cache.stats().evictions, 0);
  ExpectOwnedPiecesHold(evicted, big_);

  // A chunk larger than the whole capacity is not kept, but still comes with its owner.
  ChunkCache tiny_cache(int64_t{1} << 20);
  const std::vector<SharedPiece> uncached = ReadShared(tiny_cache, *reader, meta);
  EXPECT_EQ(tiny_cache.stats().entries, 0);
  ExpectOwnedPiecesHold(uncached, big_);
}

}  // namespace
}  // namespace ckpt

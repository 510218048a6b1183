#include "libs/store/rocksdb_checkpoint_store.h"

#include <dirent.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "ATen/core/Tensor.h"
#include "ATen/ops/equal.h"
#include "ATen/ops/full.h"
#include "ATen/ops/ones.h"
#include "ATen/ops/zeros.h"
#include "ATen/ops/zeros_like.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "libs/status/status_matchers.h"
#include "libs/store/checkpoint_contents.h"
#include "libs/store/chunk_hasher.h"
#include "libs/store/chunk_pack.h"
#include "libs/store/rocksdb_schema.h"
#include "libs/store/store_records.pb.h"
#include "libs/store/testing/store_conformance.h"
#include "libs/store/version_ref.h"

namespace ckpt {
namespace {

using ::ckpt::testing::StatusIs;
using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::UnorderedElementsAre;

using ::ckpt::testing::AdamState;
using ::ckpt::testing::ExpectSameTensor;
using ::ckpt::testing::kMiB;
using ::ckpt::testing::MakeStateDict;
using ::ckpt::testing::OneTensorHeader;
using ::ckpt::testing::Ref;
using ::ckpt::testing::Seeded;
using ::ckpt::testing::StepLrState;
using ::ckpt::testing::TensorBytes;
using ::ckpt::testing::WeightsOnly;

class RocksDbCheckpointStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const char* tmp = std::getenv("TEST_TMPDIR");
    path_ = std::string(tmp != nullptr ? tmp : "/tmp") + "/" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name();
    options_.db_path = path_;
    options_.abandoned_upload_grace = absl::ZeroDuration();
    Reopen();
  }

  void Reopen() {
    store_.reset();
    absl::StatusOr<std::unique_ptr<RocksDbCheckpointStore>> store =
        RocksDbCheckpointStore::Open(options_);
    ASSERT_OK(store.status());
    store_ = *std::move(store);
  }

  CommitResult MustCommit(const std::string& model, const CheckpointContents& contents,
                          const CommitOptions& options = {}) {
    absl::StatusOr<CommitResult> result = CommitCheckpoint(*store_, model, contents, options);
    EXPECT_OK(result.status());
    return result.value_or(CommitResult());
  }

  std::string path_;
  StoreOptions options_;
  std::unique_ptr<RocksDbCheckpointStore> store_;
};

std::vector<std::string> PackFiles(const std::string& store_path) {
  std::vector<std::string> files;
  DIR* handle = opendir((store_path + "/packs").c_str());
  if (handle == nullptr) return files;
  while (dirent* entry = readdir(handle)) {
    const std::string name = entry->d_name;
    if (name.size() > 5 && name.substr(name.size() - 5) == ".pack") {
      files.push_back(store_path + "/packs/" + name);
    }
  }
  closedir(handle);
  std::sort(files.begin(), files.end());
  return files;
}

TEST_F(RocksDbCheckpointStoreTest, AbandonedUploadLeavesNoVersionAndGcReclaimsIt) {
  const std::string data = TensorBytes(Seeded({5 * kMiB / 4}, 1));  // 5 MiB
  {
    ASSERT_OK_AND_ASSIGN(std::unique_ptr<UploadSession> session,
                         store_->BeginUpload("m", OneTensorHeader("w", 5 * kMiB), {}));
    ASSERT_OK(session->AddTensorData(0, 0, data.substr(0, 4 * kMiB + 100)));
    ASSERT_OK_AND_ASSIGN(v1::StoreStats during, store_->GetStats());
    EXPECT_EQ(during.uploads_in_progress(), 1);
  }  // destroyed without Commit
  EXPECT_THAT(store_->GetManifest(Ref("m")), StatusIs(absl::StatusCode::kNotFound));
  ASSERT_OK_AND_ASSIGN(v1::StoreStats stats, store_->GetStats());
  EXPECT_EQ(stats.uploads_in_progress(), 0);
  EXPECT_EQ(stats.versions(), 0);

  ASSERT_OK_AND_ASSIGN(v1::GarbageCollectResponse collected, store_->GarbageCollect(false));
  EXPECT_EQ(collected.abandoned_uploads_reclaimed(), 1);
  EXPECT_EQ(collected.chunks_freed(), 1);
  EXPECT_EQ(collected.bytes_freed(), 4 * kMiB);
  ASSERT_OK_AND_ASSIGN(collected, store_->GarbageCollect(false));
  EXPECT_EQ(collected.abandoned_uploads_reclaimed(), 0);

  // The chunk really is gone: no location names it and its pack file was removed.
  store_.reset();
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<StoreDb> db, StoreDb::Open(path_, false));
  std::string value;
  EXPECT_TRUE(db->db()
                  ->Get(rocksdb::ReadOptions(), db->cf(ColumnFamily::kPackedChunks),
                        Sha256(absl::string_view(data).substr(0, 4 * kMiB)), &value)
                  .IsNotFound());
  EXPECT_THAT(PackFiles(path_), IsEmpty());
}

TEST_F(RocksDbCheckpointStoreTest, AbandonedUploadWithinGracePeriodIsKept) {
  options_.abandoned_upload_grace = absl::Hours(1);
  Reopen();
  {
    ASSERT_OK_AND_ASSIGN(std::unique_ptr<UploadSession> session,
                         store_->BeginUpload("m", OneTensorHeader("w", 4 * kMiB), {}));
    ASSERT_OK(session->AddTensorData(0, 0, std::string(4 * kMiB, 'x')));
  }
  ASSERT_OK_AND_ASSIGN(v1::GarbageCollectResponse collected, store_->GarbageCollect(false));
  EXPECT_EQ(collected.abandoned_uploads_reclaimed(), 0);
  EXPECT_EQ(collected.chunks_freed(), 0);
}

// A failed import leaves a pack file behind: one whose commit was refused (every byte written)
// and one that stopped mid-tensor (a partial pack). GC keeps both while the abandoned-upload grace
// runs (a client that reconnects may reuse them), also after the importing process is gone, and
// removes them, files and all, once the grace has passed; committed versions stay whole.
TEST_F(RocksDbCheckpointStoreTest, PacksOfFailedImportsAreReclaimedOnceTheGraceHasPassed) {
  options_.abandoned_upload_grace = absl::Hours(1);
  Reopen();
  const CheckpointContents kept = WeightsOnly({{"w", Seeded({kMiB / 4}, 1)}});
  MustCommit("m", kept);
  std::vector<std::string> committed_packs;

  {
    // Every byte written, then the commit refused: another writer committed m@2 meanwhile.
    CommitOptions expect_one;
    expect_one.expected_latest_version = 1;
    ASSERT_OK_AND_ASSIGN(std::unique_ptr<UploadSession> session,
                         store_->BeginUpload("m", OneTensorHeader("w", 8 * kMiB), expect_one));
    MustCommit("m", kept);
    // m@2 deduplicated into m@1's chunk; GC removes the pack it wrote first. The failed uploads
    // create theirs with their first chunk, below.
    ASSERT_OK(store_->GarbageCollect(false).status());
    committed_packs = PackFiles(path_);
    ASSERT_OK(session->AddTensorData(0, 0, TensorBytes(Seeded({2 * kMiB}, 2))));
    EXPECT_THAT(session->Commit(), StatusIs(absl::StatusCode::kFailedPrecondition));
  }
  {
    const std::string bytes = TensorBytes(Seeded({3 * kMiB}, 3));  // 12 MiB, 5 MiB of it sent.
    ASSERT_OK_AND_ASSIGN(std::unique_ptr<UploadSession> session,
                         store_->BeginUpload("m", OneTensorHeader("w", 12 * kMiB), {}));
    ASSERT_OK(session->AddTensorData(0, 0, absl::string_view(bytes).substr(0, 5 * kMiB)));
  }                                          // the import failed here
  const absl::Time failed_at = absl::Now();  // both uploads began before this.
  const std::vector<std::string> with_failed = PackFiles(path_);
  ASSERT_EQ(with_failed.size(), committed_packs.size() + 2);

  ASSERT_OK_AND_ASSIGN(v1::GarbageCollectResponse collected, store_->GarbageCollect(false));
  EXPECT_EQ(collected.abandoned_uploads_reclaimed(), 0);
  EXPECT_EQ(PackFiles(path_), with_failed);
  Reopen();  // the importing process is gone; another one opens the store
  ASSERT_OK_AND_ASSIGN(collected, store_->GarbageCollect(false));
  EXPECT_EQ(collected.abandoned_uploads_reclaimed(), 0);
  EXPECT_EQ(PackFiles(path_), with_failed);

  // The same store once the grace has passed (a short grace, so the test need not wait an hour).
  options_.abandoned_upload_grace = absl::Seconds(1);
  Reopen();
  absl::SleepFor(failed_at + absl::Seconds(1) + absl::Milliseconds(50) - absl::Now());
  ASSERT_OK_AND_ASSIGN(collected, store_->GarbageCollect(false));
  EXPECT_EQ(collected.abandoned_uploads_reclaimed(), 2);
  EXPECT_EQ(collected.bytes_freed(), 8 * kMiB + 4 * kMiB);  // the whole chunks each one stored.
  EXPECT_EQ(PackFiles(path_), committed_packs);
  ASSERT_OK_AND_ASSIGN(v1::VerifyResponse verified, store_->Verify("", 0));
  EXPECT_THAT(verified.problems(), IsEmpty());
  for (int64_t version : {1, 2}) {
    ASSERT_OK_AND_ASSIGN(at::Tensor w, ReadTensor(*store_, "m", version, "w"));
    ExpectSameTensor(w, *kept.model.Find("w"), absl::StrCat("m@", version, " w"));
  }
}

TEST_F(RocksDbCheckpointStoreTest, GcNeverFreesChunksOfALiveUpload) {
  // A chunk whose last version was deleted (refcount 0) that a live upload relies on, and a chunk
  // the live upload stored itself.
  const std::string reused(kMiB, 'r');
  const std::string fresh(kMiB, 'f');
  MustCommit("m", WeightsOnly({{"w", at::full({kMiB}, 'r', at::kByte)}}));
  ASSERT_OK(store_->DeleteVersion("m", 1, false).status());

  v1::Manifest header = OneTensorHeader("a", kMiB);
  *header.add_tensors() = OneTensorHeader("b", kMiB).tensors(0);
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<UploadSession> session,
                       store_->BeginUpload("m", header, {}));
  ASSERT_OK(session->AddTensorData(0, 0, reused));
  ASSERT_OK(session->AddTensorData(1, 0, fresh));

  ASSERT_OK_AND_ASSIGN(v1::GarbageCollectResponse collected, store_->GarbageCollect(false));
  EXPECT_EQ(collected.chunks_freed(), 0);
  EXPECT_EQ(collected.abandoned_uploads_reclaimed(), 0);

  ASSERT_OK_AND_ASSIGN(CommitResult committed, session->Commit());
  EXPECT_EQ(committed.version.version(), 2);
  EXPECT_EQ(committed.new_bytes, kMiB);  // `reused` was still stored
  ASSERT_OK_AND_ASSIGN(at::Tensor a, ReadTensor(*store_, "m", 2, "a"));
  EXPECT_EQ(TensorBytes(a), reused);
  ASSERT_OK_AND_ASSIGN(at::Tensor b, ReadTensor(*store_, "m", 2, "b"));
  EXPECT_EQ(TensorBytes(b), fresh);
  ASSERT_OK_AND_ASSIGN(collected, store_->GarbageCollect(false));
  EXPECT_EQ(collected.chunks_freed(), 0);
  ASSERT_OK_AND_ASSIGN(v1::VerifyResponse verified, store_->Verify("", 0));
  EXPECT_THAT(verified.problems(), IsEmpty());
}

TEST_F(RocksDbCheckpointStoreTest, ConcurrentGcNeverBreaksUploadsThatReuseCollectableChunks) {
  // Each round commits a version holding `shared`, then deletes it, so `shared` sits at refcount
  // 0 when the next round's upload finds it present and skips storing it. GC runs all the while.
  const at::Tensor shared = Seeded({kMiB / 4}, 1);  // 1 MiB
  std::atomic<bool> done{false};
  std::atomic<int> collections{0};
  std::thread collector([&] {
    while (!done.load()) {
      ASSERT_OK(store_->GarbageCollect(false).status());
      collections.fetch_add(1);
    }
  });
  int64_t last = 0;
  for (int round = 0; round < 20; ++round) {
    const at::Tensor own = at::full({1000}, static_cast<float>(round));
    absl::StatusOr<CommitResult> committed =
        CommitCheckpoint(*store_, "m", WeightsOnly({{"shared", shared}, {"own", own}}));
    ASSERT_OK(committed.status());
    last = committed->version.version();
    ASSERT_OK_AND_ASSIGN(at::Tensor read, ReadTensor(*store_, "m", last, "shared"));
    ExpectSameTensor(read, shared, "shared");
    if (round < 19) {
      ASSERT_OK(store_->DeleteVersion("m", last, false).status());
    }
  }
  done.store(true);
  collector.join();
  EXPECT_GT(collections.load(), 0);
  ASSERT_OK_AND_ASSIGN(LoadedCheckpoint loaded, LoadCheckpoint(*store_, Ref("m")));
  EXPECT_EQ(loaded.manifest.version(), last);
  ExpectSameTensor(*loaded.contents.model.Find("shared"), shared, "shared");
  ASSERT_OK_AND_ASSIGN(v1::VerifyResponse verified, store_->Verify("", 0));
  EXPECT_THAT(verified.problems(), IsEmpty());
}

TEST_F(RocksDbCheckpointStoreTest, StableDataIsStoredInTheBackgroundAndErrorsSurface) {
  const std::string big = TensorBytes(Seeded({9 * kMiB / 4}, 1));  // 9 MiB: 3 chunks
  v1::Manifest header = OneTensorHeader("w", 9 * kMiB);
  *header.add_tensors() = OneTensorHeader("v", 3).tensors(0);
  {
    ASSERT_OK_AND_ASSIGN(std::unique_ptr<UploadSession> session,
                         store_->BeginUpload("m", header, {}));
    ASSERT_OK(session->AddStableTensorData(0, 0, big));
    // A partial piece falls back to the synchronous path, after the queue drains.
    ASSERT_OK(session->AddStableTensorData(1, 0, "ab"));
    ASSERT_OK(session->AddStableTensorData(1, 2, "c"));
    ASSERT_OK_AND_ASSIGN(CommitResult committed, session->Commit());
    EXPECT_EQ(committed.version.version(), 1);
  }
  ASSERT_OK_AND_ASSIGN(v1::Manifest manifest, store_->GetManifest(Ref("m@1")));
  EXPECT_EQ(manifest.tensors(0).chunks_size(), 3);
  EXPECT_EQ(manifest.tensors(0).content_hash(), ContentHashOfBytes(big));
  EXPECT_EQ(manifest.tensors(1).content_hash(), ContentHashOfBytes("abc"));

  // A content_hash mismatch found in the background fails the commit.
  header.mutable_tensors(0)->set_content_hash(ContentHashOfBytes("other"));
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<UploadSession> session,
                       store_->BeginUpload("m", header, {}));
  ASSERT_OK(session->AddStableTensorData(0, 0, big));
  // The next call drains the background work and reports its error; the session is failed.
  EXPECT_THAT(session->AddTensorData(1, 0, "abc"),
              StatusIs(absl::StatusCode::kDataLoss, "content_hash"));
  EXPECT_THAT(session->Commit().status(),
              StatusIs(absl::StatusCode::kFailedPrecondition, "failed earlier"));
  EXPECT_THAT(session->AddStableTensorData(1, 0, "abc"),
              StatusIs(absl::StatusCode::kFailedPrecondition, "failed earlier"));
}

TEST_F(RocksDbCheckpointStoreTest, ParallelHashingStoresManyPiecesInOrder) {
  // Pieces of one to three chunks and single small pieces, hashed by several threads: every
  // tensor must come back byte for byte, its chunks in order.
  v1::Manifest header;
  std::vector<std::string> data;
  for (int i = 0; i < 24; ++i) {
    const int64_t bytes = i % 3 == 0 ? (i % 2 + 1) * 4 * kMiB + 12345 : 1000 + 97 * i;
    data.push_back(TensorBytes(Seeded({bytes / 4}, i + 1)));
    *header.add_tensors() =
        OneTensorHeader(absl::StrCat("t", i), static_cast<int64_t>(data.back().size())).tensors(0);
  }
  {
    ASSERT_OK_AND_ASSIGN(std::unique_ptr<UploadSession> session,
                         store_->BeginUpload("m", header, {}));
    for (int i = 0; i < 24; ++i) ASSERT_OK(session->AddStableTensorData(i, 0, data[i]));
    ASSERT_OK(session->Commit().status());
  }
  ASSERT_OK_AND_ASSIGN(v1::Manifest manifest, store_->GetManifest(Ref("m@1")));
  for (int i = 0; i < 24; ++i) {
    EXPECT_EQ(manifest.tensors(i).content_hash(), ContentHashOfBytes(data[i])) << i;
    ASSERT_OK_AND_ASSIGN(at::Tensor read, ReadTensor(*store_, "m", 1, absl::StrCat("t", i)));
    EXPECT_EQ(TensorBytes(read), data[i]) << i;
  }
}

// Where chunk `sha256` lives, read from the store's `packed_chunks` column family.
PackLocation LocateChunk(const std::string& path, const std::string& sha256) {
  absl::StatusOr<std::unique_ptr<StoreDb>> db = StoreDb::Open(path, false);
  EXPECT_TRUE(db.ok()) << db.status();
  std::string value;
  EXPECT_TRUE(
      (*db)
          ->db()
          ->Get(rocksdb::ReadOptions(), (*db)->cf(ColumnFamily::kPackedChunks), sha256, &value)
          .ok());
  store::PackedChunk record;
  EXPECT_TRUE(record.ParseFromString(value));
  return {record.pack_id(), record.offset(), record.length()};
}

// Flips one bit of the byte at `offset` of `file`.
void FlipByte(const std::string& file, int64_t offset) {
  std::fstream stream(file, std::ios::in | std::ios::out | std::ios::binary);
  stream.seekg(offset);
  char byte = 0;
  stream.read(&byte, 1);
  byte ^= 0x40;
  stream.seekp(offset);
  stream.write(&byte, 1);
}

// Flips one byte in the middle of chunk `sha256` in its pack file.
void CorruptChunkValue(const std::string& path, const std::string& sha256) {
  const PackLocation location = LocateChunk(path, sha256);
  FlipByte(path + "/packs/" + PackFileName(location.pack_id),
           location.offset + location.length / 2);
}

TEST_F(RocksDbCheckpointStoreTest, CorruptChunkIsDataLossNamingItAndVerifyReportsIt) {
  const at::Tensor w = Seeded({5 * kMiB / 4}, 1);  // chunks of 4 MiB + 1 MiB
  MustCommit("m", WeightsOnly({{"layer.weight", w}, {"layer.bias", Seeded({10}, 2)}}));
  ASSERT_OK_AND_ASSIGN(v1::Manifest manifest, store_->GetManifest(Ref("m@1")));
  const std::string bad = manifest.tensors(0).chunks(1).sha256();
  store_.reset();
  CorruptChunkValue(path_, bad);
  Reopen();

  EXPECT_THAT(ReadTensor(*store_, "m", 1, "layer.weight"),
              StatusIs(absl::StatusCode::kDataLoss,
                       AllOf(HasSubstr(HexEncode(bad)), HasSubstr("'layer.weight'"),
                             HasSubstr("m@1"), HasSubstr("xxh3"))));
  EXPECT_THAT(LoadCheckpoint(*store_, Ref("m")),
              StatusIs(absl::StatusCode::kDataLoss, HexEncode(bad)));
  // The stream stops before the bad chunk: the good first chunk, then the error.
  int64_t delivered = 0;
  EXPECT_THAT(store_->ReadTensorChunks(manifest.tensors(0),
                                       [&](int64_t, absl::string_view bytes) {
                                         delivered += bytes.size();
                                         return absl::OkStatus();
                                       }),
              StatusIs(absl::StatusCode::kDataLoss));
  EXPECT_EQ(delivered, 4 * kMiB);
  // Other tensors are unaffected.
  ASSERT_OK(ReadTensor(*store_, "m", 1, "layer.bias").status());

  for (const std::string& model : {std::string("m"), std::string()}) {
    ASSERT_OK_AND_ASSIGN(v1::VerifyResponse verified, store_->Verify(model, 0));
    ASSERT_EQ(verified.problems_size(), 1) << model;
    const v1::VerifyProblem& problem = verified.problems(0);
    EXPECT_EQ(problem.model(), "m");
    EXPECT_EQ(problem.version(), 1);
    EXPECT_EQ(problem.tensor_key(), "layer.weight");
    EXPECT_EQ(problem.chunk_sha256(), bad);
    EXPECT_THAT(problem.message(), HasSubstr("xxh3 mismatch"));
    EXPECT_EQ(verified.chunks_checked(), 3);
    EXPECT_EQ(verified.bytes_checked(), 5 * kMiB + 40);
  }
}

TEST_F(RocksDbCheckpointStoreTest, TruncatedPackFileIsDataLossNotACrash) {
  MustCommit("m", WeightsOnly({{"w", Seeded({kMiB}, 1)}, {"b", Seeded({10}, 2)}}));
  store_.reset();
  const std::vector<std::string> packs = PackFiles(path_);
  ASSERT_EQ(packs.size(), 1u);
  ASSERT_EQ(truncate(packs[0].c_str(), 2 * kMiB), 0);
  Reopen();
  // A mapping past the end of the file would be SIGBUS on first touch: refused up front.
  EXPECT_THAT(ReadTensor(*store_, "m", 1, "w"),
              StatusIs(absl::StatusCode::kDataLoss,
                       AllOf(HasSubstr("of tensor 'w' of m@1"), HasSubstr("beyond the end"))));
  ASSERT_OK_AND_ASSIGN(v1::VerifyResponse verified, store_->Verify("m", 1));
  EXPECT_GE(verified.problems_size(), 1);
}

TEST_F(RocksDbCheckpointStoreTest, LoadedTensorsAreMappedPrivately) {
  const at::Tensor w = Seeded({kMiB}, 1);  // 4 MiB: mapped
  MustCommit("m", WeightsOnly({{"w", w}}));
  ASSERT_OK_AND_ASSIGN(at::Tensor loaded, ReadTensor(*store_, "m", 1, "w"));
  ASSERT_TRUE(at::equal(loaded, w));
  loaded.add_(1);  // copy-on-write: the store keeps its bytes
  ASSERT_OK_AND_ASSIGN(at::Tensor again, ReadTensor(*store_, "m", 1, "w"));
  EXPECT_TRUE(at::equal(again, w));
  ASSERT_OK_AND_ASSIGN(v1::VerifyResponse verified, store_->Verify("m", 1));
  EXPECT_THAT(verified.problems(), IsEmpty());

  options_.map_tensors_on_load = false;
  Reopen();
  ASSERT_OK_AND_ASSIGN(at::Tensor copied, ReadTensor(*store_, "m", 1, "w"));
  EXPECT_TRUE(at::equal(copied, w));
}

TEST_F(RocksDbCheckpointStoreTest, DeduplicatedTwinsLoadIntoSeparateMemory) {
  // Equal bytes are one chunk in the store; loaded (both large enough to be mapped), they must
  // still be two tensors.
  const at::Tensor zeros = at::zeros({kMiB});
  MustCommit("m",
             WeightsOnly({{"a.bias", zeros}, {"b.bias", zeros.clone()}, {"w", Seeded({300}, 1)}}));
  ASSERT_OK_AND_ASSIGN(LoadedCheckpoint loaded, LoadCheckpoint(*store_, Ref("m")));
  at::Tensor a = *loaded.contents.model.Find("a.bias");
  at::Tensor b = *loaded.contents.model.Find("b.bias");
  EXPECT_NE(a.data_ptr(), b.data_ptr());
  a.add_(1);
  EXPECT_TRUE(at::equal(b, zeros));
  EXPECT_TRUE(at::equal(*loaded.contents.model.Find("w"), Seeded({300}, 1)));
}

TEST_F(RocksDbCheckpointStoreTest, TensorsSharingAChunkLoadIntoSeparateMemory) {
  // b's bytes are a's second chunk: stored once, so b's bytes lie inside a's in the pack.
  const at::Tensor a = Seeded({2 * kMiB}, 1);  // 8 MiB: two chunks
  const at::Tensor b = a.narrow(0, kMiB, kMiB).clone();
  MustCommit("m", WeightsOnly({{"a", a}, {"b", b}}));
  ASSERT_OK_AND_ASSIGN(LoadedCheckpoint loaded, LoadCheckpoint(*store_, Ref("m")));
  at::Tensor loaded_a = *loaded.contents.model.Find("a");
  at::Tensor loaded_b = *loaded.contents.model.Find("b");
  ASSERT_TRUE(at::equal(loaded_a, a));
  ASSERT_TRUE(at::equal(loaded_b, b));
  loaded_a.fill_(0);
  EXPECT_TRUE(at::equal(loaded_b, b));
  loaded_b.fill_(1);
  EXPECT_TRUE(at::equal(loaded_a, at::zeros_like(a)));
}

// Corruption on the copy paths: tensors under 1 MiB and every tensor with map_tensors_on_load
// off are read by copying (ReadTensorInto), not mapped, and must check each chunk's xxh3 there.
TEST_F(RocksDbCheckpointStoreTest, CorruptChunkIsDataLossOnTheCopyPathsToo) {
  const at::Tensor small = Seeded({64 * 1024}, 1);     // 256 KiB: never mapped
  const at::Tensor large = Seeded({3 * kMiB / 2}, 2);  // chunks of 4 + 2 MiB: mapped when allowed
  MustCommit("m", WeightsOnly({{"small", small}, {"large", large}, {"ok", Seeded({100}, 3)}}));
  ASSERT_OK_AND_ASSIGN(v1::Manifest manifest, store_->GetManifest(Ref("m@1")));
  ASSERT_EQ(manifest.tensors(0).key(), "small");
  ASSERT_EQ(manifest.tensors(1).key(), "large");
  const std::string bad_small = manifest.tensors(0).chunks(0).sha256();
  const std::string bad_large = manifest.tensors(1).chunks(1).sha256();
  store_.reset();
  CorruptChunkValue(path_, bad_small);
  CorruptChunkValue(path_, bad_large);

  for (const bool map : {true, false}) {
    SCOPED_TRACE(map ? "map_tensors_on_load" : "copy only");
    options_.map_tensors_on_load = map;
    Reopen();
    EXPECT_THAT(ReadTensor(*store_, "m", 1, "small"),
                StatusIs(absl::StatusCode::kDataLoss,
                         AllOf(HasSubstr(HexEncode(bad_small)), HasSubstr("'small'"),
                               HasSubstr("m@1"), HasSubstr("xxh3"))));
    EXPECT_THAT(
        ReadTensor(*store_, "m", 1, "large"),
        StatusIs(absl::StatusCode::kDataLoss,
                 AllOf(HasSubstr(HexEncode(bad_large)), HasSubstr("'large'"), HasSubstr("xxh3"))));
    EXPECT_THAT(LoadCheckpoint(*store_, Ref("m")), StatusIs(absl::StatusCode::kDataLoss));
    // ReadTensorInto itself, as the store service's Download calls it, on each chunk alone too.
    ASSERT_OK_AND_ASSIGN(std::unique_ptr<VersionReader> reader, store_->OpenVersion(Ref("m@1")));
    for (int index : {0, 1}) {
      const v1::TensorMeta& meta = reader->manifest().tensors(index);
      std::string buffer(meta.byte_length(), '\0');
      EXPECT_THAT(reader->ReadTensorInto(meta, buffer.data()),
                  StatusIs(absl::StatusCode::kDataLoss, HasSubstr("xxh3")))
          << meta.key();
      for (const v1::ChunkRef& chunk : meta.chunks()) {
        v1::TensorMeta one_chunk;
        one_chunk.set_key(meta.key());
        one_chunk.set_byte_length(chunk.length());
        *one_chunk.add_chunks() = chunk;
        const bool corrupt = chunk.sha256() == bad_small || chunk.sha256() == bad_large;
        const absl::Status read = reader->ReadTensorInto(one_chunk, buffer.data());
        if (corrupt) {
          EXPECT_THAT(read,
                      StatusIs(absl::StatusCode::kDataLoss, HasSubstr(HexEncode(chunk.sha256()))));
        } else {
          EXPECT_OK(read);
        }
      }
    }
    // The sound tensor still reads.
    ASSERT_OK_AND_ASSIGN(at::Tensor ok, ReadTensor(*store_, "m", 1, "ok"));
    EXPECT_TRUE(at::equal(ok, Seeded({100}, 3)));
  }
}

// Deduplicated twins share their chunks; each must be checked on its own read, whichever path
// it takes (the first of two large twins read through one reader is mapped, the second copied,
// since two tensors never share memory; small twins are both copied).
TEST_F(RocksDbCheckpointStoreTest, CorruptChunkSharedByDeduplicatedTwinsIsDataLossForEach) {
  const at::Tensor large = Seeded({kMiB}, 1);       // 4 MiB, one chunk
  const at::Tensor small = Seeded({16 * 1024}, 2);  // 64 KiB, one chunk
  MustCommit("m", WeightsOnly({{"a.large", large},
                               {"b.large", large.clone()},
                               {"a.small", small},
                               {"b.small", small.clone()}}));
  ASSERT_OK_AND_ASSIGN(v1::Manifest manifest, store_->GetManifest(Ref("m@1")));
  ASSERT_EQ(manifest.tensors_size(), 4);
  // Twins: one chunk each, stored once.
  ASSERT_EQ(manifest.tensors(0).chunks(0).sha256(), manifest.tensors(1).chunks(0).sha256());
  ASSERT_EQ(manifest.tensors(2).chunks(0).sha256(), manifest.tensors(3).chunks(0).sha256());
  store_.reset();
  CorruptChunkValue(path_, manifest.tensors(0).chunks(0).sha256());
  CorruptChunkValue(path_, manifest.tensors(2).chunks(0).sha256());

  for (const bool map : {true, false}) {
    SCOPED_TRACE(map ? "map_tensors_on_load" : "copy only");
    options_.map_tensors_on_load = map;
    Reopen();
    for (const std::vector<int>& order : {std::vector<int>{0, 1, 2, 3}, {1, 0, 3, 2}}) {
      ASSERT_OK_AND_ASSIGN(std::unique_ptr<VersionReader> reader, store_->OpenVersion(Ref("m@1")));
      for (int index : order) {
        const v1::TensorMeta& meta = reader->manifest().tensors(index);
        EXPECT_THAT(
            ReadTensor(*reader, meta),
            StatusIs(absl::StatusCode::kDataLoss,
                     AllOf(HasSubstr(HexEncode(meta.chunks(0).sha256())),
                           HasSubstr(absl::StrCat("'", meta.key(), "'")), HasSubstr("xxh3"))))
            << meta.key();
      }
    }
  }
}

TEST_F(RocksDbCheckpointStoreTest, SchemaOneInlineChunksStayReadable) {
  const at::Tensor w = Seeded({3 * kMiB / 2}, 1);  // chunks of 4 + 2 MiB
  MustCommit("m", WeightsOnly({{"w", w}}));
  ASSERT_OK_AND_ASSIGN(v1::Manifest manifest, store_->GetManifest(Ref("m@1")));
  store_.reset();
  {
    // Move the second chunk into `chunks` as a schema-1 store held it.
    const std::string sha256 = manifest.tensors(0).chunks(1).sha256();
    const PackLocation location = LocateChunk(path_, sha256);
    ASSERT_OK_AND_ASSIGN(std::unique_ptr<PackDirectory> packs,
                         PackDirectory::Open(path_ + "/packs"));
    std::string bytes(location.length, '\0');
    ASSERT_OK(packs->Read(location, bytes.data()));
    ASSERT_OK_AND_ASSIGN(std::unique_ptr<StoreDb> db, StoreDb::Open(path_, false));
    ASSERT_TRUE(
        db->db()->Put(rocksdb::WriteOptions(), db->cf(ColumnFamily::kChunks), sha256, bytes).ok());
    ASSERT_TRUE(db->db()
                    ->Delete(rocksdb::WriteOptions(), db->cf(ColumnFamily::kPackedChunks), sha256)
                    .ok());
  }
  Reopen();
  ASSERT_OK_AND_ASSIGN(at::Tensor loaded, ReadTensor(*store_, "m", 1, "w"));
  EXPECT_TRUE(at::equal(loaded, w));
  ASSERT_OK_AND_ASSIGN(v1::VerifyResponse verified, store_->Verify("", 0));
  EXPECT_THAT(verified.problems(), IsEmpty());
}

TEST_F(RocksDbCheckpointStoreTest, GcRemovesDeadPacksAndCompactsMostlyDeadOnes) {
  const at::Tensor backbone = Seeded({kMiB / 4}, 1);  // 1 MiB, shared by both versions
  const at::Tensor head_1 = Seeded({kMiB}, 2);        // 4 MiB
  const at::Tensor head_2 = Seeded({kMiB}, 3);
  MustCommit("m", WeightsOnly({{"backbone", backbone}, {"head", head_1}}));
  MustCommit("m", WeightsOnly({{"backbone", backbone}, {"head", head_2}}));
  MustCommit("other", WeightsOnly({{"x", Seeded({kMiB}, 4)}}));
  ASSERT_EQ(PackFiles(path_).size(), 3u);

  // Version 1's pack then holds 1 live MiB of 5: it is rewritten, and version 2's pack (only
  // head_2 live, the backbone was deduplicated against version 1) is kept.
  ASSERT_OK(store_->DeleteVersion("m", 1, false).status());
  {
    ASSERT_OK_AND_ASSIGN(std::unique_ptr<VersionReader> reader, store_->OpenVersion(Ref("m@2")));
    ASSERT_OK(store_->GarbageCollect(false).status());
    // The reader still reads through the removed pack's descriptor.
    ASSERT_OK_AND_ASSIGN(at::Tensor read, ReadTensor(*reader, "backbone"));
    EXPECT_TRUE(at::equal(read, backbone));
  }
  EXPECT_EQ(PackFiles(path_).size(), 3u);  // v1's pack replaced by its compacted copy
  ASSERT_OK_AND_ASSIGN(LoadedCheckpoint loaded, LoadCheckpoint(*store_, Ref("m@2")));
  EXPECT_TRUE(at::equal(*loaded.contents.model.Find("backbone"), backbone));
  EXPECT_TRUE(at::equal(*loaded.contents.model.Find("head"), head_2));

  // Deleting the other model leaves its pack dead: removed.
  ASSERT_OK(store_->DeleteVersion("other", 1, false).status());
  ASSERT_OK(store_->GarbageCollect(false).status());
  EXPECT_EQ(PackFiles(path_).size(), 2u);
  ASSERT_OK_AND_ASSIGN(v1::VerifyResponse verified, store_->Verify("", 0));
  EXPECT_THAT(verified.problems(), IsEmpty());
  Reopen();
  ASSERT_OK_AND_ASSIGN(loaded, LoadCheckpoint(*store_, Ref("m@2")));
  EXPECT_TRUE(at::equal(*loaded.contents.model.Find("backbone"), backbone));
}

TEST_F(RocksDbCheckpointStoreTest, ReopenSeesEverythingCommitted) {
  CheckpointContents contents = WeightsOnly({{"w", Seeded({3 * kMiB / 2}, 1)}});
  contents.scheduler = StepLrState(4);
  CommitOptions options;
  options.aliases = {"best"};
  MustCommit("m", contents, options);
  MustCommit("m", WeightsOnly({{"w", Seeded({10}, 2)}}));

  options_.create_if_missing = false;
  Reopen();
  ASSERT_OK_AND_ASSIGN(LoadedCheckpoint loaded, LoadCheckpoint(*store_, Ref("m@best")));
  EXPECT_EQ(loaded.manifest.version(), 1);
  ExpectSameTensor(*loaded.contents.model.Find("w"), *contents.model.Find("w"), "w");
  EXPECT_EQ(*loaded.contents.scheduler, *contents.scheduler);
  ASSERT_OK_AND_ASSIGN(v1::Manifest latest, store_->GetManifest(Ref("m")));
  EXPECT_EQ(latest.version(), 2);
  ASSERT_OK_AND_ASSIGN(v1::VerifyResponse verified, store_->Verify("", 0));
  EXPECT_THAT(verified.problems(), IsEmpty());
  EXPECT_EQ(MustCommit("m", WeightsOnly({{"w", at::ones({1})}})).version.version(), 3);
}

TEST_F(RocksDbCheckpointStoreTest, OpeningAMissingStoreWithoutCreateIsNotFound) {
  StoreOptions missing;
  missing.db_path = path_ + "_missing";
  missing.create_if_missing = false;
  EXPECT_THAT(RocksDbCheckpointStore::Open(missing), StatusIs(absl::StatusCode::kNotFound));
  EXPECT_THAT(RocksDbCheckpointStore::Open(StoreOptions()),
              StatusIs(absl::StatusCode::kInvalidArgument, "db_path"));
}

// The RocksDB store runs the CheckpointStore conformance suite (libs/store/testing).
class EmbeddedStore final : public testing::StoreHarness {
 public:
  explicit EmbeddedStore(std::unique_ptr<RocksDbCheckpointStore> store)
      : store_(std::move(store)) {}
  CheckpointStore& store() override { return *store_; }

 private:
  std::unique_ptr<RocksDbCheckpointStore> store_;
};

}  // namespace

namespace testing {
INSTANTIATE_TEST_SUITE_P(RocksDb, StoreConformanceTest,
                         ::testing::Values(StoreConformanceParam{
                             "rocksdb",
                             [](const std::string& dir) -> std::unique_ptr<StoreHarness> {
                               StoreOptions options;
                               options.db_path = dir + "/db";
                               options.abandoned_upload_grace = absl::ZeroDuration();
                               absl::StatusOr<std::unique_ptr<RocksDbCheckpointStore>> store =
                                   RocksDbCheckpointStore::Open(options);
                               EXPECT_OK(store.status());
                               if (!store.ok()) return nullptr;
                               return std::make_unique<EmbeddedStore>(*std::move(store));
                             }}),
                         [](const ::testing::TestParamInfo<StoreConformanceParam>& info) {
                           return info.param.name;
                         });
}  // namespace testing

namespace {}  // namespace
}  // namespace ckpt

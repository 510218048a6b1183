// S3ChunkBackend against libs/s3's fake S3 server (testdata/fake_s3_server.py under
// /usr/bin/python3: SigV4 checked, objects and multipart uploads in memory), so these run without
// Ceph: the backend's own tests, and the CheckpointStore conformance suite on a RocksDB store whose
// packs are objects there. The store on a real radosgw is s3_chunk_backend_ceph_test.

#include "libs/store/s3_chunk_backend.h"

#include <sys/stat.h>

#include <atomic>
#include <cstdlib>
#include <fstream>
#include <future>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "libs/s3/s3_client.h"
#include "libs/s3/testing/fake_s3_server.h"
#include "libs/status/status_matchers.h"
#include "libs/store/checkpoint_contents.h"
#include "libs/store/rocksdb_checkpoint_store.h"
#include "libs/store/testing/store_conformance.h"
#include "libs/testing/child_process.h"
#include "nlohmann/json.hpp"

namespace ckpt {
namespace {

using ::ckpt::testing::StatusIs;
using ::testing::HasSubstr;
using ::testing::SizeIs;

constexpr uint64_t kMiB = uint64_t{1} << 20;

// The fake, and a client of it that gives up after two attempts.
class FakeS3 : public testing::FakeS3Server {
 public:
  // Its files go to `dir` (created); by default a directory named after the running test.
  explicit FakeS3(std::string dir = "") : FakeS3Server({}, false, std::move(dir)) {}

  std::shared_ptr<s3::S3Client> Client() const {
    s3::S3ClientOptions options = ClientOptions();
    options.max_attempts = 2;
    absl::StatusOr<std::unique_ptr<s3::S3Client>> client = s3::S3Client::Create(options);
    EXPECT_TRUE(client.ok()) << client.status();
    return client.ok() ? std::shared_ptr<s3::S3Client>(*std::move(client)) : nullptr;
  }
};

std::unique_ptr<S3ChunkBackend> MakeBackend(std::shared_ptr<s3::S3Client> client,
                                            const std::string& prefix = "store/") {
  S3ChunkBackendOptions options;
  options.prefix = prefix;
  absl::StatusOr<std::unique_ptr<S3ChunkBackend>> backend =
      S3ChunkBackend::Create(std::move(client), options);
  EXPECT_TRUE(backend.ok()) << backend.status();
  return backend.ok() ? *std::move(backend) : nullptr;
}

// How many entries a listing returned; -1 (and a failure) when it failed.
template <typename T>
int CountOf(const absl::StatusOr<std::vector<T>>& listed) {
  EXPECT_TRUE(listed.ok()) << listed.status();
  return listed.ok() ? static_cast<int>(listed->size()) : -1;
}

std::string Bytes(size_t size, int seed) {
  std::string out(size, '\0');
  for (size_t i = 0; i < size; ++i) out[i] = static_cast<char>((i * 131 + seed + i / 4093) & 0xff);
  return out;
}

TEST(S3ChunkBackendTest, ASmallPackIsOnePutAlignedReadableByRangeAndSealedBySync) {
  FakeS3 server;
  std::shared_ptr<s3::S3Client> client = server.Client();
  std::unique_ptr<S3ChunkBackend> backend = MakeBackend(client);
  EXPECT_EQ(backend->ObjectKey(0xab), "store/packs/00000000000000ab.pack");
  EXPECT_FALSE(backend->CanMap());
  EXPECT_THAT(backend->MapWhole(0xab), StatusIs(absl::StatusCode::kUnimplemented));

  ASSERT_OK_AND_ASSIGN(std::unique_ptr<ChunkWriter> writer, backend->NewPack(0xab));
  ASSERT_OK_AND_ASSIGN(int64_t first, writer->Append("abc", 1));
  ASSERT_OK_AND_ASSIGN(int64_t second, writer->Append(Bytes(5000, 1), 4096));
  EXPECT_EQ(first, 0);
  EXPECT_EQ(second, 4096);
  EXPECT_EQ(writer->size(), 4096 + 5000);
  // Not visible before Sync.
  EXPECT_THAT(client->HeadObject(backend->ObjectKey(0xab)), StatusIs(absl::StatusCode::kNotFound));
  ASSERT_OK(writer->Sync());
  ASSERT_OK(writer->Sync());  // again, with nothing new: fine.
  EXPECT_THAT(writer->Append("more", 1),
              StatusIs(absl::StatusCode::kFailedPrecondition, "immutable"));

  std::string read(5000, '\0');
  ASSERT_OK(backend->Read({0xab, second, 5000}, read.data()));
  EXPECT_TRUE(read == Bytes(5000, 1));
  std::string padding(4093, 'x');
  ASSERT_OK(backend->Read({0xab, 3, 4093}, padding.data()));
  EXPECT_EQ(padding, std::string(4093, '\0'));

  ASSERT_OK_AND_ASSIGN(std::vector<PackInfo> listed, backend->List());
  ASSERT_THAT(listed, SizeIs(1));
  EXPECT_EQ(listed[0].pack_id, 0xabu);
  EXPECT_EQ(listed[0].size, 4096 + 5000);
  ASSERT_TRUE(listed[0].last_modified.has_value());
  EXPECT_LE(*listed[0].last_modified, absl::Now() + absl::Seconds(1));
  EXPECT_GE(*listed[0].last_modified, absl::Now() - absl::Minutes(1));

  // Pack ids are never reused: an existing object refuses a new writer.
  EXPECT_THAT(backend->NewPack(0xab), StatusIs(absl::StatusCode::kAlreadyExists));
}

TEST(S3ChunkBackendTest, ALargePackGoesUpInPartsAsItFillsAndAppearsOnlyAtSync) {
  FakeS3 server;
  std::shared_ptr<s3::S3Client> client = server.Client();
  std::unique_ptr<S3ChunkBackend> backend = MakeBackend(client);
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<ChunkWriter> writer, backend->NewPack(7));
  const std::string data = Bytes(20 * kMiB + 123, 2);
  for (size_t at = 0; at < data.size(); at += kMiB) {
    ASSERT_OK(writer->Append(absl::string_view(data).substr(at, kMiB), 1).status());
  }
  // Two full parts went up while appending: the upload is pending, the object not there yet.
  ASSERT_OK_AND_ASSIGN(std::vector<PendingPack> pending, backend->ListPending());
  ASSERT_THAT(pending, SizeIs(1));
  EXPECT_EQ(pending[0].pack_id, 7u);
  EXPECT_EQ(CountOf(backend->List()), 0);
  ASSERT_OK(writer->Sync());
  EXPECT_EQ(CountOf(backend->ListPending()), 0);

  std::string whole(data.size(), '\0');
  ASSERT_OK(backend->Read({7, 0, static_cast<int64_t>(data.size())}, whole.data()));
  EXPECT_TRUE(whole == data);
  std::string across(2 * kMiB, '\0');  // a range across the first part boundary.
  ASSERT_OK(backend->Read({7, static_cast<int64_t>(7 * kMiB), static_cast<int64_t>(2 * kMiB)},
                          across.data()));
  EXPECT_TRUE(across == data.substr(7 * kMiB, 2 * kMiB));
}

TEST(S3ChunkBackendTest, MissingOrShortObjectsAreDataLoss) {
  FakeS3 server;
  std::shared_ptr<s3::S3Client> client = server.Client();
  std::unique_ptr<S3ChunkBackend> backend = MakeBackend(client);
  std::string buffer(100, '\0');
  EXPECT_THAT(backend->Read({1, 0, 10}, buffer.data()),
              StatusIs(absl::StatusCode::kDataLoss, "missing"));
  ASSERT_OK(client->PutObject(backend->ObjectKey(1), "0123456789"));
  EXPECT_THAT(backend->Read({1, 5, 10}, buffer.data()),
              StatusIs(absl::StatusCode::kDataLoss, "ends after 10 bytes"));
  EXPECT_THAT(backend->Read({1, 10, 1}, buffer.data()),
              StatusIs(absl::StatusCode::kDataLoss, "beyond the end"));
}

TEST(S3ChunkBackendTest, ARemovedPackIsUnlistedAtOnceAndDeletedWhenReleased) {
  FakeS3 server;
  std::shared_ptr<s3::S3Client> client = server.Client();
  std::unique_ptr<S3ChunkBackend> backend = MakeBackend(client);
  ASSERT_OK(client->PutObject(backend->ObjectKey(1), "0123456789"));
  ASSERT_OK(backend->Remove(1, /*generation=*/10));
  EXPECT_EQ(CountOf(backend->List()), 0);
  // A reader on an older snapshot can still read it...
  std::string buffer(4, '\0');
  ASSERT_OK(backend->Read({1, 2, 4}, buffer.data()));
  EXPECT_EQ(buffer, "2345");
  backend->ReleaseRemoved(9);  // an older generation: kept
  ASSERT_OK(backend->Read({1, 2, 4}, buffer.data()));
  // ...until the removal's generation is released.
  backend->ReleaseRemoved(10);
  EXPECT_THAT(backend->Read({1, 0, 1}, buffer.data()),
              StatusIs(absl::StatusCode::kDataLoss, "missing"));
  EXPECT_THAT(client->HeadObject(backend->ObjectKey(1)), StatusIs(absl::StatusCode::kNotFound));
}

TEST(S3ChunkBackendTest, AnAbandonedWriterAbortsItsUploadAndPendingOnesCanBeAborted) {
  FakeS3 server;
  std::shared_ptr<s3::S3Client> client = server.Client();
  std::unique_ptr<S3ChunkBackend> backend = MakeBackend(client);
  {
    ASSERT_OK_AND_ASSIGN(std::unique_ptr<ChunkWriter> writer, backend->NewPack(3));
    ASSERT_OK(writer->Append(Bytes(9 * kMiB, 3), 1).status());
    EXPECT_EQ(CountOf(backend->ListPending()), 1);
  }  // destroyed without Sync
  EXPECT_EQ(CountOf(backend->ListPending()), 0);

  // What a killed process leaves: an upload nobody will finish. Objects and uploads outside
  // the backend's prefix, or not named like packs, are not its business.
  ASSERT_OK_AND_ASSIGN(std::string upload_id, client->CreateMultipartUpload(backend->ObjectKey(4)));
  ASSERT_OK(client->CreateMultipartUpload("other/packs/0000000000000004.pack").status());
  ASSERT_OK(client->PutObject("store/packs/notes.txt", "x"));
  ASSERT_OK_AND_ASSIGN(std::vector<PendingPack> pending, backend->ListPending());
  ASSERT_THAT(pending, SizeIs(1));
  EXPECT_EQ(pending[0].pack_id, 4u);
  EXPECT_EQ(pending[0].handle, upload_id);
  EXPECT_GE(pending[0].started, absl::Now() - absl::Minutes(1));
  ASSERT_OK(backend->AbortPending(pending[0]));
  EXPECT_OK(backend->AbortPending(pending[0]));  // gone already: fine.
  EXPECT_EQ(CountOf(backend->ListPending()), 0);
  EXPECT_EQ(CountOf(backend->List()), 0);
}

TEST(S3ChunkBackendTest, CreateRefusesBadOptionsAndAnUnreachableBucket) {
  FakeS3 server;
  std::shared_ptr<s3::S3Client> client = server.Client();
  S3ChunkBackendOptions options;
  options.prefix = "no-slash";
  EXPECT_THAT(S3ChunkBackend::Create(client, options),
              StatusIs(absl::StatusCode::kInvalidArgument, "end in '/'"));
  options.prefix = "/abs/";
  EXPECT_THAT(S3ChunkBackend::Create(client, options),
              StatusIs(absl::StatusCode::kInvalidArgument, "start with '/'"));
  options.prefix = "";
  options.part_size = 5 * kMiB;
  EXPECT_THAT(S3ChunkBackend::Create(client, options),
              StatusIs(absl::StatusCode::kInvalidArgument, "part size"));
  EXPECT_THAT(S3ChunkBackend::Create(nullptr, S3ChunkBackendOptions()),
              StatusIs(absl::StatusCode::kInvalidArgument));

  s3::S3ClientOptions wrong = client->options();
  wrong.bucket = "no-such-bucket";
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<s3::S3Client> wrong_client, s3::S3Client::Create(wrong));
  EXPECT_THAT(S3ChunkBackend::Create(std::move(wrong_client), S3ChunkBackendOptions()),
              StatusIs(absl::StatusCode::kNotFound, "cannot list"));
}

// Which --chunks_s3_* flags go together: checked here once for the store service, the loader and
// ckpt.
TEST(S3ChunkStorageFromFlagsTest, NoFlagIsIgnoredAndTheEndpointNeedsABucket) {
  ASSERT_OK_AND_ASSIGN(S3ChunkStorageConfig none, S3ChunkStorageFromFlags({}));
  EXPECT_TRUE(none.endpoint.empty());
  S3ChunkFlags stray;
  stray.region = "default";
  stray.ca_file = "ca.pem";
  EXPECT_THAT(S3ChunkStorageFromFlags(stray),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "--chunks_s3_region, --chunks_s3_ca_file need --chunks_s3_endpoint"));
  S3ChunkFlags no_bucket;
  no_bucket.endpoint = "http://127.0.0.1:1";
  EXPECT_THAT(S3ChunkStorageFromFlags(no_bucket),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "--chunks_s3_endpoint needs --chunks_s3_bucket"));
  const std::string credentials = absl::StrCat(std::getenv("TEST_TMPDIR"), "/credentials");
  {
    std::ofstream file(credentials);
    file << "[default]\naws_access_key_id = AKID\naws_secret_access_key = SECRET\n";
  }
  S3ChunkFlags full = no_bucket;
  full.bucket = "ckpt";
  full.prefix = "team-a/";
  full.credentials_file = credentials;
  ASSERT_OK_AND_ASSIGN(S3ChunkStorageConfig config, S3ChunkStorageFromFlags(full));
  EXPECT_EQ(config.bucket, "ckpt");
  EXPECT_EQ(config.prefix, "team-a/");
  EXPECT_EQ(config.region, "us-east-1");  // the default when --chunks_s3_region is not given.
  EXPECT_EQ(config.access_key, "AKID");
  EXPECT_EQ(config.secret_key, "SECRET");
}

TEST(S3ChunkBackendTest, ACompleteWhoseAnswerWasLostIsAcceptedWhenItsObjectIsThere) {
  FakeS3 server;
  std::shared_ptr<s3::S3Client> client = server.Client();
  std::unique_ptr<S3ChunkBackend> backend = MakeBackend(client);
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<ChunkWriter> writer, backend->NewPack(9));
  const std::string data = Bytes(9 * kMiB + 5, 9);
  ASSERT_OK(writer->Append(data, 1).status());
  // The Complete assembles the object, then its answer is lost; the retry finds no upload.
  server.Fault({{"method", "POST"}, {"query", "uploadId"}, {"lose_response", true}});
  ASSERT_OK(writer->Sync());
  std::string read(data.size(), '\0');
  ASSERT_OK(backend->Read({9, 0, static_cast<int64_t>(data.size())}, read.data()));
  EXPECT_TRUE(read == data);
  int completes = 0;
  for (const nlohmann::json& request : server.Log()) {
    if (request["method"] == "POST" && request["query"].contains("uploadId")) ++completes;
  }
  EXPECT_EQ(completes, 2);  // the lost one and the retry that said NoSuchUpload.

  // A NoSuchUpload with no object behind it (the upload was aborted) still fails.
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<ChunkWriter> aborted, backend->NewPack(10));
  ASSERT_OK(aborted->Append(data, 1).status());
  ASSERT_OK_AND_ASSIGN(std::vector<PendingPack> pending, backend->ListPending());
  ASSERT_THAT(pending, SizeIs(1));
  ASSERT_OK(backend->AbortPending(pending[0]));
  EXPECT_THAT(aborted->Sync(), StatusIs(absl::StatusCode::kNotFound, "NoSuchUpload"));
}

TEST(S3ChunkBackendTest, AServerSendingMoreThanTheRangeIsDataLossAndNotRetried) {
  FakeS3 server;
  std::shared_ptr<s3::S3Client> client = server.Client();
  std::unique_ptr<S3ChunkBackend> backend = MakeBackend(client);
  ASSERT_OK(client->PutObject(backend->ObjectKey(1), "0123456789"));
  server.Fault({{"method", "GET"}, {"extra_bytes", 3}, {"count", 5}});
  std::string buffer(4, '\0');
  EXPECT_THAT(backend->Read({1, 2, 4}, buffer.data()),
              StatusIs(absl::StatusCode::kDataLoss,
                       ::testing::AllOf(HasSubstr("store/packs/0000000000000001.pack"),
                                        HasSubstr("bytes 2..6"), HasSubstr("bytes=2-5"))));
  int gets = 0;
  for (const nlohmann::json& request : server.Log()) gets += request["method"] == "GET" ? 1 : 0;
  EXPECT_EQ(gets, 1 + 1);  // Create's listing, and the one ranged GET: not retried.
}

// A store in `dir` (which exists) with its packs on `backend`; no grace for abandoned uploads.
std::unique_ptr<RocksDbCheckpointStore> OpenStoreWith(std::unique_ptr<S3ChunkBackend> backend,
                                                      const std::string& dir) {
  if (backend == nullptr) return nullptr;
  StoreOptions options;
  options.db_path = dir + "/db";
  options.abandoned_upload_grace = absl::ZeroDuration();
  options.chunk_backend = std::move(backend);
  absl::StatusOr<std::unique_ptr<RocksDbCheckpointStore>> store =
      RocksDbCheckpointStore::Open(options);
  EXPECT_TRUE(store.ok()) << store.status();
  return store.ok() ? *std::move(store) : nullptr;
}

// A store on the fake, for the garbage collector's tests.
std::unique_ptr<RocksDbCheckpointStore> OpenStoreOn(FakeS3& server, S3ChunkBackend** backend_out) {
  std::unique_ptr<S3ChunkBackend> backend = MakeBackend(server.Client());
  if (backend == nullptr) return nullptr;
  *backend_out = backend.get();
  const std::string dir = testing::TestCaseDir();
  EXPECT_EQ(mkdir(dir.c_str(), 0755), 0) << dir;
  return OpenStoreWith(std::move(backend), dir);
}

TEST(S3StoreGcTest, ObjectsAndUploadsOfUnknownAgeAreKeptAsYoung) {
  FakeS3 server;
  S3ChunkBackend* backend = nullptr;
  std::unique_ptr<RocksDbCheckpointStore> store = OpenStoreOn(server, &backend);
  ASSERT_NE(store, nullptr);
  std::shared_ptr<s3::S3Client> client = server.Client();
  // What another writer (or a killed store) may have just put there: unnamed by the index.
  ASSERT_OK(client->PutObject(backend->ObjectKey(0x51), "unnamed"));
  ASSERT_OK(client->CreateMultipartUpload(backend->ObjectKey(0x52)).status());
  server.Fault({{"method", "GET"}, {"query", "uploads"}, {"omit_times", true}});
  server.Fault({{"method", "GET"}, {"query", "list-type"}, {"omit_times", true}});
  ASSERT_OK_AND_ASSIGN(v1::GarbageCollectResponse collected, store->GarbageCollect(false));
  EXPECT_EQ(collected.packs_of_unknown_age_kept(), 2);
  EXPECT_EQ(collected.pack_removals_failed(), 0);
  EXPECT_OK(client->HeadObject(backend->ObjectKey(0x51)).status());
  EXPECT_EQ(CountOf(backend->ListPending()), 1);

  // With their times listed (and the grace, zero, passed) they go.
  ASSERT_OK_AND_ASSIGN(collected, store->GarbageCollect(false));
  EXPECT_EQ(collected.packs_of_unknown_age_kept(), 0);
  EXPECT_THAT(client->HeadObject(backend->ObjectKey(0x51)), StatusIs(absl::StatusCode::kNotFound));
  EXPECT_EQ(CountOf(backend->ListPending()), 0);
}

TEST(S3StoreGcTest, AFailedAbortOrDeleteIsCountedAndTheRestOfThePassGoesOn) {
  FakeS3 server;
  S3ChunkBackend* backend = nullptr;
  std::unique_ptr<RocksDbCheckpointStore> store = OpenStoreOn(server, &backend);
  ASSERT_NE(store, nullptr);
  std::shared_ptr<s3::S3Client> client = server.Client();
  ASSERT_OK(client->CreateMultipartUpload(backend->ObjectKey(0x61)).status());
  ASSERT_OK(client->CreateMultipartUpload(backend->ObjectKey(0x62)).status());
  ASSERT_OK(client->PutObject(backend->ObjectKey(0x63), "unnamed"));
  ASSERT_OK(client->PutObject(backend->ObjectKey(0x64), "unnamed"));
  // The first abort is refused (403: not retried); the other, and both deletions, go through.
  server.Fault({{"method", "DELETE"}, {"status", 403}, {"code", "AccessDenied"}});
  ASSERT_OK_AND_ASSIGN(v1::GarbageCollectResponse collected, store->GarbageCollect(false));
  EXPECT_EQ(collected.pack_removals_failed(), 1);
  EXPECT_EQ(CountOf(backend->ListPending()), 1);
  EXPECT_EQ(CountOf(client->ListAllObjects("store/packs/")), 0);

  // A refused deletion: counted, the other object deleted, the refused one kept for later.
  ASSERT_OK_AND_ASSIGN(collected, store->GarbageCollect(false));  // the last abort.
  EXPECT_EQ(collected.pack_removals_failed(), 0);
  ASSERT_OK(client->PutObject(backend->ObjectKey(0x65), "unnamed"));
  ASSERT_OK(client->PutObject(backend->ObjectKey(0x66), "unnamed"));
  server.Fault({{"method", "DELETE"}, {"status", 403}, {"code", "AccessDenied"}});
  ASSERT_OK_AND_ASSIGN(collected, store->GarbageCollect(false));
  EXPECT_EQ(collected.pack_removals_failed(), 1);
  EXPECT_EQ(CountOf(client->ListAllObjects("store/packs/")), 1);
  ASSERT_OK_AND_ASSIGN(collected, store->GarbageCollect(false));
  EXPECT_EQ(collected.pack_removals_failed(), 0);
  EXPECT_EQ(CountOf(client->ListAllObjects("store/packs/")), 0);
}

TEST(S3StoreGcTest, CommitsGoOnWhileGcWaitsForTheBucketAndTheirPacksAreKept) {
  FakeS3 server;
  S3ChunkBackend* backend = nullptr;
  std::unique_ptr<RocksDbCheckpointStore> store = OpenStoreOn(server, &backend);
  ASSERT_NE(store, nullptr);
  const at::Tensor first = testing::Seeded({300 * 1024}, 1);
  ASSERT_OK(
      CommitCheckpoint(*store, "m", testing::WeightsOnly({{"w", first}}), CommitOptions()).status());
  // The bucket answers GC's listing of pending uploads after 3 s, and then its object listing.
  server.Fault({{"method", "GET"}, {"query", "uploads"}, {"delay_s", 3}});
  server.Fault({{"method", "GET"}, {"query", "list-type"}, {"delay_s", 1}});
  const absl::Time started = absl::Now();
  std::future<absl::StatusOr<v1::GarbageCollectResponse>> gc =
      std::async(std::launch::async, [&] { return store->GarbageCollect(false); });
  absl::SleepFor(absl::Milliseconds(300));  // GC is waiting for the bucket now.
  const at::Tensor second = testing::Seeded({300 * 1024}, 2);
  ASSERT_OK(CommitCheckpoint(*store, "m", testing::WeightsOnly({{"w", second}}), CommitOptions())
                .status());
  const absl::Duration commit_done = absl::Now() - started;
  ASSERT_OK_AND_ASSIGN(v1::GarbageCollectResponse collected, gc.get());
  const absl::Duration gc_done = absl::Now() - started;
  EXPECT_LT(commit_done, absl::Seconds(2)) << "the commit waited for GC's listing";
  EXPECT_GE(gc_done, absl::Seconds(3));
  EXPECT_EQ(collected.pack_removals_failed(), 0);

  // Both versions' packs survived the pass, and a second one.
  ASSERT_OK(store->GarbageCollect(false).status());
  EXPECT_EQ(CountOf(backend->List()), 2);
  for (const auto& [ref, tensor] : {std::pair{"m@1", first}, std::pair{"m@2", second}}) {
    ASSERT_OK_AND_ASSIGN(LoadedCheckpoint loaded, LoadCheckpoint(*store, testing::Ref(ref)));
    const at::Tensor* w = loaded.contents.model.Find("w");
    ASSERT_NE(w, nullptr) << ref;
    testing::ExpectSameTensor(*w, tensor, ref);
  }
  ASSERT_OK_AND_ASSIGN(v1::VerifyResponse verified, store->Verify("", 0));
  EXPECT_THAT(verified.problems(), SizeIs(0));
}

// One fake server for the conformance suite's stores, each under a prefix of its own.
class FakeS3Environment : public ::testing::Environment {
 public:
  void TearDown() override { server_.reset(); }
  FakeS3& server() {
    if (server_ == nullptr) {
      // Not TestCaseDir(): the first test to ask may be a parameterized one, whose name has a '/'.
      const char* tmp = std::getenv("TEST_TMPDIR");
      server_ = std::make_unique<FakeS3>(absl::StrCat(tmp != nullptr ? tmp : "/tmp", "/fake_s3"));
    }
    return *server_;
  }

 private:
  std::unique_ptr<FakeS3> server_;
};

FakeS3Environment* const fake_s3 =
    static_cast<FakeS3Environment*>(::testing::AddGlobalTestEnvironment(new FakeS3Environment));

class S3Store final : public testing::StoreHarness {
 public:
  explicit S3Store(std::unique_ptr<RocksDbCheckpointStore> store) : store_(std::move(store)) {}
  CheckpointStore& store() override { return *store_; }

 private:
  std::unique_ptr<RocksDbCheckpointStore> store_;
};

}  // namespace

namespace testing {
INSTANTIATE_TEST_SUITE_P(
    FakeS3, StoreConformanceTest,
    ::testing::Values(StoreConformanceParam{
        "s3_fake",
        [](const std::string& dir) -> std::unique_ptr<StoreHarness> {
          static std::atomic<int> serial{0};
          std::unique_ptr<RocksDbCheckpointStore> store = OpenStoreWith(
              MakeBackend(fake_s3->server().Client(), absl::StrCat("store", serial++, "/")), dir);
          if (store == nullptr) return nullptr;
          return std::make_unique<S3Store>(std::move(store));
        }}),
    [](const ::testing::TestParamInfo<StoreConformanceParam>& info) { return info.param.name; });
}  // namespace testing
}  // namespace ckpt

// The RocksDB store with its packs in S3 (S3ChunkBackend) against a real S3 server: Debian's
// Ceph (mon, memstore OSD, radosgw) started on 127.0.0.1 by tools/ceph/single_node.sh once for
// this binary (a gtest Environment) and stopped after; a bucket per test.
//   - the CheckpointStore conformance suite;
//   - a store SIGKILLed mid-upload (testing/s3_upload_child.cc) leaves no version, and GC removes
//     its multipart upload or pack object only once the grace period is over;
//   - a flipped byte in a pack object is DATA_LOSS naming the chunk; an object deleted behind the
//     store's back is reported by verify.
// Where Ceph is not installed every test is skipped, and fails in CI (CKPT_REQUIRE,
// libs/testing/requirements.h).

#include <signal.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "libs/s3/s3_client.h"
#include "libs/status/status_matchers.h"
#include "libs/store/checkpoint_contents.h"
#include "libs/store/checkpoint_store.h"
#include "libs/store/rocksdb_checkpoint_store.h"
#include "libs/store/s3_chunk_backend.h"
#include "libs/store/testing/registry_workload.h"
#include "libs/store/testing/seeded_checkpoints.h"
#include "libs/store/testing/store_conformance.h"
#include "libs/store/version_ref.h"
#include "libs/testing/child_process.h"
#include "libs/testing/requirements.h"

namespace ckpt {
namespace {

using ::ckpt::testing::StatusIs;
using ::testing::HasSubstr;
using ::testing::SizeIs;

// Ceph for the whole binary: started before the first test, stopped after the last.
class CephEnvironment : public ::testing::Environment {
 public:
  // Whether Ceph is installed: each test checks (RequireCeph), so that each is reported skipped
  // (gtest reports the tests of an Environment that skips as passed).
  static bool Installed() {
    return access("/usr/bin/radosgw", X_OK) == 0 && access("/usr/bin/ceph-mon", X_OK) == 0 &&
           access("/usr/bin/ceph-osd", X_OK) == 0;
  }

  void SetUp() override {
    if (!Installed()) return;
    script_ = ckpt::testing::RunfilesPath("tools/ceph/single_node.sh");
    // Short: Ceph's admin sockets live under the directory and unix socket paths are limited to
    // 108 bytes, which TEST_TMPDIR's sandbox path can exceed.
    char dir_template[] = "/tmp/ckpt-s3-store-XXXXXX";
    ASSERT_NE(mkdtemp(dir_template), nullptr);
    dir_ = dir_template;
    const absl::Time start = absl::Now();
    const ckpt::testing::ShellResult started = ckpt::testing::RunShell(
        absl::StrCat("/bin/bash ", script_, " start --memstore-mib 1536 ", dir_, "/ceph 2>&1"));
    ASSERT_EQ(started.exit_code, 0) << started.output;
    std::fprintf(stderr, "Ceph started in %.1f s\n", absl::ToDoubleSeconds(absl::Now() - start));
    for (absl::string_view line : absl::StrSplit(ckpt::testing::ReadFileOrEmpty(dir_ + "/ceph/env"),
                                                 '\n', absl::SkipEmpty())) {
      std::pair<std::string, std::string> kv = absl::StrSplit(line, absl::MaxSplits('=', 1));
      env_[kv.first] = kv.second;
      setenv(kv.first.c_str(), kv.second.c_str(), 1);  // for the child process.
    }
  }

  void TearDown() override {
    if (dir_.empty()) return;
    const ckpt::testing::ShellResult stopped = ckpt::testing::RunShell(
        absl::StrCat("/bin/bash ", script_, " stop ", dir_, "/ceph 2>&1; rmdir ", dir_));
    EXPECT_EQ(stopped.exit_code, 0) << stopped.output;
  }

  // A client of a new bucket of its own.
  std::shared_ptr<s3::S3Client> NewBucket() {
    static std::atomic<int> serial{0};
    s3::S3ClientOptions options;
    options.endpoint = env_["S3_ENDPOINT"];
    options.access_key = env_["S3_ACCESS_KEY"];
    options.secret_key = env_["S3_SECRET_KEY"];
    options.region = env_["S3_REGION"];
    options.bucket = absl::StrCat("ckpt-store-", getpid(), "-", serial++);
    options.max_attempts = 3;
    absl::StatusOr<std::unique_ptr<s3::S3Client>> client = s3::S3Client::Create(options);
    EXPECT_TRUE(client.ok()) << client.status();
    if (!client.ok()) return nullptr;
    EXPECT_OK((*client)->CreateBucket());
    return *std::move(client);
  }

 private:
  std::string script_;
  std::string dir_;
  std::map<std::string, std::string> env_;
};

CephEnvironment* const ceph =
    static_cast<CephEnvironment*>(::testing::AddGlobalTestEnvironment(new CephEnvironment));

// Skips the current test where Ceph is missing (fails it in CI).
void RequireCeph() {
  CKPT_REQUIRE(CephEnvironment::Installed(), "Ceph (ceph-mon, ceph-osd, radosgw)");
}

class S3StoreTest : public ::testing::Test {
 protected:
  void SetUp() override { RequireCeph(); }
};

std::shared_ptr<S3ChunkBackend> MakeBackend(std::shared_ptr<s3::S3Client> client) {
  S3ChunkBackendOptions options;
  options.prefix = "index-a/";
  absl::StatusOr<std::unique_ptr<S3ChunkBackend>> backend =
      S3ChunkBackend::Create(std::move(client), options);
  EXPECT_TRUE(backend.ok()) << backend.status();
  return backend.ok() ? std::shared_ptr<S3ChunkBackend>(*std::move(backend)) : nullptr;
}

std::unique_ptr<RocksDbCheckpointStore> OpenStore(const std::string& db_path,
                                                  std::shared_ptr<ChunkBackend> backend,
                                                  absl::Duration grace) {
  StoreOptions options;
  options.db_path = db_path;
  options.abandoned_upload_grace = grace;
  options.chunk_backend = std::move(backend);
  absl::StatusOr<std::unique_ptr<RocksDbCheckpointStore>> store =
      RocksDbCheckpointStore::Open(options);
  EXPECT_TRUE(store.ok()) << store.status();
  return store.ok() ? *std::move(store) : nullptr;
}

class S3Store final : public testing::StoreHarness {
 public:
  explicit S3Store(std::unique_ptr<RocksDbCheckpointStore> store) : store_(std::move(store)) {}
  CheckpointStore& store() override { return *store_; }

 private:
  std::unique_ptr<RocksDbCheckpointStore> store_;
};

std::string Hex(absl::string_view bytes) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string out;
  for (unsigned char c : bytes) {
    out.push_back(kDigits[c >> 4]);
    out.push_back(kDigits[c & 15]);
  }
  return out;
}

std::string TestDir() {
  const std::string dir = ckpt::testing::TestCaseDir();
  EXPECT_EQ(mkdir(dir.c_str(), 0755), 0) << dir;
  return dir;
}

// Runs testing/s3_upload_child in `mode` against `bucket`; returns it once it died or is ready.
std::unique_ptr<ckpt::testing::ChildProcess> StartChild(const std::string& dir,
                                                        const std::string& mode,
                                                        const std::string& bucket) {
  auto child = std::make_unique<ckpt::testing::ChildProcess>(
      ckpt::testing::RunfilesPath("libs/store/s3_upload_child"), dir);
  EXPECT_TRUE(child->Start({mode, dir + "/db", bucket, "index-a/"}));
  return child;
}

TEST_F(S3StoreTest, AStoreKilledWithPartsUploadedLeavesNoVersionAndGcAbortsTheUploadAfterGrace) {
  const std::string dir = TestDir();
  std::shared_ptr<s3::S3Client> client = ceph->NewBucket();
  std::shared_ptr<S3ChunkBackend> backend = MakeBackend(client);
  const absl::Duration grace = absl::Seconds(8);
  const absl::Time child_started = absl::Now();
  {
    std::unique_ptr<ckpt::testing::ChildProcess> child =
        StartChild(dir, "parts", client->options().bucket);
    const absl::Time deadline = absl::Now() + absl::Seconds(60);
    while (child->stdout_text().find("ready") == std::string::npos && absl::Now() < deadline) {
      ASSERT_FALSE(child->WaitForExit(absl::Milliseconds(50)).has_value())
          << "the child exited early: " << child->stderr_text();
    }
    ASSERT_THAT(child->stdout_text(), HasSubstr("ready")) << child->stderr_text();
    child->Signal(SIGKILL);
    std::optional<int> status = child->WaitForExit(absl::Seconds(10));
    ASSERT_TRUE(status.has_value());
    ASSERT_TRUE(WIFSIGNALED(*status) && WTERMSIG(*status) == SIGKILL);
  }
  // Everything the child wrote (its upload record, the upload's Initiated time) is older.
  const absl::Time child_done = absl::Now();
  ASSERT_OK_AND_ASSIGN(std::vector<PendingPack> pending, backend->ListPending());
  ASSERT_THAT(pending, SizeIs(1)) << "the killed upload's parts are in the bucket";

  std::unique_ptr<RocksDbCheckpointStore> store = OpenStore(dir + "/db", backend, grace);
  ASSERT_NE(store, nullptr);
  ASSERT_OK_AND_ASSIGN(std::vector<v1::ModelInfo> models, store->ListModels());
  EXPECT_THAT(models, SizeIs(0));
  // Within the grace period the upload may still be resumed: nothing goes.
  ASSERT_OK_AND_ASSIGN(v1::GarbageCollectResponse early, store->GarbageCollect(false));
  ASSERT_LT(absl::Now() - child_started, grace) << "too slow to test within the grace period";
  EXPECT_EQ(early.abandoned_uploads_reclaimed(), 0);
  ASSERT_OK_AND_ASSIGN(pending, backend->ListPending());
  EXPECT_THAT(pending, SizeIs(1));
  absl::SleepFor(child_done + grace + absl::Seconds(1) - absl::Now());
  ASSERT_OK_AND_ASSIGN(v1::GarbageCollectResponse late, store->GarbageCollect(false));
  EXPECT_EQ(late.abandoned_uploads_reclaimed(), 1);
  ASSERT_OK_AND_ASSIGN(pending, backend->ListPending());
  EXPECT_THAT(pending, SizeIs(0));
  ASSERT_OK_AND_ASSIGN(std::vector<s3::PendingUpload> uploads, client->ListMultipartUploads(""));
  EXPECT_THAT(uploads, SizeIs(0));
}

TEST_F(S3StoreTest, AStoreKilledAfterItsPackWentUpLeavesNoVersionAndGcDeletesTheObjectAfterGrace) {
  const std::string dir = TestDir();
  std::shared_ptr<s3::S3Client> client = ceph->NewBucket();
  std::shared_ptr<S3ChunkBackend> backend = MakeBackend(client);
  const absl::Duration grace = absl::Seconds(8);
  const absl::Time child_started = absl::Now();
  setenv("CKPT_FAILPOINT", "commit.after_pack_sync", 1);
  std::unique_ptr<ckpt::testing::ChildProcess> child =
      StartChild(dir, "commit", client->options().bucket);
  unsetenv("CKPT_FAILPOINT");
  std::optional<int> status = child->WaitForExit(absl::Seconds(60));
  ASSERT_TRUE(status.has_value());
  ASSERT_TRUE(WIFSIGNALED(*status) && WTERMSIG(*status) == SIGKILL)
      << child->stdout_text() << child->stderr_text();
  ASSERT_THAT(child->stderr_text(), HasSubstr("commit.after_pack_sync"));
  const absl::Time child_done = absl::Now();
  ASSERT_OK_AND_ASSIGN(std::vector<PackInfo> packs, backend->List());
  ASSERT_THAT(packs, SizeIs(1)) << "the pack object was complete before the kill";

  std::unique_ptr<RocksDbCheckpointStore> store = OpenStore(dir + "/db", backend, grace);
  ASSERT_NE(store, nullptr);
  ASSERT_OK_AND_ASSIGN(std::vector<v1::ModelInfo> models, store->ListModels());
  EXPECT_THAT(models, SizeIs(0));
  ASSERT_OK(store->GarbageCollect(false).status());
  ASSERT_LT(absl::Now() - child_started, grace) << "too slow to test within the grace period";
  ASSERT_OK_AND_ASSIGN(packs, backend->List());
  EXPECT_THAT(packs, SizeIs(1)) << "removed within the grace period";
  absl::SleepFor(child_done + grace + absl::Seconds(1) - absl::Now());
  ASSERT_OK(store->GarbageCollect(false).status());
  ASSERT_OK_AND_ASSIGN(packs, backend->List());
  EXPECT_THAT(packs, SizeIs(0));
  // Gone from the bucket, not only from the backend's listing.
  // (The change log's records stay: they are the store's history, not garbage.)
  ASSERT_OK_AND_ASSIGN(std::vector<s3::ListedObject> objects,
                       client->ListAllObjects("index-a/packs/"));
  EXPECT_THAT(objects, SizeIs(0));
}

// A committed version of one 3 MiB tensor, and where its pack object is.
struct Committed {
  std::unique_ptr<RocksDbCheckpointStore> store;
  std::shared_ptr<S3ChunkBackend> backend;
  std::shared_ptr<s3::S3Client> client;
  v1::Manifest manifest;
  std::string pack_key;
};

Committed CommitOne(const std::string& dir) {
  Committed out;
  out.client = ceph->NewBucket();
  out.backend = MakeBackend(out.client);
  out.store = OpenStore(dir + "/db", out.backend, absl::ZeroDuration());
  if (out.store == nullptr) return out;
  const at::Tensor weights = testing::Seeded({3 * 1024 * 1024 / 4}, 11);
  absl::StatusOr<CommitResult> committed =
      CommitCheckpoint(*out.store, "m", testing::WeightsOnly({{"w", weights}}), CommitOptions());
  EXPECT_TRUE(committed.ok()) << committed.status();
  absl::StatusOr<v1::Manifest> manifest = out.store->GetManifest(testing::Ref("m@1"));
  EXPECT_TRUE(manifest.ok()) << manifest.status();
  if (manifest.ok()) out.manifest = *manifest;
  absl::StatusOr<std::vector<PackInfo>> packs = out.backend->List();
  EXPECT_TRUE(packs.ok() && packs->size() == 1);
  if (packs.ok() && packs->size() == 1) out.pack_key = out.backend->ObjectKey((*packs)[0].pack_id);
  return out;
}

TEST_F(S3StoreTest, AFlippedByteInAPackObjectIsDataLossNamingTheChunk) {
  Committed c = CommitOne(TestDir());
  ASSERT_NE(c.store, nullptr);
  ASSERT_FALSE(c.pack_key.empty());
  ASSERT_OK(LoadCheckpoint(*c.store, testing::Ref("m@1")).status());  // sound before.
  ASSERT_EQ(c.manifest.tensors_size(), 1);
  const v1::TensorMeta& meta = c.manifest.tensors(0);
  ASSERT_GE(meta.chunks_size(), 1);

  // Overwrite the object with one byte flipped inside the tensor's first chunk (the tensor is
  // the pack's only one and starts at offset 0).
  ASSERT_OK_AND_ASSIGN(std::string object, c.client->GetObject(c.pack_key));
  object[1000] ^= 0x01;
  ASSERT_OK(c.client->PutObject(c.pack_key, object));

  const std::string chunk = Hex(meta.chunks(0).sha256());
  EXPECT_THAT(LoadCheckpoint(*c.store, testing::Ref("m@1")),
              StatusIs(absl::StatusCode::kDataLoss, absl::StrCat("chunk ", chunk)));
  ASSERT_OK_AND_ASSIGN(v1::VerifyResponse verified, c.store->Verify("", 0));
  ASSERT_THAT(verified.problems(), SizeIs(1));
  EXPECT_EQ(Hex(verified.problems(0).chunk_sha256()), chunk);
  EXPECT_THAT(verified.problems(0).message(), HasSubstr("mismatch"));
}

// Disaster recovery on a real radosgw (issue #53): every kind of change, then the whole store
// directory deleted (the host's disk lost); a store started on an empty directory against the
// bucket alone is the same store -- models, versions, manifests, aliases and their history,
// annotations, the audit log, in the same order -- and every chunk verifies.
TEST_F(S3StoreTest, AStoreWhoseDirectoryIsLostComesBackFromTheBucketAlone) {
  std::shared_ptr<s3::S3Client> client = ceph->NewBucket();
  ASSERT_NE(client, nullptr);
  char dir_template[] = "/tmp/ckpt-s3-dr-XXXXXX";
  ASSERT_NE(mkdtemp(dir_template), nullptr);
  const std::string dir = dir_template;
  std::string before;
  {
    std::unique_ptr<RocksDbCheckpointStore> store =
        OpenStore(dir + "/lost", MakeBackend(client), absl::Hours(1));
    ASSERT_NE(store, nullptr);
    ASSERT_OK(testing::MakeEveryKindOfChange(*store));
    ASSERT_OK_AND_ASSIGN(before, testing::DumpRegistry(*store));
  }
  std::filesystem::remove_all(dir + "/lost");
  const absl::Time start = absl::Now();
  std::unique_ptr<RocksDbCheckpointStore> store =
      OpenStore(dir + "/new-host", MakeBackend(client), absl::Hours(1));
  ASSERT_NE(store, nullptr);
  std::fprintf(stderr, "rebuilt from radosgw in %.2f s\n",
               absl::ToDoubleSeconds(absl::Now() - start));
  ASSERT_OK_AND_ASSIGN(std::string after, testing::DumpRegistry(*store));
  EXPECT_EQ(after, before);
  ASSERT_OK(testing::CheckSeeded(*store, "resnet-1", 4, 104));
  store.reset();
  std::filesystem::remove_all(dir);
}

TEST_F(S3StoreTest, AnObjectDeletedBehindTheStoresBackIsReportedByVerify) {
  Committed c = CommitOne(TestDir());
  ASSERT_NE(c.store, nullptr);
  ASSERT_FALSE(c.pack_key.empty());
  ASSERT_OK_AND_ASSIGN(v1::VerifyResponse sound, c.store->Verify("", 0));
  EXPECT_THAT(sound.problems(), SizeIs(0));
  EXPECT_EQ(sound.chunks_checked(), c.manifest.tensors(0).chunks_size());

  ASSERT_OK(c.client->DeleteObject(c.pack_key));
  ASSERT_OK_AND_ASSIGN(v1::VerifyResponse verified, c.store->Verify("", 0));
  ASSERT_THAT(verified.problems(), SizeIs(c.manifest.tensors(0).chunks_size()));
  EXPECT_THAT(verified.problems(0).message(), HasSubstr("missing"));
  EXPECT_THAT(verified.problems(0).message(), HasSubstr(c.pack_key));
  EXPECT_THAT(LoadCheckpoint(*c.store, testing::Ref("m@1")),
              StatusIs(absl::StatusCode::kDataLoss, "missing"));
}

}  // namespace

namespace testing {
INSTANTIATE_TEST_SUITE_P(
    S3, StoreConformanceTest,
    ::testing::Values(StoreConformanceParam{
        "s3",
        [](const std::string& dir) -> std::unique_ptr<StoreHarness> {
          RequireCeph();
          if (::testing::Test::IsSkipped() || ::testing::Test::HasFatalFailure()) {
            // The body will not run; SetUp only needs a harness.
            return std::make_unique<S3Store>(OpenStore(dir + "/db", nullptr, absl::ZeroDuration()));
          }
          std::shared_ptr<s3::S3Client> client = ceph->NewBucket();
          if (client == nullptr) return nullptr;
          std::unique_ptr<RocksDbCheckpointStore> store =
              OpenStore(dir + "/db", MakeBackend(client), absl::ZeroDuration());
          if (store == nullptr) return nullptr;
          return std::make_unique<S3Store>(std::move(store));
        }}),
    [](const ::testing::TestParamInfo<StoreConformanceParam>& info) { return info.param.name; });
}  // namespace testing
}  // namespace ckpt

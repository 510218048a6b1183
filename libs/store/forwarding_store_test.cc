// ForwardingStore and ForwardingUploadSession over a real RocksDB store, watched through an
// InstrumentedStore between them, and the conformance suite through a bare ForwardingStore: every
// call reaches the wrapped store, a decorator's override is the only thing it changes, a watch is
// the wrapped store's, and a failed session refuses every later call without reaching the session
// it wraps.

#include "libs/store/forwarding_store.h"

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "libs/status/status_matchers.h"
#include "libs/store/checkpoint_contents.h"
#include "libs/store/rocksdb_checkpoint_store.h"
#include "libs/store/testing/instrumented_store.h"
#include "libs/store/testing/store_conformance.h"
#include "libs/testing/child_process.h"

namespace ckpt {
namespace {

using ::ckpt::testing::OneTensorHeader;
using ::ckpt::testing::Ref;
using ::ckpt::testing::Seeded;
using ::ckpt::testing::StatusIs;
using ::ckpt::testing::WeightsOnly;
using ::testing::ElementsAre;
using ::testing::ElementsAreArray;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

class ForwardingStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    StoreOptions options;
    options.db_path = ::ckpt::testing::TestCaseDir();
    ASSERT_OK_AND_ASSIGN(rocksdb_, RocksDbCheckpointStore::Open(options));
    instrumented_ = std::make_unique<InstrumentedStore>(rocksdb_.get());
    instrumented_->set_hook([this](absl::string_view method) {
      absl::MutexLock lock(&mutex_);
      calls_.emplace_back(method);
    });
  }

  // The calls that reached the wrapped store since the last Calls().
  std::vector<std::string> Calls() {
    absl::MutexLock lock(&mutex_);
    std::vector<std::string> calls;
    calls.swap(calls_);
    return calls;
  }

  std::unique_ptr<RocksDbCheckpointStore> rocksdb_;
  std::unique_ptr<InstrumentedStore> instrumented_;
  absl::Mutex mutex_;
  std::vector<std::string> calls_ ABSL_GUARDED_BY(mutex_);
};

TEST_F(ForwardingStoreTest, EveryCallReachesTheWrappedStoreWithItsArgumentsAndItsAnswer) {
  ForwardingStore store(instrumented_.get());
  ASSERT_OK_AND_ASSIGN(CommitResult committed,
                       CommitCheckpoint(store, "net", WeightsOnly({{"w", Seeded({4, 4}, 1)}})));
  EXPECT_EQ(committed.version.version(), 1);
  EXPECT_THAT(Calls(), ElementsAre("BeginUpload", "AddTensorData", "Commit"));

  ASSERT_OK(store.CreateModel("other", {}, {}).status());
  v1::ModelDetailsChange change;
  change.set_description("forwarded");
  ASSERT_OK_AND_ASSIGN(v1::ModelInfo updated, store.UpdateModel("other", change, {}));
  EXPECT_EQ(updated.details().description(), "forwarded");
  ASSERT_OK(store.RenameModel("other", "renamed", {}));
  ASSERT_OK(store.DeleteModel("renamed", /*force=*/false, {}).status());
  ASSERT_OK_AND_ASSIGN(v1::Manifest manifest, store.GetManifest(Ref("net@1")));
  EXPECT_EQ(manifest.tensors(0).key(), "w");
  ASSERT_OK(store.OpenVersion(Ref("net@1")).status());
  ASSERT_OK(store.ReadTensorChunks(manifest.tensors(0),
                                   [](int64_t, absl::string_view) { return absl::OkStatus(); }));
  ASSERT_OK_AND_ASSIGN(std::vector<std::string> missing, store.FindMissingChunks({}));
  EXPECT_THAT(missing, IsEmpty());
  ASSERT_OK_AND_ASSIGN(std::vector<v1::ModelInfo> models, store.ListModels());
  ASSERT_OK_AND_ASSIGN(std::vector<v1::VersionInfo> versions, store.ListVersions("net"));
  EXPECT_EQ(versions.size(), 1u);
  ASSERT_OK_AND_ASSIGN(int64_t previous, store.SetAlias("net", "best", 1));
  EXPECT_EQ(previous, 0);
  v1::AnnotationChange annotate;
  (*annotate.mutable_set_metrics())["loss"] = 0.5;
  ASSERT_OK(store.AnnotateVersion("net", 1, annotate, {}).status());
  ASSERT_OK(store.DeleteAlias("net", "best"));
  ASSERT_OK(store.ApplyRetention("net", {}, /*dry_run=*/true).status());
  ASSERT_OK(store.Verify("net", 1).status());
  ASSERT_OK_AND_ASSIGN(v1::StoreStats stats, store.GetStats());
  EXPECT_EQ(stats.versions(), 1);
  v1::AuditRecord record;
  record.set_identity("test");
  record.set_action(std::string(kAuditSetAlias));
  ASSERT_OK_AND_ASSIGN(int64_t sequence, store.BeginAudit(record));
  ASSERT_OK(store.FinishAudit(sequence, absl::OkStatus(), "done", 0));
  ASSERT_OK_AND_ASSIGN(std::vector<v1::AuditRecord> records, store.ListAudit({}));
  EXPECT_EQ(records.size(), 1u);
  ASSERT_OK(store.ListHistory({}).status());
  ASSERT_OK(store.GetRegistryState({"net"}).status());
  ASSERT_OK(store.WaitForHistory(0, absl::Now()).status());
  ASSERT_OK_AND_ASSIGN(int64_t released, store.DeleteVersion("net", 1, /*force=*/false));
  EXPECT_EQ(released, 4 * 4 * 4);  // the one float tensor's bytes
  ASSERT_OK(store.GarbageCollect(/*dry_run=*/false).status());
  EXPECT_THAT(store.JoinUpload("no-such-upload", {{0, 0, 1}}).status(),
              StatusIs(absl::StatusCode::kNotFound));
  EXPECT_EQ(store.CommitRetryWindow(), absl::ZeroDuration());

  EXPECT_THAT(Calls(),
              ElementsAreArray(
                  {"CreateModel",      "UpdateModel",    "RenameModel",      "DeleteModel",
                   "GetManifest",      "OpenVersion",    "ReadTensorChunks", "FindMissingChunks",
                   "ListModels",       "ListVersions",   "SetAlias",         "AnnotateVersion",
                   "DeleteAlias",      "ApplyRetention", "Verify",           "GetStats",
                   "BeginAudit",       "FinishAudit",    "ListAudit",        "ListHistory",
                   "GetRegistryState", "WaitForHistory", "DeleteVersion",    "GarbageCollect",
                   "JoinUpload"}));
}

// A decorator that refuses the registry reads CheckpointStore's default watch polls with.
class NoRegistryReads final : public ForwardingStore {
 public:
  using ForwardingStore::ForwardingStore;
  absl::StatusOr<std::vector<v1::RegistryEvent>> ListHistory(const HistoryQuery&) override {
    return absl::PermissionDeniedError("ListHistory refused by the decorator");
  }
  absl::StatusOr<RegistryState> GetRegistryState(const std::vector<std::string>&) override {
    return absl::PermissionDeniedError("GetRegistryState refused by the decorator");
  }
};

TEST_F(ForwardingStoreTest, AnOverrideChangesOnlyItsMethodAndAWatchIsTheWrappedStores) {
  NoRegistryReads store(instrumented_.get());
  ASSERT_OK(store.CreateModel("net", {}, {}).status());
  EXPECT_THAT(store.GetRegistryState({"net"}).status(),
              StatusIs(absl::StatusCode::kPermissionDenied, HasSubstr("decorator")));
  EXPECT_THAT(Calls(), ElementsAre("CreateModel"));

  // The watch runs on the wrapped store, whose registry reads work: the decorator's refusals
  // never come into it.
  v1::WatchRequest request;
  request.add_models("net");
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<RegistryWatch> watch, store.Watch(request));
  ASSERT_OK_AND_ASSIGN(std::optional<v1::WatchResponse> first,
                       watch->Next(absl::Now() + absl::Seconds(10)));
  ASSERT_TRUE(first.has_value());
  ASSERT_TRUE(first->has_state());
  ASSERT_EQ(first->state().models_size(), 1);
  EXPECT_EQ(first->state().models(0).name(), "net");
  EXPECT_THAT(Calls(), ::testing::Contains("GetRegistryState"));
}

// A session decorator that refuses stored-chunk references, failing the session.
class RefusingSession final : public ForwardingUploadSession {
 public:
  using ForwardingUploadSession::ForwardingUploadSession;
  absl::Status AddStoredChunk(int, int64_t, absl::string_view, int64_t) override {
    return Fail(absl::NotFoundError("references refused by the decorator"));
  }
};

TEST_F(ForwardingStoreTest, AFailedSessionRefusesEveryLaterCallWithoutReachingTheWrappedOne) {
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<UploadSession> base,
                       instrumented_->BeginUpload("net", OneTensorHeader("w", 8), {}));
  RefusingSession session(std::move(base));
  EXPECT_EQ(session.tensor_count(), 1);
  EXPECT_EQ(session.header().tensors(0).key(), "w");
  ASSERT_OK(session.AddTensorData(0, 0, "1234"));
  EXPECT_THAT(session.AddStoredChunk(0, 4, std::string(32, 'x'), 4),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("decorator")));
  EXPECT_THAT(Calls(), ElementsAre("BeginUpload", "AddTensorData"));

  EXPECT_THAT(session.AddTensorData(0, 4, "5678"),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("decorator")));
  EXPECT_THAT(session.AddStableTensorData(0, 4, "5678"),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("decorator")));
  EXPECT_THAT(session.Commit().status(),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("decorator")));
  EXPECT_THAT(Calls(), IsEmpty());
  // Nothing was committed.
  EXPECT_THAT(rocksdb_->ListVersions("net").status(), StatusIs(absl::StatusCode::kNotFound));
}

TEST_F(ForwardingStoreTest, AnOwnedStoreLivesAsLongAsTheDecorator) {
  auto owned = std::make_unique<ForwardingStore>(std::make_unique<ForwardingStore>(rocksdb_.get()));
  ASSERT_OK(CommitCheckpoint(*owned, "net", WeightsOnly({{"w", Seeded({2}, 3)}})).status());
  owned.reset();  // destroys the inner ForwardingStore, never rocksdb_.
  EXPECT_OK(rocksdb_->GetManifest(Ref("net@1")).status());
}

// The embedded store through a bare ForwardingStore, as the conformance suite sees it.
class ForwardedHarness final : public ::ckpt::testing::StoreHarness {
 public:
  explicit ForwardedHarness(std::unique_ptr<RocksDbCheckpointStore> store)
      : forwarded_(std::move(store)) {}
  CheckpointStore& store() override { return forwarded_; }

 private:
  ForwardingStore forwarded_;
};

}  // namespace

namespace testing {
INSTANTIATE_TEST_SUITE_P(ForwardedRocksDb, StoreConformanceTest,
                         ::testing::Values(StoreConformanceParam{
                             "forwarded_rocksdb",
                             [](const std::string& dir) -> std::unique_ptr<StoreHarness> {
                               StoreOptions options;
                               options.db_path = dir + "/db";
                               options.abandoned_upload_grace = absl::ZeroDuration();
                               absl::StatusOr<std::unique_ptr<RocksDbCheckpointStore>> store =
                                   RocksDbCheckpointStore::Open(options);
                               EXPECT_OK(store.status());
                               if (!store.ok()) return nullptr;
                               return std::make_unique<ForwardedHarness>(*std::move(store));
                             }}),
                         [](const ::testing::TestParamInfo<StoreConformanceParam>& info) {
                           return info.param.name;
                         });
}  // namespace testing
}  // namespace ckpt

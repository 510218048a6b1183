#include "libs/train/async_checkpointer.h"

#include <cstdlib>
#include <memory>
#include <string>

#include "ATen/ATen.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "libs/status/status_matchers.h"
#include "libs/store/rocksdb_checkpoint_store.h"
#include "libs/store/version_ref.h"

namespace ckpt::train {
namespace {

using ::ckpt::testing::IsOk;
using ::ckpt::testing::StatusIs;

class AsyncCheckpointerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    StoreOptions options;
    options.db_path = std::string(std::getenv("TEST_TMPDIR")) + "/" +
                      ::testing::UnitTest::GetInstance()->current_test_info()->name();
    absl::StatusOr<std::unique_ptr<RocksDbCheckpointStore>> store =
        RocksDbCheckpointStore::Open(options);
    ASSERT_THAT(store.status(), IsOk());
    store_ = *std::move(store);
  }

  CheckpointContents Contents(float fill) {
    CheckpointContents contents;
    contents.model.InsertOrAssign("fc.weight", at::full({64, 64}, fill));
    contents.model.InsertOrAssign("fc.bias", at::full({64}, fill));
    contents.optimizer = Value::Dict(
        {{"state", Value::Dict({{0, Value::Dict({{"momentum_buffer",
                                                 Value::Tensor(at::full({64, 64}, -fill))}})}})},
         {"param_groups",
          Value::List({Value::Dict({{"lr", Value::Float(0.1)},
                                    {"params", Value::List({Value::Int(0), Value::Int(1)})}})})}});
    contents.optimizer_param_names = {{0, "fc.weight"}, {1, "fc.bias"}};
    contents.extra = Value::Dict({{"step", Value::Int(static_cast<int64_t>(fill))}});
    contents.metadata.set_global_step(static_cast<int64_t>(fill));
    return contents;
  }

  std::unique_ptr<RocksDbCheckpointStore> store_;
};

TEST_F(AsyncCheckpointerTest, SnapshotIsIndependentOfLaterInPlaceUpdates) {
  AsyncCheckpointer checkpointer(store_.get(), "net");
  CheckpointContents live = Contents(1);
  ASSERT_THAT(checkpointer.Submit(live, {}), IsOk());
  // The next optimizer step updates the live tensors in place while the upload runs.
  live.model.Find("fc.weight")->fill_(7);
  live.optimizer->Find("state")->Find(0)->Find("momentum_buffer")->tensor().fill_(7);

  absl::StatusOr<std::optional<CommitResult>> committed = checkpointer.Wait();
  ASSERT_THAT(committed.status(), IsOk());
  ASSERT_TRUE(committed->has_value());
  EXPECT_EQ((*committed)->version.version(), 1);

  absl::StatusOr<LoadedCheckpoint> loaded = store_->LoadCheckpoint(*ParseVersionRef("net@1"));
  ASSERT_THAT(loaded.status(), IsOk());
  EXPECT_TRUE(at::equal(*loaded->contents.model.Find("fc.weight"), at::full({64, 64}, 1.0f)));
  ASSERT_TRUE(loaded->contents.optimizer.has_value());
  const Value* buffer =
      loaded->contents.optimizer->Find("state")->Find(0)->Find("momentum_buffer");
  ASSERT_NE(buffer, nullptr);
  EXPECT_TRUE(at::equal(buffer->tensor(), at::full({64, 64}, -1.0f)));
  EXPECT_EQ(loaded->manifest.metadata().global_step(), 1);
}

TEST_F(AsyncCheckpointerTest, CommitsInSubmissionOrderWithOneInFlight) {
  AsyncCheckpointer checkpointer(store_.get(), "net");
  for (int step = 1; step <= 5; ++step) {
    ASSERT_THAT(checkpointer.Submit(Contents(step), {}), IsOk());
  }
  absl::StatusOr<std::optional<CommitResult>> last = checkpointer.Wait();
  ASSERT_THAT(last.status(), IsOk());
  ASSERT_TRUE(last->has_value());
  EXPECT_EQ((*last)->version.version(), 5);
  for (int version = 1; version <= 5; ++version) {
    absl::StatusOr<v1::Manifest> manifest =
        store_->GetManifest(*ParseVersionRef("net@" + std::to_string(version)));
    ASSERT_THAT(manifest.status(), IsOk());
    EXPECT_EQ(manifest->metadata().global_step(), version);
    // Snapshots reuse the previous one's buffers once its upload is over: each version still
    // holds its own values.
    absl::StatusOr<LoadedCheckpoint> loaded =
        store_->LoadCheckpoint(*ParseVersionRef("net@" + std::to_string(version)));
    ASSERT_THAT(loaded.status(), IsOk());
    EXPECT_TRUE(at::equal(*loaded->contents.model.Find("fc.weight"),
                          at::full({64, 64}, static_cast<float>(version))));
    EXPECT_TRUE(at::equal(
        loaded->contents.optimizer->Find("state")->Find(0)->Find("momentum_buffer")->tensor(),
        at::full({64, 64}, -static_cast<float>(version))));
  }
  AsyncCheckpointer::Stats stats = checkpointer.stats();
  EXPECT_EQ(stats.submitted, 5);
  EXPECT_EQ(stats.committed, 5);
  EXPECT_EQ(stats.failed, 0);
  EXPECT_FALSE(checkpointer.busy());
}

TEST_F(AsyncCheckpointerTest, FailedUploadIsReportedByTheNextCall) {
  // An alias the store refuses ("latest" is implicit) fails the commit in the background.
  AsyncCheckpointer checkpointer(store_.get(), "net");
  CommitOptions bad;
  bad.aliases = {"latest"};
  ASSERT_THAT(checkpointer.Submit(Contents(1), bad), IsOk());
  EXPECT_THAT(checkpointer.Submit(Contents(2), {}),
              StatusIs(absl::StatusCode::kInvalidArgument, "latest"));
  // Reported once: the checkpointer is usable again.
  ASSERT_THAT(checkpointer.Submit(Contents(3), {}), IsOk());
  absl::StatusOr<std::optional<CommitResult>> last = checkpointer.Wait();
  ASSERT_THAT(last.status(), IsOk());
  ASSERT_TRUE(last->has_value());
  EXPECT_EQ((*last)->version.version(), 1);
  EXPECT_EQ(checkpointer.stats().failed, 1);
}

TEST_F(AsyncCheckpointerTest, WaitWithNothingSubmittedIsEmpty) {
  AsyncCheckpointer checkpointer(store_.get(), "net");
  absl::StatusOr<std::optional<CommitResult>> last = checkpointer.Wait();
  ASSERT_THAT(last.status(), IsOk());
  EXPECT_FALSE(last->has_value());
}

}  // namespace
}  // namespace ckpt::train

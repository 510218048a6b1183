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
  const Value* buffer = loaded->contents.optimizer->Find("state")->Find(0)->Find("momentum_buffer");
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

// Tensors whose bytes are not simply their values in order, next to plain ones large enough to be
// split between copying threads; each must come out equal, contiguous and in memory of its own.
CheckpointContents AwkwardContents(float fill) {
  CheckpointContents contents;
  at::Tensor big = at::arange(3 * 1024 * 1024, at::kFloat).reshape({3, 1024, 1024}) + fill;
  contents.model.InsertOrAssign("big", big);                       // 12 MiB: several shares.
  contents.model.InsertOrAssign("slice", big[1].narrow(0, 5, 7));  // storage offset.
  contents.model.InsertOrAssign("transposed", at::full({8, 3}, fill).t());
  contents.model.InsertOrAssign("empty", at::empty({0, 4}));
  contents.model.InsertOrAssign("flags", at::arange(10) % 3 == 0);
  contents.model.InsertOrAssign("half", at::full({5}, fill, at::kHalf));
  at::Tensor complex = at::complex(at::full({4}, fill), at::arange(4, at::kFloat));
  contents.model.InsertOrAssign("conjugate", complex.conj());  // a conjugate bit, not bytes.
  contents.model.InsertOrAssign("negative", at::imag(complex.conj()));  // a negative bit.
  contents.optimizer = Value::Dict(
      {{"state", Value::Dict({{0, Value::Dict({{"step", Value::Tensor(at::scalar_tensor(fill))},
                                               {"exp_avg", Value::Tensor(big * 2)}})}})},
       {"param_groups", Value::List({Value::Dict({{"lr", Value::Float(0.1)},
                                                  {"params", Value::List({Value::Int(0)})}})})}});
  contents.optimizer_param_names = {{0, "big"}};
  contents.extra = Value::Dict({{"ids", Value::Tensor(at::arange(100, at::kLong))}});
  return contents;
}

void ExpectSnapshotOf(const CheckpointContents& snapshot, const CheckpointContents& live) {
  ASSERT_EQ(snapshot.model.size(), live.model.size());
  for (const StateDict::Entry& entry : live.model) {
    SCOPED_TRACE(entry.key);
    const at::Tensor* copy = snapshot.model.Find(entry.key);
    ASSERT_NE(copy, nullptr);
    EXPECT_TRUE(copy->device().is_cpu());
    EXPECT_TRUE(copy->is_contiguous());
    EXPECT_EQ(copy->scalar_type(), entry.tensor.scalar_type());
    EXPECT_TRUE(
        at::equal(copy->resolve_conj().resolve_neg(), entry.tensor.resolve_conj().resolve_neg()));
    if (entry.tensor.numel() > 0) {
      EXPECT_NE(copy->data_ptr(), entry.tensor.data_ptr());
      EXPECT_FALSE(copy->is_alias_of(entry.tensor));
    }
  }
  const Value* exp_avg = snapshot.optimizer->Find("state")->Find(0)->Find("exp_avg");
  ASSERT_NE(exp_avg, nullptr);
  EXPECT_TRUE(at::equal(exp_avg->tensor(),
                        live.optimizer->Find("state")->Find(0)->Find("exp_avg")->tensor()));
  EXPECT_TRUE(at::equal(snapshot.extra.Find("ids")->tensor(), at::arange(100, at::kLong)));
}

TEST(SnapshotToHostTest, CopiesEveryKindOfTensorExactly) {
  const CheckpointContents live = AwkwardContents(1);
  absl::StatusOr<CheckpointContents> snapshot = SnapshotToHost(live);
  ASSERT_THAT(snapshot.status(), IsOk());
  ExpectSnapshotOf(*snapshot, live);
}

TEST(SnapshotToHostTest, QuantizedAndZeroTensorsKeepWhatTheyAre) {
  CheckpointContents live;
  const at::Tensor quantized =
      at::quantize_per_tensor(at::rand({4, 4}), /*scale=*/0.1, /*zero_point=*/10, at::kQUInt8);
  live.model.InsertOrAssign("quantized", quantized);
  live.model.InsertOrAssign("zeros", at::_efficientzerotensor({3, 2}));
  absl::StatusOr<CheckpointContents> snapshot = SnapshotToHost(live);
  ASSERT_THAT(snapshot.status(), IsOk());
  const at::Tensor& copy = *snapshot->model.Find("quantized");
  ASSERT_TRUE(copy.is_quantized());
  EXPECT_EQ(copy.q_scale(), 0.1);
  EXPECT_EQ(copy.q_zero_point(), 10);
  EXPECT_TRUE(at::equal(copy.int_repr(), quantized.int_repr()));
  EXPECT_FALSE(copy.is_alias_of(quantized));
  EXPECT_TRUE(at::equal(*snapshot->model.Find("zeros"), at::zeros({3, 2})));
}

TEST_F(AsyncCheckpointerTest, ReusedBuffersHoldEachSnapshotsOwnValues) {
  AsyncCheckpointer checkpointer(store_.get(), "net");
  for (int step = 1; step <= 3; ++step) {
    CheckpointContents live = AwkwardContents(static_cast<float>(step));
    ASSERT_THAT(checkpointer.Submit(live, {}), IsOk());
    live.model.Find("big")->fill_(-1);  // the next step's in-place update.
    ASSERT_THAT(checkpointer.Wait().status(), IsOk());
  }
  for (int version = 1; version <= 3; ++version) {
    SCOPED_TRACE(version);
    absl::StatusOr<LoadedCheckpoint> loaded =
        store_->LoadCheckpoint(*ParseVersionRef("net@" + std::to_string(version)));
    ASSERT_THAT(loaded.status(), IsOk());
    ExpectSnapshotOf(loaded->contents, AwkwardContents(static_cast<float>(version)));
  }
}

TEST_F(AsyncCheckpointerTest, WaitWithNothingSubmittedIsEmpty) {
  AsyncCheckpointer checkpointer(store_.get(), "net");
  absl::StatusOr<std::optional<CommitResult>> last = checkpointer.Wait();
  ASSERT_THAT(last.status(), IsOk());
  EXPECT_FALSE(last->has_value());
}

}  // namespace
}  // namespace ckpt::train

#include "libs/train/async_checkpointer.h"

#include <atomic>
#include <cstdlib>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "ATen/TensorOperators.h"
#include "ATen/core/Tensor.h"
#include "ATen/ops/_efficientzerotensor.h"
#include "ATen/ops/arange.h"
#include "ATen/ops/complex.h"
#include "ATen/ops/empty.h"
#include "ATen/ops/equal.h"
#include "ATen/ops/full.h"
#include "ATen/ops/imag.h"
#include "ATen/ops/quantize_per_tensor.h"
#include "ATen/ops/rand.h"
#include "ATen/ops/scalar_tensor.h"
#include "ATen/ops/zeros.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "libs/status/status_matchers.h"
#include "libs/store/checkpoint_contents.h"
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

  absl::StatusOr<LoadedCheckpoint> loaded = LoadCheckpoint(*store_, *ParseVersionRef("net@1"));
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
        LoadCheckpoint(*store_, *ParseVersionRef("net@" + std::to_string(version)));
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
        LoadCheckpoint(*store_, *ParseVersionRef("net@" + std::to_string(version)));
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

// A model with parameters big enough to make several deferred buckets, a BatchNorm-like buffer
// that the forward pass writes, and optimizer state.
CheckpointContents TrainingContents(float fill) {
  CheckpointContents contents;
  contents.model.InsertOrAssign("fc1.weight", at::full({4096, 1024}, fill));  // 16 MiB
  contents.model.InsertOrAssign("fc1.bias", at::full({4096}, fill));
  contents.model.InsertOrAssign("bn.running_mean", at::full({4096}, fill));
  contents.model.InsertOrAssign("fc2.weight", at::full({1024, 4096}, fill));  // 16 MiB
  contents.optimizer = Value::Dict(
      {{"state", Value::Dict({{0, Value::Dict({{"momentum_buffer",
                                                Value::Tensor(at::full({4096, 1024}, -fill))}})}})},
       {"param_groups",
        Value::List({Value::Dict(
            {{"lr", Value::Float(0.1)},
             {"params", Value::List({Value::Int(0), Value::Int(1), Value::Int(2)})}})})}});
  contents.optimizer_param_names = {{0, "fc1.weight"}, {1, "fc1.bias"}, {2, "fc2.weight"}};
  contents.extra = Value::Dict({{"step", Value::Int(static_cast<int64_t>(fill))}});
  return contents;
}

// What the optimizer step writes, in the order it writes it (the buffer is not there: the forward
// pass writes it).
std::vector<at::Tensor> StepWrites(const CheckpointContents& contents) {
  return {*contents.model.Find("fc1.weight"), *contents.model.Find("fc1.bias"),
          contents.optimizer->Find("state")->Find(0)->Find("momentum_buffer")->tensor(),
          *contents.model.Find("fc2.weight")};
}

void ExpectStored(CheckpointStore& store, const std::string& ref, float fill) {
  absl::StatusOr<LoadedCheckpoint> loaded = LoadCheckpoint(store, *ParseVersionRef(ref));
  ASSERT_THAT(loaded.status(), IsOk());
  const CheckpointContents expected = TrainingContents(fill);
  for (const StateDict::Entry& entry : expected.model) {
    SCOPED_TRACE(entry.key);
    const at::Tensor* stored = loaded->contents.model.Find(entry.key);
    ASSERT_NE(stored, nullptr);
    EXPECT_TRUE(at::equal(*stored, entry.tensor));
  }
  EXPECT_TRUE(at::equal(
      loaded->contents.optimizer->Find("state")->Find(0)->Find("momentum_buffer")->tensor(),
      at::full({4096, 1024}, -fill)));
}

TEST_F(AsyncCheckpointerTest, OverlappedSnapshotIsTheStateAtSubmitDespiteTheNextStep) {
  AsyncCheckpointer checkpointer(store_.get(), "net");
  for (int step = 1; step <= 2; ++step) {  // the second snapshot reuses the buffers.
    SCOPED_TRACE(step);
    CheckpointContents live = TrainingContents(static_cast<float>(step));
    ASSERT_THAT(checkpointer.SubmitOverlapped(live, {}, StepWrites(live)), IsOk());
    // The next forward pass updates the running statistics at once, unguarded.
    live.model.Find("bn.running_mean")->fill_(-100);
    checkpointer.BeforeOptimizerStep();
    // The optimizer step, in place.
    for (at::Tensor& tensor : StepWrites(live)) tensor.add_(1000);
    ASSERT_THAT(checkpointer.Wait().status(), IsOk());
    ExpectStored(*store_, "net@" + std::to_string(step), static_cast<float>(step));
  }
  EXPECT_EQ(checkpointer.stats().committed, 2);
}

TEST_F(AsyncCheckpointerTest, GuardWaitsForTheDeferredCopyThatAnUnguardedStepWouldRace) {
  AsyncCheckpointer checkpointer(store_.get(), "net");
  absl::Notification release;
  std::atomic<int> copies_started{0};
  checkpointer.SetBeforeDeferredCopyForTesting([&](size_t) {
    ++copies_started;
    release.WaitForNotification();  // an artificially slow copy.
  });
  CheckpointContents live = TrainingContents(1);
  ASSERT_THAT(checkpointer.SubmitOverlapped(live, {}, StepWrites(live)), IsOk());
  // The copy is really left to the background: an unguarded in-place write now would land in
  // the snapshot (it does, below: that is what the guard is for).
  live.model.Find("fc2.weight")->fill_(-7);

  std::atomic<bool> guard_returned{false};
  std::thread step([&] {
    checkpointer.BeforeOptimizerStep();
    guard_returned = true;
  });
  absl::SleepFor(absl::Milliseconds(300));
  EXPECT_FALSE(guard_returned) << "the guard returned while the copy was held back";
  EXPECT_GE(copies_started.load(), 1);
  release.Notify();
  step.join();
  EXPECT_TRUE(guard_returned);
  const AsyncCheckpointer::Stats stats = checkpointer.stats();
  EXPECT_GE(stats.last_guard_wait, absl::Milliseconds(250));
  EXPECT_GE(stats.last_stall, stats.last_guard_wait);
  EXPECT_GE(stats.total_stall, stats.last_stall);

  ASSERT_THAT(checkpointer.Wait().status(), IsOk());
  absl::StatusOr<LoadedCheckpoint> loaded = LoadCheckpoint(*store_, *ParseVersionRef("net@1"));
  ASSERT_THAT(loaded.status(), IsOk());
  EXPECT_TRUE(at::equal(*loaded->contents.model.Find("fc2.weight"), at::full({1024, 4096}, -7.0f)))
      << "the write before the guard did not race the copy: this test shows nothing";
  EXPECT_TRUE(at::equal(*loaded->contents.model.Find("fc1.weight"), at::full({4096, 1024}, 1.0f)));
}

TEST_F(AsyncCheckpointerTest, GuardForAParameterGroupWaitsOnlyForItsCopies) {
  AsyncCheckpointer checkpointer(store_.get(), "net");
  absl::Notification release_last;
  CheckpointContents live = TrainingContents(2);
  const std::vector<at::Tensor> order = StepWrites(live);
  // Hold back the copy of the last tensor in the order (fc2.weight); the ones before it first.
  checkpointer.SetBeforeDeferredCopyForTesting([&](size_t position) {
    if (position == order.size() - 1) release_last.WaitForNotification();
  });
  ASSERT_THAT(checkpointer.SubmitOverlapped(live, {}, order), IsOk());
  // fc1's parameters and their state come first in the order, so their guard returns now.
  checkpointer.WaitUntilSnapshotted({order[0], order[1], order[2]});
  order[0].add_(1000);
  EXPECT_TRUE(checkpointer.busy());
  std::atomic<bool> guard_returned{false};
  std::thread step([&] {
    checkpointer.WaitUntilSnapshotted({order[3]});
    guard_returned = true;
  });
  absl::SleepFor(absl::Milliseconds(200));
  EXPECT_FALSE(guard_returned);
  release_last.Notify();
  step.join();
  order[3].add_(1000);
  ASSERT_THAT(checkpointer.Wait().status(), IsOk());
  ExpectStored(*store_, "net@1", 2);
}

// One rank's share of a two-rank shared upload of TrainingContents(fill), as the trainer makes it.
AsyncCheckpointer::SharedUpload ShareFor(int rank, const CheckpointContents& contents,
                                         absl::Duration join_timeout = absl::Minutes(1)) {
  AsyncCheckpointer::SharedUpload share;
  share.upload_name = "run-1/step-2/0";
  share.rank = rank;
  share.world_size = 2;
  share.replicated = StepWrites(contents);
  share.join_timeout = join_timeout;
  return share;
}

TEST_F(AsyncCheckpointerTest, SharedUploadStoresWhatOneWriterWouldWithEachRankWritingHalf) {
  AsyncCheckpointer leader(store_.get(), "net");
  AsyncCheckpointer follower(store_.get(), "net");
  CheckpointContents rank0 = TrainingContents(2);
  CheckpointContents rank1 = TrainingContents(2);
  // Buffers differ between ranks (each ran its own forward pass): the version holds rank 0's,
  // also of one that falls in rank 1's half of the bytes.
  rank0.model.InsertOrAssign("bn2.running_var", at::full({4096}, 2.0f));
  rank1.model.InsertOrAssign("bn2.running_var", at::full({4096}, 99.0f));
  rank1.model.Find("bn.running_mean")->fill_(99);
  // The follower starts before the leader has begun the upload: it retries joining.
  ASSERT_THAT(follower.SubmitShared(rank1, {}, StepWrites(rank1), ShareFor(1, rank1)), IsOk());
  absl::SleepFor(absl::Milliseconds(50));
  EXPECT_EQ(follower.part_state(), AsyncCheckpointer::PartState::kWriting);
  ASSERT_THAT(leader.SubmitShared(rank0, {}, StepWrites(rank0), ShareFor(0, rank0)), IsOk());
  EXPECT_EQ(leader.WaitForPart(), AsyncCheckpointer::PartState::kWritten);
  EXPECT_EQ(follower.WaitForPart(), AsyncCheckpointer::PartState::kWritten);
  EXPECT_THAT(leader.Wait().status(), StatusIs(absl::StatusCode::kFailedPrecondition));
  leader.EndSharedUpload(true);
  follower.EndSharedUpload(true);
  absl::StatusOr<std::optional<CommitResult>> committed = leader.Wait();
  ASSERT_THAT(committed.status(), IsOk());
  ASSERT_TRUE(committed->has_value());
  ASSERT_THAT(follower.Wait().status(), IsOk());
  // About half of the 48 MiB each: the split is by bytes, on 4 MiB chunk boundaries.
  const int64_t mib = int64_t{1} << 20;
  EXPECT_GE(follower.stats().part_bytes_written, 20 * mib);
  EXPECT_GE(leader.stats().part_bytes_written, 20 * mib);
  EXPECT_EQ(leader.stats().part_bytes_written + follower.stats().part_bytes_written,
            48 * mib + 4096 * 4 * 3);
  // Each rank copied its share and nothing else.
  EXPECT_EQ(follower.stats().last_snapshot_bytes, follower.stats().part_bytes_written);
  EXPECT_EQ(leader.stats().last_snapshot_bytes, leader.stats().part_bytes_written);
  ExpectStored(*store_, "net@1", 2);
  absl::StatusOr<at::Tensor> late_buffer = ReadTensor(*store_, "net", 1, "bn2.running_var");
  ASSERT_THAT(late_buffer.status(), IsOk());
  EXPECT_TRUE(at::equal(*late_buffer, at::full({4096}, 2.0f)));

  // The same contents from one writer: the same tensors, hash for hash.
  ASSERT_THAT(CommitCheckpoint(*store_, "alone", rank0).status(), IsOk());
  absl::StatusOr<v1::Manifest> shared = store_->GetManifest(*ParseVersionRef("net@1"));
  absl::StatusOr<v1::Manifest> alone = store_->GetManifest(*ParseVersionRef("alone@1"));
  ASSERT_THAT(shared.status(), IsOk());
  ASSERT_THAT(alone.status(), IsOk());
  ASSERT_EQ(shared->tensors_size(), alone->tensors_size());
  for (int i = 0; i < alone->tensors_size(); ++i) {
    EXPECT_EQ(shared->tensors(i).content_hash(), alone->tensors(i).content_hash())
        << alone->tensors(i).key();
  }
  ASSERT_EQ(shared->state_tensors_size(), alone->state_tensors_size());
  for (int i = 0; i < alone->state_tensors_size(); ++i) {
    EXPECT_EQ(shared->state_tensors(i).content_hash(), alone->state_tensors(i).content_hash())
        << alone->state_tensors(i).key();
  }
}

// TrainingContents(fill) as a ZeRO-1 rank of two holds it: the momentum buffer is a shape-only
// placeholder, and a rank holds only its half of it (the first or last 8 MiB; both are -fill).
struct ShardedRank {
  CheckpointContents contents;
  at::Tensor placeholder;
  at::Tensor own_half;
};
ShardedRank ShardedContents(float fill) {
  ShardedRank sharded;
  sharded.contents = TrainingContents(fill);
  sharded.placeholder = at::empty({4096, 1024}, at::TensorOptions().device(at::kMeta));
  sharded.own_half = at::full({2048 * 1024}, -fill);
  *sharded.contents.optimizer->FindMutable("state")->FindMutable(0) =
      Value::Dict({{"momentum_buffer", Value::Tensor(sharded.placeholder, "cpu")}});
  return sharded;
}
AsyncCheckpointer::SharedUpload ShardedShareFor(int rank, const ShardedRank& sharded) {
  AsyncCheckpointer::SharedUpload share = ShareFor(rank, sharded.contents);
  const int64_t half = int64_t{8} << 20;
  share.replicated = {*sharded.contents.model.Find("fc1.weight"),
                      *sharded.contents.model.Find("fc1.bias"),
                      *sharded.contents.model.Find("fc2.weight")};
  share.partitioned = {sharded.placeholder};
  share.owned = {{sharded.placeholder, rank * half, (rank + 1) * half, sharded.own_half}};
  return share;
}

TEST_F(AsyncCheckpointerTest, RanksOwningHalvesOfAPlaceholderStoreTheWholeTensor) {
  AsyncCheckpointer leader(store_.get(), "net");
  AsyncCheckpointer follower(store_.get(), "net");
  ShardedRank rank0 = ShardedContents(6), rank1 = ShardedContents(6);
  ASSERT_THAT(leader.SubmitShared(rank0.contents, {}, {rank0.own_half}, ShardedShareFor(0, rank0)),
              IsOk());
  ASSERT_THAT(
      follower.SubmitShared(rank1.contents, {}, {rank1.own_half}, ShardedShareFor(1, rank1)),
      IsOk());
  ASSERT_EQ(leader.WaitForPart(), AsyncCheckpointer::PartState::kWritten);
  ASSERT_EQ(follower.WaitForPart(), AsyncCheckpointer::PartState::kWritten);
  leader.EndSharedUpload(true);
  follower.EndSharedUpload(true);
  ASSERT_THAT(leader.Wait().status(), IsOk());
  ASSERT_THAT(follower.Wait().status(), IsOk());
  ExpectStored(*store_, "net@1", 6);
  // Every rank copied its own bytes only: its 8 MiB of the state and about half of the rest.
  const int64_t mib = int64_t{1} << 20;
  EXPECT_EQ(follower.stats().last_snapshot_bytes, follower.stats().part_bytes_written);
  EXPECT_LE(follower.stats().last_snapshot_bytes, 25 * mib);
  EXPECT_EQ(leader.stats().part_bytes_written + follower.stats().part_bytes_written,
            48 * mib + 4096 * 4 * 2);

  // What one writer of the whole state stores, hash for hash, and where the state was.
  ASSERT_THAT(CommitCheckpoint(*store_, "alone", TrainingContents(6)).status(), IsOk());
  absl::StatusOr<v1::Manifest> shared = store_->GetManifest(*ParseVersionRef("net@1"));
  absl::StatusOr<v1::Manifest> alone = store_->GetManifest(*ParseVersionRef("alone@1"));
  ASSERT_THAT(shared.status(), IsOk());
  ASSERT_THAT(alone.status(), IsOk());
  ASSERT_EQ(shared->state_tensors_size(), alone->state_tensors_size());
  for (int i = 0; i < alone->state_tensors_size(); ++i) {
    EXPECT_EQ(shared->state_tensors(i).content_hash(), alone->state_tensors(i).content_hash());
    EXPECT_EQ(shared->state_tensors(i).original_device(), "cpu");
  }
}

TEST_F(AsyncCheckpointerTest, OwnedBytesThatCannotBeStoredAreRefusedAtSubmit) {
  AsyncCheckpointer leader(store_.get(), "net");
  ShardedRank rank0 = ShardedContents(7);
  // A placeholder nobody supplies.
  AsyncCheckpointer::SharedUpload unsupplied = ShardedShareFor(0, rank0);
  unsupplied.partitioned.clear();
  unsupplied.owned.clear();
  EXPECT_THAT(leader.SubmitShared(rank0.contents, {}, {}, unsupplied),
              StatusIs(absl::StatusCode::kInvalidArgument, "placeholder"));
  EXPECT_EQ(leader.part_state(), AsyncCheckpointer::PartState::kFailed);
  // A source that does not hold the bytes it claims.
  AsyncCheckpointer::SharedUpload short_source = ShardedShareFor(0, rank0);
  short_source.owned[0].source = at::zeros({1024});
  EXPECT_THAT(leader.SubmitShared(rank0.contents, {}, {}, short_source),
              StatusIs(absl::StatusCode::kInvalidArgument, "exactly those bytes"));
  // Owned bytes of a tensor that is not partitioned.
  AsyncCheckpointer::SharedUpload stray = ShardedShareFor(0, rank0);
  stray.owned.push_back({*rank0.contents.model.Find("fc1.bias"), 0, 4096 * 4, at::zeros({4096})});
  EXPECT_THAT(leader.SubmitShared(rank0.contents, {}, {}, stray),
              StatusIs(absl::StatusCode::kInvalidArgument, "not a partitioned tensor"));
  EXPECT_THAT(store_->GetManifest(*ParseVersionRef("net")).status(),
              StatusIs(absl::StatusCode::kNotFound));
}

TEST_F(AsyncCheckpointerTest, AbandonedSharedUploadLeavesNoVersion) {
  AsyncCheckpointer leader(store_.get(), "net");
  AsyncCheckpointer follower(store_.get(), "net");
  CheckpointContents rank0 = TrainingContents(3), rank1 = TrainingContents(3);
  ASSERT_THAT(leader.SubmitShared(rank0, {}, StepWrites(rank0), ShareFor(0, rank0)), IsOk());
  ASSERT_THAT(follower.SubmitShared(rank1, {}, StepWrites(rank1), ShareFor(1, rank1)), IsOk());
  ASSERT_EQ(leader.WaitForPart(), AsyncCheckpointer::PartState::kWritten);
  follower.WaitForPart();
  // The ranks' verdict: a part failed (here: said so), so nobody commits.
  leader.EndSharedUpload(false);
  follower.EndSharedUpload(false);
  EXPECT_THAT(leader.Wait().status(), StatusIs(absl::StatusCode::kAborted, "abandoned"));
  EXPECT_THAT(store_->GetManifest(*ParseVersionRef("net")).status(),
              StatusIs(absl::StatusCode::kNotFound));
  // The next checkpoint goes through.
  ASSERT_THAT(leader.SubmitShared(rank0, {}, StepWrites(rank0), ShareFor(0, rank0)), IsOk());
  ASSERT_THAT(follower.SubmitShared(rank1, {}, StepWrites(rank1), ShareFor(1, rank1)), IsOk());
  ASSERT_EQ(leader.WaitForPart(), AsyncCheckpointer::PartState::kWritten);
  ASSERT_EQ(follower.WaitForPart(), AsyncCheckpointer::PartState::kWritten);
  leader.EndSharedUpload(true);
  follower.EndSharedUpload(true);
  ASSERT_THAT(leader.Wait().status(), IsOk());
  ExpectStored(*store_, "net@1", 3);
}

TEST_F(AsyncCheckpointerTest, FollowerWithoutALeaderFailsItsPartAfterTheJoinTimeout) {
  AsyncCheckpointer follower(store_.get(), "net");
  CheckpointContents rank1 = TrainingContents(4);
  ASSERT_THAT(follower.SubmitShared(rank1, {}, StepWrites(rank1),
                                    ShareFor(1, rank1, absl::Milliseconds(300))),
              IsOk());
  EXPECT_EQ(follower.WaitForPart(), AsyncCheckpointer::PartState::kFailed);
  // A follower's failure reaches the ranks through part_state(), not its next Submit.
  EXPECT_THAT(follower.Wait().status(), IsOk());
}

TEST_F(AsyncCheckpointerTest, LeaderDestroyedBeforeTheVerdictAbandonsWithoutHanging) {
  {
    AsyncCheckpointer leader(store_.get(), "net");
    CheckpointContents rank0 = TrainingContents(5);
    ASSERT_THAT(leader.SubmitShared(rank0, {}, StepWrites(rank0), ShareFor(0, rank0)), IsOk());
    ASSERT_EQ(leader.WaitForPart(), AsyncCheckpointer::PartState::kWritten);
  }  // e.g. the run ended on an error: no verdict will come.
  EXPECT_THAT(store_->GetManifest(*ParseVersionRef("net")).status(),
              StatusIs(absl::StatusCode::kNotFound));
}

}  // namespace
}  // namespace ckpt::train

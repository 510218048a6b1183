#include "libs/train/testing/bundle_comparison.h"

#include <cmath>
#include <cstdlib>
#include <memory>
#include <string>

#include "ATen/core/Tensor.h"
#include "ATen/ops/arange.h"
#include "ATen/ops/full.h"
#include "ATen/ops/ones.h"
#include "ATen/ops/scalar_tensor.h"
#include "absl/status/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "libs/status/status_matchers.h"
#include "libs/store/checkpoint_contents.h"
#include "libs/store/rocksdb_checkpoint_store.h"
#include "libs/store/version_ref.h"
#include "libs/tensor/state_dict.h"
#include "libs/tensor/value.h"
#include "libs/train/trainer_state.h"

namespace ckpt::train::testing {
namespace {

using ::ckpt::testing::IsOk;
using ::ckpt::testing::StatusIs;
using ::testing::AllOf;
using ::testing::HasSubstr;

constexpr absl::StatusCode kDiffers = absl::StatusCode::kFailedPrecondition;

// A small training bundle as the trainer stores one: model, Adam-like optimizer state, a
// scheduler and the trainer's state. Every call builds new tensors with the same contents.
CheckpointContents Bundle() {
  CheckpointContents contents;
  EXPECT_THAT(contents.model.Insert("fc.weight", at::arange(12, at::kFloat).reshape({3, 4})),
              IsOk());
  EXPECT_THAT(contents.model.Insert("fc.bias", at::full({3}, 0.5f)), IsOk());
  contents.optimizer = Value::Dict(
      {{"state", Value::Dict({{0, Value::Dict({{"step", Value::Tensor(at::scalar_tensor(7.0))},
                                               {"exp_avg", Value::Tensor(at::ones({3, 4}))}})}})},
       {"param_groups",
        Value::List({Value::Dict({{"lr", Value::Float(0.01)},
                                  {"betas", Value::Tuple({Value::Float(0.9), Value::Float(0.999)})},
                                  {"params", Value::List({Value::Int(0), Value::Int(1)})}})})}});
  contents.scheduler =
      Value::Dict({{"last_epoch", Value::Int(7)}, {"base_lrs", Value::List({Value::Float(0.01)})}});
  TrainerState state;
  state.epoch = 2;
  state.sampler_position = 48;
  state.global_step = 7;
  state.target_step = 20;
  state.rng_cpu = at::arange(64, at::kByte);
  contents.extra = EncodeTrainerState(state);
  return contents;
}

TEST(BundleComparisonTest, TwoBundlesWithTheSameContentsAreTheSame) {
  EXPECT_THAT(CompareTrainingBundles(Bundle(), Bundle()), IsOk());
}

TEST(BundleComparisonTest, OneModelElementDifferenceIsNamedWithItsKeyIndexAndValues) {
  CheckpointContents b = Bundle();
  at::Tensor weight = *b.model.Find("fc.weight");
  weight[2][1] = 100.0f;  // flat index 9.
  EXPECT_THAT(CompareTrainingBundles(Bundle(), b),
              StatusIs(kDiffers, AllOf(HasSubstr("model/fc.weight"), HasSubstr("Float[3, 4]"),
                                       HasSubstr("element 9: 9 vs 100"))));
}

TEST(BundleComparisonTest, ElementsOneUlpApartPrintDifferently) {
  CheckpointContents b = Bundle();
  at::Tensor bias = *b.model.Find("fc.bias");
  bias[0] = std::nextafter(0.5f, 1.0f);
  EXPECT_THAT(CompareTrainingBundles(Bundle(), b),
              StatusIs(kDiffers, HasSubstr("element 0: 0.5 vs 0.50000006")));
}

TEST(BundleComparisonTest, NegativeZeroDiffersFromZeroAndTheSameNanIsTheSame) {
  CheckpointContents zero = Bundle(), negative_zero = Bundle();
  (*zero.model.Find("fc.bias")).zero_();
  (*negative_zero.model.Find("fc.bias")).fill_(-0.0f);
  EXPECT_THAT(CompareTrainingBundles(zero, negative_zero),
              StatusIs(kDiffers, HasSubstr("model/fc.bias")));
  CheckpointContents nan_a = Bundle(), nan_b = Bundle();
  (*nan_a.model.Find("fc.bias")).fill_(NAN);
  (*nan_b.model.Find("fc.bias")).fill_(NAN);
  EXPECT_THAT(CompareTrainingBundles(nan_a, nan_b), IsOk());
}

TEST(BundleComparisonTest, AMissingModelKeyIsNamed) {
  CheckpointContents b;
  EXPECT_THAT(b.model.Insert("fc.weight", at::arange(12, at::kFloat).reshape({3, 4})), IsOk());
  CheckpointContents a = Bundle();
  b.optimizer = a.optimizer;
  b.scheduler = a.scheduler;
  b.extra = a.extra;
  EXPECT_THAT(CompareTrainingBundles(a, b),
              StatusIs(kDiffers, HasSubstr("model/fc.bias: only in the first")));
  EXPECT_THAT(CompareTrainingBundles(b, a),
              StatusIs(kDiffers, HasSubstr("model/fc.bias: only in the second")));
}

TEST(BundleComparisonTest, ADtypeOrShapeDifferenceIsNamed) {
  CheckpointContents b = Bundle();
  b.model.InsertOrAssign("fc.bias", at::full({3}, 0.5, at::kDouble));
  EXPECT_THAT(CompareTrainingBundles(Bundle(), b),
              StatusIs(kDiffers, HasSubstr("model/fc.bias: Float[3] vs Double[3]")));
  b.model.InsertOrAssign("fc.bias", at::full({1, 3}, 0.5f));
  EXPECT_THAT(CompareTrainingBundles(Bundle(), b),
              StatusIs(kDiffers, HasSubstr("model/fc.bias: Float[3] vs Float[1, 3]")));
}

TEST(BundleComparisonTest, OptimizerStateDifferencesAreNamedByPath) {
  CheckpointContents b = Bundle();
  b.optimizer->FindMutable("state")->FindMutable(0)->FindMutable("exp_avg")->mutable_tensor()[0]
                                                                                             [3] =
      2.0f;
  EXPECT_THAT(CompareTrainingBundles(Bundle(), b),
              StatusIs(kDiffers, AllOf(HasSubstr("optimizer/'state'/0/'exp_avg'"),
                                       HasSubstr("element 3: 1 vs 2"))));
  // A missing per-parameter entry, a plain hyperparameter.
  b = Bundle();
  b.optimizer->FindMutable("state")->FindMutable(0)->mutable_entries().pop_back();
  EXPECT_THAT(CompareTrainingBundles(Bundle(), b),
              StatusIs(kDiffers, HasSubstr("optimizer/'state'/0/'exp_avg': only in the first")));
  b = Bundle();
  b.optimizer->FindMutable("param_groups")->mutable_items()[0].Set("lr", Value::Float(0.02));
  EXPECT_THAT(CompareTrainingBundles(Bundle(), b),
              StatusIs(kDiffers, HasSubstr("optimizer/'param_groups'/0/'lr': 0.01 vs 0.02")));
  // An int where a float was: the same number, another type.
  b = Bundle();
  b.scheduler->Set("last_epoch", Value::Float(7));
  EXPECT_THAT(CompareTrainingBundles(Bundle(), b),
              StatusIs(kDiffers, HasSubstr("scheduler/'last_epoch': int vs float")));
}

TEST(BundleComparisonTest, TrainerStateDifferencesAreNamed) {
  CheckpointContents b = Bundle();
  TrainerState state = *DecodeTrainerState(b.extra, "b");
  state.rng_cpu[63] = 0;
  b.extra = EncodeTrainerState(state);
  EXPECT_THAT(CompareTrainingBundles(Bundle(), b),
              StatusIs(kDiffers, HasSubstr("trainer/rng_cpu: Byte[64] differs first at element "
                                           "63: 63 vs 0")));
  state = *DecodeTrainerState(Bundle().extra, "b");
  state.sampler_position = 64;
  b.extra = EncodeTrainerState(state);
  EXPECT_THAT(CompareTrainingBundles(Bundle(), b),
              StatusIs(kDiffers, HasSubstr("trainer/sampler_position: 48 vs 64")));
}

TEST(BundleComparisonTest, BundlesMissingWhatAResumeNeedsAreNotTheSame) {
  CheckpointContents a = Bundle(), b = Bundle();
  a.scheduler.reset();
  b.scheduler.reset();
  EXPECT_THAT(CompareTrainingBundles(a, b),
              StatusIs(kDiffers, HasSubstr("scheduler: missing vs missing")));
  a = Bundle();
  b = Bundle();
  a.optimizer = b.optimizer = Value::Dict({{"state", Value::Dict()}});
  EXPECT_THAT(CompareTrainingBundles(a, b),
              StatusIs(kDiffers, HasSubstr("optimizer: holds no tensor")));
  a = Bundle();
  b = Bundle();
  a.extra = b.extra = Value();
  EXPECT_THAT(CompareTrainingBundles(a, b).code(), absl::StatusCode::kFailedPrecondition);
  a = Bundle();
  b = Bundle();
  TrainerState state = *DecodeTrainerState(a.extra, "a");
  state.rng_cpu = at::Tensor();
  a.extra = b.extra = EncodeTrainerState(state);
  EXPECT_THAT(CompareTrainingBundles(a, b),
              StatusIs(kDiffers, HasSubstr("trainer/rng_cpu: not set vs not set")));
}

std::unique_ptr<RocksDbCheckpointStore> NewStore(const std::string& name) {
  StoreOptions options;
  options.db_path = std::string(std::getenv("TEST_TMPDIR")) + "/" + name;
  absl::StatusOr<std::unique_ptr<RocksDbCheckpointStore>> store =
      RocksDbCheckpointStore::Open(options);
  EXPECT_THAT(store.status(), IsOk());
  return store.ok() ? *std::move(store) : nullptr;
}

TEST(BundleComparisonTest, StoredBundlesAreComparedAfterARoundTripThroughTheStore) {
  std::unique_ptr<RocksDbCheckpointStore> a = NewStore("a"), b = NewStore("b");
  ASSERT_TRUE(a && b);
  ASSERT_THAT(CommitCheckpoint(*a, "mlp", Bundle()).status(), IsOk());
  ASSERT_THAT(CommitCheckpoint(*b, "mlp", Bundle()).status(), IsOk());
  CheckpointContents changed = Bundle();
  (*changed.model.Find("fc.bias"))[1] = 0.25f;
  ASSERT_THAT(CommitCheckpoint(*b, "mlp", changed).status(), IsOk());

  EXPECT_THAT(CompareStoredBundles(*a, MakeVersionRef("mlp", 1), *b, MakeVersionRef("mlp", 1)),
              IsOk());
  EXPECT_THAT(CompareStoredBundles(*a, MakeVersionRef("mlp", 1), *b, MakeVersionRef("mlp", 2)),
              StatusIs(kDiffers, HasSubstr("mlp@1 vs mlp@2: model/fc.bias: Float[3] differs "
                                           "first at element 1: 0.5 vs 0.25")));
  EXPECT_THAT(CompareStoredBundles(*a, MakeVersionRef("mlp", 1), *b, MakeVersionRef("mlp", 3)),
              StatusIs(absl::StatusCode::kNotFound));
}

}  // namespace
}  // namespace ckpt::train::testing

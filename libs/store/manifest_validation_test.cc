#include "libs/store/manifest_validation.h"

#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "libs/status/status_matchers.h"

namespace ckpt {
namespace {

using ::ckpt::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

v1::TensorMeta Float32(const std::string& key, std::vector<int64_t> shape) {
  v1::TensorMeta meta;
  meta.set_key(key);
  meta.set_dtype(v1::DTYPE_FLOAT32);
  int64_t numel = 1;
  for (int64_t size : shape) {
    meta.add_shape(size);
    numel *= size;
  }
  meta.set_byte_length(numel * 4);
  return meta;
}

v1::Value Int(int64_t value) {
  v1::Value proto;
  proto.set_int_value(value);
  return proto;
}

v1::Value Ref(const std::string& key) {
  v1::Value proto;
  proto.mutable_tensor_value()->set_key(key);
  return proto;
}

void Set(v1::Value& dict, const std::string& key, v1::Value value) {
  v1::DictEntry* entry = dict.mutable_dict_value()->add_entries();
  entry->set_string_key(key);
  *entry->mutable_value() = std::move(value);
}

void Set(v1::Value& dict, int64_t key, v1::Value value) {
  v1::DictEntry* entry = dict.mutable_dict_value()->add_entries();
  entry->set_int_key(key);
  *entry->mutable_value() = std::move(value);
}

// {"state": {i: {"exp_avg": ref}}, "param_groups": [{"params": [0..n-1], "lr": ...}]}
v1::Value AdamState(int params, v1::Manifest& manifest, std::vector<int64_t> shape) {
  v1::Value optimizer, state, group, param_list;
  state.mutable_dict_value();
  for (int i = 0; i < params; ++i) {
    const std::string key = "optimizer/state/" + std::to_string(i) + "/exp_avg";
    *manifest.add_state_tensors() = Float32(key, shape);
    v1::Value per_param;
    Set(per_param, "exp_avg", Ref(key));
    Set(state, i, per_param);
    *param_list.mutable_list_value()->add_items() = Int(i);
  }
  param_list.mutable_list_value();
  Set(group, "params", param_list);
  v1::Value groups;
  *groups.mutable_list_value()->add_items() = group;
  Set(optimizer, "state", state);
  Set(optimizer, "param_groups", groups);
  return optimizer;
}

v1::Manifest TwoLayerModel() {
  v1::Manifest manifest;
  *manifest.add_tensors() = Float32("fc.weight", {10, 4});
  *manifest.add_tensors() = Float32("fc.bias", {10});
  v1::TensorMeta steps;
  steps.set_key("bn.num_batches_tracked");
  steps.set_dtype(v1::DTYPE_INT64);
  steps.set_byte_length(8);
  *manifest.add_tensors() = steps;
  return manifest;
}

TEST(ValidateManifestHeaderTest, AcceptsAPlainModel) {
  ASSERT_OK_AND_ASSIGN(std::vector<std::string> warnings, ValidateManifestHeader(TwoLayerModel()));
  EXPECT_THAT(warnings, IsEmpty());
}

TEST(ValidateManifestHeaderTest, RejectsByteLengthThatDisagreesWithShape) {
  v1::Manifest manifest = TwoLayerModel();
  manifest.mutable_tensors(0)->set_byte_length(100);
  EXPECT_THAT(ValidateManifestHeader(manifest),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "tensor 'fc.weight' (index 0): byte_length 100 but float32 [10, 4] is 160 "
                       "bytes"));
}

TEST(ValidateManifestHeaderTest, RejectsEmptyAndDuplicateKeysAndUnknownDTypes) {
  v1::Manifest empty_key = TwoLayerModel();
  empty_key.mutable_tensors(1)->set_key("");
  EXPECT_THAT(ValidateManifestHeader(empty_key),
              StatusIs(absl::StatusCode::kInvalidArgument, "empty key"));

  v1::Manifest duplicate = TwoLayerModel();
  duplicate.mutable_tensors(1)->set_key("fc.weight");
  EXPECT_THAT(ValidateManifestHeader(duplicate),
              StatusIs(absl::StatusCode::kInvalidArgument, "duplicate key"));

  v1::Manifest unknown = TwoLayerModel();
  unknown.mutable_tensors(0)->set_dtype(v1::DTYPE_UNSPECIFIED);
  EXPECT_THAT(ValidateManifestHeader(unknown),
              StatusIs(absl::StatusCode::kInvalidArgument, "dtype"));

  v1::Manifest negative = TwoLayerModel();
  negative.mutable_tensors(1)->set_shape(0, -1);
  EXPECT_THAT(ValidateManifestHeader(negative), StatusIs(absl::StatusCode::kInvalidArgument));
}

TEST(ValidateManifestHeaderTest, RejectsABundleLayoutAnExportCouldNotFollow) {
  v1::Manifest header = TwoLayerModel();
  v1::BundleLayout::Placement* model = header.mutable_bundle_layout()->add_placements();
  model->set_part(v1::BundleLayout::PART_MODEL);
  model->add_path()->set_string_key("model");
  ASSERT_TRUE(ValidateManifestHeader(header).ok());
  v1::BundleLayout::Placement* optimizer = header.mutable_bundle_layout()->add_placements();
  optimizer->set_part(v1::BundleLayout::PART_OPTIMIZER);  // no path: at the root.
  EXPECT_THAT(ValidateManifestHeader(header),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "PART_OPTIMIZER at the root is allowed only for a model placed alone"));
}

TEST(ValidateManifestHeaderTest, RejectsChunkRefsFromTheClient) {
  v1::Manifest manifest = TwoLayerModel();
  manifest.mutable_tensors(0)->add_chunks()->set_length(160);
  EXPECT_THAT(ValidateManifestHeader(manifest),
              StatusIs(absl::StatusCode::kInvalidArgument, "computes chunks itself"));
}

TEST(ValidateManifestHeaderTest, RejectsDanglingTensorRef) {
  v1::Manifest manifest = TwoLayerModel();
  v1::Value extra;
  Set(extra, "rng", Ref("extra/rng"));
  *manifest.mutable_extra_state() = extra;
  EXPECT_THAT(ValidateManifestHeader(manifest),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "extra_state/rng references tensor 'extra/rng', which is not in "
                       "state_tensors"));
}

TEST(ValidateManifestHeaderTest, AcceptsAdamStateForFewerParamsThanTensors) {
  v1::Manifest manifest = TwoLayerModel();
  // Only the weight is trained (the bias is frozen); the int64 buffer never is.
  *manifest.mutable_optimizer_state() = AdamState(1, manifest, {10, 4});
  (*manifest.mutable_optimizer_param_names())[0] = "fc.weight";
  ASSERT_OK_AND_ASSIGN(std::vector<std::string> warnings, ValidateManifestHeader(manifest));
  EXPECT_THAT(warnings, IsEmpty());
}

TEST(ValidateManifestHeaderTest, RejectsMoreOptimizerParamsThanFloatingTensors) {
  v1::Manifest manifest = TwoLayerModel();
  *manifest.mutable_optimizer_state() = AdamState(3, manifest, {10});
  EXPECT_THAT(ValidateManifestHeader(manifest),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "optimizer_state has 3 parameters (indices up to 2) but the model has "
                       "only 2 floating-point tensors"));
}

TEST(ValidateManifestHeaderTest, RejectsOptimizerStateWithoutParamGroups) {
  v1::Manifest manifest = TwoLayerModel();
  v1::Value optimizer, state;
  state.mutable_dict_value();
  Set(optimizer, "state", state);
  *manifest.mutable_optimizer_state() = optimizer;
  EXPECT_THAT(ValidateManifestHeader(manifest),
              StatusIs(absl::StatusCode::kInvalidArgument, "'param_groups'"));
}

TEST(ValidateManifestHeaderTest, RejectsParamNamesForUnknownKeys) {
  v1::Manifest manifest = TwoLayerModel();
  *manifest.mutable_optimizer_state() = AdamState(1, manifest, {10, 4});
  (*manifest.mutable_optimizer_param_names())[0] = "module.fc.weight";
  EXPECT_THAT(ValidateManifestHeader(manifest),
              StatusIs(absl::StatusCode::kInvalidArgument, "not a model tensor key"));
}

TEST(ValidateManifestHeaderTest, WarnsAboutShapeMismatchAndOrphanState) {
  v1::Manifest manifest = TwoLayerModel();
  *manifest.mutable_optimizer_state() = AdamState(1, manifest, {7});
  (*manifest.mutable_optimizer_param_names())[0] = "fc.weight";
  *manifest.add_state_tensors() = Float32("extra/unused", {1});
  ASSERT_OK_AND_ASSIGN(std::vector<std::string> warnings, ValidateManifestHeader(manifest));
  EXPECT_THAT(warnings,
              ElementsAre(HasSubstr("'extra/unused' is not referenced"),
                          HasSubstr("0/exp_avg has shape [7] but its parameter 'fc.weight' has "
                                    "shape [10, 4]")));
}

TEST(ValidateManifestHeaderTest, SchedulerNeedsLastEpoch) {
  v1::Manifest manifest = TwoLayerModel();
  v1::Value scheduler, base_lrs;
  base_lrs.mutable_list_value();
  Set(scheduler, "base_lrs", base_lrs);
  *manifest.mutable_scheduler_state() = scheduler;
  EXPECT_THAT(ValidateManifestHeader(manifest),
              StatusIs(absl::StatusCode::kInvalidArgument, "no integer 'last_epoch'"));

  Set(scheduler, "last_epoch", Int(5));
  *manifest.mutable_scheduler_state() = scheduler;
  EXPECT_OK(ValidateManifestHeader(manifest).status());
}

TEST(ValidateManifestHeaderTest, CompositeSchedulerIsCheckedThroughItsChildren) {
  v1::Manifest manifest = TwoLayerModel();
  v1::Value child_ok, child_bad, children, scheduler;
  Set(child_ok, "last_epoch", Int(1));
  Set(child_bad, "gamma", Int(1));
  *children.mutable_list_value()->add_items() = child_ok;
  *children.mutable_list_value()->add_items() = child_bad;
  Set(scheduler, "_schedulers", children);
  *manifest.mutable_scheduler_state() = scheduler;
  EXPECT_THAT(ValidateManifestHeader(manifest),
              StatusIs(absl::StatusCode::kInvalidArgument, "scheduler_state/_schedulers/1"));
}

TEST(ValidateManifestHeaderTest, NonDictSchedulerIsStoredWithAWarning) {
  v1::Manifest manifest = TwoLayerModel();
  manifest.mutable_scheduler_state()->mutable_opaque_value()->set_class_name("my.Scheduler");
  ASSERT_OK_AND_ASSIGN(std::vector<std::string> warnings, ValidateManifestHeader(manifest));
  EXPECT_THAT(warnings, ElementsAre(HasSubstr("scheduler_state is a opaque object")));
}

TEST(ValidateManifestHeaderTest, RejectsValueWithoutKind) {
  v1::Manifest manifest = TwoLayerModel();
  v1::Value extra;
  Set(extra, "x", v1::Value());
  *manifest.mutable_extra_state() = extra;
  EXPECT_THAT(ValidateManifestHeader(manifest),
              StatusIs(absl::StatusCode::kInvalidArgument, "extra_state/x: value has no kind"));
}

TEST(ValidateManifestHeaderTest, LineageParentMustBeANumberedVersion) {
  v1::Manifest manifest = TwoLayerModel();
  v1::Lineage& lineage = *manifest.mutable_metadata()->mutable_lineage();
  lineage.set_parent("resnet@7");
  lineage.set_parent_relation("resumed_from");
  EXPECT_OK(ValidateManifestHeader(manifest).status());
  lineage.set_parent("resnet@production");
  EXPECT_THAT(ValidateManifestHeader(manifest),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "lineage parent 'resnet@production' is not MODEL@VERSION"));
  lineage.clear_parent();
  EXPECT_THAT(ValidateManifestHeader(manifest),
              StatusIs(absl::StatusCode::kInvalidArgument, "no parent"));
}

}  // namespace
}  // namespace ckpt

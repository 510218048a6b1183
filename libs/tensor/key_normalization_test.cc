#include "libs/tensor/key_normalization.h"

#include <string>
#include <vector>

#include "ATen/core/Tensor.h"
#include "ATen/ops/ones.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "libs/status/status_matchers.h"

namespace ckpt {
namespace {

using ::ckpt::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::IsEmpty;

using Keys = std::vector<std::string>;

// Normalizes `keys`, checks that every original key is re-created exactly, returns the result.
NormalizedKeys NormalizeAndCheckReapplication(const Keys& keys) {
  absl::StatusOr<NormalizedKeys> normalized = NormalizeKeys(keys);
  EXPECT_TRUE(normalized.ok()) << normalized.status();
  if (!normalized.ok()) return {};
  EXPECT_EQ(normalized->keys.size(), keys.size());
  for (size_t i = 0; i < keys.size(); ++i) {
    EXPECT_EQ(normalized->normalization.OriginalKey(normalized->keys[i]), keys[i]);
  }
  absl::StatusOr<Keys> reapplied =
      ApplyKeyPolicy(normalized->keys, KeyPolicy::Original(), normalized->normalization);
  EXPECT_TRUE(reapplied.ok());
  if (reapplied.ok()) {
    EXPECT_EQ(*reapplied, keys);
  }
  // Through the proto (how the store keeps it) and back.
  EXPECT_EQ(KeyNormalization::FromProto(normalized->normalization.ToProto()),
            normalized->normalization);
  return *normalized;
}

TEST(NormalizeKeysTest, StripsModulePrefixFromDdpCheckpoint) {
  const NormalizedKeys result = NormalizeAndCheckReapplication(
      {"module.conv1.weight", "module.bn1.running_mean", "module.fc.bias"});
  EXPECT_THAT(result.keys, ElementsAre("conv1.weight", "bn1.running_mean", "fc.bias"));
  EXPECT_EQ(result.normalization.stripped_prefix, "module.");
  EXPECT_THAT(result.normalization.wrappers, ElementsAre("ddp"));
}

TEST(NormalizeKeysTest, StripsTorchCompilePrefix) {
  const NormalizedKeys result =
      NormalizeAndCheckReapplication({"_orig_mod.linear.weight", "_orig_mod.linear.bias"});
  EXPECT_THAT(result.keys, ElementsAre("linear.weight", "linear.bias"));
  EXPECT_THAT(result.normalization.wrappers, ElementsAre("compile"));
}

TEST(NormalizeKeysTest, StripsFsdpAndCheckpointWrapperPrefixes) {
  EXPECT_THAT(NormalizeAndCheckReapplication(
                  {"_fsdp_wrapped_module.layer.weight", "_fsdp_wrapped_module.layer.bias"})
                  .keys,
              ElementsAre("layer.weight", "layer.bias"));
  const NormalizedKeys checkpointed = NormalizeAndCheckReapplication(
      {"_checkpoint_wrapped_module.block.weight", "_checkpoint_wrapped_module.block.bias"});
  EXPECT_THAT(checkpointed.keys, ElementsAre("block.weight", "block.bias"));
  EXPECT_THAT(checkpointed.normalization.wrappers, ElementsAre("checkpoint"));
}

TEST(NormalizeKeysTest, StripsNestedWrappersOutermostFirst) {
  const NormalizedKeys result = NormalizeAndCheckReapplication(
      {"module._orig_mod.encoder.weight", "module._orig_mod.decoder.weight"});
  EXPECT_THAT(result.keys, ElementsAre("encoder.weight", "decoder.weight"));
  EXPECT_EQ(result.normalization.stripped_prefix, "module._orig_mod.");
  EXPECT_THAT(result.normalization.wrappers, ElementsAre("ddp", "compile"));

  // DataParallel around DataParallel.
  EXPECT_THAT(NormalizeAndCheckReapplication({"module.module.w", "module.module.b"}).keys,
              ElementsAre("w", "b"));
}

TEST(NormalizeKeysTest, RemovesWrapperSegmentsInsideKeys) {
  // FSDP with auto-wrapped layers and activation checkpointing on some blocks, inside DDP.
  const NormalizedKeys result = NormalizeAndCheckReapplication({
      "module.embed.weight",
      "module.layers.0._fsdp_wrapped_module.linear.weight",
      "module.layers.1._checkpoint_wrapped_module.linear.weight",
      "module.layers.2._fsdp_wrapped_module._checkpoint_wrapped_module.linear.weight",
      "module.layers.3._fsdp_wrapped_module._fpw_module.linear.weight",
      "module.head._orig_mod.weight",
  });
  EXPECT_THAT(result.keys,
              ElementsAre("embed.weight", "layers.0.linear.weight", "layers.1.linear.weight",
                          "layers.2.linear.weight", "layers.3.linear.weight", "head.weight"));
  EXPECT_EQ(result.normalization.stripped_prefix, "module.");
  EXPECT_THAT(result.normalization.wrappers, ElementsAre("ddp", "fsdp", "checkpoint", "compile"));
  EXPECT_EQ(result.normalization.inner_renames.size(), 5u);
}

TEST(NormalizeKeysTest, NeverStripsSegmentsThatBelongToTheModel) {
  // Keys that only look like wrappers.
  const Keys keys = {"encoder.module_list.0.weight", "head.module.weight", "modules.0.bias",
                     "module_a.weight"};
  const NormalizedKeys result = NormalizeAndCheckReapplication(keys);
  EXPECT_EQ(result.keys, keys);
  EXPECT_FALSE(result.normalization.changed_keys());
  EXPECT_THAT(result.normalization.wrappers, IsEmpty());
}

TEST(NormalizeKeysTest, KeepsAPrefixThatOnlySomeKeysHave) {
  const Keys keys = {"module.weight", "head.module.weight", "bias"};
  EXPECT_EQ(NormalizeAndCheckReapplication(keys).keys, keys);
}

TEST(NormalizeKeysTest, KeepsAWrapperNameInTheLastSegment) {
  // The last segment names the tensor itself, never a wrapper.
  const Keys keys = {"block._orig_mod", "block.module"};
  EXPECT_EQ(NormalizeAndCheckReapplication(keys).keys, keys);
  // A bare "module" key is not a prefix either.
  EXPECT_THAT(NormalizeAndCheckReapplication({"module", "module.weight"}).keys,
              ElementsAre("module", "module.weight"));
}

TEST(NormalizeKeysTest, EmptyInputGivesEmptyResult) {
  const NormalizedKeys result = NormalizeAndCheckReapplication({});
  EXPECT_THAT(result.keys, IsEmpty());
  EXPECT_FALSE(result.normalization.changed_keys());
}

TEST(NormalizeKeysTest, RejectsKeysThatCollideAfterNormalization) {
  EXPECT_THAT(NormalizeKeys({"layer._orig_mod.weight", "layer.weight"}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "'layer._orig_mod.weight' and 'layer.weight' both normalize to"));
  EXPECT_THAT(NormalizeKeys({"a", ""}), StatusIs(absl::StatusCode::kInvalidArgument, "empty key"));
}

TEST(KeyPolicyTest, AddsPrefixForDdpConsumers) {
  const NormalizedKeys result = NormalizeAndCheckReapplication({"fc.weight", "fc.bias"});
  EXPECT_THAT(
      ApplyKeyPolicy(result.keys, KeyPolicy::AddPrefix("module."), result.normalization).value(),
      ElementsAre("module.fc.weight", "module.fc.bias"));
  // A prefix without its dot gets one.
  EXPECT_EQ(KeyPolicy::AddPrefix("model").prefix(), "model.");
  EXPECT_EQ(ApplyKeyPolicy("fc.bias", KeyPolicy::Canonical(), result.normalization), "fc.bias");
}

TEST(KeyPolicyTest, OriginalReappliesWhatWasStrippedExactly) {
  const Keys keys = {"module.a._checkpoint_wrapped_module.w", "module.b.w"};
  const NormalizedKeys result = NormalizeAndCheckReapplication(keys);
  EXPECT_THAT(result.keys, ElementsAre("a.w", "b.w"));
  EXPECT_EQ(ApplyKeyPolicy("a.w", KeyPolicy::Original(), result.normalization), keys[0]);
  EXPECT_EQ(ApplyKeyPolicy("b.w", KeyPolicy::Original(), result.normalization), keys[1]);
}

TEST(NormalizeStateDictTest, RenamesTensorsAndKeepsThem) {
  StateDict dict;
  const at::Tensor weight = at::ones({2, 2});
  ASSERT_OK(dict.Insert("module.fc.weight", weight, "cuda:1"));
  ASSERT_OK_AND_ASSIGN(auto normalized, NormalizeStateDict(dict));
  EXPECT_THAT(normalized.first.keys(), ElementsAre("fc.weight"));
  EXPECT_TRUE(normalized.first.Find("fc.weight")->is_same(weight));
  EXPECT_EQ(normalized.first.entry(0).original_device, "cuda:1");
  EXPECT_EQ(normalized.second.stripped_prefix, "module.");
}

TEST(StripExactPrefixTest, StripsFromEveryKeyOrNamesTheKeyWithout) {
  StateDict dict;
  ASSERT_OK(dict.Insert("model.fc.weight", at::ones({1})));
  ASSERT_OK(dict.Insert("model.fc.bias", at::ones({1})));
  ASSERT_OK_AND_ASSIGN(StateDict stripped, StripExactPrefix(dict, "model."));
  EXPECT_THAT(stripped.keys(), ElementsAre("fc.weight", "fc.bias"));
  EXPECT_THAT(StripExactPrefix(dict, "model.fc.w"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "key 'model.fc.bias' does not start with the prefix 'model.fc.w'"));
}

}  // namespace
}  // namespace ckpt

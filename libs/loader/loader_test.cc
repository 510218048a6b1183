#include "libs/loader/loader.h"

#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "libs/loader/load_target.h"
#include "libs/status/status_matchers.h"
#include "libs/store/checkpoint_contents.h"
#include "libs/store/rocksdb_checkpoint_store.h"
#include "libs/store/version_ref.h"
#include "libs/tensor/device.h"
#include "libs/tensor/dtype.h"
#include "proto/ckpt/v1/loader.pb.h"
#include "torch/nn/module.h"

namespace ckpt {
namespace {

using ::ckpt::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

// A layer with a weight, a bias and an int64 counter buffer (like BatchNorm's
// num_batches_tracked).
struct Layer : torch::nn::Module {
  Layer(int64_t out, int64_t in) {
    weight = register_parameter("weight", torch::zeros({out, in}));
    bias = register_parameter("bias", torch::zeros({out}));
    num_batches_tracked =
        register_buffer("num_batches_tracked", torch::zeros({}, torch::dtype(torch::kInt64)));
  }
  torch::Tensor weight, bias, num_batches_tracked;
};

// Unwrapped consumer: keys "backbone.weight", ..., "fc.num_batches_tracked".
struct Net : torch::nn::Module {
  explicit Net(int64_t classes) {
    backbone = register_module("backbone", std::make_shared<Layer>(8, 4));
    fc = register_module("fc", std::make_shared<Layer>(classes, 8));
  }
  std::shared_ptr<Layer> backbone, fc;
};

// DDP-style consumer: every key under "module.".
struct DdpNet : torch::nn::Module {
  DdpNet() { module = register_module("module", std::make_shared<Net>(3)); }
  std::shared_ptr<Net> module;
};

// Same bytes: dtype, shape and every byte.
bool BytesEqual(const at::Tensor& a, const at::Tensor& b) {
  if (a.scalar_type() != b.scalar_type() || a.sizes() != b.sizes()) return false;
  const at::Tensor ca = a.cpu().contiguous();
  const at::Tensor cb = b.cpu().contiguous();
  return std::memcmp(ca.data_ptr(), cb.data_ptr(), ca.nbytes()) == 0;
}

class LoaderTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const char* tmp = std::getenv("TEST_TMPDIR");
    StoreOptions options;
    options.db_path = std::string(tmp != nullptr ? tmp : "/tmp") + "/" +
                      ::testing::UnitTest::GetInstance()->current_test_info()->name();
    ASSERT_OK_AND_ASSIGN(store_, RocksDbCheckpointStore::Open(options));

    // What a DDP job saved on cuda:1: "module."-prefixed keys.
    torch::manual_seed(7);
    const std::vector<std::pair<std::string, at::Tensor>> tensors = {
        {"backbone.weight", torch::randn({8, 4})},
        {"backbone.bias", torch::randn({8})},
        {"backbone.num_batches_tracked", torch::full({}, 41, torch::dtype(torch::kInt64))},
        {"fc.weight", torch::randn({3, 8})},
        {"fc.bias", torch::randn({3})},
        {"fc.num_batches_tracked", torch::full({}, 42, torch::dtype(torch::kInt64))},
    };
    CheckpointContents contents;
    for (const auto& [key, tensor] : tensors) {
      originals_.emplace_back(key, tensor);
      ASSERT_OK(contents.model.Insert("module." + key, tensor, "cuda:1"));
    }
    Value optimizer = Value::Dict();
    optimizer.Set(
        "state",
        Value::Dict({{0, Value::Dict({{"exp_avg", Value::Tensor(torch::ones({8, 4}))}})}}));
    optimizer.Set("param_groups",
                  Value::List({Value::Dict(
                      {{"lr", Value::Float(0.01)}, {"params", Value::List({Value::Int(0)})}})}));
    contents.optimizer = optimizer;
    ASSERT_OK_AND_ASSIGN(CommitResult committed, CommitCheckpoint(*store_, "net", contents));
    ref_ = committed.version;
  }

  const at::Tensor& Original(const std::string& canonical_key) const {
    for (const auto& [key, tensor] : originals_) {
      if (key == canonical_key) return tensor;
    }
    ADD_FAILURE() << "no original " << canonical_key;
    return originals_.front().second;
  }

  std::unique_ptr<RocksDbCheckpointStore> store_;
  std::vector<std::pair<std::string, at::Tensor>> originals_;
  v1::VersionRef ref_;
};

TEST_F(LoaderTest, LoadsDdpCheckpointFromCuda1OntoCpuUnderCanonicalKeys) {
  ASSERT_OK_AND_ASSIGN(LoadedState state, Load(*store_, ref_, LoadTarget()));
  ASSERT_EQ(state.model.size(), originals_.size());
  for (const StateDict::Entry& entry : state.model) {
    EXPECT_TRUE(entry.tensor.device().is_cpu()) << entry.key;
    EXPECT_EQ(entry.original_device, "cuda:1") << entry.key;
    EXPECT_TRUE(BytesEqual(entry.tensor, Original(entry.key))) << entry.key;
  }
  EXPECT_EQ(state.model.entry(0).key, "backbone.weight");
  EXPECT_FALSE(state.optimizer.has_value());
  EXPECT_FALSE(state.scheduler.has_value());
  EXPECT_EQ(state.manifest.version(), ref_.version());
}

TEST_F(LoaderTest, AddPrefixGivesDdpStyleKeys) {
  LoadTarget target;
  target.keys = KeyPolicy::AddPrefix("module.");
  ASSERT_OK_AND_ASSIGN(LoadedState state, Load(*store_, ref_, target));
  ASSERT_EQ(state.model.size(), originals_.size());
  for (const auto& [key, tensor] : originals_) {
    const at::Tensor* loaded = state.model.Find("module." + key);
    ASSERT_NE(loaded, nullptr) << key;
    EXPECT_TRUE(BytesEqual(*loaded, tensor)) << key;
  }
}

TEST_F(LoaderTest, CastToBf16TouchesFloatingTensorsOnly) {
  LoadTarget target;
  ASSERT_OK_AND_ASSIGN(target.dtype, DTypePolicy::CastFloatingTo(DType::kBFloat16));
  ASSERT_OK_AND_ASSIGN(LoadedState state, Load(*store_, ref_, target));
  for (const StateDict::Entry& entry : state.model) {
    const at::Tensor& original = Original(entry.key);
    if (original.is_floating_point()) {
      EXPECT_EQ(entry.tensor.scalar_type(), at::kBFloat16) << entry.key;
      EXPECT_TRUE(BytesEqual(entry.tensor, original.to(at::kBFloat16))) << entry.key;
    } else {
      EXPECT_TRUE(BytesEqual(entry.tensor, original)) << entry.key;  // int64 untouched.
    }
  }
}

TEST_F(LoaderTest, SubsetByPrefixAndKeyLoadsOnlyThoseTensors) {
  LoadTarget target;
  target.include_prefixes = {"backbone."};
  target.include_keys = {"fc.bias"};
  ASSERT_OK_AND_ASSIGN(LoadedState state, Load(*store_, ref_, target));
  EXPECT_THAT(state.model.keys(), ElementsAre("backbone.weight", "backbone.bias",
                                              "backbone.num_batches_tracked", "fc.bias"));
  EXPECT_TRUE(BytesEqual(*state.model.Find("fc.bias"), Original("fc.bias")));
}

TEST_F(LoaderTest, SubsetNamingAbsentKeysIsInvalidArgumentNamingThem) {
  LoadTarget target;
  target.include_keys = {"fc.bias", "head.weight"};
  target.include_prefixes = {"decoder."};
  EXPECT_THAT(Load(*store_, ref_, target),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       ::testing::AllOf(HasSubstr("head.weight"), HasSubstr("decoder."),
                                        ::testing::Not(HasSubstr("fc.bias")))));
}

TEST_F(LoaderTest, OptimizerStateOnlyWhenAsked) {
  LoadTarget target;
  target.include_optimizer = true;
  ASSERT_OK_AND_ASSIGN(LoadedState state, Load(*store_, ref_, target));
  ASSERT_TRUE(state.optimizer.has_value());
  const Value* exp_avg = state.optimizer->Find("state")->Find(0)->Find("exp_avg");
  ASSERT_NE(exp_avg, nullptr);
  EXPECT_TRUE(BytesEqual(exp_avg->tensor(), torch::ones({8, 4})));
  EXPECT_FALSE(state.scheduler.has_value());  // the version has none.
}

TEST_F(LoaderTest, MissingVersionIsNotFound) {
  ASSERT_OK_AND_ASSIGN(v1::VersionRef missing, ParseVersionRef("net@9"));
  EXPECT_THAT(Load(*store_, missing, LoadTarget()),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("net@9")));
}

TEST_F(LoaderTest, UnavailableDeviceFailsBeforeTheStoreIsRead) {
  ASSERT_OK_AND_ASSIGN(DeviceSpec cuda, ParseDevice("cuda:0"));
  if (ResolveTorchDevice(cuda).ok()) GTEST_SKIP() << "this process has cuda:0";
  LoadTarget target;
  target.device = cuda;
  EXPECT_THAT(Load(*store_, ref_, target), StatusIs(absl::StatusCode::kFailedPrecondition));
  // Even a version that does not exist: the device is checked before the store is touched.
  ASSERT_OK_AND_ASSIGN(v1::VersionRef missing, ParseVersionRef("nothing@1"));
  EXPECT_THAT(Load(*store_, missing, target), StatusIs(absl::StatusCode::kFailedPrecondition));
}

TEST_F(LoaderTest, LoadIntoUnwrappedModuleStrictCopiesEveryByte) {
  Net net(3);
  ASSERT_OK_AND_ASSIGN(CompatibilityReport report, LoadInto(*store_, ref_, net));
  EXPECT_TRUE(report.compatible());
  EXPECT_EQ(report.loaded_keys.size(), originals_.size());
  EXPECT_TRUE(BytesEqual(net.backbone->weight, Original("backbone.weight")));
  EXPECT_TRUE(BytesEqual(net.fc->bias, Original("fc.bias")));
  EXPECT_TRUE(BytesEqual(net.fc->num_batches_tracked, Original("fc.num_batches_tracked")));
  EXPECT_TRUE(net.fc->weight.requires_grad());  // still a parameter, updated in place.
}

TEST_F(LoaderTest, LoadIntoDdpStyleModuleWithAddPrefix) {
  DdpNet net;
  LoadIntoOptions options;
  options.keys = KeyPolicy::AddPrefix("module.");
  ASSERT_OK(LoadInto(*store_, ref_, net, options).status());
  EXPECT_TRUE(BytesEqual(net.module->backbone->bias, Original("backbone.bias")));
}

TEST_F(LoaderTest, LoadIntoKeepsTheModulesDtype) {
  Net net(3);
  net.to(torch::kFloat64);
  ASSERT_OK(LoadInto(*store_, ref_, net).status());
  EXPECT_EQ(net.fc->weight.scalar_type(), at::kDouble);
  EXPECT_TRUE(BytesEqual(net.fc->weight, Original("fc.weight").to(at::kDouble)));
}

TEST_F(LoaderTest, StrictLoadIntoReportsEverythingAtOnceAndCopiesNothing) {
  // fc has 10 classes instead of 3, and an extra layer the checkpoint lacks; the DDP-prefixed
  // keys of the checkpoint under Original() are all unexpected too.
  struct Wider : torch::nn::Module {
    Wider() {
      backbone = register_module("backbone", std::make_shared<Layer>(8, 4));
      fc = register_module("fc", std::make_shared<Layer>(10, 8));
      head = register_parameter("head", torch::zeros({2}));
    }
    std::shared_ptr<Layer> backbone, fc;
    torch::Tensor head;
  } net;
  absl::StatusOr<CompatibilityReport> result = LoadInto(*store_, ref_, net);
  EXPECT_THAT(result, StatusIs(absl::StatusCode::kInvalidArgument,
                               ::testing::AllOf(HasSubstr("missing: [head]"),
                                                HasSubstr("fc.weight: [3, 8] in checkpoint, "
                                                          "[10, 8] in module"),
                                                HasSubstr("fc.bias: [3] in checkpoint, [10] in "
                                                          "module"))));
  EXPECT_TRUE(BytesEqual(net.backbone->weight, torch::zeros({8, 4})));  // untouched.

  LoadIntoOptions original;
  original.keys = KeyPolicy::Original();
  Net plain(3);
  EXPECT_THAT(LoadInto(*store_, ref_, plain, original),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       ::testing::AllOf(HasSubstr("missing: [backbone.weight, backbone.bias"),
                                        HasSubstr("unexpected: [module.backbone.weight"))));
}

TEST_F(LoaderTest, NonStrictLoadIntoLoadsWhatMatchesAndReports) {
  struct Wider : torch::nn::Module {
    Wider() {
      backbone = register_module("backbone", std::make_shared<Layer>(8, 4));
      fc = register_module("fc", std::make_shared<Layer>(10, 8));
      head = register_parameter("head", torch::zeros({2}));
    }
    std::shared_ptr<Layer> backbone, fc;
    torch::Tensor head;
  } net;
  LoadIntoOptions options;
  options.strict = false;
  ASSERT_OK_AND_ASSIGN(CompatibilityReport report, LoadInto(*store_, ref_, net, options));
  EXPECT_THAT(report.missing_keys, ElementsAre("head"));
  EXPECT_TRUE(report.unexpected_keys.empty());
  ASSERT_EQ(report.shape_mismatches.size(), 2u);
  EXPECT_EQ(report.shape_mismatches[0].key, "fc.weight");
  EXPECT_THAT(report.shape_mismatches[0].checkpoint_shape, ElementsAre(3, 8));
  EXPECT_THAT(report.shape_mismatches[0].expected_shape, ElementsAre(10, 8));
  EXPECT_THAT(report.loaded_keys,
              ElementsAre("backbone.weight", "backbone.bias", "backbone.num_batches_tracked",
                          "fc.num_batches_tracked"));
  EXPECT_TRUE(BytesEqual(net.backbone->weight, Original("backbone.weight")));
  EXPECT_TRUE(BytesEqual(net.fc->weight, torch::zeros({10, 8})));  // mismatched: untouched.
}

TEST_F(LoaderTest, PreflightSuggestsModulePrefixForDdpConsumer) {
  DdpNet net;
  ASSERT_OK_AND_ASSIGN(PreflightReport preflight, Preflight(*store_, ref_, ExpectedTensorsOf(net)));
  EXPECT_FALSE(preflight.report.compatible());
  EXPECT_EQ(preflight.report.missing_keys.size(), originals_.size());
  EXPECT_EQ(preflight.report.unexpected_keys.size(), originals_.size());
  ASSERT_TRUE(preflight.suggested_keys.has_value());
  // Original() would fit too (the producer's keys were "module."-prefixed); the explicit prefix
  // is preferred.
  EXPECT_EQ(preflight.suggested_keys->kind(), KeyPolicy::Kind::kAddPrefix);
  EXPECT_EQ(preflight.suggested_keys->prefix(), "module.");
  EXPECT_THAT(preflight.summary, HasSubstr("Every key matches under"));

  ASSERT_OK_AND_ASSIGN(
      PreflightReport under_prefix,
      Preflight(*store_, ref_, ExpectedTensorsOf(net), KeyPolicy::AddPrefix("module.")));
  EXPECT_TRUE(under_prefix.report.compatible()) << under_prefix.summary;
}

TEST(PreflightTest, SuggestsAddPrefixWhenCanonicalKeysLackIt) {
  v1::Manifest manifest;
  manifest.set_model("m");
  manifest.set_version(1);
  v1::TensorMeta* meta = manifest.add_tensors();
  meta->set_key("fc.weight");
  meta->add_shape(10);
  meta->add_shape(512);
  const std::vector<ExpectedTensor> expected = {{"module.fc.weight", {1000, 512}}};
  const PreflightReport preflight = Preflight(manifest, expected);
  EXPECT_THAT(preflight.report.missing_keys, ElementsAre("module.fc.weight"));
  EXPECT_THAT(preflight.report.unexpected_keys, ElementsAre("fc.weight"));
  ASSERT_TRUE(preflight.suggested_keys.has_value());
  EXPECT_EQ(preflight.suggested_keys->kind(), KeyPolicy::Kind::kAddPrefix);
  EXPECT_EQ(preflight.suggested_keys->prefix(), "module.");

  const PreflightReport prefixed = Preflight(manifest, expected, KeyPolicy::AddPrefix("module."));
  EXPECT_EQ(prefixed.report.ToString(),
            "shape mismatch: module.fc.weight: [10, 512] in checkpoint, [1000, 512] in module");
}

TEST(LoadTargetFromProtoTest, DefaultsAreCpuKeepCanonical) {
  ASSERT_OK_AND_ASSIGN(LoadTarget target, LoadTargetFromProto(v1::LoadTarget()));
  EXPECT_EQ(target.device, DeviceSpec::Cpu());
  EXPECT_FALSE(target.dtype.floating_target().has_value());
  EXPECT_EQ(target.keys.kind(), KeyPolicy::Kind::kCanonical);
  EXPECT_FALSE(target.include_optimizer);
}

TEST(LoadTargetFromProtoTest, ReadsEveryField) {
  v1::LoadTarget proto;
  proto.set_device("cuda:1");
  proto.set_cast_floating_to(v1::DTYPE_BFLOAT16);
  proto.set_key_policy(v1::KEY_POLICY_ADD_PREFIX);
  proto.add_include_keys("fc.bias");
  proto.add_include_prefixes("encoder.");
  proto.set_include_optimizer_state(true);
  proto.set_include_scheduler_state(true);
  ASSERT_OK_AND_ASSIGN(LoadTarget target, LoadTargetFromProto(proto));
  EXPECT_EQ(target.device.ToString(), "cuda:1");
  EXPECT_EQ(target.dtype.floating_target(), DType::kBFloat16);
  EXPECT_EQ(target.keys.prefix(), "module.");  // empty key_prefix means "module.".
  EXPECT_THAT(target.include_keys, ElementsAre("fc.bias"));
  EXPECT_THAT(target.include_prefixes, ElementsAre("encoder."));
  EXPECT_TRUE(target.include_optimizer);
  EXPECT_TRUE(target.include_scheduler);
}

TEST(LoadTargetFromProtoTest, RejectsBadDeviceAndNonFloatingCast) {
  v1::LoadTarget bad_device;
  bad_device.set_device("cuda:x");
  EXPECT_THAT(LoadTargetFromProto(bad_device), StatusIs(absl::StatusCode::kInvalidArgument));
  v1::LoadTarget int_cast;
  int_cast.set_cast_floating_to(v1::DTYPE_INT64);
  EXPECT_THAT(LoadTargetFromProto(int_cast), StatusIs(absl::StatusCode::kInvalidArgument));
}

}  // namespace
}  // namespace ckpt

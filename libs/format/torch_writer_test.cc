#include "libs/format/torch_writer.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <set>
#include <string>
#include <vector>

#include "ATen/TensorIndexing.h"
#include "ATen/TensorOperators.h"
#include "ATen/core/Tensor.h"
#include "ATen/ops/arange.h"
#include "ATen/ops/empty.h"
#include "ATen/ops/full.h"
#include "ATen/ops/linspace.h"
#include "ATen/ops/ones.h"
#include "ATen/ops/quantize_per_channel.h"
#include "ATen/ops/quantize_per_tensor.h"
#include "ATen/ops/randn.h"
#include "ATen/ops/scalar_tensor.h"
#include "ATen/ops/tensor.h"
#include "ATen/ops/zeros.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "libs/status/status_matchers.h"
#include "libs/tensor/dtype.h"
#include "libs/testing/python_runner.h"

namespace ckpt {
namespace {

using ::ckpt::testing::StatusIs;

std::string TmpPath(const std::string& name) {
  return std::string(std::getenv("TEST_TMPDIR")) + "/" + name;
}

std::string RunPython(const std::string& args) {
  return ::ckpt::testing::RunPythonOrAddFailure("libs/format/testdata/torch_export_check.py", args);
}

std::set<std::string> Lines(const std::string& text) {
  std::set<std::string> lines;
  for (absl::string_view line : absl::StrSplit(text, '\n', absl::SkipEmpty())) lines.emplace(line);
  return lines;
}

std::string Describe(const std::string& key, const at::Tensor& tensor) {
  const at::Tensor bytes = tensor.detach().contiguous();
  return absl::StrCat(key, "|torch.", DTypeName(FromScalarType(bytes.scalar_type()).value()), "|",
                      absl::StrJoin(bytes.sizes(), ","), "|",
                      absl::BytesToHexString(absl::string_view(
                          static_cast<const char*>(bytes.data_ptr()), bytes.nbytes())));
}

TEST(TorchWriterTest, PythonLoadsAStateDictWithWeightsOnlyAndSeesEveryValue) {
  const at::Tensor base = at::arange(24, at::kFloat).reshape({4, 6});
  const at::Tensor embedding = at::randn({5, 3});
  StateDict state;
  ASSERT_OK(state.Insert("embed.weight", embedding));
  ASSERT_OK(state.Insert("head.weight", embedding));  // Tied weights.
  ASSERT_OK(state.Insert("t.transposed", base.t()));
  ASSERT_OK(state.Insert("t.offset_slice", base.index({at::indexing::Slice(1, 3), 2})));
  ASSERT_OK(state.Insert("bn.num_batches_tracked", at::scalar_tensor(42, at::kLong)));
  ASSERT_OK(state.Insert("half", at::randn({3}).to(at::kHalf)));
  ASSERT_OK(state.Insert("bf16", at::randn({2, 2}).to(at::kBFloat16)));
  ASSERT_OK(state.Insert("mask", at::tensor({1, 0}, at::kByte).to(at::kBool)));
  ASSERT_OK(state.Insert("codes", at::tensor({-3, 7}, at::kChar)));
  ASSERT_OK(state.Insert("wide", at::tensor({1.5, -2.25}, at::kDouble)));
  ASSERT_OK(state.Insert("phase", at::randn({2}, at::kComplexFloat)));
  ASSERT_OK(state.Insert("empty", at::zeros({0, 4})));
  ASSERT_OK(state.Insert("param", at::ones({2}).set_requires_grad(true)));
  ASSERT_OK(state.Insert("d4", at::arange(16, at::kInt).reshape({1, 2, 2, 4})));

  const std::string path = TmpPath("state.pt");
  ASSERT_OK_AND_ASSIGN(TorchWriteReport report, WriteTorchFile(path, StateDictToValue(state)));
  EXPECT_TRUE(report.warnings.empty());
  EXPECT_EQ(report.storages, static_cast<int64_t>(state.size()) - 2);  // Tied and the slice share.

  std::set<std::string> expected = {"TYPE OrderedDict", "PARAM param True",
                                    "SHARED embed.weight head.weight",
                                    "SHARED t.transposed t.offset_slice"};
  for (const StateDict::Entry& entry : state) expected.insert(Describe(entry.key, entry.tensor));
  EXPECT_EQ(Lines(RunPython("describe " + path)), expected);
}

TEST(TorchWriterTest, WritesBundlesWithOnlyAllowedGlobalsAndExactValues) {
  StateDict model;
  ASSERT_OK(model.Insert("fc.weight", at::arange(6, at::kFloat).reshape({2, 3})));
  Value param_state = Value::Dict();
  param_state.Set("step", Value::Tensor(at::scalar_tensor(5.0)));
  param_state.Set("exp_avg", Value::Tensor(at::full({2, 3}, 0.5)));
  Value state = Value::Dict();
  state.Set(0, param_state);
  Value group = Value::Dict();
  group.Set("lr", Value::Float(0.001));
  group.Set("betas", Value::Tuple({Value::Float(0.9), Value::Float(0.999)}));
  group.Set("params", Value::List({Value::Int(0)}));
  Value optimizer = Value::Dict();
  optimizer.Set("state", state);
  optimizer.Set("param_groups", Value::List({group}));

  Value bundle = Value::Dict();
  bundle.Set("epoch", Value::Int(3));
  bundle.Set("model", StateDictToValue(model));
  bundle.Set("optimizer", optimizer);
  bundle.Set("name", Value::String("run-1"));
  bundle.Set("flags", Value::List({Value::Bool(true), Value::Bool(false), Value::None()}));
  bundle.Set("blob", Value::Bytes(std::string("\x00\x01\xff", 3)));
  bundle.Set("big", Value::Int(int64_t{1} << 40));
  bundle.Set("neg", Value::Int(-7));
  bundle.Set("ratio", Value::Tuple({Value::Float(std::nan("")),
                                    Value::Float(-std::numeric_limits<double>::infinity())}));
  Value thing_state = Value::Dict();
  thing_state.Set("a", Value::Int(2));
  bundle.Set("opaque", Value::Opaque("mypkg.Thing", Value::Tuple({Value::Int(1)}), thing_state));

  const std::string path = TmpPath("bundle.pt");
  ASSERT_OK_AND_ASSIGN(TorchWriteReport report, WriteTorchFile(path, bundle));
  ASSERT_EQ(report.warnings.size(), 1u);
  EXPECT_THAT(report.warnings[0], ::testing::HasSubstr("mypkg.Thing"));
  EXPECT_EQ(RunPython("bundle " + path), "OK\n");
}

TEST(TorchWriterTest, RecordsAreAlignedAndZip64ReadsInPythonAndTorch) {
  StateDict state;
  ASSERT_OK(state.Insert("a", at::randn({7})));
  ASSERT_OK(state.Insert("b", at::randn({3, 3}).to(at::kDouble)));
  const std::string plain = TmpPath("aligned.pt");
  ASSERT_OK(WriteTorchFile(plain, StateDictToValue(state)).status());
  EXPECT_EQ(RunPython("zip " + plain), "OK\n");

  TorchWriteOptions options;
  options.zip.force_zip64 = true;
  const std::string zip64 = TmpPath("zip64.pt");
  ASSERT_OK(WriteTorchFile(zip64, StateDictToValue(state), options).status());
  EXPECT_EQ(RunPython("zip " + zip64), "OK\n");
  std::set<std::string> expected = {"TYPE OrderedDict"};
  for (const StateDict::Entry& entry : state) expected.insert(Describe(entry.key, entry.tensor));
  EXPECT_EQ(Lines(RunPython("describe " + zip64)), expected);
}

std::string ReadAll(const std::string& path) {
  std::FILE* file = std::fopen(path.c_str(), "rb");
  std::string bytes;
  if (file == nullptr) return bytes;
  char buffer[1 << 16];
  for (size_t n; (n = std::fread(buffer, 1, sizeof(buffer), file)) > 0;) bytes.append(buffer, n);
  std::fclose(file);
  return bytes;
}

TEST(TorchWriterTest, DeferredTensorsStreamOneAtATimeIntoTheSameBytes) {
  StateDict state;
  ASSERT_OK(state.Insert("embed.weight", at::randn({5, 3})));
  ASSERT_OK(state.Insert("bn.num_batches_tracked", at::scalar_tensor(42, at::kLong)));
  ASSERT_OK(state.Insert("bf16", at::randn({2, 2}).to(at::kBFloat16)));
  ASSERT_OK(state.Insert("empty", at::zeros({0, 4})));
  ASSERT_OK(state.Insert("d4", at::arange(16, at::kInt).reshape({1, 2, 2, 4})));
  const std::string in_memory = TmpPath("in_memory.pt");
  ASSERT_OK(WriteTorchFile(in_memory, StateDictToValue(state)).status());

  // The same state dict as placeholders; each fetch hands out a fresh copy and checks that the
  // writer has released the one it fetched before.
  DeferredTensors deferred;
  StateDict placeholders;
  c10::weak_intrusive_ptr<c10::TensorImpl> previous(c10::intrusive_ptr<c10::TensorImpl>{});
  std::vector<std::string> fetched;
  for (const StateDict::Entry& entry : state) {
    ASSERT_OK_AND_ASSIGN(DType dtype, FromScalarType(entry.tensor.scalar_type()));
    ASSERT_OK_AND_ASSIGN(
        at::Tensor placeholder,
        deferred.Add(dtype, entry.tensor.sizes().vec(), [&, key = entry.key, t = entry.tensor] {
          EXPECT_TRUE(previous.expired()) << "still held when " << key << " was fetched";
          fetched.push_back(key);
          at::Tensor copy = t.clone();
          previous = c10::weak_intrusive_ptr<c10::TensorImpl>(copy.getIntrusivePtr());
          return absl::StatusOr<at::Tensor>(copy);
        }));
    EXPECT_TRUE(placeholder.is_meta());
    ASSERT_OK(placeholders.Insert(entry.key, placeholder));
  }
  ASSERT_OK_AND_ASSIGN(TorchFileWriter writer,
                       TorchFileWriter::Plan(StateDictToValue(placeholders), &deferred));
  EXPECT_TRUE(fetched.empty());  // Planning reads no tensor.
  const uint64_t planned = writer.file_bytes();
  std::vector<uint64_t> progress;
  const std::string streamed = TmpPath("streamed.pt");
  ASSERT_OK_AND_ASSIGN(TorchWriteReport report,
                       writer.WriteFile(streamed, [&](uint64_t done, uint64_t total) {
                         EXPECT_EQ(total, planned);
                         progress.push_back(done);
                       }));
  EXPECT_EQ(fetched, state.keys());
  EXPECT_TRUE(previous.expired());
  EXPECT_EQ(report.file_bytes, planned);
  EXPECT_EQ(report.storages, static_cast<int64_t>(state.size()));
  ASSERT_FALSE(progress.empty());
  EXPECT_LT(progress.back(), planned);  // The directory follows the last record.
  EXPECT_EQ(ReadAll(streamed), ReadAll(in_memory));

  std::set<std::string> expected = {"TYPE OrderedDict"};
  for (const StateDict::Entry& entry : state) expected.insert(Describe(entry.key, entry.tensor));
  EXPECT_EQ(Lines(RunPython("describe " + streamed)), expected);
  EXPECT_EQ(RunPython("zip " + streamed), "OK\n");
}

TEST(TorchWriterTest, ViewsOfAPlaceholderShareItsRecord) {
  const at::Tensor base = at::arange(24, at::kFloat).reshape({4, 6});
  DeferredTensors deferred;
  int fetches = 0;
  ASSERT_OK_AND_ASSIGN(at::Tensor placeholder, deferred.Add(DType::kFloat32, {4, 6}, [&] {
    ++fetches;
    return absl::StatusOr<at::Tensor>(base);
  }));
  StateDict views;
  ASSERT_OK(views.Insert("t.offset_slice", placeholder.index({at::indexing::Slice(1, 3), 2})));
  ASSERT_OK(views.Insert("whole", placeholder));
  ASSERT_OK(views.Insert("t.transposed", placeholder.t()));
  ASSERT_OK_AND_ASSIGN(TorchFileWriter writer,
                       TorchFileWriter::Plan(StateDictToValue(views), &deferred));
  const std::string path = TmpPath("views.pt");
  ASSERT_OK_AND_ASSIGN(TorchWriteReport report, writer.WriteFile(path));
  EXPECT_EQ(fetches, 1);
  EXPECT_EQ(report.storages, 1);
  EXPECT_EQ(
      Lines(RunPython("describe " + path)),
      (std::set<std::string>{"TYPE OrderedDict",
                             Describe("t.offset_slice", base.index({at::indexing::Slice(1, 3), 2})),
                             Describe("whole", base), Describe("t.transposed", base.t()),
                             "SHARED t.offset_slice whole", "SHARED t.offset_slice t.transposed"}));
}

TEST(TorchWriterTest, DeferredTensorsThatDoNotFitFailAndLeaveNoFile) {
  // A meta tensor nothing supplies.
  EXPECT_THAT(WriteTorchFile(TmpPath("meta.pt"), Value::Tensor(at::empty({2}, at::kMeta))),
              StatusIs(absl::StatusCode::kInvalidArgument, "meta device"));

  DeferredTensors deferred;
  ASSERT_OK_AND_ASSIGN(at::Tensor wrong_shape, deferred.Add(DType::kFloat32, {2, 3}, [] {
    return absl::StatusOr<at::Tensor>(at::zeros({3, 2}));
  }));
  ASSERT_OK_AND_ASSIGN(at::Tensor failing, deferred.Add(DType::kFloat32, {2}, [] {
    return absl::StatusOr<at::Tensor>(absl::DataLossError("chunk 7 is bad"));
  }));
  const std::string path = TmpPath("unfit.pt");
  ASSERT_OK_AND_ASSIGN(TorchFileWriter shape_writer,
                       TorchFileWriter::Plan(Value::Tensor(wrong_shape), &deferred));
  EXPECT_THAT(
      shape_writer.WriteFile(path),
      StatusIs(absl::StatusCode::kInternal, "planned as Float [2, 3] but fetched as Float [3, 2]"));
  ASSERT_OK_AND_ASSIGN(TorchFileWriter failing_writer,
                       TorchFileWriter::Plan(Value::Tensor(failing), &deferred));
  EXPECT_THAT(failing_writer.WriteFile(path),
              StatusIs(absl::StatusCode::kDataLoss, "chunk 7 is bad"));
  EXPECT_EQ(std::fopen(path.c_str(), "rb"), nullptr);
  EXPECT_THAT(deferred.Add(DType::kFloat32, {-1}, nullptr).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, "negative"));
}

// Quantized tensors as torch.save writes them (_rebuild_qtensor): per tensor and per channel,
// each integer dtype, a view at an offset; torch reads back the same integers, scheme and
// quantizer parameters.
TEST(TorchWriterTest, PythonLoadsQuantizedTensorsWithTheirSchemeAndParameters) {
  const at::Tensor values = at::linspace(-3, 3, 24).reshape({4, 6});
  StateDict state;
  ASSERT_OK(state.Insert("per_tensor", at::quantize_per_tensor(values, 0.05, 7, at::kQInt8)));
  ASSERT_OK(state.Insert("unsigned", at::quantize_per_tensor(values, 0.1, 128, at::kQUInt8)));
  ASSERT_OK(state.Insert("wide", at::quantize_per_tensor(values, 0.001, -5, at::kQInt32)));
  ASSERT_OK(state.Insert(
      "per_channel",
      at::quantize_per_channel(values, at::tensor(std::vector<double>{0.1, 0.2, 0.3, 0.4}),
                               at::tensor(std::vector<int64_t>{0, 1, -1, 2}), 0, at::kQInt8)));
  ASSERT_OK(state.Insert(
      "float_qparams",
      at::quantize_per_channel(values, at::tensor(std::vector<float>{0.1, 0.2, 0.3, 0.4, 0.5, 0.6}),
                               at::tensor(std::vector<float>{0.5, 0, 1, 0, 0, 2}), 1, at::kQUInt8)));
  const std::string path = TmpPath("quantized.pt");
  ASSERT_OK(WriteTorchFile(path, StateDictToValue(state)).status());

  const auto hex = [](const at::Tensor& tensor) {
    const at::Tensor bytes = tensor.contiguous();
    return absl::BytesToHexString(
        absl::string_view(static_cast<const char*>(bytes.data_ptr()), bytes.nbytes()));
  };
  std::set<std::string> expected;
  for (const StateDict::Entry& entry : state) {
    const at::Tensor& q = entry.tensor;
    std::string params;
    if (q.qscheme() == at::kPerTensorAffine) {
      const double scale = q.q_scale();
      const int64_t zero_point = q.q_zero_point();
      params = absl::StrCat(
          absl::BytesToHexString(absl::string_view(reinterpret_cast<const char*>(&scale), 8)),
          absl::BytesToHexString(absl::string_view(reinterpret_cast<const char*>(&zero_point), 8)));
    } else {
      params = absl::StrCat(hex(q.q_per_channel_scales()), ",",
                            hex(q.q_per_channel_zero_points()), ",", q.q_per_channel_axis());
    }
    expected.insert(absl::StrCat(entry.key, "|torch.", DTypeName(FromScalarType(q.scalar_type()).value()),
                                 "|", absl::StrJoin(q.sizes(), ","), "|", c10::toString(q.qscheme()),
                                 "|", params, "|", hex(q.int_repr())));
  }
  EXPECT_EQ(Lines(RunPython("quantized " + path)), expected);
}

// Objects that are data, not code (a complex, a torch.device, a dtype), as the reader keeps
// them: written back as the objects they were, not as descriptions.
TEST(TorchWriterTest, WritesComplexDevicesAndDtypesBackAsThemselves) {
  Value root = Value::Dict();
  root.Set("c", Value::Opaque("builtins.complex", Value::Tuple({Value::Float(1.5), Value::Int(-2)}),
                              Value::None()));
  root.Set("dev", Value::Opaque("torch.device",
                                Value::Tuple({Value::String("cuda"), Value::Int(1)}), Value::None()));
  root.Set("cpu", Value::Opaque("torch.device", Value::Tuple({Value::String("cpu")}), Value::None()));
  root.Set("dt", Value::Opaque("torch.float16", Value::None(), Value::None()));
  const std::string path = TmpPath("plain.pt");
  ASSERT_OK_AND_ASSIGN(TorchWriteReport report, WriteTorchFile(path, root));
  EXPECT_TRUE(report.warnings.empty());
  EXPECT_EQ(Lines(RunPython("plain " + path)),
            (std::set<std::string>{"c|complex|(1.5-2j)", "dev|device|device(type='cuda', index=1)",
                                   "cpu|device|device(type='cpu')", "dt|dtype|torch.float16"}));
}

TEST(TorchWriterTest, RejectsWhatTheFormatCannotHold) {
  Value bad_key = Value::Dict();
  bad_key.Set(std::string("\xff\xfe", 2), Value::Int(1));
  EXPECT_THAT(WriteTorchFile(TmpPath("bad.pt"), bad_key),
              StatusIs(absl::StatusCode::kInvalidArgument, "not valid UTF-8"));

  const at::Tensor floats = at::zeros({4});
  Value mixed = Value::List({Value::Tensor(floats), Value::Tensor(floats.view(at::kInt))});
  EXPECT_THAT(WriteTorchFile(TmpPath("mixed.pt"), mixed),
              StatusIs(absl::StatusCode::kInvalidArgument, "view one storage as"));

  const at::Tensor packed = at::quantize_per_channel(
      at::ones({2, 4}), at::ones({2}), at::zeros({2}), 0, at::kQUInt4x2);
  EXPECT_THAT(WriteTorchFile(TmpPath("q.pt"), Value::Tensor(packed)),
              StatusIs(absl::StatusCode::kInvalidArgument, "quint4x2 tensor (sub-byte"));
  EXPECT_THAT(WriteTorchFile(TmpPath("no/such/dir/x.pt"), Value::Int(1)),
              StatusIs(absl::StatusCode::kNotFound));
}

}  // namespace
}  // namespace ckpt

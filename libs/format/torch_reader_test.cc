#include "libs/format/torch_reader.h"

#include <cstdlib>
#include <cstring>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "ATen/core/Tensor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "libs/format/testing/torch_fixtures.h"
#include "libs/format/testing/zip_builder.h"
#include "libs/status/status_matchers.h"

namespace ckpt {
namespace {

using ::ckpt::testing::ExpectedTensor;
using ::ckpt::testing::FindValueAtPath;
using ::ckpt::testing::GenerateTorchFixtures;
using ::ckpt::testing::SharingMatches;
using ::ckpt::testing::StatusIs;
using ::ckpt::testing::TensorMatches;
using ::ckpt::testing::TorchFixtures;
using ::ckpt::testing::ZipBuilder;
using ::testing::HasSubstr;

const TorchFixtures& Fixtures() { return GenerateTorchFixtures({"basic"}); }

std::string ReadFileBytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream buffer;
  buffer << in.rdbuf();
  return buffer.str();
}

// Every tensor Python saw in `file` is in `root` with the same dtype, shape, strides, offset,
// requires_grad, device and bytes, and storages are shared exactly where Python shared them.
void ExpectMatchesPython(const std::string& file, const Value& root) {
  const std::vector<ExpectedTensor> expected = Fixtures().TensorsOf(file);
  ASSERT_FALSE(expected.empty()) << file;
  std::vector<at::Tensor> ours;
  std::vector<ExpectedTensor> compared;
  for (const ExpectedTensor& e : expected) {
    std::string path = e.path;
    const size_t hash = path.find('#');  // Quantization parameters of a quantized tensor.
    const std::string suffix = hash == std::string::npos ? "" : path.substr(hash + 1);
    if (hash != std::string::npos) path.resize(hash);
    const Value* value = FindValueAtPath(root, path);
    ASSERT_NE(value, nullptr) << file << ": no value at '" << e.path << "' in "
                              << root.DebugString();
    ASSERT_TRUE(value->is_tensor()) << file << " '" << e.path << "': " << value->DebugString();
    at::Tensor tensor = value->tensor();
    if (suffix == "scales") tensor = tensor.q_per_channel_scales();
    if (suffix == "zero_points") tensor = tensor.q_per_channel_zero_points();
    EXPECT_TRUE(TensorMatches(tensor, value->tensor_original_device(), e));
    if (suffix.empty()) {
      ours.push_back(tensor);
      compared.push_back(e);
    }
  }
  EXPECT_TRUE(SharingMatches(compared, ours)) << file;
  EXPECT_EQ(root.TensorCount(), static_cast<int64_t>(compared.size())) << file;
}

std::vector<std::string> DictKeys(const Value& value) {
  std::vector<std::string> keys;
  for (const auto& [key, child] : value.entries()) keys.push_back(key.DebugString());
  return keys;
}

TEST(ReadTorchFileTest, ReadsAPlainStateDictExactly) {
  ASSERT_OK_AND_ASSIGN(TorchFile file, ReadTorchFile(Fixtures().Path("plain.pt")));
  EXPECT_EQ(file.format, "torch_zip");
  EXPECT_THAT(file.warnings, ::testing::IsEmpty());
  EXPECT_THAT(DictKeys(file.root),
              ::testing::ElementsAre("'0.weight'", "'0.bias'", "'2.weight'", "'2.bias'"));
  ExpectMatchesPython("plain.pt", file.root);
}

TEST(ReadTorchFileTest, ReadsADataParallelStateDict) {
  ASSERT_OK_AND_ASSIGN(TorchFile file, ReadTorchFile(Fixtures().Path("dataparallel.pt")));
  EXPECT_THAT(DictKeys(file.root), ::testing::Contains("'module.0.weight'"));
  ExpectMatchesPython("dataparallel.pt", file.root);
}

TEST(ReadTorchFileTest, ReadsTensorsSavedOnAnotherDeviceOntoTheCpu) {
  // PyTorch itself cannot load this file here without map_location.
  EXPECT_THAT(Fixtures().python_load.at("cuda1.pt"), HasSubstr("CUDA"));
  ASSERT_OK_AND_ASSIGN(TorchFile file, ReadTorchFile(Fixtures().Path("cuda1.pt")));
  for (const auto& [key, value] : file.root.entries()) {
    EXPECT_EQ(value.tensor_original_device(), "cuda:1") << key.DebugString();
    EXPECT_TRUE(value.tensor().device().is_cpu());
  }
  ExpectMatchesPython("cuda1.pt", file.root);
}

TEST(ReadTorchFileTest, KeepsViewsOfSharedStorages) {
  ASSERT_OK_AND_ASSIGN(TorchFile file, ReadTorchFile(Fixtures().Path("views.pt")));
  ExpectMatchesPython("views.pt", file.root);
  const at::Tensor& base = file.root.Find("base")->tensor();
  const at::Tensor& transposed = file.root.Find("transposed")->tensor();
  EXPECT_EQ(base.storage().data(), transposed.storage().data());
  EXPECT_FALSE(transposed.is_contiguous());
}

TEST(ReadTorchFileTest, ReadsATensorAtTheRoot) {
  ASSERT_OK_AND_ASSIGN(TorchFile file, ReadTorchFile(Fixtures().Path("root_tensor.pt")));
  ASSERT_TRUE(file.root.is_tensor());
  ExpectMatchesPython("root_tensor.pt", file.root);
}

TEST(ReadTorchFileTest, ReadsEveryDtype) {
  for (const std::string name : {"dtypes.pt", "dtypes_p4.pt"}) {
    ASSERT_OK_AND_ASSIGN(TorchFile file, ReadTorchFile(Fixtures().Path(name)));
    ExpectMatchesPython(name, file.root);
  }
}

TEST(ReadTorchFileTest, ReadsTheLegacyFormat) {
  ASSERT_OK_AND_ASSIGN(TorchFile file, ReadTorchFile(Fixtures().Path("legacy.pt")));
  EXPECT_EQ(file.format, "torch_legacy");
  ExpectMatchesPython("legacy.pt", file.root);
}

// A legacy file from a big-endian host: sys_info says so, the data is little-endian all the
// same (as the legacy writer writes it), and is read as torch reads it, unswapped.
TEST(ReadTorchFileTest, ReadsLegacyFilesFromBigEndianHostsAsTorchDoes) {
  ASSERT_OK_AND_ASSIGN(TorchFile file, ReadTorchFile(Fixtures().Path("legacy_bigendian.pt")));
  ExpectMatchesPython("legacy_bigendian.pt", file.root);
}

// Tensors pickled the pre-1.0 way (torch.Tensor() and a __setstate__ tuple), as the legacy
// files of PyTorch's own backwards-compatibility tests hold them.
TEST(ReadTorchFileTest, ReadsPreOneZeroTensorSetState) {
  ASSERT_OK_AND_ASSIGN(TorchFile file, ReadTorchFile(Fixtures().Path("legacy_setstate.pt")));
  ExpectMatchesPython("legacy_setstate.pt", file.root);
  ASSERT_TRUE(file.root.Find("row")->is_tensor());
  // The view shares the tensor's storage, as torch.load's does.
  EXPECT_EQ(file.root.Find("row")->tensor().storage().data(),
            file.root.Find("w")->tensor().storage().data());
}

TEST(ReadTorchFileTest, ReadsQuantizedTensors) {
  ASSERT_OK_AND_ASSIGN(TorchFile file, ReadTorchFile(Fixtures().Path("quantized.pt")));
  ExpectMatchesPython("quantized.pt", file.root);
  const at::Tensor& per_tensor = file.root.Find("per_tensor")->tensor();
  const auto& q = Fixtures().qparams.at({"quantized.pt", "per_tensor"});
  EXPECT_DOUBLE_EQ(per_tensor.q_scale(), q.scale);
  EXPECT_EQ(per_tensor.q_zero_point(), q.zero_point);
  const at::Tensor& per_channel = file.root.Find("per_channel")->tensor();
  EXPECT_EQ(per_channel.q_per_channel_axis(),
            Fixtures().qparams.at({"quantized.pt", "per_channel"}).axis);
}

TEST(ReadTorchFileTest, KeepsRequiresGradOfParameters) {
  ASSERT_OK_AND_ASSIGN(TorchFile file, ReadTorchFile(Fixtures().Path("parameters.pt")));
  EXPECT_TRUE(file.root.Find("weight")->tensor().requires_grad());
  EXPECT_FALSE(file.root.Find("frozen")->tensor().requires_grad());
  ExpectMatchesPython("parameters.pt", file.root);
}

TEST(ReadTorchFileTest, UnderstandsTorchAndNumpyValues) {
  ASSERT_OK_AND_ASSIGN(TorchFile file, ReadTorchFile(Fixtures().Path("misc.pt")));
  const Value& root = file.root;
  EXPECT_EQ(*root.Find("device"),
            Value::Opaque("torch.device", Value::Tuple({Value::String("cuda"), Value::Int(1)}),
                          Value::None()));
  EXPECT_EQ(*root.Find("dtype"), Value::Opaque("torch.bfloat16", Value::None(), Value::None()));
  EXPECT_EQ(*root.Find("size"), Value::Tuple({Value::Int(2), Value::Int(3)}));
  EXPECT_EQ(*root.Find("np_f32"), Value::Float(1.5));
  EXPECT_EQ(*root.Find("np_f16"), Value::Float(-2.5));
  EXPECT_EQ(*root.Find("np_u8"), Value::Int(200));
  EXPECT_EQ(*root.Find("np_bool"), Value::Bool(true));
  EXPECT_EQ(
      *root.Find("slice"),
      Value::Opaque("builtins.slice", Value::Tuple({Value::Int(1), Value::Int(5), Value::Int(2)}),
                    Value::None()));
  EXPECT_EQ(*root.Find("set"), Value::List({Value::Int(1)}));
  EXPECT_EQ(*root.Find("bytes"), Value::Bytes(std::string("\x00\xff", 2)));
  // A numpy array is data we keep but do not interpret.
  ASSERT_TRUE(root.Find("np_array")->is_opaque());
  EXPECT_EQ(root.Find("np_array")->opaque_class_name(), "numpy.core.multiarray._reconstruct");
  // A tensor subclass reads as a plain tensor, with a warning. (PyTorch 1.13 pickles no
  // attributes of an nn.Parameter, so the tagged one is a plain parameter.)
  ExpectMatchesPython("misc.pt", root);
  EXPECT_THAT(file.warnings,
              ::testing::IsSupersetOf(
                  {HasSubstr("'numpy.core.multiarray._reconstruct' as opaque data"),
                   HasSubstr("tensor subclass __main__.FixtureTensor read as a plain tensor")}));
}

TEST(ReadTorchFileTest, ByteswapsBigEndianFiles) {
  ASSERT_OK_AND_ASSIGN(TorchFile file, ReadTorchFile(Fixtures().Path("bigendian.pt")));
  ExpectMatchesPython("bigendian.pt", file.root);
}

TEST(ReadTorchFileTest, ReadsFromMemoryToo) {
  const std::string bytes = ReadFileBytes(Fixtures().Path("views.pt"));
  ASSERT_OK_AND_ASSIGN(TorchFile file, ReadTorchBytes(bytes, "views.pt"));
  ExpectMatchesPython("views.pt", file.root);
}

// A TorchScript archive reads as its module's state_dict(): every tensor torch.jit.load's
// state_dict() has, in its order, none of its code run.
TEST(ReadTorchFileTest, ReadsATorchScriptArchiveAsItsStateDict) {
  for (const std::string name : {"torchscript.pt", "torchscript_nokeys.pt", "torchscript_traced.pt",
                                 "torchscript_keys.pt"}) {
    absl::StatusOr<TorchFile> read = ReadTorchFile(Fixtures().Path(name));
    ASSERT_TRUE(read.ok()) << read.status();
    const TorchFile& file = *read;
    EXPECT_EQ(file.format, "torchscript");
    ExpectMatchesPython(name, file.root);
    std::vector<std::string> expected_keys;
    for (const ExpectedTensor& tensor : Fixtures().TensorsOf(name)) {
      expected_keys.push_back(absl::StrCat("'", tensor.path, "'"));
    }
    EXPECT_EQ(DictKeys(file.root), expected_keys) << name;
    // One line, saying what was read; the module's classes are not each reported as opaque.
    ASSERT_EQ(file.warnings.size(), 1u) << name << ": " << absl::StrJoin(file.warnings, "; ");
    EXPECT_THAT(file.warnings.back(), HasSubstr("without running its code")) << name;
  }
  // Without state_dict_keys.txt the non-persistent buffer is there, as in torch.jit.load's
  // state_dict(); the plain tensor attribute never is.
  ASSERT_OK_AND_ASSIGN(TorchFile nokeys, ReadTorchFile(Fixtures().Path("torchscript_nokeys.pt")));
  EXPECT_NE(nokeys.root.Find("mask"), nullptr);
  EXPECT_EQ(nokeys.root.Find("plain"), nullptr);
  ASSERT_OK_AND_ASSIGN(TorchFile keys, ReadTorchFile(Fixtures().Path("torchscript_keys.pt")));
  EXPECT_EQ(keys.root.Find("mask"), nullptr);
}

TEST(ReadTorchFileTest, RefusesTarFormatFiles) {
  EXPECT_THAT(ReadTorchFile(Fixtures().Path("old_tar.pt")),
              StatusIs(absl::StatusCode::kUnimplemented, "is a tar archive"));
}

TEST(ReadTorchFileTest, RefusesFilesThatAreNotTorchSaveFiles) {
  EXPECT_THAT(ReadTorchFile(Fixtures().Path("plain_pickle.pkl")),
              StatusIs(absl::StatusCode::kInvalidArgument, "not torch.save's magic number"));
  EXPECT_THAT(ReadTorchBytes("hello world, not a checkpoint", "notes.txt"),
              StatusIs(absl::StatusCode::kInvalidArgument, "notes.txt is not a torch.save file"));
  EXPECT_THAT(ReadTorchBytes("", "empty.pt"),
              StatusIs(absl::StatusCode::kInvalidArgument, "the file is empty"));
  std::string safetensors("\x10\x00\x00\x00\x00\x00\x00\x00{\"a\":1}", 16);
  EXPECT_THAT(ReadTorchBytes(safetensors, "model.safetensors"),
              StatusIs(absl::StatusCode::kInvalidArgument, "looks like a safetensors file"));
  EXPECT_THAT(ReadTorchFile(Fixtures().Path("missing.pt")),
              StatusIs(absl::StatusCode::kNotFound, "missing.pt"));
  ZipBuilder zip;
  zip.Add("stuff/readme.txt", "hi");
  EXPECT_THAT(ReadTorchBytes(zip.Finish(), "other.zip"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "zip archive without <name>/data.pkl, so not a torch.save file (entries: "
                       "stuff/readme.txt)"));
}

TEST(ReadTorchFileTest, DetectsCorruptTensorBytes) {
  std::string bytes = ReadFileBytes(Fixtures().Path("plain.pt"));
  // The first storage record's data starts at the first 64-byte boundary after its header.
  const size_t record = bytes.find("plain/data/0");
  ASSERT_NE(record, std::string::npos);
  bytes[(record / 64 + 1) * 64 + 3] ^= 0x40;
  EXPECT_THAT(ReadTorchBytes(bytes, "plain.pt"),
              StatusIs(absl::StatusCode::kDataLoss, "zip entry 'plain/data/0': CRC-32 mismatch"));
}

TEST(ReadTorchFileTest, TruncatedFilesAreDataLoss) {
  const std::string zip = ReadFileBytes(Fixtures().Path("plain.pt"));
  EXPECT_THAT(ReadTorchBytes(zip.substr(0, zip.size() / 2), "plain.pt"),
              StatusIs(absl::StatusCode::kDataLoss, "plain.pt: starts like a zip archive"));
  const std::string legacy = ReadFileBytes(Fixtures().Path("legacy.pt"));
  EXPECT_THAT(ReadTorchBytes(legacy.substr(0, legacy.size() - 10), "legacy.pt"),
              StatusIs(absl::StatusCode::kDataLoss, "legacy.pt: needs bytes"));
}

TEST(ReadTorchFileTest, EveryTruncationIsAnErrorNotACrash) {
  // Every prefix of a zip file; every third of a legacy one (each parses several pickles).
  for (const std::string name : {"plain.pt", "legacy.pt"}) {
    const std::string bytes = ReadFileBytes(Fixtures().Path(name));
    const size_t step = name == "legacy.pt" ? 3 : 1;
    for (size_t size = 0; size < bytes.size(); size += step) {
      absl::StatusOr<TorchFile> file = ReadTorchBytes(bytes.substr(0, size), name);
      EXPECT_FALSE(file.ok()) << name << " cut to " << size << " bytes";
    }
  }
}

TEST(ReadTorchFileTest, RandomCorruptionNeverCrashes) {
  std::mt19937 random(7);
  for (const std::string name : {"plain.pt", "legacy.pt", "views.pt"}) {
    const std::string bytes = ReadFileBytes(Fixtures().Path(name));
    for (int round = 0; round < 300; ++round) {
      std::string mutated = bytes;
      for (int i = 0; i < 1 + static_cast<int>(random() % 3); ++i) {
        mutated[random() % mutated.size()] = static_cast<char>(random() % 256);
      }
      (void)ReadTorchBytes(mutated, name);  // Any status; no crash, hang or huge allocation.
    }
  }
}

// --- Hand-made archives for specific malformations ---------------------------------------------

std::string PickleInt(int64_t v) {
  std::string out = "\x8a\x08";
  for (int i = 0; i < 8; ++i)
    out.push_back(static_cast<char>((static_cast<uint64_t>(v) >> (8 * i)) & 0xFF));
  return out;
}

std::string PickleStr(const std::string& s) {
  std::string out = "X";
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>((s.size() >> (8 * i)) & 0xFF));
  return out + s;
}

std::string PickleInts(const std::vector<int64_t>& values) {
  std::string out = "(";
  for (int64_t v : values) out += PickleInt(v);
  return out + "t";
}

// {'w': _rebuild_tensor_v2(storage('0', float32, numel), offset, size, stride, False, {})}
std::string TensorDictPickle(int64_t numel, int64_t offset, const std::vector<int64_t>& size,
                             const std::vector<int64_t>& stride) {
  return "\x80\x02}(" + PickleStr("w") + "ctorch._utils\n_rebuild_tensor_v2\n((" +
         PickleStr("storage") + "ctorch\nFloatStorage\n" + PickleStr("0") + PickleStr("cpu") +
         PickleInt(numel) + "tQ" + PickleInt(offset) + PickleInts(size) + PickleInts(stride) +
         "\x89}tRu.";
}

std::string Floats(int count) {
  std::string out;
  for (int i = 0; i < count; ++i) {
    const float f = static_cast<float>(i);
    out.append(reinterpret_cast<const char*>(&f), sizeof(f));
  }
  return out;
}

std::string TorchZip(const std::string& pickle, const std::string& record) {
  ZipBuilder zip;
  zip.Add("archive/data.pkl", pickle);
  zip.Add("archive/data/0", record);
  zip.Add("archive/version", "3\n");
  return zip.Finish();
}

TEST(ReadTorchBytesTest, HandMadeArchiveReads) {
  ASSERT_OK_AND_ASSIGN(TorchFile file,
                       ReadTorchBytes(TorchZip(TensorDictPickle(6, 1, {2, 2}, {1, 2}), Floats(6))));
  const at::Tensor& w = file.root.Find("w")->tensor();
  EXPECT_EQ(w.sizes().vec(), (std::vector<int64_t>{2, 2}));
  EXPECT_EQ(w.storage_offset(), 1);
  // Elements at storage offsets 1 + i + 2j.
  EXPECT_EQ(w[0][0].item<float>(), 1.0f);
  EXPECT_EQ(w[1][0].item<float>(), 2.0f);
  EXPECT_EQ(w[0][1].item<float>(), 3.0f);
  EXPECT_EQ(w[1][1].item<float>(), 4.0f);
}

TEST(ReadTorchBytesTest, StorageTooSmallForSizeStrideOrOffsetIsRejected) {
  EXPECT_THAT(ReadTorchBytes(TorchZip(TensorDictPickle(4, 0, {10}, {1}), Floats(4)), "m.pt"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "m.pt: archive/data.pkl offset 140: torch._utils._rebuild_tensor_v2: a "
                       "tensor of size [10], stride [1] and storage offset 0 needs 10 elements of "
                       "float32 but its storage holds 4"));
  EXPECT_THAT(ReadTorchBytes(TorchZip(TensorDictPickle(4, 0, {2, 2}, {3, 1}), Floats(4))),
              StatusIs(absl::StatusCode::kInvalidArgument, "needs 5 elements"));
  EXPECT_THAT(ReadTorchBytes(TorchZip(TensorDictPickle(4, 3, {2}, {1}), Floats(4))),
              StatusIs(absl::StatusCode::kInvalidArgument, "storage offset 3 needs 5 elements"));
  EXPECT_THAT(
      ReadTorchBytes(TorchZip(TensorDictPickle(4, 0, {4, 2}, {INT64_MAX / 2, 1}), Floats(4))),
      StatusIs(absl::StatusCode::kInvalidArgument, "needs more than 2^63 elements"));
  EXPECT_THAT(ReadTorchBytes(TorchZip(TensorDictPickle(4, -1, {1}, {1}), Floats(4))),
              StatusIs(absl::StatusCode::kInvalidArgument, "negative storage offset"));
  EXPECT_THAT(ReadTorchBytes(TorchZip(TensorDictPickle(4, 0, {2}, {-1}), Floats(4))),
              StatusIs(absl::StatusCode::kInvalidArgument, "negative stride"));
  EXPECT_THAT(ReadTorchBytes(TorchZip(TensorDictPickle(4, 0, {2, 2}, {1}), Floats(4))),
              StatusIs(absl::StatusCode::kInvalidArgument, "differ in length"));
  EXPECT_THAT(ReadTorchBytes(TorchZip(TensorDictPickle(4, 0, {INT64_MAX, 4}, {0, 0}), Floats(4))),
              StatusIs(absl::StatusCode::kInvalidArgument, "overflows 2^62 bytes"));
}

TEST(ReadTorchBytesTest, RecordSizesMustMatchThePickle) {
  EXPECT_THAT(ReadTorchBytes(TorchZip(TensorDictPickle(1000, 0, {4}, {1}), Floats(4))),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "record 'archive/data/0' holds 16 bytes but the pickle expects 1000 x "
                       "float32 = 4000"));
  // A huge element count fails before anything is allocated.
  EXPECT_THAT(ReadTorchBytes(TorchZip(TensorDictPickle(int64_t{1} << 58, 0, {4}, {1}), Floats(4))),
              StatusIs(absl::StatusCode::kInvalidArgument, "holds 16 bytes"));
  EXPECT_THAT(ReadTorchBytes(TorchZip(TensorDictPickle(int64_t{1} << 61, 0, {4}, {1}), Floats(4))),
              StatusIs(absl::StatusCode::kInvalidArgument, "overflows 2^62 bytes"));
  ZipBuilder zip;
  zip.Add("archive/data.pkl", TensorDictPickle(4, 0, {4}, {1}));
  EXPECT_THAT(ReadTorchBytes(zip.Finish()),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "storage record 'archive/data/0' is missing from the archive"));
}

TEST(ReadTorchBytesTest, PickleErrorsNameTheRecordAndOffset) {
  EXPECT_THAT(
      ReadTorchBytes(TorchZip(std::string("\x80\x02}q\x00h\x07.", 8), ""), "m.pt"),
      StatusIs(absl::StatusCode::kInvalidArgument,
               "m.pt: archive/data.pkl offset 5: BINGET of memo index 7 that was never PUT"));
  EXPECT_THAT(ReadTorchBytes(TorchZip("\x80\x02}\xfe.", ""), "m.pt"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "m.pt: archive/data.pkl offset 3: unknown opcode 0xfe"));
  EXPECT_THAT(ReadTorchBytes(TorchZip("\x80\x02X\xf0\xff\xff\x7f", ""), "m.pt"),
              StatusIs(absl::StatusCode::kDataLoss,
                       "archive/data.pkl offset 2: BINUNICODE needs 2147483632 bytes"));
  EXPECT_THAT(ReadTorchBytes(TorchZip("\x80\x02(" + PickleStr("tensor") + "Q.", ""), "m.pt"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "offset 14: persistent id 'tensor': expected ('storage', type, key, "
                       "location, numel)"));
}

TEST(ReadTorchBytesTest, UnknownClassesStayOpaqueWithAWarning) {
  const std::string pickle = "\x80\x02}(" + PickleStr("obj") + "cmy_pkg.models\nNet\n)\x81}(" +
                             PickleStr("depth") + PickleInt(3) + "ubu.";
  ASSERT_OK_AND_ASSIGN(TorchFile file, ReadTorchBytes(TorchZip(pickle, ""), "m.pt"));
  EXPECT_EQ(*file.root.Find("obj"), Value::Opaque("my_pkg.models.Net", Value::Tuple(),
                                                  Value::Dict({{"depth", Value::Int(3)}})));
  EXPECT_THAT(file.warnings, ::testing::ElementsAre(HasSubstr("'my_pkg.models.Net'")));
}

TEST(ReadTorchBytesTest, BigEndianRecordsAreByteswapped) {
  std::string big;
  for (int i = 0; i < 4; ++i) {
    const float f = static_cast<float>(i) + 0.5f;
    char bytes[4];
    std::memcpy(bytes, &f, 4);
    big.append({bytes[3], bytes[2], bytes[1], bytes[0]});
  }
  ZipBuilder zip;
  zip.Add("archive/data.pkl", TensorDictPickle(4, 0, {4}, {1}));
  zip.Add("archive/data/0", big);
  zip.Add("archive/byteorder", "big");
  ASSERT_OK_AND_ASSIGN(TorchFile file, ReadTorchBytes(zip.Finish()));
  EXPECT_EQ(file.root.Find("w")->tensor()[3].item<float>(), 3.5f);

  ZipBuilder odd;
  odd.Add("archive/data.pkl", TensorDictPickle(4, 0, {4}, {1}));
  odd.Add("archive/byteorder", "middle");
  EXPECT_THAT(ReadTorchBytes(odd.Finish()),
              StatusIs(absl::StatusCode::kInvalidArgument, "expected 'little' or 'big'"));
}

TEST(ReadTorchBytesTest, SharedStorageKeysGiveOneBuffer) {
  // Two tensors over storage '0': the second persistent id comes from the memo.
  const std::string pickle = "\x80\x02}(" + PickleStr("a") +
                             "ctorch._utils\n_rebuild_tensor_v2\nq\x01((" + PickleStr("storage") +
                             "ctorch\nFloatStorage\n" + PickleStr("0") + PickleStr("cpu") +
                             PickleInt(4) + "tq\x02Q" + PickleInt(0) + PickleInts({4}) +
                             PickleInts({1}) + "\x89}tR" + PickleStr("b") + "h\x01(h\x02Q" +
                             PickleInt(2) + PickleInts({2}) + PickleInts({1}) + "\x89}tRu.";
  ASSERT_OK_AND_ASSIGN(TorchFile file, ReadTorchBytes(TorchZip(pickle, Floats(4))));
  const at::Tensor& a = file.root.Find("a")->tensor();
  const at::Tensor& b = file.root.Find("b")->tensor();
  EXPECT_TRUE(a.storage().is_alias_of(b.storage()));
  EXPECT_EQ(b[0].item<float>(), 2.0f);
}

}  // namespace
}  // namespace ckpt

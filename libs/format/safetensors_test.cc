#include "libs/format/safetensors.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "ATen/TensorIndexing.h"
#include "ATen/TensorOperators.h"
#include "ATen/core/Tensor.h"
#include "ATen/ops/arange.h"
#include "ATen/ops/equal.h"
#include "ATen/ops/tensor.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "libs/status/status_matchers.h"
#include "libs/testing/python_runner.h"

namespace ckpt {
namespace {

using ::ckpt::testing::StatusIs;

std::string TmpDir() { return std::getenv("TEST_TMPDIR"); }

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream contents;
  contents << in.rdbuf();
  return contents.str();
}

// Runs the Python peer (real PyTorch) and returns its stdout; fails the test on a non-zero exit.
std::string RunPeer(const std::string& args) {
  return ::ckpt::testing::RunPythonOrAddFailure("libs/format/testdata/safetensors_fixture.py",
                                                args);
}

std::set<std::string> Lines(const std::string& text) {
  std::set<std::string> lines;
  for (absl::string_view line : absl::StrSplit(text, '\n', absl::SkipEmpty())) {
    lines.emplace(line);
  }
  return lines;
}

// The same description the peer prints: name|dtype|shape|hex of the bytes.
std::set<std::string> Describe(const SafetensorsFile& file) {
  std::set<std::string> lines;
  for (const StateDict::Entry& entry : file.tensors) {
    const at::Tensor bytes = entry.tensor.contiguous();
    DType dtype = FromScalarType(bytes.scalar_type()).value();
    lines.insert(absl::StrCat(entry.key, "|", GetDTypeInfo(dtype).safetensors_name, "|",
                              absl::StrJoin(bytes.sizes(), ","), "|",
                              absl::BytesToHexString(absl::string_view(
                                  static_cast<const char*>(bytes.data_ptr()), bytes.nbytes()))));
  }
  for (const auto& [key, value] : file.header.metadata) {
    lines.insert(absl::StrCat("META|", key, "|", value));
  }
  return lines;
}

class SafetensorsInteropTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { RunPeer("write " + TmpDir()); }
  std::string reference_path() const { return TmpDir() + "/reference.safetensors"; }
};

TEST_F(SafetensorsInteropTest, ReadsAFileWrittenByAnIndependentWriterValueByValue) {
  ASSERT_OK_AND_ASSIGN(SafetensorsFile file, ReadSafetensorsFile(reference_path()));
  EXPECT_EQ(Describe(file), Lines(ReadFile(TmpDir() + "/reference.txt")));
  EXPECT_EQ(file.tensors.size(), 12u);
  EXPECT_EQ(file.header.metadata.at("format"), "pt");
  const at::Tensor* steps = file.tensors.Find("bn.num_batches_tracked");
  ASSERT_NE(steps, nullptr);
  EXPECT_EQ(steps->dim(), 0);
  EXPECT_EQ(steps->item<int64_t>(), 17);
}

TEST_F(SafetensorsInteropTest, WritesTheReferenceLayoutByteForByte) {
  ASSERT_OK_AND_ASSIGN(SafetensorsFile file, ReadSafetensorsFile(reference_path()));
  const std::string ours = TmpDir() + "/ours.safetensors";
  ASSERT_OK(WriteSafetensorsFile(ours, file.tensors, file.header.metadata));
  EXPECT_EQ(ReadFile(ours), ReadFile(reference_path()));
  // And the independent parser accepts it and sees the same values.
  EXPECT_EQ(Lines(RunPeer("check " + ours)), Lines(ReadFile(TmpDir() + "/reference.txt")));
}

TEST_F(SafetensorsInteropTest, WritesNonContiguousTensorsAsTheirValues) {
  StateDict tensors;
  const at::Tensor base = at::arange(12, at::kFloat).reshape({3, 4});
  ASSERT_OK(tensors.Insert("transposed", base.t()));
  ASSERT_OK(tensors.Insert("sliced", base.index({at::indexing::Slice(1, 3), 1})));
  const std::string path = TmpDir() + "/views.safetensors";
  ASSERT_OK(WriteSafetensorsFile(path, tensors, {}));
  ASSERT_OK_AND_ASSIGN(SafetensorsFile back, ReadSafetensorsFile(path));
  EXPECT_TRUE(at::equal(*back.tensors.Find("transposed"), base.t()));
  EXPECT_TRUE(at::equal(*back.tensors.Find("sliced"), at::tensor({5.0f, 9.0f})));
  RunPeer("check " + path);
}

// Builds a file from a JSON header (unpadded) and a data buffer.
std::string FileWith(const std::string& header, const std::string& data) {
  std::string bytes(8, '\0');
  const uint64_t length = header.size();
  std::memcpy(bytes.data(), &length, 8);
  return bytes + header + data;
}

absl::Status ParseBytes(const std::string& bytes) {
  return ReadSafetensors(*MemorySource(bytes, "bad.safetensors")).status();
}

TEST(SafetensorsMalformedTest, RejectsEveryBrokenRuleWithAClearError) {
  const std::string eight_bytes(8, 'x');
  struct Case {
    std::string bytes;
    std::string expected;
  };
  std::string huge_length(8, '\0');
  const uint64_t huge = kSafetensorsMaxHeaderBytes + 1;
  std::memcpy(huge_length.data(), &huge, 8);
  const std::vector<Case> cases = {
      {"abc", "8-byte header length"},
      {huge_length + "{}", "exceeds the limit"},
      {FileWith("{}", "").substr(0, 9), "runs past the end"},
      {FileWith("[]", ""), "does not start with '{'"},
      {FileWith("{\"a\":", ""), "does not parse"},
      {FileWith(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
                R"("a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})",
                eight_bytes.substr(0, 4)),
       "'a' twice"},
      {FileWith(R"({"a":{"dtype":"F33","shape":[1],"data_offsets":[0,4]}})", "xxxx"),
       "unknown safetensors dtype 'F33'"},
      {FileWith(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,4]}})", "xxxx"),
       "needs 8 bytes but data_offsets span 4"},
      {FileWith(R"({"a":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}})", "xxxx"),
       "not a non-negative integer"},
      {FileWith(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[4,0]}})", "xxxx"),
       "end before they begin"},
      {FileWith(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
                R"("b":{"dtype":"F32","shape":[1],"data_offsets":[2,6]}})",
                eight_bytes),
       "starts at data offset 2 but the previous tensor ends at 4"},
      {FileWith(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", eight_bytes),
       "starts at data offset 4 but the previous tensor ends at 0"},
      {FileWith(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", eight_bytes),
       "cover 4 data bytes but the file holds 8"},
      {FileWith(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", "xxxx"),
       "(truncated?)"},
      {FileWith(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0.5,4]}})", "xxxx"),
       "data_offsets"},
      {FileWith(R"({"a":{"shape":[1],"data_offsets":[0,4]}})", "xxxx"), "no \"dtype\""},
      {FileWith(R"({"":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", "xxxx"), "empty name"},
      {FileWith(R"({"__metadata__":{"k":1}})", ""), "is not a string"},
      {FileWith(R"({"a":{"dtype":"F32","shape":[4611686018427387904,8],"data_offsets":[0,4]}})",
                "xxxx"),
       "overflows"},
      {FileWith("{\"\xff\":1}", ""), "does not parse"},
  };
  for (const Case& c : cases) {
    EXPECT_THAT(ParseBytes(c.bytes), StatusIs(absl::StatusCode::kInvalidArgument, c.expected))
        << absl::CHexEscape(c.bytes);
  }
}

TEST(SafetensorsMalformedTest, ErrorsNameTheSource) {
  EXPECT_THAT(ParseBytes("abc"), StatusIs(absl::StatusCode::kInvalidArgument,
                                          "bad.safetensors: not a valid safetensors file"));
  EXPECT_THAT(ReadSafetensorsFile(TmpDir() + "/missing.safetensors"),
              StatusIs(absl::StatusCode::kNotFound));
}

TEST(SafetensorsTest, AcceptsAnEmptyFileAndHeaderPadding) {
  ASSERT_OK_AND_ASSIGN(SafetensorsFile empty,
                       ReadSafetensors(*MemorySource(FileWith("{}      ", ""), "empty")));
  EXPECT_TRUE(empty.tensors.empty());
}

TEST(SafetensorsTest, DTypesLibTorchLacksParseButDoNotMaterialize) {
  const std::string bytes =
      FileWith(R"({"f8":{"dtype":"F8_E4M3","shape":[4],"data_offsets":[0,4]}})", "abcd");
  ASSERT_OK_AND_ASSIGN(SafetensorsHeader header,
                       ReadSafetensorsHeader(*MemorySource(bytes, "f8.safetensors")));
  ASSERT_EQ(header.tensors.size(), 1u);
  EXPECT_EQ(header.tensors[0].dtype, DType::kFloat8E4M3Fn);
  EXPECT_THAT(ParseBytes(bytes), StatusIs(absl::StatusCode::kFailedPrecondition, "float8_e4m3fn"));
}

TEST(PlanSafetensorsTest, OrdersAlignsAndRejectsWhatTheFormatCannotHold) {
  ASSERT_OK_AND_ASSIGN(SafetensorsLayout layout, PlanSafetensors({{"b", DType::kUInt8, {3}},
                                                                  {"a", DType::kFloat32, {2}},
                                                                  {"c", DType::kInt64, {}}},
                                                                 {{"format", "pt"}}));
  ASSERT_EQ(layout.tensors.size(), 3u);
  EXPECT_EQ(layout.tensors[0].name, "c");
  EXPECT_EQ(layout.tensors[1].name, "a");
  EXPECT_EQ(layout.tensors[2].name, "b");
  EXPECT_EQ((layout.header_bytes.size() - 8) % 8, 0u);
  EXPECT_EQ(layout.total_bytes, layout.header_bytes.size() + 8 + 8 + 3);

  EXPECT_THAT(PlanSafetensors({{"z", DType::kComplex128, {1}}}, {}),
              StatusIs(absl::StatusCode::kInvalidArgument, "no dtype for tensor 'z'"));
  EXPECT_THAT(PlanSafetensors({{"a", DType::kFloat32, {1}}, {"a", DType::kFloat32, {1}}}, {}),
              StatusIs(absl::StatusCode::kInvalidArgument, "appears twice"));
  EXPECT_THAT(PlanSafetensors({{"__metadata__", DType::kFloat32, {1}}}, {}),
              StatusIs(absl::StatusCode::kInvalidArgument, "__metadata__"));
}

// ---- Hugging Face's sharded layout, against sets the Python peer writes by the spec.

std::set<std::string> DescribeTensors(const StateDict& tensors) {
  std::set<std::string> lines;
  for (const StateDict::Entry& entry : tensors) {
    const at::Tensor bytes = entry.tensor.contiguous();
    DType dtype = FromScalarType(bytes.scalar_type()).value();
    lines.insert(absl::StrCat(entry.key, "|", GetDTypeInfo(dtype).safetensors_name, "|",
                              absl::StrJoin(bytes.sizes(), ","), "|",
                              absl::BytesToHexString(absl::string_view(
                                  static_cast<const char*>(bytes.data_ptr()), bytes.nbytes()))));
  }
  return lines;
}

class ShardedSafetensorsTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    ::ckpt::testing::RunPythonOrAddFailure("libs/format/testdata/sharded_safetensors.py",
                                           "write " + Dir());
  }
  static std::string Dir() { return TmpDir() + "/sharded"; }
  static std::string Index(const std::string& set) {
    return absl::StrCat(Dir(), "/", set, "/", kSafetensorsIndexName);
  }
};

TEST_F(ShardedSafetensorsTest, ReadsEveryShardAsOneStateDict) {
  ASSERT_OK_AND_ASSIGN(HuggingFaceLayout layout, LocateHuggingFaceLayout(Dir() + "/good"));
  EXPECT_EQ(layout.index, Index("good"));
  ASSERT_OK_AND_ASSIGN(ShardedSafetensors sharded, ReadShardedSafetensors(layout.index));
  EXPECT_EQ(DescribeTensors(sharded.tensors), Lines(ReadFile(Dir() + "/good.txt")));
  EXPECT_EQ(sharded.tensors.size(), 7u);
  ASSERT_EQ(sharded.shard_paths.size(), 3u);
  EXPECT_EQ(sharded.shard_paths[0], Dir() + "/good/model-00001-of-00003.safetensors");
  EXPECT_EQ(sharded.metadata.at("format"), "pt");
  EXPECT_TRUE(sharded.warnings.empty()) << absl::StrJoin(sharded.warnings, "\n");
  // The index file itself is also a way in.
  ASSERT_OK_AND_ASSIGN(layout, LocateHuggingFaceLayout(Index("good")));
  EXPECT_EQ(layout.index, Index("good"));
}

TEST_F(ShardedSafetensorsTest, BrokenSetsFailBeforeAnyTensorIsRead) {
  EXPECT_THAT(
      ReadShardedSafetensors(Index("missing")).status(),
      StatusIs(absl::StatusCode::kNotFound, "to the shard " + Dir() +
                                                "/missing/model-00002-of-00003.safetensors, "
                                                "which is missing"));
  EXPECT_THAT(ReadShardedSafetensors(Index("twice")).status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "tensor 'layers.0.bias' is in two shards, model-00002-of-00003.safetensors "
                       "and model-00003-of-00003.safetensors"));
  EXPECT_THAT(ReadShardedSafetensors(Index("lacks")).status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "the weight_map puts tensor 'extra.weight' in "
                       "model-00001-of-00003.safetensors, which lacks it"));

  const std::string escape = TmpDir() + "/escape.index.json";
  std::ofstream(escape) << R"({"weight_map": {"w": "../model.safetensors"}})";
  EXPECT_THAT(ReadShardedSafetensors(escape).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, "not a file name beside the index"));
  const std::string no_map = TmpDir() + "/no_map.index.json";
  std::ofstream(no_map) << R"({"metadata": {}})";
  EXPECT_THAT(ReadShardedSafetensors(no_map).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, "no \"weight_map\""));
  EXPECT_THAT(LocateHuggingFaceLayout(TmpDir()).status(),
              StatusIs(absl::StatusCode::kNotFound, "holding neither"));
  ASSERT_OK_AND_ASSIGN(HuggingFaceLayout plain,
                       LocateHuggingFaceLayout(Dir() + "/good/model-00001-of-00003.safetensors"));
  EXPECT_TRUE(plain.index.empty() && plain.file.empty());
}

TEST(SafetensorsShardsTest, SplitsAsHuggingFaceHubAndNamesShardsAsTransformers) {
  using Shards = std::vector<std::vector<size_t>>;
  // 100 > 64: its own shard, ahead of the one being filled.
  EXPECT_EQ(PlanSafetensorsShards({36, 100, 6, 20, 8, 2, 48}, 64),
            (Shards{{1}, {0, 2, 3}, {4, 5, 6}}));
  EXPECT_EQ(PlanSafetensorsShards({10, 10, 10}, 20), (Shards{{0, 1}, {2}}));
  EXPECT_EQ(PlanSafetensorsShards({10, 10, 10}, 0), (Shards{{0, 1, 2}}));
  EXPECT_EQ(PlanSafetensorsShards({}, 20), (Shards{{}}));
  EXPECT_EQ(SafetensorsShardName(2, 15), "model-00002-of-00015.safetensors");
  EXPECT_EQ(SafetensorsIndexJson(12, {{"b", "model-00002-of-00002.safetensors"},
                                      {"a", "model-00001-of-00002.safetensors"}}),
            "{\n  \"metadata\": {\n    \"total_size\": 12\n  },\n  \"weight_map\": {\n    \"a\": "
            "\"model-00001-of-00002.safetensors\",\n    \"b\": "
            "\"model-00002-of-00002.safetensors\"\n  }\n}\n");
}

}  // namespace
}  // namespace ckpt

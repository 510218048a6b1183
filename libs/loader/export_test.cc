#include "libs/loader/export.h"

#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <functional>
#include <memory>
#include <set>
#include <sstream>
#include <string>
#include <utility>

#include "ATen/core/Tensor.h"
#include "ATen/ops/equal.h"
#include "ATen/ops/full.h"
#include "ATen/ops/ones.h"
#include "ATen/ops/randn.h"
#include "ATen/ops/zeros.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "libs/format/checkpoint_file.h"
#include "libs/format/safetensors.h"
#include "libs/format/torch_writer.h"
#include "libs/loader/loader.h"
#include "libs/status/status_matchers.h"
#include "libs/store/checkpoint_contents.h"
#include "libs/store/rocksdb_checkpoint_store.h"
#include "libs/tensor/device.h"
#include "libs/testing/python_runner.h"

namespace ckpt {
namespace {

using ::ckpt::testing::StatusIs;
using ::testing::ElementsAre;

std::string Dir() {
  const char* tmp = std::getenv("TEST_TMPDIR");
  return std::string(tmp != nullptr ? tmp : "/tmp");
}

std::string ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream contents;
  contents << in.rdbuf();
  return contents.str();
}

std::set<std::string> Lines(const std::string& text) {
  std::set<std::string> lines;
  for (absl::string_view line : absl::StrSplit(text, '\n', absl::SkipEmpty())) lines.emplace(line);
  return lines;
}

std::string Hex(const at::Tensor& tensor) {
  const at::Tensor bytes = tensor.contiguous();
  return absl::BytesToHexString(
      absl::string_view(static_cast<const char*>(bytes.data_ptr()), bytes.nbytes()));
}

// What libs/loader/testdata/streamed_export_check.py prints for a tensor:
// PATH|torch.DTYPE|SHAPE|HEX.
std::string TorchLine(const std::string& path, const at::Tensor& tensor) {
  return absl::StrCat(path, "|torch.", DTypeName(FromScalarType(tensor.scalar_type()).value()), "|",
                      absl::StrJoin(tensor.sizes(), ","), "|", Hex(tensor));
}

// What libs/format/testdata/sharded_safetensors.py prints: NAME|SAFETENSORS_DTYPE|SHAPE|HEX.
std::string SafetensorsLine(const std::string& name, const at::Tensor& tensor) {
  return absl::StrCat(name, "|",
                      GetDTypeInfo(FromScalarType(tensor.scalar_type()).value()).safetensors_name,
                      "|", absl::StrJoin(tensor.sizes(), ","), "|", Hex(tensor));
}

std::string Python(const std::string& script, const std::string& args) {
  return ::ckpt::testing::RunPythonOrAddFailure(script, args);
}
constexpr char kTorchCheck[] = "libs/loader/testdata/streamed_export_check.py";
constexpr char kShardCheck[] = "libs/format/testdata/sharded_safetensors.py";

// The store's reader, noting each tensor as it is read (an export copies every tensor through
// ReadTensorInto, never mapping one).
class RecordingReader : public VersionReader {
 public:
  RecordingReader(const VersionReader& inner, std::function<void(const std::string&)> on_read)
      : inner_(inner), on_read_(std::move(on_read)) {}
  const v1::Manifest& manifest() const override { return inner_.manifest(); }
  absl::Status ReadTensorChunks(const v1::TensorMeta& meta,
                                const ChunkCallback& callback) const override {
    return inner_.ReadTensorChunks(meta, callback);
  }
  absl::Status ReadTensorInto(const v1::TensorMeta& meta, char* destination) const override {
    on_read_(meta.key());
    return inner_.ReadTensorInto(meta, destination);
  }
  absl::StatusOr<MappedBytes> MapTensorBytes(const v1::TensorMeta& meta) const override {
    ADD_FAILURE() << "the export mapped " << meta.key();
    return inner_.MapTensorBytes(meta);
  }

 private:
  const VersionReader& inner_;
  std::function<void(const std::string&)> on_read_;
};

class ExportTest : public ::testing::Test {
 protected:
  void SetUp() override {
    StoreOptions options;
    options.db_path = Dir() + "/" + ::testing::UnitTest::GetInstance()->current_test_info()->name();
    ASSERT_OK_AND_ASSIGN(store_, RocksDbCheckpointStore::Open(options));
    weight_ = at::randn({6, 5});
    CheckpointContents contents;
    ASSERT_OK(contents.model.Insert("module.enc.weight", weight_, "cuda:1"));
    ASSERT_OK(contents.model.Insert("module.enc.steps", at::full({}, 3, at::kLong), "cuda:1"));
    ASSERT_OK(contents.model.Insert("module.head.bias", at::randn({5}), "cuda:1"));
    ASSERT_OK_AND_ASSIGN(CommitResult committed, CommitCheckpoint(*store_, "m", contents));
    ASSERT_OK_AND_ASSIGN(reader_, store_->OpenVersion(committed.version));
  }

  std::unique_ptr<RocksDbCheckpointStore> store_;
  std::unique_ptr<VersionReader> reader_;
  at::Tensor weight_;
};

TEST_F(ExportTest, SafetensorsStreamsTheAdaptedSubsetInPiecesEqualToTheFile) {
  ExportOptions options;
  options.format = ExportFormat::kSafetensors;
  options.target.keys = KeyPolicy::AddPrefix("module.");
  options.target.include_prefixes = {"enc."};
  ASSERT_OK_AND_ASSIGN(options.target.dtype, DTypePolicy::CastFloatingTo(DType::kBFloat16));
  const std::string path = Dir() + "/subset.safetensors";
  ASSERT_OK_AND_ASSIGN(ExportResult written, ExportToFile(*reader_, options, path));
  EXPECT_EQ(written.tensors, 2);

  std::string streamed;
  uint64_t announced = 0;
  ASSERT_OK_AND_ASSIGN(
      ExportResult result,
      ExportToSink(*reader_, options, /*piece_bytes=*/7,
                   [&](const ExportResult&, uint64_t total, absl::string_view bytes) {
                     EXPECT_LE(bytes.size(), 7u);
                     announced = total;
                     streamed.append(bytes.data(), bytes.size());
                     return absl::OkStatus();
                   }));
  EXPECT_EQ(streamed, ReadAll(path));
  EXPECT_EQ(announced, streamed.size());
  EXPECT_EQ(result.file_bytes, streamed.size());

  ASSERT_OK_AND_ASSIGN(SafetensorsFile file, ReadSafetensorsFile(path));
  EXPECT_EQ(file.header.metadata.at("ckpt.version"), "m@1");
  const at::Tensor* weight = file.tensors.Find("module.enc.weight");
  ASSERT_NE(weight, nullptr);
  EXPECT_TRUE(at::equal(*weight, weight_.to(at::kBFloat16)));
  const at::Tensor* steps = file.tensors.Find("module.enc.steps");
  ASSERT_NE(steps, nullptr);
  EXPECT_EQ(steps->scalar_type(), at::kLong);  // never cast.
  EXPECT_EQ(file.tensors.Find("module.head.bias"), nullptr);
}

TEST_F(ExportTest, TorchFileStreamsLikeTheFileAndReadsBack) {
  ExportOptions options;
  const std::string path = Dir() + "/all.pt";
  ASSERT_OK(ExportToFile(*reader_, options, path).status());
  ASSERT_OK_AND_ASSIGN(CheckpointFile file, ReadCheckpointFile(path));
  EXPECT_THAT(file.bundle.model.keys(), ElementsAre("enc.weight", "enc.steps", "head.bias"));
  EXPECT_TRUE(at::equal(*file.bundle.model.Find("enc.weight"), weight_));

  std::string streamed;
  ASSERT_OK(ExportToSink(*reader_, options, 1 << 20,
                         [&](const ExportResult&, uint64_t, absl::string_view bytes) {
                           streamed.append(bytes.data(), bytes.size());
                           return absl::OkStatus();
                         })
                .status());
  const std::string copy = Dir() + "/streamed.pt";
  std::ofstream(copy, std::ios::binary) << streamed;
  ASSERT_OK_AND_ASSIGN(CheckpointFile reread, ReadCheckpointFile(copy));
  EXPECT_TRUE(
      at::equal(*reread.bundle.model.Find("head.bias"), *file.bundle.model.Find("head.bias")));
}

TEST_F(ExportTest, TorchExportWritesEachTensorBeforeReadingTheNext) {
  // Each tensor is read only after everything before it reached the sink: the version is never
  // held. (Built from the whole state dict, all three were read before the first byte went out.)
  std::string streamed;
  std::vector<size_t> sent_at_read;
  RecordingReader reader(*reader_,
                         [&](const std::string&) { sent_at_read.push_back(streamed.size()); });
  uint64_t announced = 0;
  ExportOptions options;
  ASSERT_OK_AND_ASSIGN(
      ExportResult result,
      ExportToSink(reader, options, /*piece_bytes=*/1000,
                   [&](const ExportResult&, uint64_t total, absl::string_view bytes) {
                     if (streamed.empty()) announced = total;
                     streamed.append(bytes.data(), bytes.size());
                     return absl::OkStatus();
                   }));
  ASSERT_EQ(sent_at_read.size(), 3u);
  EXPECT_GT(sent_at_read[0], 0u);                           // The pickle went out first.
  EXPECT_GT(sent_at_read[1], sent_at_read[0] + 5 * 6 * 4);  // After enc.weight's 120 bytes.
  EXPECT_GT(sent_at_read[2], sent_at_read[1] + 8);          // After enc.steps.
  EXPECT_EQ(announced, streamed.size());                    // Known before the first piece.
  EXPECT_EQ(result.file_bytes, streamed.size());

  // Byte for byte the file the torch writer makes from the loaded state dict in memory.
  ASSERT_OK_AND_ASSIGN(LoadedState loaded, Load(*reader_, LoadTarget()));
  const std::string in_memory = Dir() + "/in_memory.pt";
  ASSERT_OK(WriteTorchFile(in_memory, StateDictToValue(loaded.model)).status());
  EXPECT_EQ(streamed, ReadAll(in_memory));
}

TEST_F(ExportTest, PythonLoadsAStreamedTorchExportWithWeightsOnly) {
  ExportOptions options;
  ASSERT_OK_AND_ASSIGN(options.target.dtype, DTypePolicy::CastFloatingTo(DType::kBFloat16));
  const std::string path = Dir() + "/weights_only.pt";
  std::vector<uint64_t> progress;
  options.progress = [&](uint64_t done, uint64_t total) {
    progress.push_back(done);
    EXPECT_LE(done, total);
  };
  ASSERT_OK_AND_ASSIGN(ExportResult result, ExportToFile(*reader_, options, path));
  EXPECT_EQ(result.file_bytes, ReadAll(path).size());
  EXPECT_GE(progress.size(), 3u);
  ASSERT_OK_AND_ASSIGN(LoadedState stored, Load(*reader_, LoadTarget()));
  std::set<std::string> expected = {"TYPE OrderedDict"};
  for (const StateDict::Entry& entry : stored.model) {
    const at::Tensor cast =
        entry.tensor.is_floating_point() ? entry.tensor.to(at::kBFloat16) : entry.tensor;
    expected.insert(TorchLine(entry.key, cast));
  }
  EXPECT_EQ(Lines(Python(kTorchCheck, "state " + path)), expected);
}

TEST_F(ExportTest, ShardedSafetensorsAreHuggingFacesLayoutAndReadBackWhole) {
  ASSERT_OK_AND_ASSIGN(LoadedState stored, Load(*reader_, LoadTarget()));
  std::set<std::string> expected;
  for (const StateDict::Entry& entry : stored.model) {
    expected.insert(SafetensorsLine(entry.key, entry.tensor));
  }
  const std::string keys = absl::StrJoin(stored.model.keys(), ",");
  const std::string dir = Dir() + "/sharded";
  ExportOptions options;
  options.format = ExportFormat::kSafetensors;
  std::vector<std::pair<uint64_t, uint64_t>> progress;
  options.progress = [&](uint64_t done, uint64_t total) { progress.emplace_back(done, total); };

  // enc.weight (120 bytes) outgrows 24-byte shards and gets its own; enc.steps (8) and head.bias
  // (20) do not fit one together.
  options.max_shard_bytes = 24;
  ASSERT_OK_AND_ASSIGN(ExportResult result, ExportToFile(*reader_, options, dir));
  EXPECT_EQ(result.tensors, 3);
  EXPECT_THAT(result.files,
              ElementsAre("model-00001-of-00003.safetensors", "model-00002-of-00003.safetensors",
                          "model-00003-of-00003.safetensors", kSafetensorsIndexName));
  ASSERT_FALSE(progress.empty());
  EXPECT_EQ(progress.back(), std::make_pair(result.file_bytes, result.file_bytes));
  std::set<std::string> lines =
      Lines(Python(kShardCheck, absl::StrCat("check ", dir, " 24 ", keys)));
  for (const std::string& line : expected) EXPECT_TRUE((lines.count(line) > 0)) << line;
  EXPECT_TRUE((lines.count("SHARD model-00001-of-00003.safetensors enc.weight") > 0));

  // Whole again through the reader every import and convert uses (the directory, or its index).
  for (const std::string& path : {dir, absl::StrCat(dir, "/", kSafetensorsIndexName)}) {
    ASSERT_OK_AND_ASSIGN(CheckpointFile file, ReadCheckpointFile(path));
    EXPECT_EQ(file.format, CheckpointFormat::kSafetensors);
    std::set<std::string> read;
    for (const StateDict::Entry& entry : file.bundle.model) {
      read.insert(SafetensorsLine(entry.key, entry.tensor));
    }
    EXPECT_EQ(read, expected) << path;
    EXPECT_EQ(file.metadata.at("ckpt.version"), "m@1");
  }

  // Exported again with bigger shards: two shards, the third of the old set removed.
  options.max_shard_bytes = 100;
  ASSERT_OK(ExportToFile(*reader_, options, dir).status());
  lines = Lines(Python(kShardCheck, absl::StrCat("check ", dir, " 100 ", keys)));
  EXPECT_TRUE((lines.count("SHARD model-00002-of-00002.safetensors enc.steps,head.bias") > 0));
  EXPECT_NE(access((dir + "/model-00003-of-00003.safetensors").c_str(), F_OK), 0);

  // Everything in one shard: model.safetensors alone, as transformers writes it.
  options.max_shard_bytes = 1000;
  ASSERT_OK_AND_ASSIGN(result, ExportToFile(*reader_, options, dir));
  EXPECT_THAT(result.files, ElementsAre(kSafetensorsSingleName));
  EXPECT_NE(access((dir + "/" + kSafetensorsIndexName).c_str(), F_OK), 0);
  EXPECT_NE(access((dir + "/model-00001-of-00002.safetensors").c_str(), F_OK), 0);
  ASSERT_OK_AND_ASSIGN(CheckpointFile single, ReadCheckpointFile(dir));
  EXPECT_EQ(single.bundle.model.size(), 3u);
}

// A DCP directory (libs/format/dcp_writer.h; dcp_writer_test has real PyTorch load one): the
// adapted model, read back whole through the reader import and convert use; never a stream.
TEST_F(ExportTest, DcpIsADirectoryOfTheAdaptedModelThatReadsBack) {
  LoadTarget target;
  target.dtype = *DTypePolicy::CastFloatingTo(DType::kBFloat16);
  ASSERT_OK_AND_ASSIGN(LoadedState stored, Load(*reader_, target));
  ExportOptions options;
  options.format = ExportFormat::kDcp;
  options.target = target;
  const std::string dir = Dir() + "/m.dcp";
  ASSERT_OK_AND_ASSIGN(ExportResult result, ExportToFile(*reader_, options, dir));
  EXPECT_EQ(result.tensors, 3);
  EXPECT_THAT(result.files, ElementsAre("__0_0.distcp", ".metadata"));
  ASSERT_OK_AND_ASSIGN(CheckpointFile file, ReadCheckpointFile(dir));
  EXPECT_EQ(file.format, CheckpointFormat::kDcp);
  ASSERT_EQ(file.bundle.model.size(), stored.model.size());
  for (const StateDict::Entry& entry : stored.model) {
    const at::Tensor* read = file.bundle.model.Find(entry.key);
    ASSERT_NE(read, nullptr) << entry.key;
    EXPECT_TRUE(read->equal(entry.tensor)) << entry.key;
  }
  EXPECT_EQ(ParseExportFormat("dcp").value_or(ExportFormat::kTorch), ExportFormat::kDcp);
  EXPECT_THAT(ExportToSink(
                  *reader_, options, 1 << 20,
                  [](const ExportResult&, uint64_t, absl::string_view) { return absl::OkStatus(); })
                  .status(),
              StatusIs(absl::StatusCode::kInvalidArgument, "directory"));
  options.target.include_optimizer = true;
  EXPECT_THAT(ExportToFile(*reader_, options, dir).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, "torch bundle"));
}

TEST_F(ExportTest, ShardingIsForSafetensorsFilesAndSizesParseAsHuggingFaceWritesThem) {
  ExportOptions options;
  options.max_shard_bytes = 100;
  EXPECT_THAT(ExportToFile(*reader_, options, Dir() + "/t").status(),
              StatusIs(absl::StatusCode::kInvalidArgument, "safetensors exports only"));
  options.format = ExportFormat::kSafetensors;
  EXPECT_THAT(ExportToSink(
                  *reader_, options, 64,
                  [](const ExportResult&, uint64_t, absl::string_view) { return absl::OkStatus(); })
                  .status(),
              StatusIs(absl::StatusCode::kInvalidArgument, "a stream carries one file"));
  const std::string file = Dir() + "/a_file";
  std::ofstream(file) << "x";
  EXPECT_THAT(ExportToFile(*reader_, options, file).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, "is a file"));

  const std::vector<std::pair<std::string, uint64_t>> sizes = {{"5GB", 5'000'000'000},
                                                               {"500mb", 500'000'000},
                                                               {"2GiB", uint64_t{2} << 30},
                                                               {"1.5 KB", 1500},
                                                               {"1048576", 1048576}};
  for (const auto& [text, bytes] : sizes) {
    absl::StatusOr<uint64_t> parsed = ParseShardSize(text);
    ASSERT_OK(parsed.status()) << text;
    EXPECT_EQ(*parsed, bytes) << text;
  }
  for (const char* bad : {"", "GB", "5XB", "-1", "0", "0.1B", "1e30"}) {
    EXPECT_THAT(ParseShardSize(bad), StatusIs(absl::StatusCode::kInvalidArgument, "positive size"))
        << bad;
  }
}

// A version with optimizer, scheduler and other fields but no recorded layout (as the trainer
// writes them): the bundle is {"epoch", "global_step", "model", "optimizer", "scheduler", ...}.
class BundleExportTest : public ExportTest {
 protected:
  v1::VersionRef Commit(bool with_names) {
    CheckpointContents contents;
    EXPECT_OK(contents.model.Insert("enc.weight", at::ones({2, 2})));
    EXPECT_OK(contents.model.Insert("enc.running_mean", at::zeros({2})));
    EXPECT_OK(contents.model.Insert("head.bias", at::ones({2})));
    Value group = Value::Dict(
        {{"lr", Value::Float(0.5)}, {"params", Value::List({Value::Int(0), Value::Int(1)})}});
    contents.optimizer = Value::Dict(
        {{"state", Value::Dict({{0, Value::Dict({{"momentum_buffer",
                                                  Value::Tensor(at::full({2, 2}, 0.25))}})}})},
         {"param_groups", Value::List({group})}});
    contents.scheduler = Value::Dict({{"last_epoch", Value::Int(3)}});
    contents.extra = Value::Dict({{"trainer", Value::Dict({{"seed", Value::Int(7)}})}});
    contents.metadata.set_source_format("trainer");
    contents.metadata.set_epoch(2);
    contents.metadata.set_global_step(3);
    if (with_names) contents.optimizer_param_names = {{0, "enc.weight"}, {1, "head.bias"}};
    absl::StatusOr<CommitResult> committed = CommitCheckpoint(*store_, "b", contents);
    EXPECT_OK(committed.status());
    return committed->version;
  }

  absl::StatusOr<ExportResult> Export(const v1::VersionRef& ref, const LoadTarget& target,
                                      const std::string& path) {
    ASSIGN_OR_RETURN(std::unique_ptr<VersionReader> reader, store_->OpenVersion(ref));
    ExportOptions options;
    options.target = target;
    return ExportToFile(*reader, options, path);
  }

  static LoadTarget Everything() {
    LoadTarget target;
    target.include_optimizer = true;
    target.include_scheduler = true;
    return target;
  }
};

TEST_F(BundleExportTest, AVersionWithoutALayoutGetsTheUsualBundle) {
  const v1::VersionRef ref = Commit(/*with_names=*/false);
  const std::string path = Dir() + "/bundle.pt";
  ASSERT_OK_AND_ASSIGN(ExportResult result, Export(ref, Everything(), path));
  EXPECT_TRUE(result.bundle);
  EXPECT_EQ(result.tensors, 3);
  ASSERT_OK_AND_ASSIGN(CheckpointFile file, ReadCheckpointFile(path));
  std::vector<std::string> keys;
  for (const auto& [key, value] : file.root.entries()) keys.push_back(key.string_key());
  EXPECT_THAT(keys,
              ElementsAre("epoch", "global_step", "model", "optimizer", "scheduler", "trainer"));
  EXPECT_EQ(*file.root.Find("epoch"), Value::Int(2));
  EXPECT_TRUE(file.root.Find("model")->is_ordered_dict());
  EXPECT_TRUE(at::equal(
      file.root.Find("optimizer")->Find("state")->Find(0)->Find("momentum_buffer")->tensor(),
      at::full({2, 2}, 0.25)));
  EXPECT_EQ(*file.root.Find("scheduler"), Value::Dict({{"last_epoch", Value::Int(3)}}));

  // Only the scheduler: the optimizer is named as left out.
  LoadTarget scheduler_only;
  scheduler_only.include_scheduler = true;
  ASSERT_OK_AND_ASSIGN(result, Export(ref, scheduler_only, path));
  EXPECT_THAT(result.left_out, ElementsAre("optimizer: not asked for"));
  ASSERT_OK_AND_ASSIGN(file, ReadCheckpointFile(path));
  EXPECT_EQ(file.root.Find("optimizer"), nullptr);

  // Safetensors cannot hold a bundle, and says so.
  ExportOptions safetensors;
  safetensors.format = ExportFormat::kSafetensors;
  safetensors.target = Everything();
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<VersionReader> reader, store_->OpenVersion(ref));
  ASSERT_OK_AND_ASSIGN(result, ExportToFile(*reader, safetensors, Dir() + "/b.safetensors"));
  EXPECT_FALSE(result.bundle);
  EXPECT_THAT(
      result.left_out,
      ElementsAre(::testing::HasSubstr("optimizer: safetensors holds tensors only"),
                  ::testing::HasSubstr("scheduler"), ::testing::HasSubstr("the other fields")));
}

TEST_F(BundleExportTest, PythonLoadsAStreamedBundleValueByValue) {
  const v1::VersionRef ref = Commit(/*with_names=*/true);
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<VersionReader> stored, store_->OpenVersion(ref));
  std::vector<std::string> read;
  RecordingReader reader(*stored, [&](const std::string& key) { read.push_back(key); });
  ExportOptions options;
  options.target = Everything();
  const std::string path = Dir() + "/streamed_bundle.pt";
  ASSERT_OK_AND_ASSIGN(ExportResult result, ExportToFile(reader, options, path));
  EXPECT_TRUE(result.bundle);
  EXPECT_EQ(read.size(), 4u);  // Three model tensors and the momentum buffer, once each.
  EXPECT_EQ(Lines(Python(kTorchCheck, "bundle " + path)),
            (std::set<std::string>{
                "TYPE / dict",
                "epoch=2",
                "global_step=3",
                "TYPE model OrderedDict",
                TorchLine("model/enc.weight", at::ones({2, 2})),
                TorchLine("model/enc.running_mean", at::zeros({2})),
                TorchLine("model/head.bias", at::ones({2})),
                "TYPE optimizer dict",
                "TYPE optimizer/state dict",
                "TYPE optimizer/state/0 dict",
                TorchLine("optimizer/state/0/momentum_buffer", at::full({2, 2}, 0.25)),
                "TYPE optimizer/param_groups/0 dict",
                "optimizer/param_groups/0/lr=0.5",
                "optimizer/param_groups/0/params/0=0",
                "optimizer/param_groups/0/params/1=1",
                "TYPE scheduler dict",
                "scheduler/last_epoch=3",
                "TYPE trainer dict",
                "trainer/seed=7",
            }));
}

TEST_F(BundleExportTest, ASubsetMustKeepEveryParameterTheOptimizerIndexes) {
  const std::string path = Dir() + "/subset.pt";
  LoadTarget target = Everything();
  target.include_keys = {"enc.weight", "head.bias"};  // drops a buffer only.
  // Without parameter names nothing proves the subset keeps the optimizer's parameters.
  EXPECT_THAT(
      Export(Commit(/*with_names=*/false), target, path).status(),
      StatusIs(absl::StatusCode::kInvalidArgument, "does not record which tensor each index is"));
  EXPECT_NE(access(path.c_str(), F_OK), 0);
  const v1::VersionRef named = Commit(/*with_names=*/true);
  ASSERT_OK(Export(named, target, path).status());
  target.include_keys = {"enc.weight"};
  EXPECT_THAT(Export(named, target, Dir() + "/misaligned.pt").status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "leaves out optimizer parameter(s) 1 (head.bias)"));
  target.include_optimizer = false;
  ASSERT_OK(Export(named, target, Dir() + "/no_optimizer.pt").status());
}

TEST_F(BundleExportTest, ABundleOfAVersionWithoutOptimizerStateLeavesItOutAndSaysSo) {
  // The fixture's version holds model tensors only: the bundle is written without an optimizer,
  // as one without a scheduler is.
  const std::string path = Dir() + "/none.pt";
  ExportOptions options;
  options.target = Everything();
  ASSERT_OK_AND_ASSIGN(ExportResult result, ExportToFile(*reader_, options, path));
  EXPECT_THAT(result.left_out,
              ::testing::Contains("optimizer: m@1 holds none (saved without one)"));
  EXPECT_THAT(result.left_out, ::testing::Contains("scheduler: the version holds none"));
  EXPECT_EQ(access(path.c_str(), F_OK), 0);
}

TEST_F(ExportTest, SinkErrorsStopTheExportAndBadNamesAreRejected) {
  ExportOptions options;
  options.format = ExportFormat::kSafetensors;
  EXPECT_THAT(ExportToSink(*reader_, options, 64,
                           [](const ExportResult&, uint64_t, absl::string_view) {
                             return absl::CancelledError("consumer left");
                           })
                  .status(),
              StatusIs(absl::StatusCode::kCancelled, "consumer left"));
  EXPECT_THAT(ParseExportFormat("onnx").status(),
              StatusIs(absl::StatusCode::kInvalidArgument, "torch, safetensors or dcp"));
  EXPECT_THAT(ExportFormatFromProto(v1::EXPORT_FORMAT_UNSPECIFIED).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, ""));
  EXPECT_EQ(ExportFileName("m", 3, ExportFormat::kSafetensors), "m-v3.safetensors");
}

TEST(ExportFormatTest, FormatNamesReadBackAndPathsTellTheFormatByTheirEnding) {
  for (const ExportFormat format : {ExportFormat::kTorch, ExportFormat::kSafetensors}) {
    ASSERT_OK_AND_ASSIGN(const ExportFormat read_back, ParseExportFormat(ExportFormatName(format)));
    EXPECT_EQ(read_back, format);
  }
  ASSERT_OK_AND_ASSIGN(const ExportFormat safetensors,
                       ExportFormatForPath("out/m.safetensors", /*sharded=*/false));
  EXPECT_EQ(safetensors, ExportFormat::kSafetensors);
  ASSERT_OK_AND_ASSIGN(const ExportFormat pt, ExportFormatForPath("m.pt", /*sharded=*/false));
  EXPECT_EQ(pt, ExportFormat::kTorch);
  ASSERT_OK_AND_ASSIGN(const ExportFormat pth, ExportFormatForPath("m.pth", /*sharded=*/true));
  EXPECT_EQ(pth, ExportFormat::kTorch);
  // A sharded export's path is a directory, of safetensors shards.
  ASSERT_OK_AND_ASSIGN(const ExportFormat directory,
                       ExportFormatForPath("out/m", /*sharded=*/true));
  EXPECT_EQ(directory, ExportFormat::kSafetensors);
  EXPECT_THAT(ExportFormatForPath("out/m.bin", /*sharded=*/false),
              StatusIs(absl::StatusCode::kInvalidArgument, "out/m.bin"));
}

}  // namespace
}  // namespace ckpt

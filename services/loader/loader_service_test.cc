// The loader service end to end: a real RocksDB store in TEST_TMPDIR, the real service on a gRPC
// server at 127.0.0.1:0, the real C++ client (RemoteLoader), real PyTorch on the other side of
// exports and as a Python gRPC client.

#include "services/loader/loader_service.h"

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "ATen/core/Tensor.h"
#include "ATen/ops/arange.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "gtest/gtest.h"
#include "libs/auth/access_policy.h"
#include "libs/client/remote_loader.h"
#include "libs/format/checkpoint_file.h"
#include "libs/loader/export.h"
#include "libs/loader/loader.h"
#include "libs/rpc/grpc_server.h"
#include "libs/status/status_matchers.h"
#include "libs/store/checkpoint_contents.h"
#include "libs/store/checkpoint_import.h"
#include "libs/store/rocksdb_checkpoint_store.h"
#include "libs/store/version_ref.h"
#include "libs/tensor/device.h"
#include "libs/testing/child_process.h"
#include "libs/testing/python_runner.h"
#include "libs/testing/test_certificates.h"
#include "proto/ckpt/v1/loader.grpc.pb.h"
#include "torch/csrc/autograd/grad_mode.h"
#include "torch/nn/modules/activation.h"
#include "torch/nn/modules/batchnorm.h"
#include "torch/nn/modules/container/sequential.h"
#include "torch/nn/modules/linear.h"

namespace ckpt {
namespace {

using ::ckpt::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

constexpr char kFixtures[] = "libs/format/testdata/checkpoint_fixtures.py";

std::string Dir() { return std::string(std::getenv("TEST_TMPDIR")); }

// The fixtures' model (Linear, BatchNorm1d, ReLU, Linear) in LibTorch: keys "0.weight", ...,
// "1.running_mean", "1.num_batches_tracked", "3.bias" -- as Python's nn.Sequential names them.
torch::nn::Sequential MakeModel() {
  return torch::nn::Sequential(torch::nn::Linear(4, 8), torch::nn::BatchNorm1d(8),
                               torch::nn::ReLU(), torch::nn::Linear(8, 3));
}

// A DDP-style consumer: the same model under "module.".
struct DdpModel : torch::nn::Module {
  DdpModel() { module = register_module("module", MakeModel().ptr()); }
  std::shared_ptr<torch::nn::SequentialImpl> module;
};

bool BytesEqual(const at::Tensor& a, const at::Tensor& b) {
  if (a.scalar_type() != b.scalar_type() || a.sizes() != b.sizes()) return false;
  const at::Tensor ca = a.cpu().contiguous();
  const at::Tensor cb = b.cpu().contiguous();
  return std::memcmp(ca.data_ptr(), cb.data_ptr(), ca.nbytes()) == 0;
}

class LoaderServiceTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    ::ckpt::testing::RunPythonOrAddFailure(kFixtures, "make " + Dir());
  }

  void SetUp() override {
    StoreOptions options;
    options.db_path =
        Dir() + "/store-" + ::testing::UnitTest::GetInstance()->current_test_info()->name();
    ASSERT_OK_AND_ASSIGN(store_, RocksDbCheckpointStore::Open(options));
    ASSERT_OK_AND_ASSIGN(ImportResult imported,
                         ImportCheckpointFile(*store_, Dir() + "/ddp_cuda1.pt", "mlp"));
    ref_ = imported.commit.version;
    absl::StatusOr<CheckpointFile> reference = ReadCheckpointFile(Dir() + "/reference.pt");
    ASSERT_OK(reference.status());
    reference_ = reference->bundle.model;
  }

  void TearDown() override { StopLoader(); }

  void StartLoader(LoaderServiceOptions options = {}, const std::string& client_token = "") {
    ASSERT_OK_AND_ASSIGN(service_, LoaderService::Create(store_.get(), options));
    ASSERT_OK_AND_ASSIGN(
        server_, GrpcServer::Start({}, {{service_.get(), v1::Loader::service_full_name()}}));
    RemoteLoaderOptions client;
    client.address = server_->address();
    client.auth_token = client_token;
    ASSERT_OK_AND_ASSIGN(loader_, RemoteLoader::Connect(client));
  }

  void StopLoader() {
    loader_.reset();
    if (server_ != nullptr) {
      server_->Shutdown(absl::ZeroDuration());
      server_->Wait();
    }
    server_.reset();
    service_.reset();
  }

  // Expects `state` to hold reference.pt's tensors under `prefix` + key, byte for byte.
  void ExpectReference(const StateDict& state, const std::string& prefix) {
    ASSERT_EQ(state.size(), reference_.size());
    for (const StateDict::Entry& entry : reference_) {
      const at::Tensor* loaded = state.Find(prefix + entry.key);
      ASSERT_NE(loaded, nullptr) << prefix << entry.key;
      EXPECT_TRUE(BytesEqual(*loaded, entry.tensor)) << entry.key;
    }
  }

  std::unique_ptr<RocksDbCheckpointStore> store_;
  v1::VersionRef ref_;
  StateDict reference_;
  std::unique_ptr<LoaderService> service_;
  std::unique_ptr<GrpcServer> server_;
  std::unique_ptr<RemoteLoader> loader_;
};

// Copies every tensor of `state` into the module's tensor of the same name; fails the test on a
// missing, extra or misshapen key (load_state_dict(strict=True)).
void LoadStrict(const StateDict& state, torch::nn::Module& module) {
  torch::NoGradGuard no_grad;
  std::vector<std::pair<std::string, at::Tensor>> tensors;
  for (const auto& item : module.named_parameters()) tensors.emplace_back(item.key(), item.value());
  for (const auto& item : module.named_buffers()) tensors.emplace_back(item.key(), item.value());
  ASSERT_EQ(tensors.size(), state.size());
  for (auto& [key, destination] : tensors) {
    const at::Tensor* source = state.Find(key);
    ASSERT_NE(source, nullptr) << key;
    ASSERT_EQ(source->sizes(), destination.sizes()) << key;
    destination.copy_(*source);
  }
}

ExportOptions Exporting(ExportFormat format) {
  ExportOptions options;
  options.format = format;
  return options;
}

TEST_F(LoaderServiceTest, DdpCheckpointFromCuda1LoadsIntoUnwrappedCpuModule) {
  StartLoader();
  torch::nn::Sequential model = MakeModel();
  ASSERT_OK_AND_ASSIGN(PreflightReport preflight,
                       loader_->Preflight(ref_, ExpectedTensorsOf(*model), LoadTarget()));
  EXPECT_TRUE(preflight.report.compatible()) << preflight.summary;

  ASSERT_OK_AND_ASSIGN(LoadedState state, loader_->Load(ref_, LoadTarget()));
  ExpectReference(state.model, "");
  for (const StateDict::Entry& entry : state.model) {
    EXPECT_TRUE(entry.tensor.device().is_cpu()) << entry.key;
    EXPECT_EQ(entry.original_device, "cuda:1") << entry.key;
  }
  LoadStrict(state.model, *model);
  EXPECT_TRUE(BytesEqual(model[0]->as<torch::nn::Linear>()->weight, *reference_.Find("0.weight")));
  EXPECT_TRUE(BytesEqual(model[1]->as<torch::nn::BatchNorm1d>()->running_var,
                         *reference_.Find("1.running_var")));
}

TEST_F(LoaderServiceTest, DdpStyleConsumerGetsModulePrefixSuggestedThenLoads) {
  StartLoader();
  DdpModel model;
  ASSERT_OK_AND_ASSIGN(PreflightReport preflight,
                       loader_->Preflight(ref_, ExpectedTensorsOf(model), LoadTarget()));
  EXPECT_FALSE(preflight.report.compatible());
  EXPECT_EQ(preflight.report.missing_keys.size(), reference_.size());
  ASSERT_TRUE(preflight.suggested_keys.has_value());
  EXPECT_EQ(preflight.suggested_keys->kind(), KeyPolicy::Kind::kAddPrefix);
  EXPECT_EQ(preflight.suggested_keys->prefix(), "module.");

  LoadTarget target;
  target.keys = KeyPolicy::AddPrefix("module.");
  ASSERT_OK_AND_ASSIGN(preflight, loader_->Preflight(ref_, ExpectedTensorsOf(model), target));
  EXPECT_TRUE(preflight.report.compatible()) << preflight.summary;
  ASSERT_OK_AND_ASSIGN(LoadedState state, loader_->Load(ref_, target));
  EXPECT_EQ(state.model.entry(0).key, "module.0.weight");
  ExpectReference(state.model, "module.");
  LoadStrict(state.model, model);
}

TEST_F(LoaderServiceTest, CastsAndSubsetsOnTheServer) {
  StartLoader();
  LoadTarget target;
  ASSERT_OK_AND_ASSIGN(target.dtype, DTypePolicy::CastFloatingTo(DType::kBFloat16));
  target.include_prefixes = {"1."};
  ASSERT_OK_AND_ASSIGN(LoadedState state, loader_->Load(ref_, target));
  EXPECT_THAT(state.model.keys(), ElementsAre("1.weight", "1.bias", "1.running_mean",
                                              "1.running_var", "1.num_batches_tracked"));
  for (const StateDict::Entry& entry : state.model) {
    const at::Tensor& original = *reference_.Find(entry.key);
    if (original.is_floating_point()) {
      EXPECT_EQ(entry.tensor.scalar_type(), at::kBFloat16) << entry.key;
      EXPECT_TRUE(BytesEqual(entry.tensor, original.to(at::kBFloat16))) << entry.key;
    } else {
      EXPECT_TRUE(BytesEqual(entry.tensor, original)) << entry.key;  // never cast.
    }
  }
  // The adapted manifest says what arrived.
  EXPECT_EQ(state.manifest.tensors(0).dtype(), v1::DTYPE_BFLOAT16);
  EXPECT_EQ(state.manifest.tensors(0).byte_length(), 8 * 2);
}

TEST_F(LoaderServiceTest, ExportedTorchFileLoadsInPythonWeightsOnly) {
  StartLoader();
  const std::string path = Dir() + "/export.pt";
  ASSERT_OK_AND_ASSIGN(ExportResult result,
                       loader_->Export(ref_, Exporting(ExportFormat::kTorch), path));
  EXPECT_GT(result.file_bytes, 0u);
  EXPECT_THAT(
      ::ckpt::testing::RunPythonOrAddFailure(kFixtures, "verify_torch " + path + " " + Dir()),
      HasSubstr("OK"));
}

TEST_F(LoaderServiceTest, ExportedSafetensorsParsesIndependently) {
  StartLoader();
  const std::string path = Dir() + "/export.safetensors";
  uint64_t last_done = 0, last_total = 0;
  ExportOptions options = Exporting(ExportFormat::kSafetensors);
  options.progress = [&](uint64_t done, uint64_t total) { last_done = done, last_total = total; };
  ASSERT_OK_AND_ASSIGN(ExportResult result, loader_->Export(ref_, options, path));
  EXPECT_EQ(result.version, "mlp@1");
  EXPECT_EQ(last_done, result.file_bytes);
  EXPECT_EQ(last_total, result.file_bytes);
  EXPECT_THAT(
      ::ckpt::testing::RunPythonOrAddFailure(kFixtures, "verify_safetensors " + path + " " + Dir()),
      HasSubstr("OK"));
}

// `ckpt export --loader` (RemoteLoader::Export underneath) against a loader that flips one bit of
// one file byte after it took the piece's XXH3-64: each flip fails the command with DATA_LOSS
// naming the version and the damaged bytes' offset, and leaves no file; an intact stream works.
TEST_F(LoaderServiceTest, CkptExportThroughTheLoaderCatchesEveryFlippedByte) {
  std::atomic<int64_t> flip_at{-1};
  std::atomic<int> flipped{0};
  LoaderServiceOptions options;
  options.tamper_for_testing = [&](const LoaderServiceOptions::OutgoingPiece& piece,
                                   absl::Span<char> bytes) {
    const int64_t at = flip_at.load();
    if (!piece.export_file || at < piece.offset ||
        at >= piece.offset + static_cast<int64_t>(bytes.size())) {
      return;
    }
    bytes[at - piece.offset] ^= static_cast<char>(1 << (at % 8));
    ++flipped;
  };
  StartLoader(options);
  const std::string path = Dir() + "/flipped_by_cli.safetensors";
  const std::string command =
      absl::StrCat("tools/ckpt/ckpt export mlp@1 ", path, " --loader=", server_->address());
  const ::ckpt::testing::ShellResult clean = ::ckpt::testing::RunShell(command);
  ASSERT_EQ(clean.exit_code, 0) << clean.output;
  const int64_t size = static_cast<int64_t>(std::filesystem::file_size(path));
  ASSERT_TRUE(std::filesystem::remove(path));
  // The header's first byte, bytes spread through the file, its last byte.
  std::vector<int64_t> offsets;
  for (int i = 0; i < 10; ++i) offsets.push_back((size - 1) * i / 9);
  for (const int64_t offset : offsets) {
    flip_at = offset;
    const int before = flipped.load();
    const ::ckpt::testing::ShellResult damaged = ::ckpt::testing::RunShell(command);
    EXPECT_EQ(flipped.load(), before + 1);
    EXPECT_NE(damaged.exit_code, 0) << "byte " << offset;
    EXPECT_THAT(damaged.output, HasSubstr("DATA_LOSS")) << "byte " << offset;
    EXPECT_THAT(damaged.output, HasSubstr("the Export stream of mlp@1: file bytes ")) << offset;
    EXPECT_FALSE(std::filesystem::exists(path)) << "byte " << offset;
  }
  flip_at = -1;
  EXPECT_EQ(::ckpt::testing::RunShell(command).exit_code, 0);
  EXPECT_EQ(static_cast<int64_t>(std::filesystem::file_size(path)), size);
}

TEST_F(LoaderServiceTest, PythonGrpcClientLoadsAVersion) {
  LoaderServiceOptions options;
  options.auth_token = "py-token";
  StartLoader(options, "py-token");
  EXPECT_THAT(::ckpt::testing::RunPythonOrAddFailure(
                  "services/loader/testdata/python_client.py",
                  absl::StrCat(server_->address(), " py-token mlp ", Dir(), " ", Dir(), "/gen")),
              HasSubstr("OK"));
}

TEST_F(LoaderServiceTest, PythonGrpcClientOverMutualTlsListsServicesAndLoadsAVersion) {
  const std::string cert_dir = Dir() + "/certs";
  std::filesystem::create_directories(cert_dir);
  ASSERT_OK_AND_ASSIGN(::ckpt::testing::TestCertificates certs,
                       ::ckpt::testing::MakeTestCertificates(cert_dir));
  ::ckpt::testing::WriteTextFile(cert_dir + "/identities.json", R"({"identities": [
      {"name": "team-a", "certificate": "team-a.example", "role": "reader",
       "models": ["mlp"]}]})");
  LoaderServiceOptions options;
  ASSERT_OK_AND_ASSIGN(options.access,
                       AccessPolicy::FromIdentitiesFile(cert_dir + "/identities.json"));
  ASSERT_OK_AND_ASSIGN(service_, LoaderService::Create(store_.get(), options));
  GrpcServerOptions server_options;
  server_options.tls = {certs.server.cert, certs.server.key, certs.ca};
  ASSERT_OK_AND_ASSIGN(
      server_,
      GrpcServer::Start(server_options, {{service_.get(), v1::Loader::service_full_name()}}));
  EXPECT_THAT(::ckpt::testing::RunPythonOrAddFailure(
                  "services/loader/testdata/python_mtls_client.py",
                  absl::StrCat(server_->address(), " ", certs.ca, " ", certs.client.cert, " ",
                               certs.client.key, " mlp ", Dir(), " ", Dir(), "/gen-mtls")),
              HasSubstr("OK"));
}

TEST_F(LoaderServiceTest, ErrorsNameWhatIsWrong) {
  StartLoader();
  EXPECT_THAT(loader_->Load(ParseVersionRef("absent@3").value(), LoadTarget()).status(),
              StatusIs(absl::StatusCode::kNotFound, "absent"));
  LoadTarget subset;
  subset.include_keys = {"0.weight", "9.weight"};
  EXPECT_THAT(loader_->Load(ref_, subset).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, "9.weight"));
  ExportOptions bad_subset = Exporting(ExportFormat::kSafetensors);
  bad_subset.target = subset;
  EXPECT_THAT(loader_->Export(ref_, bad_subset, Dir() + "/bad.st").status(),
              StatusIs(absl::StatusCode::kInvalidArgument, "9.weight"));
  StopLoader();

  LoaderServiceOptions options;
  options.auth_token = "secret";
  StartLoader(options, "wrong");
  EXPECT_THAT(loader_->Load(ref_, LoadTarget()).status(),
              StatusIs(absl::StatusCode::kUnauthenticated, "not valid"));
  // As long as the right token, but not it.
  StopLoader();
  StartLoader(options, "secreT");
  EXPECT_THAT(loader_->Load(ref_, LoadTarget()).status(),
              StatusIs(absl::StatusCode::kUnauthenticated, "not valid"));
  StopLoader();
  StartLoader(options, "secret");
  EXPECT_THAT(loader_->Load(ref_, LoadTarget()).status(), ::ckpt::testing::IsOk());
}

// A stream's slot is free by the time its client has the status: one stream after another never
// meets RESOURCE_EXHAUSTED, even with room for one.
// The messages of a Load stream with `max_message_bytes`, read with the generated stub.
absl::StatusOr<int> CountLoadMessages(const std::string& address, const v1::VersionRef& ref,
                                      int max_message_bytes) {
  std::unique_ptr<v1::Loader::Stub> stub =
      v1::Loader::NewStub(grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(20));
  v1::LoadRequest request;
  *request.mutable_ref() = ref;
  request.set_max_message_bytes(max_message_bytes);
  std::unique_ptr<grpc::ClientReader<v1::LoadResponse>> reader = stub->Load(&context, request);
  v1::LoadResponse response;
  int messages = 0;
  while (reader->Read(&response)) ++messages;
  const grpc::Status status = reader->Finish();
  if (!status.ok()) return absl::InternalError(status.error_message());
  return messages;
}

TEST_F(LoaderServiceTest, TinyMaxMessageBytesIsRaisedToSixtyFourKiB) {
  StartLoader();
  ASSERT_OK_AND_ASSIGN(const int at_minimum, CountLoadMessages(server_->address(), ref_, 64 << 10));
  for (int tiny : {1, 1000}) {
    ASSERT_OK_AND_ASSIGN(const int messages, CountLoadMessages(server_->address(), ref_, tiny));
    EXPECT_EQ(messages, at_minimum) << "max_message_bytes " << tiny;
  }
}

TEST_F(LoaderServiceTest, BackToBackStreamsFitOneSlot) {
  LoaderServiceOptions options;
  options.max_concurrent_streams = 1;
  StartLoader(options);
  for (int i = 0; i < 30; ++i) {
    ASSERT_OK(loader_->Load(ref_, LoadTarget()).status()) << "load " << i;
  }
}

TEST(RemoteLoaderTest, ConnectToNothingIsUnavailableNamingTheAddress) {
  RemoteLoaderOptions options;
  options.address = "127.0.0.1:1";
  options.connect_timeout = absl::Milliseconds(200);
  EXPECT_THAT(RemoteLoader::Connect(options).status(),
              StatusIs(absl::StatusCode::kUnavailable, "127.0.0.1:1"));
}

// 64 MiB in four 16 MiB tensors: 16 distinct 4 MiB chunks.
class ConcurrentReadersTest : public LoaderServiceTest {
 protected:
  void SetUp() override {
    LoaderServiceTest::SetUp();
    CheckpointContents contents;
    for (int i = 0; i < 4; ++i) {
      at::Tensor tensor = at::arange(int64_t{4} << 20, at::kInt) + i * (int64_t{4} << 20);
      big_.push_back(tensor);
      ASSERT_OK(contents.model.Insert(absl::StrCat("layer", i, ".weight"), tensor));
    }
    ASSERT_OK_AND_ASSIGN(CommitResult committed, CommitCheckpoint(*store_, "big", contents));
    big_ref_ = committed.version;
  }

  // Runs `readers` concurrent Load streams of big@1 with the raw stub, each comparing every
  // piece with the original bytes as it arrives (so the test holds no copies); returns how many
  // readers saw every byte right.
  int ReadConcurrently(int readers) {
    std::vector<std::thread> threads;
    std::vector<int> good(readers, 0);
    for (int r = 0; r < readers; ++r) {
      threads.emplace_back([&, r] {
        // One channel per reader, as separate consumers would have.
        grpc::ChannelArguments arguments;
        arguments.SetInt("ckpt.reader", r);  // distinct arguments: a distinct connection.
        auto own = grpc::CreateCustomChannel(server_->address(), grpc::InsecureChannelCredentials(),
                                             arguments);
        auto stub = v1::Loader::NewStub(own);
        grpc::ClientContext context;
        context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(120)));
        v1::LoadRequest request;
        *request.mutable_ref() = big_ref_;
        auto stream = stub->Load(&context, request);
        v1::LoadResponse response;
        int64_t bytes = 0;
        bool right = stream->Read(&response) && response.has_manifest();
        while (right && stream->Read(&response)) {
          const v1::TensorData& data = response.data();
          const at::Tensor& original = big_[data.tensor_index()];
          right = data.offset() + static_cast<int64_t>(data.data().size()) <=
                      static_cast<int64_t>(original.nbytes()) &&
                  std::memcmp(static_cast<const char*>(original.data_ptr()) + data.offset(),
                              data.data().data(), data.data().size()) == 0;
          bytes += static_cast<int64_t>(data.data().size());
        }
        if (!right) context.TryCancel();
        const bool finished = stream->Finish().ok();
        good[r] = right && finished && bytes == (int64_t{64} << 20) ? 1 : 0;
      });
    }
    for (std::thread& thread : threads) thread.join();
    int total = 0;
    for (int g : good) total += g;
    return total;
  }

  std::vector<at::Tensor> big_;
  v1::VersionRef big_ref_;
};

TEST_F(ConcurrentReadersTest, SixteenReadersOfOneVersionShareOneCachedCopy) {
  StartLoader();  // 1 GiB cache.
  EXPECT_EQ(ReadConcurrently(16), 16);
  const ChunkCacheStats stats = service_->cache_stats();
  std::cout << "16 readers x 64 MiB, cache 1 GiB: " << stats.ToString() << std::endl;
  // Each chunk read from the store once; every other read shared that one copy.
  EXPECT_EQ(stats.misses, 16);
  EXPECT_EQ(stats.hits, 15 * 16);
  EXPECT_EQ(stats.bytes_from_store, int64_t{64} << 20);
  EXPECT_EQ(stats.resident_bytes, int64_t{64} << 20);
  EXPECT_EQ(stats.entries, 16);
}

TEST_F(ConcurrentReadersTest, CacheStaysWithinItsCapUnderSixteenReaders) {
  LoaderServiceOptions options;
  options.cache_bytes = int64_t{12} << 20;  // three chunks.
  StartLoader(options);
  EXPECT_EQ(ReadConcurrently(16), 16);
  const ChunkCacheStats stats = service_->cache_stats();
  std::cout << "16 readers x 64 MiB, cache 12 MiB: " << stats.ToString() << std::endl;
  EXPECT_LE(stats.peak_resident_bytes, int64_t{12} << 20);
  EXPECT_LE(stats.resident_bytes, int64_t{12} << 20);
  EXPECT_GT(stats.evictions, 0);
  EXPECT_EQ(stats.hits + stats.misses, 16 * 16);
}

}  // namespace
}  // namespace ckpt

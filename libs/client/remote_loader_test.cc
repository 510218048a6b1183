// RemoteLoader against a real loader service (services/loader) on 127.0.0.1, over a real RocksDB
// store: optimizer state through the stream, retries on UNAVAILABLE, deadlines, bad input.
// (Model loads, exports and the DDP fixtures are covered in services/loader/loader_service_test.)

#include "libs/client/remote_loader.h"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "ATen/core/Tensor.h"
#include "ATen/ops/equal.h"
#include "ATen/ops/full.h"
#include "ATen/ops/randn.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "gtest/gtest.h"
#include "libs/loader/testing/loader_conformance.h"
#include "libs/rpc/grpc_server.h"
#include "libs/status/status_matchers.h"
#include "libs/store/checkpoint_contents.h"
#include "libs/store/rocksdb_checkpoint_store.h"
#include "libs/store/testing/instrumented_store.h"
#include "libs/store/version_ref.h"
#include "libs/tensor/device.h"
#include "libs/tensor/dtype.h"
#include "libs/tensor/value.h"
#include "services/loader/loader_service.h"

namespace ckpt {
namespace {

using ::ckpt::testing::StatusIs;
using ::testing::ElementsAre;

class RemoteLoaderTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const char* tmp = std::getenv("TEST_TMPDIR");
    StoreOptions options;
    options.db_path = std::string(tmp != nullptr ? tmp : "/tmp") + "/" +
                      ::testing::UnitTest::GetInstance()->current_test_info()->name();
    ASSERT_OK_AND_ASSIGN(store_, RocksDbCheckpointStore::Open(options));
    weight_ = at::randn({8, 4});
    exp_avg_ = at::randn({8, 4});
    CheckpointContents contents;
    ASSERT_OK(contents.model.Insert("module.fc.weight", weight_, "cuda:1"));
    ASSERT_OK(contents.model.Insert("module.fc.steps", at::full({}, 5, at::kLong), "cuda:1"));
    Value optimizer = Value::Dict();
    optimizer.Set("state", Value::Dict({{0, Value::Dict({{"exp_avg", Value::Tensor(exp_avg_)}})}}));
    optimizer.Set("param_groups",
                  Value::List({Value::Dict(
                      {{"lr", Value::Float(0.01)}, {"params", Value::List({Value::Int(0)})}})}));
    contents.optimizer = optimizer;
    ASSERT_OK_AND_ASSIGN(CommitResult committed, CommitCheckpoint(*store_, "net", contents));
    ref_ = committed.version;
    instrumented_ = std::make_unique<InstrumentedStore>(store_.get());
    instrumented_->set_hook([this](absl::string_view method) {
      if (method == "GetManifest" && hold_manifests_.load()) release_.WaitForNotification();
    });
    ASSERT_OK_AND_ASSIGN(service_, LoaderService::Create(instrumented_.get(), {}));
    StartServer("127.0.0.1:0");
  }

  void TearDown() override {
    if (!release_.HasBeenNotified()) release_.Notify();
    StopServer();
  }

  void StartServer(const std::string& address) {
    GrpcServerOptions options;
    options.listen_address = address;
    ASSERT_OK_AND_ASSIGN(
        server_, GrpcServer::Start(options, {{service_.get(), v1::Loader::service_full_name()}}));
  }

  void StopServer() {
    if (server_ == nullptr) return;
    server_->Shutdown(absl::ZeroDuration());
    server_->Wait();
    server_.reset();
  }

  RemoteLoaderOptions ClientOptions() const {
    RemoteLoaderOptions options;
    options.address = server_->address();
    return options;
  }

  std::unique_ptr<RocksDbCheckpointStore> store_;
  // Holds the service's GetManifest calls while hold_manifests_ is set, until release_.
  std::unique_ptr<InstrumentedStore> instrumented_;
  std::atomic<bool> hold_manifests_{false};
  absl::Notification release_;
  at::Tensor weight_, exp_avg_;
  v1::VersionRef ref_;
  std::unique_ptr<LoaderService> service_;
  std::unique_ptr<GrpcServer> server_;
};

TEST_F(RemoteLoaderTest, LoadsModelAndOptimizerStateWithTheirTensors) {
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<RemoteLoader> loader,
                       RemoteLoader::Connect(ClientOptions()));
  LoadTarget target;
  target.include_optimizer = true;
  ASSERT_OK_AND_ASSIGN(LoadedState state, loader->Load(ref_, target));
  EXPECT_THAT(state.model.keys(), ElementsAre("fc.weight", "fc.steps"));
  EXPECT_TRUE(at::equal(*state.model.Find("fc.weight"), weight_));
  EXPECT_EQ(state.model.entry(0).original_device, "cuda:1");
  EXPECT_EQ(state.model.Find("fc.steps")->item<int64_t>(), 5);
  ASSERT_TRUE(state.optimizer.has_value());
  const Value* group = state.optimizer->Find("state");
  ASSERT_NE(group, nullptr);
  const Value* first = group->Find(int64_t{0});
  ASSERT_NE(first, nullptr);
  const Value* exp_avg = first->Find("exp_avg");
  ASSERT_NE(exp_avg, nullptr);
  EXPECT_TRUE(at::equal(exp_avg->tensor(), exp_avg_));
  EXPECT_FALSE(state.scheduler.has_value());

  // Without asking, no optimizer state travels.
  ASSERT_OK_AND_ASSIGN(LoadedState weights_only, loader->Load(ref_, LoadTarget()));
  EXPECT_FALSE(weights_only.optimizer.has_value());
  EXPECT_EQ(weights_only.manifest.state_tensors_size(), 0);
}

TEST_F(RemoteLoaderTest, RetriesUnavailableUntilTheServerIsBack) {
  const std::string address = server_->address();
  RemoteLoaderOptions options = ClientOptions();
  options.max_retries = 8;
  options.initial_backoff = absl::Milliseconds(50);
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<RemoteLoader> loader, RemoteLoader::Connect(options));
  StopServer();

  // Without retries the outage shows as UNAVAILABLE.
  RemoteLoaderOptions no_retries = options;
  no_retries.max_retries = 0;
  std::unique_ptr<RemoteLoader> impatient;
  {
    // Connect needs a live server; make one now and stop it again.
    StartServer(address);
    ASSERT_OK_AND_ASSIGN(impatient, RemoteLoader::Connect(no_retries));
    StopServer();
  }
  EXPECT_THAT(impatient->Load(ref_, LoadTarget()).status(),
              StatusIs(absl::StatusCode::kUnavailable, ""));

  // With retries, a server that comes back on the same address during the backoff is reached.
  std::thread restarter([&] {
    // The restart happens while the client backs off (its first attempt has nothing to reach).
    absl::SleepFor(absl::Milliseconds(300));
    StartServer(address);
  });
  absl::StatusOr<LoadedState> state = loader->Load(ref_, LoadTarget());
  restarter.join();
  ASSERT_OK(state.status());
  EXPECT_TRUE(at::equal(*state->model.Find("fc.weight"), weight_));
}

TEST_F(RemoteLoaderTest, DeadlineExceededIsReported) {
  RemoteLoaderOptions options = ClientOptions();
  options.deadline = absl::Milliseconds(300);
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<RemoteLoader> loader, RemoteLoader::Connect(options));
  hold_manifests_.store(true);  // the server's Preflight now outlasts the client's deadline.
  EXPECT_THAT(loader->Preflight(ref_, {}, LoadTarget()).status(),
              StatusIs(absl::StatusCode::kDeadlineExceeded, ""));
  release_.Notify();
}

TEST_F(RemoteLoaderTest, BadOptionsAndUnusableDevicesFailBeforeAnyCall) {
  RemoteLoaderOptions options = ClientOptions();
  options.auth_token = "two words";
  EXPECT_THAT(RemoteLoader::Connect(options).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, "auth_token"));
  options = ClientOptions();
  options.address.clear();
  EXPECT_THAT(RemoteLoader::Connect(options).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, "address"));

  ASSERT_OK_AND_ASSIGN(std::unique_ptr<RemoteLoader> loader,
                       RemoteLoader::Connect(ClientOptions()));
  LoadTarget target;
  target.device = DeviceSpec{"nosuchdevice", 0};
  EXPECT_THAT(loader->Load(ref_, target).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, "nosuchdevice"));
  if (!at::hasCUDA()) {
    // This LibTorch has no CUDA backend: refused here, before the server streams a byte.
    target.device = DeviceSpec{"cuda", 0};
    EXPECT_THAT(loader->Load(ref_, target).status(),
                StatusIs(absl::StatusCode::kFailedPrecondition, ""));
  }
}

// Checksums to the consumer: bytes damaged after the loader took their checksums (a test hook on
// the service's outgoing pieces) never reach the caller; every flip is DATA_LOSS naming the tensor.
class RemoteLoaderIntegrityTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const char* tmp = std::getenv("TEST_TMPDIR");
    StoreOptions options;
    options.db_path = std::string(tmp != nullptr ? tmp : "/tmp") + "/integrity-" +
                      ::testing::UnitTest::GetInstance()->current_test_info()->name();
    ASSERT_OK_AND_ASSIGN(store_, RocksDbCheckpointStore::Open(options));
    CheckpointContents contents;
    ASSERT_OK(contents.model.Insert("fc.weight", at::randn({8, 4}), "cpu"));
    ASSERT_OK(contents.model.Insert("fc.steps", at::full({}, 5, at::kLong), "cpu"));
    // 10 MiB: three store chunks (4 + 4 + 2 MiB), each in several 1 MiB pieces.
    ASSERT_OK(contents.model.Insert("big", at::randn({int64_t{10} << 18}), "cpu"));
    Value optimizer = Value::Dict();
    optimizer.Set("state",
                  Value::Dict({{0, Value::Dict({{"exp_avg", Value::Tensor(at::randn({8, 4}))}})}}));
    optimizer.Set("param_groups",
                  Value::List({Value::Dict(
                      {{"lr", Value::Float(0.01)}, {"params", Value::List({Value::Int(0)})}})}));
    contents.optimizer = optimizer;
    ASSERT_OK_AND_ASSIGN(CommitResult committed, CommitCheckpoint(*store_, "net", contents));
    ref_ = committed.version;
    LoaderServiceOptions service_options;
    service_options.tamper_for_testing = [this](const LoaderServiceOptions::OutgoingPiece& piece,
                                                absl::Span<char> bytes) {
      absl::MutexLock lock(&mu_);
      newest_stream_ = std::max(newest_stream_, piece.stream);
      // Only streams started after FlipNext: the stream of the previous trial, which the client
      // cancelled at its DATA_LOSS, may still be sending its next pieces.
      if (!flip_.has_value() || piece.stream < flip_->stream ||
          flip_->export_file != piece.export_file ||
          (!piece.export_file && flip_->tensor_index != piece.tensor_index) ||
          flip_->offset < piece.offset ||
          flip_->offset >= piece.offset + static_cast<int64_t>(bytes.size())) {
        return;
      }
      bytes[flip_->offset - piece.offset] ^= static_cast<char>(1 << (flip_->offset % 8));
      ++flipped_;
    };
    ASSERT_OK_AND_ASSIGN(service_, LoaderService::Create(store_.get(), service_options));
    ASSERT_OK_AND_ASSIGN(
        server_, GrpcServer::Start({}, {{service_.get(), v1::Loader::service_full_name()}}));
    RemoteLoaderOptions client;
    client.address = server_->address();
    ASSERT_OK_AND_ASSIGN(loader_, RemoteLoader::Connect(client));
  }

  void TearDown() override {
    loader_.reset();
    server_->Shutdown(absl::ZeroDuration());
    server_->Wait();
  }

  // The next stream flips one bit of byte `offset` of tensor `index` (or of the file).
  void FlipNext(int index, int64_t offset, bool export_file = false) {
    absl::MutexLock lock(&mu_);
    flip_ = LoaderServiceOptions::OutgoingPiece{newest_stream_ + 1, export_file, index, offset};
  }
  int64_t flipped() {
    absl::MutexLock lock(&mu_);
    return flipped_;
  }

  // Loads with `target` once cleanly, then once per byte of `offsets_of(tensor)` with that byte
  // flipped; expects each damaged load to fail with DATA_LOSS naming the tensor (and, with
  // chunk refs, the chunk). Returns the number of flips tried.
  int ExpectEveryFlipCaught(const LoadTarget& target,
                            const std::function<std::vector<int64_t>(int64_t)>& offsets_of) {
    absl::StatusOr<LoadedState> clean = loader_->Load(ref_, target);
    EXPECT_OK(clean.status());
    if (!clean.ok()) return 0;
    const v1::Manifest& manifest = clean->manifest;
    std::vector<const v1::TensorMeta*> metas;
    for (const v1::TensorMeta& meta : manifest.tensors()) metas.push_back(&meta);
    for (const v1::TensorMeta& meta : manifest.state_tensors()) metas.push_back(&meta);
    int trials = 0;
    for (size_t i = 0; i < metas.size(); ++i) {
      const v1::TensorMeta& meta = *metas[i];
      for (int64_t offset : offsets_of(meta.byte_length())) {
        FlipNext(static_cast<int>(i), offset);
        const int64_t before = flipped();
        absl::Status status = loader_->Load(ref_, target).status();
        EXPECT_EQ(flipped(), before + 1) << meta.key() << " byte " << offset << " was not sent";
        std::string expected = absl::StrCat("tensor '", meta.key(), "' of net@");
        if (meta.chunks_size() > 0) {
          absl::StrAppend(&expected, ref_.version(), ": chunk ", offset / (int64_t{4} << 20));
        }
        EXPECT_THAT(status, StatusIs(absl::StatusCode::kDataLoss, expected))
            << meta.key() << " byte " << offset;
        ++trials;
      }
    }
    FlipNext(-1, 0);  // nothing.
    EXPECT_OK(loader_->Load(ref_, target).status());
    return trials;
  }

  // Every byte of small tensors; 12 spread over a large one.
  static std::vector<int64_t> Offsets(int64_t length) {
    std::vector<int64_t> offsets;
    if (length <= 1024) {
      for (int64_t i = 0; i < length; ++i) offsets.push_back(i);
    } else {
      for (int64_t i = 0; i < 12; ++i) offsets.push_back((length - 1) * i / 11);
    }
    return offsets;
  }

  std::unique_ptr<RocksDbCheckpointStore> store_;
  v1::VersionRef ref_;
  std::unique_ptr<LoaderService> service_;
  std::unique_ptr<GrpcServer> server_;
  std::unique_ptr<RemoteLoader> loader_;
  absl::Mutex mu_;
  std::optional<LoaderServiceOptions::OutgoingPiece> flip_ ABSL_GUARDED_BY(mu_);
  int64_t flipped_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t newest_stream_ ABSL_GUARDED_BY(mu_) = -1;  // the highest stream a piece came from.
};

TEST_F(RemoteLoaderIntegrityTest, EveryFlipOfBytesSentAsStoredIsCaught) {
  LoadTarget target;
  target.include_optimizer = true;
  const int trials = ExpectEveryFlipCaught(target, Offsets);
  EXPECT_EQ(trials, 128 + 8 + 12 + 128);
}

TEST_F(RemoteLoaderIntegrityTest, EveryFlipOfBytesTheLoaderCastIsCaught) {
  LoadTarget target;
  target.dtype = *DTypePolicy::CastFloatingTo(DType::kBFloat16);
  target.include_optimizer = true;
  // fc.weight and big are cast (TensorDigest); fc.steps and the optimizer state go as stored.
  const int trials = ExpectEveryFlipCaught(target, Offsets);
  EXPECT_EQ(trials, 64 + 8 + 12 + 128);
}

TEST_F(RemoteLoaderIntegrityTest, EveryFlipOfAnExportIsCaughtAndNoFileIsLeft) {
  const std::string path = std::string(std::getenv("TEST_TMPDIR")) + "/flipped.safetensors";
  for (const ExportFormat format : {ExportFormat::kSafetensors, ExportFormat::kTorch}) {
    ExportOptions options;
    options.format = format;
    options.target.include_keys = {"fc.weight", "fc.steps"};
    FlipNext(0, -1, /*export_file=*/true);  // nothing.
    ASSERT_OK_AND_ASSIGN(ExportResult clean, loader_->Export(ref_, options, path));
    const int64_t size = static_cast<int64_t>(clean.file_bytes);
    ASSERT_TRUE(std::filesystem::remove(path));
    // Every 3rd byte of the file, header and tensor bytes alike.
    for (int64_t offset = 0; offset < size; offset += 3) {
      FlipNext(0, offset, /*export_file=*/true);
      const int64_t before = flipped();
      EXPECT_THAT(loader_->Export(ref_, options, path).status(),
                  StatusIs(absl::StatusCode::kDataLoss,
                           absl::StrCat("the Export stream of net@", ref_.version())))
          << "byte " << offset << " of " << size;
      EXPECT_EQ(flipped(), before + 1);
      EXPECT_FALSE(std::filesystem::exists(path)) << "byte " << offset;
    }
  }
}

// A client built before checksums sends no send_digests: it gets only manifests and data, as
// before, and the new chunk refs in the manifest are fields it may ignore.
TEST_F(RemoteLoaderIntegrityTest, ClientsThatDoNotAskGetNoDigests) {
  std::shared_ptr<grpc::Channel> channel =
      grpc::CreateChannel(server_->address(), grpc::InsecureChannelCredentials());
  std::unique_ptr<v1::Loader::Stub> stub = v1::Loader::NewStub(channel);
  for (const bool ask : {false, true}) {
    v1::LoadRequest request;
    *request.mutable_ref() = ref_;
    request.mutable_target()->set_cast_floating_to(v1::DTYPE_FLOAT16);
    request.set_send_digests(ask);
    grpc::ClientContext context;
    std::unique_ptr<grpc::ClientReader<v1::LoadResponse>> reader = stub->Load(&context, request);
    v1::LoadResponse response;
    int manifests = 0, digests = 0;
    int64_t bytes = 0;
    while (reader->Read(&response)) {
      if (response.has_manifest()) {
        ++manifests;
        for (const v1::TensorMeta& meta : response.manifest().tensors()) {
          // Cast tensors lose the stored chunk refs; fc.steps (int64) keeps them.
          EXPECT_EQ(meta.chunks_size() > 0, meta.key() == "fc.steps") << meta.key();
        }
      }
      if (response.has_data()) bytes += static_cast<int64_t>(response.data().data().size());
      if (response.has_digest()) ++digests;
    }
    ASSERT_TRUE(reader->Finish().ok());
    EXPECT_EQ(manifests, 1);
    EXPECT_EQ(bytes, 64 + 8 + (int64_t{10} << 19));
    EXPECT_EQ(digests, ask ? 2 : 0);  // fc.weight and big.
  }
}

// RemoteLoader runs the Loader conformance suite against a loader service over the suite's
// store: the same answers as LocalLoader, through gRPC.
class ServedLoader final : public ::ckpt::testing::LoaderHarness {
 public:
  explicit ServedLoader(CheckpointStore& store) {
    absl::StatusOr<std::unique_ptr<LoaderService>> service = LoaderService::Create(&store, {});
    EXPECT_OK(service.status());
    service_ = *std::move(service);
    GrpcServerOptions options;
    options.listen_address = "127.0.0.1:0";
    absl::StatusOr<std::unique_ptr<GrpcServer>> server =
        GrpcServer::Start(options, {{service_.get(), v1::Loader::service_full_name()}});
    EXPECT_OK(server.status());
    server_ = *std::move(server);
    RemoteLoaderOptions loader_options;
    loader_options.address = server_->address();
    absl::StatusOr<std::unique_ptr<RemoteLoader>> loader = RemoteLoader::Connect(loader_options);
    EXPECT_OK(loader.status());
    loader_ = *std::move(loader);
  }
  ~ServedLoader() override {
    loader_.reset();
    server_->Shutdown(absl::ZeroDuration());
    server_->Wait();
  }
  const Loader& loader() const override { return *loader_; }

 private:
  std::unique_ptr<LoaderService> service_;
  std::unique_ptr<GrpcServer> server_;
  std::unique_ptr<RemoteLoader> loader_;
};

}  // namespace

namespace testing {
INSTANTIATE_TEST_SUITE_P(Remote, LoaderConformanceTest,
                         ::testing::Values(LoaderConformanceParam{
                             "remote",
                             [](CheckpointStore& store) -> std::unique_ptr<LoaderHarness> {
                               return std::make_unique<ServedLoader>(store);
                             }}),
                         [](const ::testing::TestParamInfo<LoaderConformanceParam>& info) {
                           return info.param.name;
                         });
}  // namespace testing

namespace {}  // namespace
}  // namespace ckpt

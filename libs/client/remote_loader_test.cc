// RemoteLoader against a real loader service (services/loader) on 127.0.0.1, over a real RocksDB
// store: optimizer state through the stream, retries on UNAVAILABLE, deadlines, bad input.
// (Model loads, exports and the DDP fixtures are covered in services/loader/loader_service_test.)

#include "libs/client/remote_loader.h"

#include <atomic>
#include <cstdlib>
#include <memory>
#include <string>
#include <thread>

#include "ATen/ATen.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "libs/loader/testing/loader_conformance.h"
#include "libs/rpc/grpc_server.h"
#include "libs/status/status_matchers.h"
#include "libs/store/rocksdb_checkpoint_store.h"
#include "libs/store/testing/instrumented_store.h"
#include "libs/store/version_ref.h"
#include "libs/tensor/device.h"
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
    ASSERT_OK_AND_ASSIGN(CommitResult committed, store_->CommitCheckpoint("net", contents));
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

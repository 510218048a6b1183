// RemoteLoader against a fleet of real loader servers on 127.0.0.1 over one store: round-robin
// over an address list, health checks (a NOT_SERVING loader gets no calls), a load split over
// several streams (bit for bit the one-stream load, integrity checks included), and a load that
// survives the loader serving it being killed mid-stream (loader processes over a store service).

#include <signal.h>
#include <sys/stat.h>

#include <atomic>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "ATen/core/Tensor.h"
#include "ATen/ops/empty.h"
#include "ATen/ops/full.h"
#include "ATen/ops/randint.h"
#include "ATen/ops/randn.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "google/protobuf/util/message_differencer.h"
#include "grpcpp/health_check_service_interface.h"
#include "grpcpp/security/server_credentials.h"
#include "grpcpp/server.h"
#include "grpcpp/server_builder.h"
#include "gtest/gtest.h"
#include "libs/client/remote_loader.h"
#include "libs/rpc/grpc_server.h"
#include "libs/status/status_matchers.h"
#include "libs/store/checkpoint_contents.h"
#include "libs/store/rocksdb_checkpoint_store.h"
#include "libs/tensor/dtype.h"
#include "libs/tensor/value.h"
#include "libs/testing/child_process.h"
#include "services/checkpoint_store/store_service.h"
#include "services/loader/loader_service.h"

namespace ckpt {
namespace {

using ::ckpt::testing::StatusIs;
using ::testing::HasSubstr;

// The raw bytes of a CPU tensor, to compare bit for bit (NaN payloads, -0.0 included).
std::string BytesOf(const at::Tensor& tensor) {
  const at::Tensor contiguous = tensor.contiguous();
  return std::string(static_cast<const char*>(contiguous.data_ptr()), contiguous.nbytes());
}

// Every tensor of `a` and `b` (model and optimizer state) is the same bytes, dtype and shape,
// under the same keys, and the manifests are equal.
void ExpectSameState(const LoadedState& a, const LoadedState& b) {
  EXPECT_TRUE(google::protobuf::util::MessageDifferencer::Equals(a.manifest, b.manifest));
  ASSERT_EQ(a.model.keys(), b.model.keys());
  for (size_t i = 0; i < a.model.size(); ++i) {
    const at::Tensor& x = a.model.entry(i).tensor;
    const at::Tensor& y = b.model.entry(i).tensor;
    EXPECT_EQ(x.scalar_type(), y.scalar_type()) << a.model.entry(i).key;
    EXPECT_EQ(x.sizes(), y.sizes()) << a.model.entry(i).key;
    EXPECT_EQ(BytesOf(x), BytesOf(y)) << a.model.entry(i).key;
  }
  ASSERT_EQ(a.optimizer.has_value(), b.optimizer.has_value());
  if (a.optimizer.has_value()) {
    const Value* x = a.optimizer->Find("state")->Find(int64_t{0})->Find("exp_avg");
    const Value* y = b.optimizer->Find("state")->Find(int64_t{0})->Find("exp_avg");
    ASSERT_NE(x, nullptr);
    ASSERT_NE(y, nullptr);
    EXPECT_EQ(BytesOf(x->tensor()), BytesOf(y->tensor()));
  }
}

class FleetTest : public ::testing::Test {
 protected:
  void SetUp() override {
    StoreOptions options;
    options.db_path = testing::TestCaseDir() + "/store";
    std::filesystem::create_directories(testing::TestCaseDir());
    ASSERT_OK_AND_ASSIGN(store_, RocksDbCheckpointStore::Open(options));
    // Tensors of many sizes (several 1 MiB messages, a scalar, an empty one) and dtypes, so
    // that the streams' groups differ in count and bytes.
    const std::vector<int64_t> rows = {300, 7, 1, 1024, 64, 2000, 3, 512, 129, 9};
    for (size_t i = 0; i < rows.size(); ++i) {
      const std::string key = absl::StrCat("layers.", i, ".weight");
      at::Tensor tensor = at::randn({rows[i], 257});
      if (i == 4) tensor = at::randn({rows[i], 33}).to(at::kDouble);
      if (i == 6) tensor = at::randint(0, 1000, {rows[i], 5}, at::kLong);
      originals_.emplace_back(key, tensor);
      ASSERT_OK(contents_.model.Insert(key, tensor));
    }
    originals_.emplace_back("empty", at::empty({0, 4}));
    ASSERT_OK(contents_.model.Insert("empty", originals_.back().second));
    originals_.emplace_back("step", at::full({}, 7, at::kLong));
    ASSERT_OK(contents_.model.Insert("step", originals_.back().second));
    exp_avg_ = at::randn({100, 100});
    Value optimizer = Value::Dict();
    optimizer.Set("state", Value::Dict({{0, Value::Dict({{"exp_avg", Value::Tensor(exp_avg_)}})}}));
    optimizer.Set("param_groups",
                  Value::List({Value::Dict(
                      {{"lr", Value::Float(0.01)}, {"params", Value::List({Value::Int(0)})}})}));
    contents_.optimizer = optimizer;
    ASSERT_OK_AND_ASSIGN(CommitResult committed, CommitCheckpoint(*store_, "net", contents_));
    ref_ = committed.version;
  }

  void TearDown() override {
    for (auto& server : servers_) {
      server->Shutdown(absl::ZeroDuration());
      server->Wait();
    }
    for (auto& server : raw_servers_) server->Shutdown(std::chrono::system_clock::now());
  }

  // A loader server over the store; its address.
  std::string StartLoader(LoaderServiceOptions options = {}) {
    absl::StatusOr<std::unique_ptr<LoaderService>> service =
        LoaderService::Create(store_.get(), std::move(options));
    EXPECT_OK(service.status());
    services_.push_back(*std::move(service));
    absl::StatusOr<std::unique_ptr<GrpcServer>> server =
        GrpcServer::Start({}, {{services_.back().get(), v1::Loader::service_full_name()}});
    EXPECT_OK(server.status());
    servers_.push_back(*std::move(server));
    return servers_.back()->address();
  }

  // A loader server that reports ckpt.v1.Loader NOT_SERVING on grpc.health.v1 (draining) yet
  // still answers calls; its address.
  std::string StartNotServingLoader() {
    absl::StatusOr<std::unique_ptr<LoaderService>> service =
        LoaderService::Create(store_.get(), {});
    EXPECT_OK(service.status());
    services_.push_back(*std::move(service));
    grpc::EnableDefaultHealthCheckService(true);
    grpc::ServerBuilder builder;
    int port = 0;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    builder.RegisterService(services_.back().get());
    raw_servers_.push_back(builder.BuildAndStart());
    raw_servers_.back()->GetHealthCheckService()->SetServingStatus(
        std::string(v1::Loader::service_full_name()), false);
    return absl::StrCat("127.0.0.1:", port);
  }

  std::unique_ptr<RemoteLoader> Connect(const std::vector<std::string>& addresses,
                                        int streams = 1) {
    RemoteLoaderOptions options;
    options.address = absl::StrJoin(addresses, ",");
    options.streams = streams;
    options.initial_backoff = absl::Milliseconds(20);
    absl::StatusOr<std::unique_ptr<RemoteLoader>> loader = RemoteLoader::Connect(options);
    EXPECT_OK(loader.status());
    return loader.ok() ? *std::move(loader) : nullptr;
  }

  void ExpectOriginals(const LoadedState& state) {
    ASSERT_EQ(state.model.size(), originals_.size());
    for (const auto& [key, tensor] : originals_) {
      const at::Tensor* loaded = state.model.Find(key);
      ASSERT_NE(loaded, nullptr) << key;
      EXPECT_EQ(loaded->scalar_type(), tensor.scalar_type()) << key;
      EXPECT_EQ(BytesOf(*loaded), BytesOf(tensor)) << key;
    }
  }

  int64_t TotalBytes() const {
    int64_t total = 0;
    for (const auto& [key, tensor] : originals_) total += tensor.nbytes();
    return total;
  }

  std::unique_ptr<RocksDbCheckpointStore> store_;
  CheckpointContents contents_;
  std::vector<std::pair<std::string, at::Tensor>> originals_;
  at::Tensor exp_avg_;
  v1::VersionRef ref_;
  std::vector<std::unique_ptr<LoaderService>> services_;
  std::vector<std::unique_ptr<GrpcServer>> servers_;
  std::vector<std::unique_ptr<grpc::Server>> raw_servers_;
};

TEST_F(FleetTest, RoundRobinSpreadsLoadsOverEveryLoader) {
  std::vector<std::string> addresses;
  for (int i = 0; i < 3; ++i) addresses.push_back(StartLoader());
  std::unique_ptr<RemoteLoader> loader = Connect(addresses);
  ASSERT_NE(loader, nullptr);
  for (int i = 0; i < 9; ++i) {
    ASSERT_OK_AND_ASSIGN(LoadedState state, loader->Load(ref_, LoadTarget()));
    ExpectOriginals(state);
  }
  // Every loader took its share (round-robin over the ready ones; the first loads may find
  // only some connected yet).
  for (const auto& service : services_) EXPECT_GE(service->streams_started(), 2);
  EXPECT_EQ(services_[0]->streams_started() + services_[1]->streams_started() +
                services_[2]->streams_started(),
            9);
}

TEST_F(FleetTest, LoaderReportedNotServingGetsNoLoads) {
  const std::string draining = StartNotServingLoader();
  const std::string first = StartLoader();
  const std::string second = StartLoader();
  std::unique_ptr<RemoteLoader> loader = Connect({draining, first, second});
  ASSERT_NE(loader, nullptr);
  for (int i = 0; i < 6; ++i) {
    ASSERT_OK_AND_ASSIGN(LoadedState state, loader->Load(ref_, LoadTarget()));
    ExpectOriginals(state);
  }
  EXPECT_EQ(services_[0]->streams_started(), 0);
  EXPECT_EQ(services_[1]->streams_started() + services_[2]->streams_started(), 6);
}

TEST_F(FleetTest, SeveralStreamsLoadBitForBitWhatOneStreamLoads) {
  std::vector<std::string> addresses;
  for (int i = 0; i < 3; ++i) addresses.push_back(StartLoader());
  std::unique_ptr<RemoteLoader> one = Connect({addresses[0]});
  ASSERT_NE(one, nullptr);
  for (int streams : {2, 3, 4, 64}) {
    SCOPED_TRACE(absl::StrCat(streams, " streams"));
    std::unique_ptr<RemoteLoader> several = Connect(addresses, streams);
    ASSERT_NE(several, nullptr);
    for (const bool cast : {false, true}) {
      LoadTarget target;
      target.include_optimizer = true;
      target.keys = KeyPolicy::AddPrefix("module.");
      if (cast) {
        ASSERT_OK_AND_ASSIGN(target.dtype, DTypePolicy::CastFloatingTo(DType::kBFloat16));
      }
      ASSERT_OK_AND_ASSIGN(LoadedState expected, one->Load(ref_, target));
      ASSERT_OK_AND_ASSIGN(LoadedState loaded, several->Load(ref_, target));
      ExpectSameState(expected, loaded);
      EXPECT_EQ(loaded.model.Find("module.layers.1.weight")->scalar_type(),
                cast ? at::kBFloat16 : at::kFloat);
    }
    // The manifest alone, then one stream per group (no more groups than tensors: 13).
    const int64_t groups = std::min(streams, 13);
    EXPECT_EQ(several->counters().load_streams, 2 * (1 + groups));
    EXPECT_EQ(several->counters().resumed_streams, 0);
  }
  ASSERT_OK_AND_ASSIGN(LoadedState plain, Connect(addresses, 3)->Load(ref_, LoadTarget()));
  ExpectOriginals(plain);
}

TEST_F(FleetTest, CorruptPieceInOneOfSeveralStreamsIsDataLossNamingTheTensor) {
  // Loaders that flip a bit of tensor 5 ("layers.5.weight", 2 MB; byte 500000 of it, stored or
  // cast) in every stream that sends it, after its checksums were taken.
  LoaderServiceOptions options;
  options.tamper_for_testing = [](const LoaderServiceOptions::OutgoingPiece& piece,
                                  absl::Span<char> bytes) {
    constexpr int64_t kOffset = 500000;
    if (!piece.export_file && piece.tensor_index == 5 && piece.offset <= kOffset &&
        kOffset < piece.offset + static_cast<int64_t>(bytes.size())) {
      bytes[kOffset - piece.offset] ^= 0x10;
    }
  };
  std::vector<std::string> addresses;
  for (int i = 0; i < 2; ++i) addresses.push_back(StartLoader(options));
  for (int streams : {1, 3}) {
    std::unique_ptr<RemoteLoader> loader = Connect(addresses, streams);
    ASSERT_NE(loader, nullptr);
    // As stored: the chunk digests catch it; cast: the loader's TensorDigest does.
    LoadTarget cast;
    ASSERT_OK_AND_ASSIGN(cast.dtype, DTypePolicy::CastFloatingTo(DType::kFloat16));
    for (const LoadTarget& target : {LoadTarget(), cast}) {
      EXPECT_THAT(loader->Load(ref_, target).status(),
                  StatusIs(absl::StatusCode::kDataLoss, HasSubstr("layers.5.weight")))
          << streams << " streams";
    }
  }
}

// Two loaders; the first stream to reach tensor 5 stalls there (after tensors 0-4 went out)
// while its loader shuts down with a grace period (as services/loader/main.cc does on SIGTERM),
// and is still running past the grace. gRPC then cuts the call off by closing the connection,
// which the client sees as UNAVAILABLE (not CANCELLED, which is kept for its own cancellation),
// so it resumes the rest on the other loader.
TEST_F(FleetTest, LoaderDrainedMidLoadHandsTheRestToAnotherLoader) {
  absl::Notification stalled;
  absl::Notification released;
  std::atomic<bool> stalled_once{false};
  std::atomic<int> stalled_loader{-1};
  std::vector<std::string> addresses;
  for (int i = 0; i < 2; ++i) {
    LoaderServiceOptions options;
    options.tamper_for_testing = [&, i](const LoaderServiceOptions::OutgoingPiece& piece,
                                        absl::Span<char>) {
      if (piece.export_file || piece.tensor_index != 5 || stalled_once.exchange(true)) return;
      stalled_loader = i;
      stalled.Notify();
      released.WaitForNotification();
    };
    addresses.push_back(StartLoader(std::move(options)));
  }
  std::unique_ptr<RemoteLoader> loader = Connect(addresses);
  ASSERT_NE(loader, nullptr);
  absl::StatusOr<LoadedState> loaded;
  std::thread load([&] { loaded = loader->Load(ref_, LoadTarget()); });
  const bool stalled_in_time = stalled.WaitForNotificationWithTimeout(absl::Seconds(60));
  int drained = 0;
  std::thread shutdown;
  if (stalled_in_time) {
    drained = stalled_loader.load();
    const absl::Duration grace = absl::Milliseconds(300);
    shutdown = std::thread([this, drained, grace] { servers_[drained]->Shutdown(grace); });
    // The handler is held until the client has resumed on the other loader, which it does only
    // once the drain cut the stream at the end of the grace: releasing it after a fixed sleep
    // could let the stream finish normally on a slow machine (the shutdown thread may start
    // late), and the test would then fail without the client being at fault.
    const absl::Time give_up = absl::Now() + absl::Seconds(60);
    while (services_[1 - drained]->streams_started() == 0 && absl::Now() < give_up) {
      absl::SleepFor(absl::Milliseconds(20));
    }
  }
  released.Notify();  // on every path, so the load thread and the shutdown can finish.
  load.join();
  if (shutdown.joinable()) shutdown.join();
  ASSERT_TRUE(stalled_in_time) << "no stream reached tensor 5 within 60 s";
  ASSERT_OK(loaded.status());
  ExpectOriginals(*loaded);
  EXPECT_GE(loader->counters().resumed_streams, 1);
  EXPECT_EQ(services_[1 - drained]->streams_started(), 1);
}

// Three loader processes over one store service; the first stream to reach tensor 5 stalls
// there (after tensors 0-4 went out) until the test kills its process with SIGKILL.
class KilledLoaderTest : public FleetTest, public ::testing::WithParamInterface<int> {};

TEST_P(KilledLoaderTest, LoadFinishesOnTheOtherLoadersWithCorrectBytes) {
  const int streams = GetParam();
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<StoreService> store_service,
                       StoreService::Create(store_.get(), {}));
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<GrpcServer> store_server,
                       GrpcServer::Start({}, {{store_service.get(), "ckpt.v1.CheckpointStore"}}));
  const std::string dir = testing::TestCaseDir();
  const std::string marker = dir + "/stalled";
  std::vector<std::unique_ptr<testing::ChildProcess>> loaders;
  std::vector<std::string> addresses;
  for (int i = 0; i < 3; ++i) {
    const std::string loader_dir = absl::StrCat(dir, "/loader", i);
    std::filesystem::create_directories(loader_dir);
    loaders.push_back(std::make_unique<testing::ChildProcess>(
        testing::RunfilesPath("services/loader/tampering_loader"), loader_dir));
    ASSERT_TRUE(loaders.back()->Start({"--store=" + store_server->address(),
                                       "--port_file=" + loader_dir + "/port",
                                       "--stall_marker=" + marker, "--stall_tensor=5"}));
    const int port = loaders.back()->WaitForPort(loader_dir + "/port", absl::Seconds(60));
    ASSERT_GT(port, 0) << loaders.back()->stderr_text();
    addresses.push_back(absl::StrCat("127.0.0.1:", port));
  }
  std::unique_ptr<RemoteLoader> loader = Connect(addresses, streams);
  ASSERT_NE(loader, nullptr);
  absl::StatusOr<LoadedState> loaded;
  std::thread load([&] { loaded = loader->Load(ref_, LoadTarget()); });
  // Which loader stalled, once tensors 0-4 are in.
  int64_t before_stall = 0;
  for (int i = 0; i < 5; ++i) before_stall += originals_[i].second.nbytes();
  std::string pid_text;
  const absl::Time give_up = absl::Now() + absl::Seconds(60);
  while (absl::Now() < give_up) {
    pid_text = testing::ReadFileOrEmpty(marker);
    if (!pid_text.empty() && (streams > 1 || loader->counters().tensor_bytes >= before_stall)) {
      break;
    }
    absl::SleepFor(absl::Milliseconds(10));
  }
  int pid = 0;
  ASSERT_TRUE(absl::SimpleAtoi(absl::StripAsciiWhitespace(pid_text), &pid)) << pid_text;
  bool killed = false;
  for (auto& child : loaders) {
    if (child->pid() == pid) {
      child->Signal(SIGKILL);
      killed = true;
    }
  }
  ASSERT_TRUE(killed);
  load.join();
  ASSERT_OK(loaded.status());
  ExpectOriginals(*loaded);
  EXPECT_GE(loader->counters().resumed_streams, 1);
  if (streams == 1) {
    // Resumed from tensor 5: no tensor arrived twice.
    EXPECT_EQ(loader->counters().tensor_bytes, TotalBytes());
  }
  store_server->Shutdown(absl::ZeroDuration());
  store_server->Wait();
}

INSTANTIATE_TEST_SUITE_P(Streams, KilledLoaderTest, ::testing::Values(1, 3));

}  // namespace
}  // namespace ckpt

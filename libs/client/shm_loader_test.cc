// SharedMemoryLoader against a real ShmLoaderServer and a real gRPC loader service on 127.0.0.1,
// over a real RocksDB store: the bytes LocalLoader gives (as stored and cast), pack corruption,
// the fallback to gRPC, uid refusal, descriptor hygiene and clients that go away, plus the
// conformance suite every Loader runs.

#include "libs/client/shm_loader.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "ATen/TensorOperators.h"
#include "ATen/core/Tensor.h"
#include "ATen/ops/empty.h"
#include "ATen/ops/equal.h"
#include "ATen/ops/full.h"
#include "ATen/ops/randn.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "libs/client/remote_loader.h"
#include "libs/loader/local_loader.h"
#include "libs/loader/shm_server.h"
#include "libs/loader/shm_wire.h"
#include "libs/loader/testing/loader_conformance.h"
#include "libs/rpc/grpc_server.h"
#include "libs/status/status_matchers.h"
#include "libs/store/checkpoint_contents.h"
#include "libs/store/rocksdb_checkpoint_store.h"
#include "libs/tensor/device.h"
#include "libs/tensor/dtype.h"
#include "libs/tensor/value.h"
#include "libs/testing/requirements.h"
#include "services/loader/loader_service.h"

namespace ckpt {
namespace {

using ::ckpt::testing::StatusIs;
using ::testing::HasSubstr;
using ::testing::Not;

// A directory short enough for sun_path (TEST_TMPDIR under Bazel is not), removed at the end.
class ShortTempDir {
 public:
  ShortTempDir() {
    char pattern[] = "/tmp/ckpt-shm-XXXXXX";
    path_ = mkdtemp(pattern);
  }
  ~ShortTempDir() {
    std::error_code ignored;
    std::filesystem::remove_all(path_, ignored);
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

int OpenFdCount() {
  int count = 0;
  DIR* dir = opendir("/proc/self/fd");
  while (dirent* entry = readdir(dir)) {
    if (entry->d_name[0] != '.') ++count;
  }
  closedir(dir);
  return count - 1;  // the directory's own descriptor.
}

// A log that remembers its lines.
struct Lines {
  absl::Mutex mu;
  std::vector<std::string> lines;
  std::function<void(absl::string_view)> sink() {
    return [this](absl::string_view line) {
      absl::MutexLock lock(&mu);
      lines.emplace_back(line);
    };
  }
};

class SharedMemoryLoaderTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const char* tmp = std::getenv("TEST_TMPDIR");
    StoreOptions options;
    options.db_path = std::string(tmp != nullptr ? tmp : "/tmp") + "/" +
                      ::testing::UnitTest::GetInstance()->current_test_info()->name();
    ASSERT_OK_AND_ASSIGN(store_, RocksDbCheckpointStore::Open(options));
    // Over one 4 MiB chunk, so some tensors have several; small ones; a deduplicated twin.
    weight_ = at::randn({(5 << 20) / 4 + 123});
    CheckpointContents contents;
    ASSERT_OK(contents.model.Insert("module.w32", weight_, "cuda:0"));
    ASSERT_OK(contents.model.Insert("module.twin", weight_.clone(), "cuda:0"));
    ASSERT_OK(contents.model.Insert("module.wbf16", at::randn({300, 1000}).to(at::kBFloat16), ""));
    ASSERT_OK(contents.model.Insert("module.wf16", at::randn({37, 3}).to(at::kHalf), ""));
    ASSERT_OK(contents.model.Insert("module.steps", at::full({}, 5, at::kLong), ""));
    ASSERT_OK(contents.model.Insert("module.empty", at::empty({0, 4}), ""));
    Value optimizer = Value::Dict();
    optimizer.Set(
        "state",
        Value::Dict({{0, Value::Dict({{"exp_avg", Value::Tensor(at::randn({64, 64}))}})}}));
    optimizer.Set("param_groups",
                  Value::List({Value::Dict(
                      {{"lr", Value::Float(0.01)}, {"params", Value::List({Value::Int(0)})}})}));
    contents.optimizer = optimizer;
    ASSERT_OK_AND_ASSIGN(CommitResult committed, CommitCheckpoint(*store_, "net", contents));
    ref_ = committed.version;

    ASSERT_OK_AND_ASSIGN(service_, LoaderService::Create(store_.get(), {}));
    GrpcServerOptions grpc;
    grpc.listen_address = "127.0.0.1:0";
    ASSERT_OK_AND_ASSIGN(
        grpc_server_, GrpcServer::Start(grpc, {{service_.get(), v1::Loader::service_full_name()}}));
    ShmServerOptions shm;
    shm.socket_path = socket_path();
    shm.cache = &service_->cache();  // as services/loader/main.cc shares it.
    ASSERT_OK_AND_ASSIGN(shm_server_, ShmLoaderServer::Start(store_.get(), shm));
  }

  void TearDown() override {
    if (shm_server_ != nullptr) shm_server_->Shutdown();
    grpc_server_->Shutdown(absl::ZeroDuration());
    grpc_server_->Wait();
  }

  std::string socket_path() const { return dir_.path() + "/loader.sock"; }

  LoaderClientOptions ClientOptions() {
    LoaderClientOptions options;
    options.address = grpc_server_->address();
    options.shm_socket = socket_path();
    options.log = log_.sink();
    return options;
  }

  std::unique_ptr<SharedMemoryLoader> OpenShm() {
    absl::StatusOr<std::unique_ptr<Loader>> loader = OpenLoaderClient(ClientOptions());
    EXPECT_OK(loader.status());
    if (!loader.ok()) return nullptr;
    auto* shm = dynamic_cast<SharedMemoryLoader*>(loader->get());
    EXPECT_NE(shm, nullptr) << "OpenLoaderClient chose gRPC";
    if (shm == nullptr) return nullptr;
    loader->release();
    return std::unique_ptr<SharedMemoryLoader>(shm);
  }

  ShortTempDir dir_;
  std::unique_ptr<RocksDbCheckpointStore> store_;
  at::Tensor weight_;
  v1::VersionRef ref_;
  std::unique_ptr<LoaderService> service_;
  std::unique_ptr<GrpcServer> grpc_server_;
  std::unique_ptr<ShmLoaderServer> shm_server_;
  Lines log_;
};

void ExpectSameState(const LoadedState& expected, const LoadedState& actual) {
  ASSERT_EQ(expected.model.keys(), actual.model.keys());
  for (const std::string& key : expected.model.keys()) {
    const at::Tensor& want = *expected.model.Find(key);
    const at::Tensor& got = *actual.model.Find(key);
    EXPECT_EQ(want.scalar_type(), got.scalar_type()) << key;
    EXPECT_EQ(want.sizes(), got.sizes()) << key;
    EXPECT_TRUE(at::equal(want, got)) << key;
  }
  ASSERT_EQ(expected.optimizer.has_value(), actual.optimizer.has_value());
  if (expected.optimizer.has_value()) {
    const at::Tensor want = expected.optimizer->Find("state")->Find(0)->Find("exp_avg")->tensor();
    const at::Tensor got = actual.optimizer->Find("state")->Find(0)->Find("exp_avg")->tensor();
    EXPECT_TRUE(at::equal(want, got));
  }
}

TEST_F(SharedMemoryLoaderTest, GivesLocalLoadersBytesAsStoredAndCast) {
  std::unique_ptr<SharedMemoryLoader> shm = OpenShm();
  ASSERT_NE(shm, nullptr);
  LocalLoader local(*store_);
  std::vector<LoadTarget> targets(4);
  targets[0].include_optimizer = true;
  targets[1].dtype = *DTypePolicy::CastFloatingTo(DType::kBFloat16);
  targets[2].dtype = *DTypePolicy::CastFloatingTo(DType::kFloat16);
  targets[3].dtype = *DTypePolicy::CastFloatingTo(DType::kFloat32);
  targets[3].keys = KeyPolicy::AddPrefix("module.");
  for (const LoadTarget& target : targets) {
    ASSERT_OK_AND_ASSIGN(LoadedState want, local.Load(ref_, target));
    ASSERT_OK_AND_ASSIGN(LoadedState got, shm->Load(ref_, target));
    ExpectSameState(want, got);
  }
  EXPECT_EQ(shm->counters().shm_loads, 4);
  EXPECT_EQ(shm->counters().fallback_loads, 0);
  const ShmServerCounters served = shm_server_->counters();
  // The float32 tensor came from its pack as it lies (only bf16 / fp16 casts leave it alone).
  EXPECT_GE(served.in_place_bytes, 2 * weight_.nbytes());
  // Casts and the deduplicated twin were written into memfds.
  EXPECT_GE(served.copied_bytes, weight_.nbytes());
}

// Copies into the memfd read through the loader's chunk cache, the one its gRPC service reads
// through: a second cast load of the same version reads nothing more from the store.
TEST_F(SharedMemoryLoaderTest, CopiesReadThroughTheLoadersChunkCache) {
  std::unique_ptr<SharedMemoryLoader> shm = OpenShm();
  ASSERT_NE(shm, nullptr);
  LoadTarget cast;
  cast.dtype = *DTypePolicy::CastFloatingTo(DType::kBFloat16);
  ASSERT_OK_AND_ASSIGN(LoadedState first, shm->Load(ref_, cast));
  const ChunkCacheStats after_first = service_->cache_stats();
  EXPECT_GT(after_first.misses, 0) << after_first.ToString();
  EXPECT_GT(after_first.bytes_from_store, static_cast<int64_t>(weight_.nbytes()));
  ASSERT_OK_AND_ASSIGN(LoadedState second, shm->Load(ref_, cast));
  const ChunkCacheStats after_second = service_->cache_stats();
  EXPECT_EQ(after_second.bytes_from_store, after_first.bytes_from_store)
      << after_second.ToString();
  EXPECT_GT(after_second.hits, after_first.hits) << after_second.ToString();
  ExpectSameState(first, second);
}

TEST_F(SharedMemoryLoaderTest, TensorsAreWritableAndPrivate) {
  std::unique_ptr<SharedMemoryLoader> shm = OpenShm();
  ASSERT_NE(shm, nullptr);
  ASSERT_OK_AND_ASSIGN(LoadedState first, shm->Load(ref_, LoadTarget()));
  at::Tensor w32 = *first.model.Find("w32");
  w32.add_(1.0);  // a private copy of the touched pages; the pack never changes.
  EXPECT_TRUE(at::equal(*first.model.Find("twin"), weight_));
  ASSERT_OK_AND_ASSIGN(LoadedState second, shm->Load(ref_, LoadTarget()));
  EXPECT_TRUE(at::equal(*second.model.Find("w32"), weight_));
  EXPECT_TRUE(at::equal(w32, weight_ + 1.0));
}

TEST_F(SharedMemoryLoaderTest, CorruptChunkInAPackIsDataLoss) {
  std::unique_ptr<SharedMemoryLoader> shm = OpenShm();
  ASSERT_NE(shm, nullptr);
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<VersionReader> reader, store_->OpenVersion(ref_));
  const v1::TensorMeta* meta = nullptr;
  for (const v1::TensorMeta& tensor : reader->manifest().tensors()) {
    if (tensor.key() == "w32") meta = &tensor;
  }
  ASSERT_NE(meta, nullptr);
  ASSERT_GE(meta->chunks_size(), 2);
  ASSERT_OK_AND_ASSIGN(std::optional<VersionReader::FileRegion> region,
                       reader->LocateTensorBytes(*meta));
  ASSERT_TRUE(region.has_value());
  // One byte of the second chunk, flipped in the pack file itself.
  const int64_t at = region->offset + meta->chunks(0).length() + 1000;
  const int fd = open(region->path.c_str(), O_RDWR);
  ASSERT_GE(fd, 0);
  char byte;
  ASSERT_EQ(pread(fd, &byte, 1, at), 1);
  byte ^= 0x40;
  ASSERT_EQ(pwrite(fd, &byte, 1, at), 1);
  close(fd);
  // w32 alone: its twin shares the damaged chunk, and the loader's own read of the twin (which
  // it copies) would report it first.
  LoadTarget as_stored;
  as_stored.include_keys = {"w32"};
  EXPECT_THAT(shm->Load(ref_, as_stored),
              StatusIs(absl::StatusCode::kDataLoss,
                       ::testing::AllOf(HasSubstr("tensor 'w32'"), HasSubstr("chunk 1 of 2"))));
  // Cast on the loader, it is the store's read that finds it.
  LoadTarget cast = as_stored;
  cast.dtype = *DTypePolicy::CastFloatingTo(DType::kBFloat16);
  EXPECT_THAT(shm->Load(ref_, cast), StatusIs(absl::StatusCode::kDataLoss, HasSubstr("w32")));
}

TEST_F(SharedMemoryLoaderTest, NoSocketFallsBackToGrpcAndSaysSoOnce) {
  LoaderClientOptions options = ClientOptions();
  options.shm_socket = dir_.path() + "/absent.sock";  // as on another host
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Loader> loader, OpenLoaderClient(options));
  EXPECT_NE(dynamic_cast<RemoteLoader*>(loader.get()), nullptr);
  ASSERT_OK_AND_ASSIGN(LoadedState state, loader->Load(ref_, LoadTarget()));
  EXPECT_TRUE(at::equal(*state.model.Find("w32"), weight_));
  {
    absl::MutexLock lock(&log_.mu);
    ASSERT_EQ(log_.lines.size(), 1u);
    EXPECT_THAT(log_.lines[0], HasSubstr("absent.sock"));
    EXPECT_THAT(log_.lines[0], HasSubstr("over gRPC"));
  }
  EXPECT_EQ(shm_server_->counters().answers, 0);
}

TEST_F(SharedMemoryLoaderTest, SocketGoneAfterConnectFallsBackPerLoad) {
  std::unique_ptr<SharedMemoryLoader> shm = OpenShm();
  ASSERT_NE(shm, nullptr);
  shm_server_->Shutdown();  // a loader restarted without --shm_socket
  for (int i = 0; i < 2; ++i) {
    ASSERT_OK_AND_ASSIGN(LoadedState state, shm->Load(ref_, LoadTarget()));
    EXPECT_TRUE(at::equal(*state.model.Find("w32"), weight_));
  }
  EXPECT_EQ(shm->counters().fallback_loads, 2);
  absl::MutexLock lock(&log_.mu);
  EXPECT_EQ(log_.lines.size(), 1u);
}

TEST_F(SharedMemoryLoaderTest, UidNotAdmittedIsPermissionDenied) {
  ShmServerOptions options;
  options.socket_path = dir_.path() + "/strangers.sock";
  options.admit_own_uid = false;  // this process plays a uid the loader does not admit
  options.allowed_uids = {static_cast<uid_t>(geteuid() + 4242)};
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<ShmLoaderServer> server,
                       ShmLoaderServer::Start(store_.get(), options));
  SharedMemoryLoaderOptions shm;
  shm.socket_path = options.socket_path;
  EXPECT_THAT(SharedMemoryLoader::Probe(shm),
              StatusIs(absl::StatusCode::kPermissionDenied,
                       HasSubstr(absl::StrCat("uid ", geteuid(), " may not load"))));
  // A Load request sent anyway is refused before the version is looked at.
  {
    UniqueFd socket_fd(socket(AF_UNIX, SOCK_STREAM, 0));
    sockaddr_un address{};
    address.sun_family = AF_UNIX;
    std::strcpy(address.sun_path, options.socket_path.c_str());
    ASSERT_EQ(connect(socket_fd.get(), reinterpret_cast<sockaddr*>(&address), sizeof(address)), 0);
    v1::ShmRequest request;
    *request.mutable_load()->mutable_ref() = ref_;
    // The server answers without reading it and may have closed already (then this is EPIPE).
    (void)SendFrame(socket_fd.get(), request.SerializeAsString(), {});
    std::string bytes;
    std::vector<UniqueFd> fds;
    ASSERT_OK(ReceiveFrame(socket_fd.get(), kMaxShmFrameBytes, bytes, fds));
    v1::ShmAnswer answer;
    ASSERT_TRUE(answer.ParseFromString(bytes));
    EXPECT_EQ(answer.code(), static_cast<int>(absl::StatusCode::kPermissionDenied));
    EXPECT_TRUE(fds.empty());
    EXPECT_FALSE(answer.has_manifest());
  }
  EXPECT_EQ(server->counters().refused, 2);
  // The factory falls back to gRPC, whose own access policy applies.
  LoaderClientOptions client = ClientOptions();
  client.shm_socket = options.socket_path;
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Loader> loader, OpenLoaderClient(client));
  EXPECT_NE(dynamic_cast<RemoteLoader*>(loader.get()), nullptr);
  absl::MutexLock lock(&log_.mu);
  ASSERT_EQ(log_.lines.size(), 1u);
  EXPECT_THAT(log_.lines[0], HasSubstr("may not load"));
}

// A connected socket to `path`, or an invalid one.
UniqueFd ConnectTo(const std::string& path) {
  UniqueFd socket_fd(socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  std::strcpy(address.sun_path, path.c_str());
  if (connect(socket_fd.get(), reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0) {
    return UniqueFd();
  }
  return socket_fd;
}

// A stranger's uid is checked as soon as it is accepted: it gets its PERMISSION_DENIED at once,
// whether it sends nothing, a header promising a huge frame, or a whole request, and the server
// reads none of it (it holds no connection slot while it dawdles).
TEST_F(SharedMemoryLoaderTest, StrangerIsRefusedBeforeItsRequestIsRead) {
  ShmServerOptions options;
  options.socket_path = dir_.path() + "/strangers.sock";
  options.admit_own_uid = false;
  options.io_timeout = absl::Seconds(60);  // a server that waited for the request would hang
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<ShmLoaderServer> server,
                       ShmLoaderServer::Start(store_.get(), options));
  v1::ShmRequest request;
  *request.mutable_load()->mutable_ref() = ref_;
  const std::string frame = request.SerializeAsString();
  for (int sends : {0, 1, 2}) {
    SCOPED_TRACE(absl::StrCat("sends ", sends));
    UniqueFd peer = ConnectTo(options.socket_path);
    ASSERT_TRUE(peer.valid());
    ASSERT_OK(SetSocketTimeouts(peer.get(), absl::Seconds(5)));
    bool request_sent = false;
    if (sends == 1) {
      const char huge[4] = {0, 0, 0, 0x40};  // 1 GiB announced, never sent.
      (void)send(peer.get(), huge, sizeof(huge), MSG_NOSIGNAL);
    } else if (sends == 2) {
      // The server may have answered and closed already (then this is EPIPE).
      request_sent = SendFrame(peer.get(), frame, {}).ok();
    }
    std::string bytes;
    std::vector<UniqueFd> fds;
    ASSERT_OK(ReceiveFrame(peer.get(), kMaxShmFrameBytes, bytes, fds));
    v1::ShmAnswer answer;
    ASSERT_TRUE(answer.ParseFromString(bytes));
    EXPECT_EQ(answer.code(), static_cast<int>(absl::StatusCode::kPermissionDenied));
    EXPECT_THAT(answer.message(), HasSubstr(absl::StrCat("uid ", geteuid(), " may not load")));
    EXPECT_TRUE(fds.empty());
    // Then closed. A request that reached the server's socket was never read: closing a Unix
    // socket with unread bytes resets the peer instead of an orderly end.
    char byte;
    const ssize_t got = recv(peer.get(), &byte, 1, 0);
    if (request_sent) {
      EXPECT_EQ(got, -1);
      EXPECT_EQ(errno, ECONNRESET);
    } else {
      EXPECT_LE(got, 0);
    }
  }
  EXPECT_EQ(server->counters().refused, 3);
  EXPECT_EQ(server->active_connections(), 0);
}

// A request is bounded by what a real one needs (kMaxShmRequestBytes): an admitted peer that
// announces more is answered at once, its bytes never read; a client with a larger request goes
// to the gRPC loader without asking the socket.
TEST_F(SharedMemoryLoaderTest, OversizedRequestIsRefusedUnreadAndLoadsOverGrpc) {
  UniqueFd peer = ConnectTo(socket_path());
  ASSERT_TRUE(peer.valid());
  ASSERT_OK(SetSocketTimeouts(peer.get(), absl::Seconds(5)));  // the server's io_timeout is 30 s
  const uint32_t announced = static_cast<uint32_t>(kMaxShmRequestBytes) + 1;
  const char header[4] = {
      static_cast<char>(announced & 0xff), static_cast<char>((announced >> 8) & 0xff),
      static_cast<char>((announced >> 16) & 0xff), static_cast<char>((announced >> 24) & 0xff)};
  ASSERT_EQ(send(peer.get(), header, sizeof(header), MSG_NOSIGNAL), 4);
  std::string bytes;
  std::vector<UniqueFd> fds;
  ASSERT_OK(ReceiveFrame(peer.get(), kMaxShmFrameBytes, bytes, fds));
  v1::ShmAnswer answer;
  ASSERT_TRUE(answer.ParseFromString(bytes));
  // RESOURCE_EXHAUSTED: a client with a larger cap falls back to gRPC on it.
  EXPECT_EQ(answer.code(), static_cast<int>(absl::StatusCode::kResourceExhausted));
  EXPECT_THAT(answer.message(), HasSubstr(absl::StrCat("at most ", kMaxShmRequestBytes)));

  std::unique_ptr<SharedMemoryLoader> shm = OpenShm();
  ASSERT_NE(shm, nullptr);
  LoadTarget target;
  // Some 1.2 MB of request: 400,000 times the prefix "w" (3 bytes each on the wire).
  target.include_prefixes.assign(400000, "w");
  // The server counts an answer after sending it: wait until it has finished with the earlier
  // connections (the refused one, OpenShm's hello), so none is counted after the baseline.
  for (int i = 0; i < 1000 && shm_server_->active_connections() > 0; ++i) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  const int64_t answers = shm_server_->counters().answers;
  ASSERT_OK_AND_ASSIGN(LoadedState state, shm->Load(ref_, target));
  EXPECT_TRUE(at::equal(*state.model.Find("w32"), weight_));
  EXPECT_EQ(shm->counters().fallback_loads, 1);
  EXPECT_EQ(shm_server_->counters().answers, answers);
}

// Peers of an admitted uid that trickle a request a byte at a time hold their connection only
// until its deadline (io_timeout for the whole request, not per byte); a good client then gets
// served although the trickle goes on.
TEST_F(SharedMemoryLoaderTest, SlowLorisDoesNotBlockAGoodClient) {
  ShmServerOptions options;
  options.socket_path = dir_.path() + "/loris.sock";
  options.max_connections = 2;
  options.io_timeout = absl::Seconds(1);
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<ShmLoaderServer> server,
                       ShmLoaderServer::Start(store_.get(), options));
  std::atomic<bool> stop{false};
  std::vector<std::thread> lorises;
  for (int i = 0; i < options.max_connections; ++i) {
    lorises.emplace_back([&] {
      UniqueFd peer = ConnectTo(options.socket_path);
      if (!peer.valid()) return;
      const char header[4] = {static_cast<char>(200), 0, 0, 0};
      if (send(peer.get(), header, sizeof(header), MSG_NOSIGNAL) != 4) return;
      // A byte every 100 ms for up to 20 s: every single recv is quick.
      for (int n = 0; n < 200 && !stop.load(); ++n) {
        if (send(peer.get(), "x", 1, MSG_NOSIGNAL) != 1) return;  // cut off
        absl::SleepFor(absl::Milliseconds(100));
      }
    });
  }
  for (int i = 0; i < 500 && server->active_connections() < options.max_connections; ++i) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  EXPECT_EQ(server->active_connections(), options.max_connections);
  SharedMemoryLoaderOptions good;
  good.socket_path = options.socket_path;
  const absl::Time start = absl::Now();
  absl::Status probed;
  do {
    probed = SharedMemoryLoader::Probe(good);
    if (!probed.ok()) absl::SleepFor(absl::Milliseconds(50));
  } while (!probed.ok() && absl::Now() - start < absl::Seconds(10));
  const absl::Duration waited = absl::Now() - start;
  stop = true;
  for (std::thread& loris : lorises) loris.join();
  // A loris cut off after the probe succeeded is counted when its thread ends.
  for (int i = 0; i < 1000 && server->active_connections() > 0; ++i) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  EXPECT_OK(probed);
  EXPECT_LT(waited, absl::Seconds(5));
  EXPECT_GE(server->counters().broken, options.max_connections);
}

// Whoever holds the socket path decides every byte served, so the client checks the server's
// uid: a socket served by another (untrusted) uid is refused before anything is sent.
TEST_F(SharedMemoryLoaderTest, SocketServedByAnUntrustedUidIsRefused) {
  CKPT_REQUIRE(geteuid() == 0, "root, to serve a socket as another uid (65534)");
  const std::string dir = dir_.path() + "/open";
  ASSERT_EQ(chmod(dir_.path().c_str(), 0711), 0);  // mkdtemp's 0700 would shut the impostor out
  ASSERT_EQ(mkdir(dir.c_str(), 0777), 0);
  ASSERT_EQ(chmod(dir.c_str(), 0777), 0);
  const std::string path = dir + "/impostor.sock";
  int ready[2];
  ASSERT_EQ(pipe(ready), 0);
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {  // only system calls from here: the parent has threads.
    close(ready[0]);
    if (setgid(65534) != 0 || setuid(65534) != 0) _exit(2);
    const int listener = socket(AF_UNIX, SOCK_STREAM, 0);
    sockaddr_un address{};
    address.sun_family = AF_UNIX;
    std::memcpy(address.sun_path, path.c_str(), path.size() + 1);
    if (bind(listener, reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0 ||
        listen(listener, 4) != 0) {
      _exit(3);
    }
    if (write(ready[1], "r", 1) != 1) _exit(4);
    for (;;) pause();
  }
  close(ready[1]);
  char byte = 0;
  ASSERT_EQ(read(ready[0], &byte, 1), 1) << "the impostor could not listen";
  close(ready[0]);
  SharedMemoryLoaderOptions options;
  options.socket_path = path;
  EXPECT_THAT(SharedMemoryLoader::Probe(options),
              StatusIs(absl::StatusCode::kPermissionDenied, HasSubstr("runs as uid 65534")));
  options.trusted_server_uids = {65534};
  // Trusted now: the check passes, and the impostor, which never answers, times out.
  options.timeout = absl::Milliseconds(200);
  EXPECT_THAT(SharedMemoryLoader::Probe(options),
              Not(StatusIs(absl::StatusCode::kPermissionDenied)));
  kill(child, SIGKILL);
  waitpid(child, nullptr, 0);
}

TEST_F(SharedMemoryLoaderTest, DescriptorsAreClosedOnceTheStateIsDropped) {
  std::unique_ptr<SharedMemoryLoader> shm = OpenShm();
  ASSERT_NE(shm, nullptr);
  LoadTarget cast;  // packs and a memfd both
  cast.dtype = *DTypePolicy::CastFloatingTo(DType::kBFloat16);
  cast.include_optimizer = true;
  // The server lives in this process too: its connection threads close their sockets after the
  // client has read its answer, so descriptors are counted with the server idle.
  const auto idle_fd_count = [&] {
    for (int i = 0; i < 500 && shm_server_->active_connections() > 0; ++i)
      absl::SleepFor(absl::Milliseconds(10));
    return OpenFdCount();
  };
  const auto load_all = [&] {
    ASSERT_OK_AND_ASSIGN(LoadedState kept, shm->Load(ref_, LoadTarget()));
    ASSERT_OK_AND_ASSIGN(LoadedState cast_state, shm->Load(ref_, cast));
    EXPECT_TRUE(at::equal(*kept.model.Find("w32"), weight_));
    // Not found: an error answer passes nothing.
    v1::VersionRef missing = ref_;
    missing.set_version(99);
    EXPECT_THAT(shm->Load(missing, LoadTarget()), StatusIs(absl::StatusCode::kNotFound));
  };
  // First use opens what the in-process store keeps open (its table files, the pack
  // descriptors it caches for reads); after that, loads must leave the count where it was.
  load_all();
  const int before = idle_fd_count();
  for (int i = 0; i < 3; ++i) load_all();
  EXPECT_EQ(idle_fd_count(), before);
  EXPECT_EQ(shm->counters().shm_loads, 8);
}

TEST_F(SharedMemoryLoaderTest, ServerSurvivesClientsThatLeaveMidAnswer) {
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  std::strcpy(address.sun_path, socket_path().c_str());
  v1::ShmRequest request;
  *request.mutable_load()->mutable_ref() = ref_;
  request.mutable_load()->mutable_target()->set_cast_floating_to(v1::DTYPE_BFLOAT16);
  const std::string frame = request.SerializeAsString();
  for (int i = 0; i < 20; ++i) {
    UniqueFd socket_fd(socket(AF_UNIX, SOCK_STREAM, 0));
    ASSERT_EQ(connect(socket_fd.get(), reinterpret_cast<sockaddr*>(&address), sizeof(address)), 0);
    if (i % 2 == 0) {
      // The whole request, then gone before the answer (or with it half read).
      ASSERT_OK(SendFrame(socket_fd.get(), frame, {}));
      if (i % 4 == 0) {
        char two[2];
        (void)recv(socket_fd.get(), two, sizeof(two), 0);
      }
    } else {
      // Half a request.
      const char header[4] = {static_cast<char>(frame.size() & 0xff),
                              static_cast<char>((frame.size() >> 8) & 0xff), 0, 0};
      ASSERT_EQ(send(socket_fd.get(), header, sizeof(header), MSG_NOSIGNAL), 4);
      ASSERT_EQ(send(socket_fd.get(), frame.data(), frame.size() / 2, MSG_NOSIGNAL),
                static_cast<ssize_t>(frame.size() / 2));
    }
  }
  std::unique_ptr<SharedMemoryLoader> shm = OpenShm();
  ASSERT_NE(shm, nullptr);
  ASSERT_OK_AND_ASSIGN(LoadedState state, shm->Load(ref_, LoadTarget()));
  EXPECT_TRUE(at::equal(*state.model.Find("w32"), weight_));
  EXPECT_GE(shm_server_->counters().broken, 10);
}

TEST_F(SharedMemoryLoaderTest, DeviceIsCheckedBeforeTheSocket) {
  std::unique_ptr<SharedMemoryLoader> shm = OpenShm();
  ASSERT_NE(shm, nullptr);
  LoadTarget target;
  target.device = DeviceSpec{"nosuchdevice", 0};
  EXPECT_FALSE(shm->Load(ref_, target).ok());
  // The server counts an answer after sending it: wait until it is idle.
  for (int i = 0; i < 500 && shm_server_->active_connections() > 0; ++i) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  const int64_t answers = shm_server_->counters().answers;
  EXPECT_EQ(answers, 1);  // the hello only
}

// The conformance suite over a loader service, its shared-memory socket and OpenLoaderClient.
class ServedShmLoader final : public testing::LoaderHarness {
 public:
  explicit ServedShmLoader(CheckpointStore& store) {
    absl::StatusOr<std::unique_ptr<LoaderService>> service = LoaderService::Create(&store, {});
    EXPECT_OK(service.status());
    service_ = *std::move(service);
    GrpcServerOptions options;
    options.listen_address = "127.0.0.1:0";
    absl::StatusOr<std::unique_ptr<GrpcServer>> server =
        GrpcServer::Start(options, {{service_.get(), v1::Loader::service_full_name()}});
    EXPECT_OK(server.status());
    server_ = *std::move(server);
    ShmServerOptions shm;
    shm.socket_path = dir_.path() + "/loader.sock";
    shm.cache = &service_->cache();
    absl::StatusOr<std::unique_ptr<ShmLoaderServer>> shm_server =
        ShmLoaderServer::Start(&store, shm);
    EXPECT_OK(shm_server.status());
    shm_server_ = *std::move(shm_server);
    LoaderClientOptions client;
    client.address = server_->address();
    client.shm_socket = shm.socket_path;
    absl::StatusOr<std::unique_ptr<Loader>> loader = OpenLoaderClient(client);
    EXPECT_OK(loader.status());
    loader_ = *std::move(loader);
    EXPECT_NE(dynamic_cast<SharedMemoryLoader*>(loader_.get()), nullptr);
  }
  ~ServedShmLoader() override {
    loader_.reset();
    shm_server_->Shutdown();
    server_->Shutdown(absl::ZeroDuration());
    server_->Wait();
  }
  const Loader& loader() const override { return *loader_; }

 private:
  ShortTempDir dir_;
  std::unique_ptr<LoaderService> service_;
  std::unique_ptr<GrpcServer> server_;
  std::unique_ptr<ShmLoaderServer> shm_server_;
  std::unique_ptr<Loader> loader_;
};

}  // namespace

namespace testing {
INSTANTIATE_TEST_SUITE_P(SharedMemory, LoaderConformanceTest,
                         ::testing::Values(LoaderConformanceParam{
                             "shm",
                             [](CheckpointStore& store) -> std::unique_ptr<LoaderHarness> {
                               return std::make_unique<ServedShmLoader>(store);
                             }}),
                         [](const ::testing::TestParamInfo<LoaderConformanceParam>& info) {
                           return info.param.name;
                         });
}  // namespace testing

}  // namespace ckpt

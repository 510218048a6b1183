#include "libs/client/remote_checkpoint_store.h"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "ATen/core/Tensor.h"
#include "ATen/ops/arange.h"
#include "ATen/ops/empty.h"
#include "ATen/ops/full.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "google/protobuf/util/message_differencer.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "gtest/gtest.h"
#include "libs/rpc/grpc_server.h"
#include "libs/status/status_matchers.h"
#include "libs/store/audited_store.h"
#include "libs/store/checkpoint_contents.h"
#include "libs/store/rocksdb_checkpoint_store.h"
#include "libs/store/testing/instrumented_store.h"
#include "libs/store/testing/store_conformance.h"
#include "libs/store/version_ref.h"
#include "libs/tensor/state_dict.h"
#include "libs/tensor/value.h"
#include "proto/grpc/health/v1/health.grpc.pb.h"
#include "services/checkpoint_store/store_service.h"

namespace ckpt {
namespace {

using ::ckpt::testing::StatusIs;
using ::google::protobuf::util::MessageDifferencer;
using ::grpc::health::v1::HealthCheckRequest;
using ::grpc::health::v1::HealthCheckResponse;
using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

using ::ckpt::testing::AdamState;
using ::ckpt::testing::ExpectSameTensor;
using ::ckpt::testing::kMiB;
using ::ckpt::testing::Ref;
using ::ckpt::testing::Seeded;
using ::ckpt::testing::StepLrState;

// A DDP-wrapped model of mixed dtypes whose first tensor (4.7 MiB) spans two store chunks, with
// Adam state, a StepLR scheduler and extra bundle entries.
CheckpointContents FullCheckpoint(uint64_t seed) {
  const at::Tensor encoder_weight = Seeded({1200, 1024}, seed);
  const at::Tensor encoder_bias = Seeded({1024}, seed + 1);
  const at::Tensor head_weight = Seeded({10, 1024}, seed + 2).to(at::kHalf);
  const at::Tensor head_bias = Seeded({10}, seed + 3).to(at::kBFloat16);
  CheckpointContents contents;
  EXPECT_OK(contents.model.Insert("module.encoder.weight", encoder_weight));
  EXPECT_OK(contents.model.Insert("module.encoder.bias", encoder_bias));
  EXPECT_OK(contents.model.Insert("module.head.weight", head_weight));
  EXPECT_OK(contents.model.Insert("module.head.bias", head_bias));
  EXPECT_OK(contents.model.Insert("module.bn.num_batches_tracked",
                                  at::full({}, static_cast<int64_t>(seed), at::kLong)));
  EXPECT_OK(contents.model.Insert("module.mask", Seeded({33}, seed + 4).gt(0)));
  EXPECT_OK(contents.model.Insert("module.codebook",
                                  at::arange(257, at::kInt).remainder(251).to(at::kByte)));
  EXPECT_OK(contents.model.Insert("module.empty", at::empty({0, 4})));
  contents.optimizer =
      AdamState({encoder_weight, encoder_bias, head_weight, head_bias}, /*step=*/100, seed);
  contents.optimizer_param_names = {{0, "module.encoder.weight"},
                                    {1, "module.encoder.bias"},
                                    {2, "module.head.weight"},
                                    {3, "module.head.bias"}};
  contents.scheduler = StepLrState(static_cast<int64_t>(seed));
  Value extra = Value::Dict();
  extra.Set("epoch", Value::Int(7));
  extra.Set("rng_state", Value::Tensor(at::arange(16, at::kInt).to(at::kByte)));
  contents.extra = extra;
  contents.metadata.set_epoch(7);
  contents.metadata.set_global_step(7000);
  (*contents.metadata.mutable_metrics())["loss"] = 0.25;
  return contents;
}

CheckpointContents SmallCheckpoint(uint64_t seed) {
  CheckpointContents contents;
  EXPECT_OK(contents.model.Insert("fc.weight", Seeded({16, 8}, seed)));
  EXPECT_OK(contents.model.Insert("fc.bias", Seeded({16}, seed + 1)));
  return contents;
}

// The canonical key of a "module."-prefixed key.
std::string Canonical(const std::string& key) {
  return key.rfind("module.", 0) == 0 ? key.substr(7) : key;
}

void ExpectSameCheckpoint(const CheckpointContents& loaded, const CheckpointContents& original) {
  ASSERT_EQ(loaded.model.size(), original.model.size());
  for (size_t i = 0; i < original.model.size(); ++i) {
    const StateDict::Entry& expected = original.model.entry(i);
    const StateDict::Entry& actual = loaded.model.entry(i);
    EXPECT_EQ(actual.key, Canonical(expected.key));
    ExpectSameTensor(actual.tensor, expected.tensor, expected.key);
  }
  ASSERT_EQ(loaded.optimizer.has_value(), original.optimizer.has_value());
  if (original.optimizer.has_value()) {
    EXPECT_TRUE(*loaded.optimizer == *original.optimizer);
  }
  ASSERT_EQ(loaded.scheduler.has_value(), original.scheduler.has_value());
  if (original.scheduler.has_value()) {
    EXPECT_TRUE(*loaded.scheduler == *original.scheduler);
  }
  EXPECT_TRUE(loaded.extra == original.extra);
  EXPECT_EQ(loaded.metadata.epoch(), original.metadata.epoch());
  EXPECT_EQ(loaded.metadata.global_step(), original.metadata.global_step());
}

// A header for one float32 tensor "w" of `floats` elements.
v1::Manifest OneTensorHeader(int64_t floats) {
  v1::Manifest header;
  v1::TensorMeta* meta = header.add_tensors();
  meta->set_key("w");
  meta->set_dtype(v1::DTYPE_FLOAT32);
  meta->add_shape(floats);
  meta->set_byte_length(floats * 4);
  return header;
}

std::string Bytes(int64_t size, char seed) {
  std::string bytes(size, '\0');
  for (int64_t i = 0; i < size; ++i) bytes[i] = static_cast<char>(seed + i * 31 + (i >> 12));
  return bytes;
}

// Polls `condition` until it holds or `timeout` passes (for effects that land asynchronously
// on the server, such as an abandoned session being destroyed).
template <typename Condition>
bool Eventually(Condition condition, absl::Duration timeout = absl::Seconds(10)) {
  const absl::Time deadline = absl::Now() + timeout;
  while (absl::Now() < deadline) {
    if (condition()) return true;
    absl::SleepFor(absl::Milliseconds(5));
  }
  return condition();
}

class RemoteCheckpointStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const char* tmp = std::getenv("TEST_TMPDIR");
    StoreOptions options;
    options.db_path = std::string(tmp != nullptr ? tmp : "/tmp") + "/" +
                      ::testing::UnitTest::GetInstance()->current_test_info()->name();
    options.abandoned_upload_grace = absl::ZeroDuration();
    ASSERT_OK_AND_ASSIGN(local_, RocksDbCheckpointStore::Open(options));
    instrumented_ = std::make_unique<InstrumentedStore>(local_.get());
    instrumented_->set_hook([this](absl::string_view method) {
      if (method == "GetStats" && hold_get_stats_.load()) release_get_stats_.WaitForNotification();
    });
  }

  void TearDown() override {
    if (!release_get_stats_.HasBeenNotified()) release_get_stats_.Notify();
    StopServer();
  }

  void StartServer(const std::string& token = "") {
    StoreServiceOptions options;
    options.auth_token = token;
    options.worker_threads = 4;
    ASSERT_OK_AND_ASSIGN(service_, StoreService::Create(instrumented_.get(), options));
    ASSERT_OK_AND_ASSIGN(
        server_,
        GrpcServer::Start({}, {{service_.get(), v1::CheckpointStore::service_full_name()}}));
  }

  void StopServer(absl::Duration grace = absl::ZeroDuration()) {
    if (server_ != nullptr) {
      server_->Shutdown(grace);
      server_->Wait();
    }
    server_.reset();
    service_.reset();
  }

  RemoteStoreOptions Options(const std::string& token = "") const {
    RemoteStoreOptions options;
    options.address = server_->address();
    options.auth_token = token;
    options.deadline = absl::Seconds(20);
    options.connect_timeout = absl::Seconds(5);
    options.initial_backoff = absl::Milliseconds(20);
    return options;
  }

  std::unique_ptr<RemoteCheckpointStore> MustConnect(const std::string& token = "") {
    absl::StatusOr<std::unique_ptr<RemoteCheckpointStore>> remote =
        RemoteCheckpointStore::Connect(Options(token));
    EXPECT_OK(remote.status());
    return remote.ok() ? *std::move(remote) : nullptr;
  }

  grpc::Status CheckHealth(HealthCheckResponse* response) const {
    auto channel = grpc::CreateChannel(server_->address(), grpc::InsecureChannelCredentials());
    auto stub = grpc::health::v1::Health::NewStub(channel);
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(5)));
    HealthCheckRequest request;
    request.set_service(v1::CheckpointStore::service_full_name());
    return stub->Check(&context, request, response);
  }

  std::unique_ptr<RocksDbCheckpointStore> local_;
  std::unique_ptr<InstrumentedStore> instrumented_;
  std::unique_ptr<StoreService> service_;
  std::unique_ptr<GrpcServer> server_;
  std::atomic<bool> hold_get_stats_{false};
  absl::Notification release_get_stats_;
};

TEST_F(RemoteCheckpointStoreTest, ReadsTensorsOutOfOrderRepeatedAndChunkByChunk) {
  StartServer();
  std::unique_ptr<RemoteCheckpointStore> remote = MustConnect();
  ASSERT_NE(remote, nullptr);
  const CheckpointContents original = FullCheckpoint(2);
  ASSERT_OK(CommitCheckpoint(*remote, "m", original).status());

  ASSERT_OK_AND_ASSIGN(std::unique_ptr<VersionReader> reader, remote->OpenVersion(Ref("m")));
  EXPECT_EQ(reader->manifest().version(), 1);
  // Behind, ahead and repeated reads, by key and by meta.
  for (const char* key : {"head.bias", "encoder.weight", "encoder.weight", "module.missing", "mask",
                          "encoder.bias"}) {
    absl::StatusOr<at::Tensor> tensor = ReadTensor(*reader, key);
    const at::Tensor* expected = original.model.Find(absl::StrCat("module.", key));
    if (expected == nullptr) {
      EXPECT_THAT(tensor, StatusIs(absl::StatusCode::kNotFound, "module.missing"));
      continue;
    }
    ASSERT_OK(tensor.status()) << key;
    ExpectSameTensor(*tensor, *expected, key);
  }
  const v1::TensorMeta& state = reader->manifest().state_tensors(0);
  ASSERT_OK_AND_ASSIGN(at::Tensor from_wire, ReadTensor(*reader, state));
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<VersionReader> disk, local_->OpenVersion(Ref("m@1")));
  ASSERT_OK_AND_ASSIGN(at::Tensor from_disk, ReadTensor(*disk, state.key()));
  ExpectSameTensor(from_wire, from_disk, state.key());

  // One callback per verified 4 MiB store chunk, at its offset.
  const v1::TensorMeta& big = reader->manifest().tensors(0);
  ASSERT_EQ(big.byte_length(), 1200 * 1024 * 4);
  std::vector<std::pair<int64_t, size_t>> pieces;
  ASSERT_OK(reader->ReadTensorChunks(big, [&](int64_t offset, absl::string_view bytes) {
    pieces.emplace_back(offset, bytes.size());
    return absl::OkStatus();
  }));
  EXPECT_THAT(pieces,
              ElementsAre(std::make_pair(int64_t{0}, size_t{4 * kMiB}),
                          std::make_pair(int64_t{4 * kMiB}, size_t{1200 * 1024 * 4 - 4 * kMiB})));
  // A callback's error stops the read and comes back unchanged.
  EXPECT_THAT(reader->ReadTensorChunks(
                  big, [](int64_t, absl::string_view) { return absl::AbortedError("enough"); }),
              StatusIs(absl::StatusCode::kAborted, "enough"));

  // Reading by chunk list outside a version is not something the wire offers.
  EXPECT_THAT(
      remote->ReadTensorChunks(big, [](int64_t, absl::string_view) { return absl::OkStatus(); }),
      StatusIs(absl::StatusCode::kUnimplemented, "OpenVersion"));
}

TEST_F(RemoteCheckpointStoreTest, RequiresTheConfiguredBearerTokenButHealthStaysOpen) {
  StartServer("s3cret-token");
  HealthCheckResponse health;
  ASSERT_TRUE(CheckHealth(&health).ok());
  EXPECT_EQ(health.status(), HealthCheckResponse::SERVING);

  // "s3cret-tokeX" and "S3cret-token" are as long as the right token: a comparison of lengths
  // or of a prefix would let them in.
  for (const std::string token :
       {"", "wrong-token", "s3cret-tokenX", "s3cret-toke", "s3cret-tokeX", "S3cret-token"}) {
    std::unique_ptr<RemoteCheckpointStore> remote = MustConnect(token);
    ASSERT_NE(remote, nullptr);
    EXPECT_THAT(remote->GetStats(), StatusIs(absl::StatusCode::kUnauthenticated)) << token;
    EXPECT_THAT(remote->ListModels(), StatusIs(absl::StatusCode::kUnauthenticated)) << token;
    EXPECT_THAT(remote->SetAlias("m", "a", 1), StatusIs(absl::StatusCode::kUnauthenticated));
    EXPECT_THAT(CommitCheckpoint(*remote, "m", SmallCheckpoint(1)),
                StatusIs(absl::StatusCode::kUnauthenticated));
    EXPECT_THAT(remote->OpenVersion(Ref("m")), StatusIs(absl::StatusCode::kUnauthenticated));
  }
  std::unique_ptr<RemoteCheckpointStore> remote = MustConnect("s3cret-token");
  ASSERT_NE(remote, nullptr);
  ASSERT_OK(CommitCheckpoint(*remote, "m", SmallCheckpoint(1)).status());
  ASSERT_OK_AND_ASSIGN(LoadedCheckpoint loaded, LoadCheckpoint(*remote, Ref("m")));
  ExpectSameCheckpoint(loaded.contents, SmallCheckpoint(1));
  ASSERT_OK_AND_ASSIGN(v1::StoreStats stats, remote->GetStats());
  EXPECT_EQ(stats.versions(), 1);
}

TEST_F(RemoteCheckpointStoreTest, AbandonedUploadLeavesNoVersionAndGcReclaimsIt) {
  StartServer();
  std::unique_ptr<RemoteCheckpointStore> remote = MustConnect();
  ASSERT_NE(remote, nullptr);
  const int64_t floats = 3 * kMiB / 2;  // 6 MiB: one full chunk stored before the cancel.
  const std::string bytes = Bytes(floats * 4, 7);
  {
    ASSERT_OK_AND_ASSIGN(std::unique_ptr<UploadSession> session,
                         remote->BeginUpload("abandoned", OneTensorHeader(floats), {}));
    ASSERT_OK(session->AddTensorData(0, 0, absl::string_view(bytes).substr(0, 5 * kMiB)));
    ASSERT_OK_AND_ASSIGN(v1::StoreStats stats, remote->GetStats());
    EXPECT_EQ(stats.uploads_in_progress(), 1);
    // A remote AddTensorData returns once the bytes are sent; wait until the server stored them.
    EXPECT_TRUE(Eventually([&] { return instrumented_->uploaded_bytes() == 5 * kMiB; }));
  }  // Destroyed mid-way: the stream is cancelled.
  EXPECT_TRUE(Eventually([&] {
    absl::StatusOr<v1::StoreStats> stats = local_->GetStats();
    return stats.ok() && stats->uploads_in_progress() == 0;
  }));
  EXPECT_THAT(remote->ListVersions("abandoned"), StatusIs(absl::StatusCode::kNotFound));
  ASSERT_OK_AND_ASSIGN(v1::GarbageCollectResponse collected, remote->GarbageCollect(false));
  EXPECT_EQ(collected.abandoned_uploads_reclaimed(), 1);
  EXPECT_EQ(collected.bytes_freed(), 4 * kMiB);
}

TEST_F(RemoteCheckpointStoreTest, ConcurrentReadersOfOneVersionSeeTheSameBytes) {
  StartServer();
  std::unique_ptr<RemoteCheckpointStore> remote = MustConnect();
  ASSERT_NE(remote, nullptr);
  const CheckpointContents original = FullCheckpoint(3);
  ASSERT_OK(CommitCheckpoint(*remote, "m", original).status());
  std::vector<std::thread> readers;
  for (int r = 0; r < 4; ++r) {
    readers.emplace_back([&] {
      absl::StatusOr<LoadedCheckpoint> loaded = LoadCheckpoint(*remote, Ref("m@1"));
      ASSERT_OK(loaded.status());
      ExpectSameCheckpoint(loaded->contents, original);
    });
  }
  for (std::thread& reader : readers) reader.join();
}

TEST_F(RemoteCheckpointStoreTest, ShutdownAbortsAnUnfinishedUploadLeavingNothing) {
  StartServer();
  std::unique_ptr<RemoteCheckpointStore> remote = MustConnect();
  ASSERT_NE(remote, nullptr);
  const int64_t floats = kMiB;
  const std::string bytes = Bytes(floats * 4, 3);
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<UploadSession> session,
                       remote->BeginUpload("m", OneTensorHeader(floats), {}));
  ASSERT_OK(session->AddTensorData(0, 0, absl::string_view(bytes).substr(0, 2 * kMiB)));
  // The grace passes without a commit: the server cancels the upload.
  StopServer(absl::Milliseconds(200));
  absl::Status late =
      session->AddTensorData(0, 2 * kMiB, absl::string_view(bytes).substr(2 * kMiB));
  if (late.ok()) late = session->Commit().status();
  EXPECT_FALSE(late.ok());
  session.reset();
  EXPECT_THAT(local_->ListVersions("m"), StatusIs(absl::StatusCode::kNotFound));
  ASSERT_OK_AND_ASSIGN(v1::StoreStats stats, local_->GetStats());
  EXPECT_EQ(stats.uploads_in_progress(), 0);
  EXPECT_EQ(stats.versions(), 0);
}

TEST_F(RemoteCheckpointStoreTest, ShutdownLetsAnUploadCommitWithinTheGrace) {
  StartServer();
  std::unique_ptr<RemoteCheckpointStore> remote = MustConnect();
  ASSERT_NE(remote, nullptr);
  const int64_t floats = kMiB;
  const std::string bytes = Bytes(floats * 4, 5);
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<UploadSession> session,
                       remote->BeginUpload("m", OneTensorHeader(floats), {}));
  ASSERT_OK(session->AddTensorData(0, 0, absl::string_view(bytes).substr(0, 2 * kMiB)));
  std::thread shutdown([this] { server_->Shutdown(absl::Seconds(15)); });
  // Shutdown has begun once health stops answering SERVING.
  EXPECT_TRUE(Eventually([&] {
    HealthCheckResponse health;
    return !CheckHealth(&health).ok() || health.status() != HealthCheckResponse::SERVING;
  }));
  absl::Status finished =
      session->AddTensorData(0, 2 * kMiB, absl::string_view(bytes).substr(2 * kMiB));
  absl::StatusOr<CommitResult> committed =
      finished.ok() ? session->Commit() : absl::StatusOr<CommitResult>(finished);
  shutdown.join();
  StopServer();
  // Either the whole version, or nothing: never a partial one.
  EXPECT_OK(committed.status());
  if (committed.ok()) {
    ASSERT_OK_AND_ASSIGN(std::unique_ptr<VersionReader> reader, local_->OpenVersion(Ref("m@1")));
    std::string read;
    ASSERT_OK(reader->ReadTensorChunks(reader->manifest().tensors(0),
                                       [&](int64_t, absl::string_view piece) {
                                         read.append(piece.data(), piece.size());
                                         return absl::OkStatus();
                                       }));
    EXPECT_TRUE(read == bytes);
  } else {
    EXPECT_THAT(local_->ListVersions("m"), StatusIs(absl::StatusCode::kNotFound));
  }
}

TEST_F(RemoteCheckpointStoreTest, SlowServerCallSurfacesDeadlineExceeded) {
  StartServer();
  RemoteStoreOptions options = Options();
  options.deadline = absl::Milliseconds(300);
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<RemoteCheckpointStore> remote,
                       RemoteCheckpointStore::Connect(options));
  hold_get_stats_.store(true);
  EXPECT_THAT(remote->GetStats(), StatusIs(absl::StatusCode::kDeadlineExceeded));
  release_get_stats_.Notify();
  hold_get_stats_.store(false);
  EXPECT_OK(remote->GetStats().status());
}

TEST_F(RemoteCheckpointStoreTest, UnreachableServerIsUnavailableNamingTheAddress) {
  StartServer();
  const std::string address = server_->address();
  RemoteStoreOptions options = Options();
  options.connect_timeout = absl::Milliseconds(300);
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<RemoteCheckpointStore> remote,
                       RemoteCheckpointStore::Connect(options));
  StopServer();
  // Read-only calls retry, then give up; calls that change the store never send.
  EXPECT_THAT(remote->GetStats(), StatusIs(absl::StatusCode::kUnavailable, address));
  EXPECT_THAT(remote->DeleteAlias("m", "best"), StatusIs(absl::StatusCode::kUnavailable, address));

  EXPECT_THAT(RemoteCheckpointStore::Connect(options),
              StatusIs(absl::StatusCode::kUnavailable, address));
}

TEST_F(RemoteCheckpointStoreTest, ARestartedServerIsFoundAgainWithoutErrors) {
  StartServer();
  std::unique_ptr<RemoteCheckpointStore> remote = MustConnect();
  ASSERT_NE(remote, nullptr);
  ASSERT_OK(CommitCheckpoint(*remote, "m", SmallCheckpoint(1)).status());
  const std::string address = server_->address();
  StopServer();
  // The same store served again on the same port: reads retry until the channel reconnects,
  // writes wait for it.
  StoreServiceOptions service_options;
  ASSERT_OK_AND_ASSIGN(service_, StoreService::Create(instrumented_.get(), service_options));
  GrpcServerOptions server_options;
  server_options.listen_address = address;
  ASSERT_OK_AND_ASSIGN(
      server_, GrpcServer::Start(server_options,
                                 {{service_.get(), v1::CheckpointStore::service_full_name()}}));
  ASSERT_OK_AND_ASSIGN(v1::StoreStats stats, remote->GetStats());
  EXPECT_EQ(stats.versions(), 1);
  ASSERT_OK(remote->SetAlias("m", "best", 1).status());
  ASSERT_OK_AND_ASSIGN(LoadedCheckpoint loaded, LoadCheckpoint(*remote, Ref("m@best")));
  ExpectSameCheckpoint(loaded.contents, SmallCheckpoint(1));
}

TEST_F(RemoteCheckpointStoreTest, ACommitWhoseAnswerWasLostIsSentAgainAndLandsOnce) {
  std::atomic<int> commits{0};
  instrumented_->set_commit_answer_fault([&](absl::string_view) {
    return commits.fetch_add(1) == 0 ? absl::UnavailableError("the answer was lost on its way")
                                     : absl::OkStatus();
  });
  StartServer();
  std::unique_ptr<RemoteCheckpointStore> remote = MustConnect();
  ASSERT_NE(remote, nullptr);
  // The first attempt committed version 1 and its answer was lost; CommitCheckpoint sent the
  // upload again with the same idempotency key and got version 1 back.
  ASSERT_OK_AND_ASSIGN(CommitResult committed, CommitCheckpoint(*remote, "m", SmallCheckpoint(1)));
  EXPECT_EQ(commits.load(), 2);
  EXPECT_EQ(committed.version.version(), 1);
  EXPECT_TRUE(committed.replayed);
  EXPECT_EQ(committed.new_bytes, 0);
  ASSERT_OK_AND_ASSIGN(std::vector<v1::VersionInfo> versions, local_->ListVersions("m"));
  EXPECT_EQ(versions.size(), 1u);
  ASSERT_OK_AND_ASSIGN(LoadedCheckpoint loaded, LoadCheckpoint(*remote, Ref("m@1")));
  ExpectSameCheckpoint(loaded.contents, SmallCheckpoint(1));

  // A session of the caller's own is sent once: its UNAVAILABLE is the caller's to resolve.
  commits = 0;
  ASSERT_OK_AND_ASSIGN(PreparedUpload prepared, PrepareUpload(SmallCheckpoint(2), {}));
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<UploadSession> session,
                       remote->BeginUpload("m", prepared.header, {}));
  for (size_t i = 0; i < prepared.tensors.size(); ++i) {
    const at::Tensor tensor = prepared.tensors[i].contiguous();
    ASSERT_OK(session->AddTensorData(
        static_cast<int>(i), 0,
        absl::string_view(static_cast<const char*>(tensor.data_ptr()), tensor.nbytes())));
  }
  EXPECT_THAT(session->Commit(), StatusIs(absl::StatusCode::kUnavailable, "lost on its way"));
  EXPECT_EQ(commits.load(), 1);

  // A store that stays down: the retries end within the window (connect_timeout) and say so.
  instrumented_->set_commit_answer_fault(
      [](absl::string_view) { return absl::UnavailableError("the answer was lost on its way"); });
  RemoteStoreOptions quick = Options();
  quick.connect_timeout = absl::Milliseconds(500);
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<RemoteCheckpointStore> impatient,
                       RemoteCheckpointStore::Connect(quick));
  absl::StatusOr<CommitResult> refused = CommitCheckpoint(*impatient, "n", SmallCheckpoint(3));
  EXPECT_THAT(refused, StatusIs(absl::StatusCode::kUnavailable, "attempts of this commit"));
  // Every attempt after the first found the first one's version: still one.
  ASSERT_OK_AND_ASSIGN(versions, local_->ListVersions("n"));
  EXPECT_EQ(versions.size(), 1u);
}

TEST_F(RemoteCheckpointStoreTest, TheServerAuditsEveryChangeAndListAuditReadsItBack) {
  StartServer();
  std::unique_ptr<RemoteCheckpointStore> remote = MustConnect();
  ASSERT_NE(remote, nullptr);
  CommitOptions with_best;
  with_best.aliases = {"best"};
  ASSERT_OK(CommitCheckpoint(*remote, "m", SmallCheckpoint(1), with_best).status());
  CheckpointContents claimed = SmallCheckpoint(2);
  claimed.metadata.set_producer("train.py on gpu-7");
  ASSERT_OK(CommitCheckpoint(*remote, "m", claimed).status());
  ASSERT_OK(remote->SetAlias("m", "best", 2).status());
  EXPECT_THAT(remote->SetAlias("m", "best", 9), StatusIs(absl::StatusCode::kNotFound));
  ASSERT_OK(remote->DeleteAlias("m", "best"));
  ASSERT_OK(remote->DeleteVersion("m", 1, /*force=*/false).status());
  ASSERT_OK(remote->GarbageCollect(/*dry_run=*/true).status());  // changes nothing: not recorded
  ASSERT_OK(remote->GarbageCollect(/*dry_run=*/false).status());
  ASSERT_OK(remote->ListVersions("m").status());  // reads are not recorded

  ASSERT_OK_AND_ASSIGN(std::vector<v1::AuditRecord> records, remote->ListAudit({}));
  std::vector<std::string> actions;
  for (const v1::AuditRecord& record : records) {
    SCOPED_TRACE(record.ShortDebugString());
    actions.push_back(absl::StrCat(
        record.sequence(), " ", record.action(), " ", record.model(), "@", record.version(), " ",
        v1::AuditRecord::Outcome_Name(record.outcome()), " ", record.error_code()));
    EXPECT_EQ(record.identity(), "anonymous");
    EXPECT_THAT(record.peer(), ::testing::StartsWith("ipv4:127.0.0.1:"));
    EXPECT_GT(record.unix_micros(), 0);
  }
  EXPECT_THAT(actions, ElementsAre("1 commit m@1 OK 0", "2 commit m@2 OK 0", "3 set_alias m@2 OK 0",
                                   "4 set_alias m@9 FAILED 5", "5 delete_alias m@0 OK 0",
                                   "6 delete_version m@1 OK 0", "7 garbage_collect @0 OK 0"));
  ASSERT_EQ(records.size(), 7u);
  EXPECT_EQ(records[2].detail(), "alias best: 1 -> 2");
  EXPECT_THAT(records[3].error_message(), HasSubstr("m@9 not found"));

  // The same records as the server's store holds, field for field.
  ASSERT_OK_AND_ASSIGN(std::vector<v1::AuditRecord> on_disk, local_->ListAudit({}));
  ASSERT_EQ(on_disk.size(), records.size());
  for (size_t i = 0; i < records.size(); ++i) {
    EXPECT_TRUE(MessageDifferencer::Equals(records[i], on_disk[i])) << i;
  }
  AuditQuery query;
  query.model = "m";
  query.after_sequence = 2;
  query.limit = 2;
  ASSERT_OK_AND_ASSIGN(std::vector<v1::AuditRecord> page, remote->ListAudit(query));
  ASSERT_EQ(page.size(), 2u);
  EXPECT_EQ(page[0].sequence(), 3);
  EXPECT_EQ(page[1].sequence(), 4);

  // The producer is who committed, as the server saw it.
  ASSERT_OK_AND_ASSIGN(v1::Manifest second, remote->GetManifest(Ref("m@2")));
  EXPECT_EQ(second.metadata().producer(), "anonymous");
  EXPECT_EQ(second.metadata().labels().at("client_producer"), "train.py on gpu-7");

  // A client cannot write records for anyone, so an AuditedStore over it changes nothing.
  EXPECT_THAT(remote->BeginAudit(records[0]),
              StatusIs(absl::StatusCode::kFailedPrecondition, "records its own audit"));
  EXPECT_THAT(remote->FinishAudit(1, absl::OkStatus(), "", 0),
              StatusIs(absl::StatusCode::kFailedPrecondition));
  AuditedStore impostor(*remote, {"mallory", "local"});
  EXPECT_THAT(impostor.SetAlias("m", "best", 2), StatusIs(absl::StatusCode::kFailedPrecondition));
  ASSERT_OK_AND_ASSIGN(records, remote->ListAudit({}));
  EXPECT_EQ(records.size(), 7u);
}

// The client's own arrival check: a server that sends bytes other than those its manifest hashes
// (damage after the server's check: a bad NIC, memory, a proxy) must not get them past
// RemoteCheckpointStore. StoreServiceOptions::tamper_for_testing flips one bit of one chunk, on
// whichever read path carries it: in-order and out-of-order tensors (read into their buffer),
// chunk callbacks, and LoadCheckpoint.
TEST_F(RemoteCheckpointStoreTest, EveryChunkDamagedInTransitIsDataLossOnTheClient) {
  constexpr int kNone = -1;
  std::atomic<int> target_tensor{kNone};  // which chunk to damage: tensor index...
  std::atomic<int64_t> target_offset{0};  // ...and offset in it.
  std::atomic<int> tampered{0};
  StoreServiceOptions options;
  options.worker_threads = 4;
  options.tamper_for_testing = [&](int tensor_index, int64_t offset, absl::Span<char> chunk) {
    if (tensor_index != target_tensor.load() || offset != target_offset.load()) return;
    chunk[chunk.size() / 2] ^= 0x10;
    tampered.fetch_add(1);
  };
  ASSERT_OK_AND_ASSIGN(service_, StoreService::Create(instrumented_.get(), options));
  ASSERT_OK_AND_ASSIGN(
      server_, GrpcServer::Start({}, {{service_.get(), v1::CheckpointStore::service_full_name()}}));
  std::unique_ptr<RemoteCheckpointStore> remote = MustConnect();
  ASSERT_NE(remote, nullptr);
  const CheckpointContents original = FullCheckpoint(5);
  ASSERT_OK(CommitCheckpoint(*remote, "m", original).status());
  ASSERT_OK_AND_ASSIGN(v1::Manifest manifest, remote->GetManifest(Ref("m@1")));

  // Every chunk of the two-chunk tensor 0, a small model tensor, and a state tensor.
  struct Target {
    int tensor_index;
    int64_t offset;
  };
  const int state_index = manifest.tensors_size();
  const std::vector<Target> targets = {{0, 0}, {0, 4 * kMiB}, {1, 0}, {state_index, 0}};
  for (const Target& target : targets) {
    const v1::TensorMeta& meta = target.tensor_index < manifest.tensors_size()
                                     ? manifest.tensors(target.tensor_index)
                                     : manifest.state_tensors(0);
    SCOPED_TRACE(absl::StrCat("tensor '", meta.key(), "' bytes ", target.offset));
    ASSERT_GT(meta.byte_length(), target.offset);
    const auto wrong_checksum =
        StatusIs(absl::StatusCode::kDataLoss,
                 AllOf(HasSubstr(absl::StrCat("of tensor '", meta.key(), "' of m@1 (bytes ",
                                              target.offset, "..")),
                       HasSubstr("arrived with a wrong xxh3 checksum")));
    target_offset.store(target.offset);
    target_tensor.store(target.tensor_index);
    const int before = tampered.load();

    // Read in order on the version's stream (the reader skips to it)...
    ASSERT_OK_AND_ASSIGN(std::unique_ptr<VersionReader> reader, remote->OpenVersion(Ref("m@1")));
    EXPECT_THAT(ReadTensor(*reader, meta), wrong_checksum);
    // ...again, out of order (a Download of its own)...
    EXPECT_THAT(ReadTensor(*reader, meta), wrong_checksum);
    // ...chunk by chunk: the sound chunks before the damaged one arrive, the damaged one not...
    ASSERT_OK_AND_ASSIGN(reader, remote->OpenVersion(Ref("m@1")));
    int64_t delivered = 0;
    EXPECT_THAT(reader->ReadTensorChunks(meta,
                                         [&](int64_t offset, absl::string_view bytes) {
                                           EXPECT_EQ(offset, delivered);
                                           delivered += static_cast<int64_t>(bytes.size());
                                           return absl::OkStatus();
                                         }),
                wrong_checksum);
    EXPECT_EQ(delivered, target.offset);
    // ...into a caller's buffer...
    ASSERT_OK_AND_ASSIGN(reader, remote->OpenVersion(Ref("m@1")));
    std::string buffer(meta.byte_length(), '\0');
    EXPECT_THAT(reader->ReadTensorInto(meta, buffer.data()), wrong_checksum);
    // ...and as part of a whole checkpoint.
    EXPECT_THAT(LoadCheckpoint(*remote, Ref("m@1")), wrong_checksum);
    // The damage was really sent on each of those reads (the server's checks passed).
    EXPECT_GE(tampered.load() - before, 5);
  }

  // Undamaged, the same reads give the checkpoint back whole.
  target_tensor.store(kNone);
  ASSERT_OK_AND_ASSIGN(LoadedCheckpoint loaded, LoadCheckpoint(*remote, Ref("m@1")));
  ExpectSameCheckpoint(loaded.contents, original);
}

// A store whose host dies in the middle of a Download (a failover: the client's store list
// moves on to the successor) ends the stream with UNAVAILABLE. The reader goes on from the first
// chunk it did not deliver, on a fresh Download of the same version: a load in flight finishes,
// and no byte is delivered twice or skipped, on every read path.
TEST_F(RemoteCheckpointStoreTest, ADownloadBrokenByAnUnavailableStoreGoesOnFromItsNextChunk) {
  StartServer();
  std::unique_ptr<RemoteCheckpointStore> remote = MustConnect();
  ASSERT_NE(remote, nullptr);
  const CheckpointContents original = FullCheckpoint(6);
  ASSERT_OK(CommitCheckpoint(*remote, "m", original).status());
  ASSERT_OK_AND_ASSIGN(v1::Manifest manifest, remote->GetManifest(Ref("m@1")));
  const v1::TensorMeta& big = manifest.tensors(0);
  ASSERT_EQ(big.chunks_size(), 2);

  // Every third chunk read on the server fails, as a dying store's would.
  std::atomic<int> reads{0};
  std::atomic<int> broken{0};
  instrumented_->set_read_fault([&](absl::string_view) {
    if (reads.fetch_add(1) % 3 != 2) return absl::OkStatus();
    broken.fetch_add(1);
    return absl::UnavailableError("the store's host went down");
  });

  // A whole checkpoint, in order on the version's main stream (resumed with the later tensors).
  ASSERT_OK_AND_ASSIGN(LoadedCheckpoint loaded, LoadCheckpoint(*remote, Ref("m@1")));
  ExpectSameCheckpoint(loaded.contents, original);
  EXPECT_GE(broken.load(), 3);

  // Chunk by chunk: each chunk reaches the callback once, in order, the second after a break
  // (the server's first read, chunk 0, succeeds; its second, chunk 1, fails).
  reads = 1;
  int broken_before = broken.load();
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<VersionReader> reader, remote->OpenVersion(Ref("m@1")));
  std::vector<std::pair<int64_t, size_t>> pieces;
  ASSERT_OK(reader->ReadTensorChunks(big, [&](int64_t offset, absl::string_view bytes) {
    pieces.emplace_back(offset, bytes.size());
    return absl::OkStatus();
  }));
  EXPECT_THAT(pieces, ElementsAre(std::make_pair(int64_t{0}, size_t{4 * kMiB}),
                                  std::make_pair(int64_t{4 * kMiB},
                                                 static_cast<size_t>(big.byte_length() - 4 * kMiB))));
  EXPECT_GT(broken.load(), broken_before);
  // The main stream goes on after its break: the next tensors read in order are whole.
  for (int i = 1; i < manifest.tensors_size(); ++i) {
    ASSERT_OK_AND_ASSIGN(at::Tensor tensor, ReadTensor(*reader, manifest.tensors(i)));
    const std::string key = manifest.tensors(i).key();
    ExpectSameTensor(tensor, *original.model.Find("module." + key), key);
  }

  // Out of order, into a buffer, and a byte range across the chunk boundary: one-off Downloads
  // whose second chunk read fails.
  reads = 1;
  broken_before = broken.load();
  ASSERT_OK_AND_ASSIGN(at::Tensor again, ReadTensor(*reader, big));
  ExpectSameTensor(again, *original.model.Find("module.encoder.weight"), "encoder.weight");
  EXPECT_GT(broken.load(), broken_before);
  reads = 1;
  broken_before = broken.load();
  const int64_t begin = 4 * kMiB - 100;
  std::string range(200, '\0');
  ASSERT_OK(reader->ReadTensorRange(big, begin, begin + 200, range.data()));
  const at::Tensor flat = original.model.Find("module.encoder.weight")->contiguous();
  EXPECT_EQ(range, std::string(static_cast<const char*>(flat.data_ptr()) + begin, 200));
  EXPECT_GT(broken.load(), broken_before);

  // A store that stays unavailable: the read ends with its UNAVAILABLE after a few fruitless
  // resumes, naming the store, and delivers nothing twice.
  instrumented_->set_read_fault(
      [](absl::string_view) { return absl::UnavailableError("the store's host went down"); });
  ASSERT_OK_AND_ASSIGN(reader, remote->OpenVersion(Ref("m@1")));
  pieces.clear();
  EXPECT_THAT(reader->ReadTensorChunks(big,
                                       [&](int64_t offset, absl::string_view bytes) {
                                         pieces.emplace_back(offset, bytes.size());
                                         return absl::OkStatus();
                                       }),
              StatusIs(absl::StatusCode::kUnavailable, server_->address()));
  EXPECT_THAT(pieces, IsEmpty());
  // Other errors are not resumed: a callback's own UNAVAILABLE comes back unchanged at once.
  instrumented_->set_read_fault(nullptr);
  int calls = 0;
  EXPECT_THAT(reader->ReadTensorChunks(big,
                                       [&](int64_t, absl::string_view) {
                                         ++calls;
                                         return absl::UnavailableError("the caller's own");
                                       }),
              StatusIs(absl::StatusCode::kUnavailable, "the caller's own"));
  EXPECT_EQ(calls, 1);
}

TEST(RemoteStoreOptionsTest, BadOptionsAreInvalidArguments) {
  RemoteStoreOptions options;
  EXPECT_THAT(RemoteCheckpointStore::Connect(options),
              StatusIs(absl::StatusCode::kInvalidArgument, "address"));
  options.address = "127.0.0.1:1";
  options.auth_token = "two words";
  EXPECT_THAT(RemoteCheckpointStore::Connect(options),
              StatusIs(absl::StatusCode::kInvalidArgument, "auth_token"));
  options.auth_token = "";
  options.deadline = absl::ZeroDuration();
  EXPECT_THAT(RemoteCheckpointStore::Connect(options),
              StatusIs(absl::StatusCode::kInvalidArgument, "deadline"));
}

// RemoteCheckpointStore runs the CheckpointStore conformance suite (libs/store/testing) through
// a real store service on loopback over a RocksDB store.
class ServedStore final : public ::ckpt::testing::StoreHarness {
 public:
  explicit ServedStore(const std::string& dir) {
    StoreOptions options;
    options.db_path = dir + "/db";
    options.abandoned_upload_grace = absl::ZeroDuration();
    absl::StatusOr<std::unique_ptr<RocksDbCheckpointStore>> local =
        RocksDbCheckpointStore::Open(options);
    EXPECT_OK(local.status());
    local_ = *std::move(local);
    StoreServiceOptions service_options;
    service_options.worker_threads = 4;
    absl::StatusOr<std::unique_ptr<StoreService>> service =
        StoreService::Create(local_.get(), service_options);
    EXPECT_OK(service.status());
    service_ = *std::move(service);
    absl::StatusOr<std::unique_ptr<GrpcServer>> server =
        GrpcServer::Start({}, {{service_.get(), v1::CheckpointStore::service_full_name()}});
    EXPECT_OK(server.status());
    server_ = *std::move(server);
    RemoteStoreOptions remote_options;
    remote_options.address = server_->address();
    absl::StatusOr<std::unique_ptr<RemoteCheckpointStore>> remote =
        RemoteCheckpointStore::Connect(remote_options);
    EXPECT_OK(remote.status());
    remote_ = *std::move(remote);
  }
  ~ServedStore() override {
    remote_.reset();
    server_->Shutdown(absl::ZeroDuration());
    server_->Wait();
  }
  CheckpointStore& store() override { return *remote_; }

 private:
  std::unique_ptr<RocksDbCheckpointStore> local_;
  std::unique_ptr<StoreService> service_;
  std::unique_ptr<GrpcServer> server_;
  std::unique_ptr<RemoteCheckpointStore> remote_;
};

}  // namespace

namespace testing {
INSTANTIATE_TEST_SUITE_P(Remote, StoreConformanceTest,
                         ::testing::Values(StoreConformanceParam{
                             "remote",
                             [](const std::string& dir) -> std::unique_ptr<StoreHarness> {
                               return std::make_unique<ServedStore>(dir);
                             }}),
                         [](const ::testing::TestParamInfo<StoreConformanceParam>& info) {
                           return info.param.name;
                         });
}  // namespace testing

namespace {}  // namespace
}  // namespace ckpt

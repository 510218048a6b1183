// The wire protocol of StoreService, driven with raw gRPC stubs against a real server on loopback
// over a RocksDB store in TEST_TMPDIR. (libs/client's tests drive it through the
// CheckpointStore interface.)

#include "services/checkpoint_store/store_service.h"

#include <dirent.h>

#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "ATen/Context.h"
#include "ATen/core/Tensor.h"
#include "ATen/ops/arange.h"
#include "ATen/ops/empty.h"
#include "ATen/ops/ones.h"
#include "ATen/ops/randn.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/security/credentials.h"
#include "grpcpp/support/channel_arguments.h"
#include "gtest/gtest.h"
#include "libs/client/remote_checkpoint_store.h"
#include "libs/io/xxh3.h"
#include "libs/rpc/grpc_server.h"
#include "libs/status/grpc_status.h"
#include "libs/status/status_matchers.h"
#include "libs/store/checkpoint_contents.h"
#include "libs/store/rocksdb_checkpoint_store.h"
#include "libs/store/testing/instrumented_store.h"
#include "libs/store/version_ref.h"
#include "libs/tensor/state_dict.h"
#include "libs/tensor/value.h"
#include "proto/grpc/health/v1/health.grpc.pb.h"

namespace ckpt {
namespace {

using ::ckpt::testing::StatusIs;
using ::grpc::health::v1::HealthCheckRequest;
using ::grpc::health::v1::HealthCheckResponse;
using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

constexpr int64_t kMiB = 1 << 20;
constexpr char kToken[] = "0123456789abcdef-token";

v1::VersionRef Ref(absl::string_view text) {
  absl::StatusOr<v1::VersionRef> ref = ParseVersionRef(text);
  EXPECT_OK(ref.status());
  return ref.value_or(v1::VersionRef());
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

v1::UploadRequest HeaderRequest(const std::string& model, v1::Manifest manifest,
                                std::vector<std::string> aliases = {}) {
  v1::UploadRequest request;
  request.mutable_header()->set_model(model);
  *request.mutable_header()->mutable_manifest() = std::move(manifest);
  for (const std::string& alias : aliases) request.mutable_header()->add_aliases(alias);
  return request;
}

v1::UploadRequest DataRequest(int index, int64_t offset, std::string bytes) {
  v1::UploadRequest request;
  request.mutable_data()->set_tensor_index(index);
  request.mutable_data()->set_offset(offset);
  request.mutable_data()->set_data(std::move(bytes));
  return request;
}

v1::UploadRequest CommitRequest(std::vector<std::string> aliases = {}) {
  v1::UploadRequest request;
  request.mutable_commit();
  for (const std::string& alias : aliases) request.mutable_commit()->add_aliases(alias);
  return request;
}

std::string TensorBytes(const at::Tensor& tensor) {
  const at::Tensor contiguous = tensor.contiguous();
  return std::string(static_cast<const char*>(contiguous.data_ptr()), contiguous.nbytes());
}

class StoreServiceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const char* tmp = std::getenv("TEST_TMPDIR");
    StoreOptions options;
    options.db_path = std::string(tmp != nullptr ? tmp : "/tmp") + "/" +
                      ::testing::UnitTest::GetInstance()->current_test_info()->name();
    ASSERT_OK_AND_ASSIGN(local_, RocksDbCheckpointStore::Open(options));
    instrumented_ = std::make_unique<InstrumentedStore>(local_.get());
    instrumented_->set_hook([this](absl::string_view method) {
      if (method != "ReadTensorChunks") return;
      absl::MutexLock lock(&mu_);
      ++chunk_reads_;
    });
  }

  void TearDown() override {
    if (server_ != nullptr) {
      server_->Shutdown(absl::ZeroDuration());
      server_->Wait();
    }
    server_.reset();
    service_.reset();
  }

  void StartServer(const std::string& token = "") {
    StoreServiceOptions options;
    options.auth_token = token;
    options.worker_threads = 2;
    ASSERT_OK_AND_ASSIGN(service_, StoreService::Create(instrumented_.get(), options));
    ASSERT_OK_AND_ASSIGN(
        server_,
        GrpcServer::Start({}, {{service_.get(), v1::CheckpointStore::service_full_name()}}));
    stub_ = NewStub();
  }

  std::unique_ptr<v1::CheckpointStore::Stub> NewStub(
      const grpc::ChannelArguments& arguments = grpc::ChannelArguments()) const {
    return v1::CheckpointStore::NewStub(grpc::CreateCustomChannel(
        server_->address(), grpc::InsecureChannelCredentials(), arguments));
  }

  static std::unique_ptr<grpc::ClientContext> Context(const std::string& authorization = "") {
    auto context = std::make_unique<grpc::ClientContext>();
    context->set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(20)));
    if (!authorization.empty()) context->AddMetadata("authorization", authorization);
    return context;
  }

  // Sends `requests` on one Upload stream (stopping at the first failed write), half-closes and
  // returns the call's status.
  absl::Status Upload(const std::vector<v1::UploadRequest>& requests,
                      v1::UploadResponse* response = nullptr) {
    v1::UploadResponse ignored;
    std::unique_ptr<grpc::ClientContext> context = Context();
    auto writer = stub_->Upload(context.get(), response != nullptr ? response : &ignored);
    for (const v1::UploadRequest& request : requests) {
      if (!writer->Write(request)) break;
    }
    writer->WritesDone();
    return FromGrpcStatus(writer->Finish());
  }

  // Sends `messages` as they are (not necessarily UploadRequests) on one Upload stream, half-closes
  // and returns the call's status: what a client with another protobuf, or none, would send.
  absl::Status RawUpload(const std::vector<std::string>& messages) {
    grpc::GenericStub stub(
        grpc::CreateChannel(server_->address(), grpc::InsecureChannelCredentials()));
    grpc::CompletionQueue queue;
    std::unique_ptr<grpc::ClientContext> context = Context();
    std::unique_ptr<grpc::GenericClientAsyncReaderWriter> call = stub.PrepareCall(
        context.get(), absl::StrCat("/", v1::CheckpointStore::service_full_name(), "/Upload"),
        &queue);
    void* tag = nullptr;
    bool ok = false;
    auto wait = [&] { return queue.Next(&tag, &ok) && ok; };
    call->StartCall(&queue);
    EXPECT_TRUE(wait());
    for (const std::string& message : messages) {
      grpc::Slice slice(message);
      call->Write(grpc::ByteBuffer(&slice, 1), &queue);
      if (!wait()) break;
    }
    call->WritesDone(&queue);
    wait();
    grpc::ByteBuffer response;
    call->Read(&response, &queue);
    wait();
    grpc::Status status;
    call->Finish(&status, &queue);
    wait();
    queue.Shutdown();
    while (queue.Next(&tag, &ok)) {
    }
    return FromGrpcStatus(status);
  }

  // Reads a whole Download: the manifest and every TensorData.
  absl::Status Download(const v1::DownloadRequest& request, v1::Manifest* manifest,
                        std::vector<v1::TensorData>* data) {
    std::unique_ptr<grpc::ClientContext> context = Context();
    auto reader = stub_->Download(context.get(), request);
    v1::DownloadResponse response;
    bool first = true;
    while (reader->Read(&response)) {
      EXPECT_EQ(response.has_manifest(), first);
      if (response.has_manifest()) *manifest = response.manifest();
      if (response.has_data()) data->push_back(response.data());
      first = false;
    }
    return FromGrpcStatus(reader->Finish());
  }

  bool NoUploadInProgress() {
    const absl::Time deadline = absl::Now() + absl::Seconds(10);
    while (absl::Now() < deadline) {
      absl::StatusOr<v1::StoreStats> stats = local_->GetStats();
      if (stats.ok() && stats->uploads_in_progress() == 0) return true;
      absl::SleepFor(absl::Milliseconds(5));
    }
    return false;
  }

  std::unique_ptr<RocksDbCheckpointStore> local_;
  std::unique_ptr<InstrumentedStore> instrumented_;
  std::unique_ptr<StoreService> service_;
  std::unique_ptr<GrpcServer> server_;
  std::unique_ptr<v1::CheckpointStore::Stub> stub_;
  absl::Mutex mu_;
  int64_t chunk_reads_ ABSL_GUARDED_BY(mu_) = 0;
};

TEST_F(StoreServiceTest, UploadMustBeginWithAHeader) {
  StartServer();
  EXPECT_THAT(Upload({DataRequest(0, 0, "abcd")}),
              StatusIs(absl::StatusCode::kInvalidArgument, "must be an UploadHeader"));
  EXPECT_THAT(Upload({CommitRequest()}),
              StatusIs(absl::StatusCode::kInvalidArgument, "must be an UploadHeader"));
  v1::UploadRequest stored_chunk;
  stored_chunk.mutable_stored_chunk()->set_length(1);
  EXPECT_THAT(Upload({stored_chunk}), StatusIs(absl::StatusCode::kInvalidArgument,
                                               "must be an UploadHeader; got StoredChunk"));
  EXPECT_THAT(Upload({v1::UploadRequest()}), StatusIs(absl::StatusCode::kInvalidArgument,
                                                      "no header, data, stored chunk or commit"));
  EXPECT_THAT(
      Upload({HeaderRequest("m", OneTensorHeader(1)), HeaderRequest("m", OneTensorHeader(1))}),
      StatusIs(absl::StatusCode::kInvalidArgument, "second UploadHeader"));
  EXPECT_THAT(Upload({}), StatusIs(absl::StatusCode::kInvalidArgument, "before its UploadHeader"));
  ASSERT_OK_AND_ASSIGN(std::vector<v1::ModelInfo> models, local_->ListModels());
  EXPECT_THAT(models, ::testing::IsEmpty());
}

// A first message the server cannot parse is not an empty stream: the client must hear that its
// message was refused, and why, not that it sent no header.
TEST_F(StoreServiceTest, UnparsableMessagesAreReportedAsSuchNotAsAMissingHeader) {
  StartServer();
  // Deeper than protobuf's recursion limit (100): each Value adds a Value and a ValueList.
  v1::Manifest deep = OneTensorHeader(1);
  v1::Value* value = deep.mutable_extra_state();
  for (int i = 0; i < 200; ++i) value = value->mutable_list_value()->add_items();
  value->set_int_value(1);
  EXPECT_THAT(Upload({HeaderRequest("m", deep)}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       ::testing::AllOf(HasSubstr("could not be parsed"),
                                        HasSubstr("first message"), HasSubstr("nested"))));
  EXPECT_THAT(RawUpload({std::string("\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\x01garbage", 18)}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       ::testing::AllOf(HasSubstr("could not be parsed"), HasSubstr("18 bytes"))));
  // The same after the header: the stream is refused and nothing is stored.
  EXPECT_THAT(RawUpload({HeaderRequest("m", OneTensorHeader(4)).SerializeAsString(), "\x0a\xff"}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("message 2")));
  // An empty stream is still reported as one.
  EXPECT_THAT(RawUpload({}),
              StatusIs(absl::StatusCode::kInvalidArgument, "before its UploadHeader"));
  EXPECT_TRUE(NoUploadInProgress());
  ASSERT_OK_AND_ASSIGN(std::vector<v1::ModelInfo> models, local_->ListModels());
  EXPECT_THAT(models, ::testing::IsEmpty());
}

// FindMissingChunks takes what the server's message limit allows (16 MiB by default), not gRPC's
// 4 MiB default. The response can be as large as the request (every address missing), so a client
// must accept messages that large; one with gRPC's default receive limit fails on the response.
TEST_F(StoreServiceTest, FindMissingChunksTakesUpToTheServersSixteenMiB) {
  StartServer();
  auto request_of = [](int64_t bytes) {
    v1::FindMissingChunksRequest request;
    for (int64_t i = 0; i < bytes / 34; ++i) {  // 32 bytes and a 2-byte field header each.
      std::string sha256(32, '\0');
      std::memcpy(&sha256[0], &i, sizeof(i));
      request.add_sha256(std::move(sha256));
    }
    return request;
  };
  grpc::ChannelArguments arguments;
  arguments.SetMaxReceiveMessageSize(64 << 20);
  std::unique_ptr<v1::CheckpointStore::Stub> stub = NewStub(arguments);
  const v1::FindMissingChunksRequest fifteen = request_of(15 * kMiB);
  v1::FindMissingChunksResponse missing;
  ASSERT_OK(FromGrpcStatus(stub->FindMissingChunks(Context().get(), fifteen, &missing)));
  EXPECT_EQ(missing.missing_sha256_size(), fifteen.sha256_size());
  EXPECT_THAT(
      FromGrpcStatus(stub->FindMissingChunks(Context().get(), request_of(17 * kMiB), &missing)),
      StatusIs(absl::StatusCode::kResourceExhausted, HasSubstr("16777216")));
  EXPECT_THAT(FromGrpcStatus(stub_->FindMissingChunks(Context().get(), fifteen, &missing)),
              StatusIs(absl::StatusCode::kResourceExhausted, HasSubstr("4194304")));
}

TEST_F(StoreServiceTest, TensorDataOverOneMiBIsRejectedAndNothingIsStored) {
  StartServer();
  EXPECT_THAT(Upload({HeaderRequest("m", OneTensorHeader(kMiB)),
                      DataRequest(0, 0, std::string(kMiB + 1, 'x'))}),
              StatusIs(absl::StatusCode::kInvalidArgument, "at most 1048576"));
  EXPECT_TRUE(NoUploadInProgress());
  EXPECT_THAT(local_->ListVersions("m"), StatusIs(absl::StatusCode::kNotFound));
}

TEST_F(StoreServiceTest, UploadEndingWithoutCommitStoresNothing) {
  StartServer();
  EXPECT_THAT(
      Upload({HeaderRequest("m", OneTensorHeader(4)), DataRequest(0, 0, std::string(16, 'a'))}),
      StatusIs(absl::StatusCode::kInvalidArgument, "without an UploadCommit"));
  EXPECT_TRUE(NoUploadInProgress());
  EXPECT_THAT(local_->ListVersions("m"), StatusIs(absl::StatusCode::kNotFound));
}

TEST_F(StoreServiceTest, UploadCommitsWithHeaderAliasesAndRejectsOtherCommitAliases) {
  StartServer();
  const std::string bytes(16, 'b');
  v1::UploadResponse response;
  ASSERT_OK(Upload({HeaderRequest("m", OneTensorHeader(4), {"best"}), DataRequest(0, 0, bytes),
                    CommitRequest({"best"})},
                   &response));
  EXPECT_EQ(FormatVersionRef(response.version()), "m@1");
  EXPECT_EQ(response.logical_bytes(), 16);
  ASSERT_OK_AND_ASSIGN(v1::Manifest best, local_->GetManifest(Ref("m@best")));
  EXPECT_EQ(best.version(), 1);

  EXPECT_THAT(Upload({HeaderRequest("m", OneTensorHeader(4), {"best"}), DataRequest(0, 0, bytes),
                      CommitRequest({"production"})}),
              StatusIs(absl::StatusCode::kInvalidArgument, "UploadHeader.aliases"));
  ASSERT_OK_AND_ASSIGN(std::vector<v1::VersionInfo> versions, local_->ListVersions("m"));
  EXPECT_EQ(versions.size(), 1u);
  // Store errors keep their codes: a bad byte count at commit, a stale expected version.
  EXPECT_THAT(
      Upload({HeaderRequest("m", OneTensorHeader(4)), DataRequest(0, 0, "short"), CommitRequest()}),
      StatusIs(absl::StatusCode::kInvalidArgument, "incomplete"));
  v1::UploadRequest stale = HeaderRequest("m", OneTensorHeader(4));
  stale.mutable_header()->set_expected_latest_version(7);
  EXPECT_THAT(Upload({stale}), StatusIs(absl::StatusCode::kFailedPrecondition, "latest version 7"));
}

TEST_F(StoreServiceTest, AcceptedHeaderIsAcknowledgedWithItsWarnings) {
  StartServer();
  v1::Manifest header = OneTensorHeader(4);
  v1::TensorMeta* orphan = header.add_state_tensors();
  orphan->set_key("extra/orphan");
  orphan->set_dtype(v1::DTYPE_FLOAT32);
  orphan->add_shape(1);
  orphan->set_byte_length(4);
  std::unique_ptr<grpc::ClientContext> context = Context();
  v1::UploadResponse response;
  auto writer = stub_->Upload(context.get(), &response);
  ASSERT_TRUE(writer->Write(HeaderRequest("m", header)));
  writer->WaitForInitialMetadata();
  const auto& metadata = context->GetServerInitialMetadata();
  EXPECT_EQ(metadata.count(kUploadAcceptedMetadata), 1u);
  auto warning = metadata.find(kUploadWarningMetadata);
  ASSERT_NE(warning, metadata.end());
  EXPECT_THAT(std::string(warning->second.data(), warning->second.size()),
              HasSubstr("extra/orphan"));
  context->TryCancel();
  EXPECT_EQ(writer->Finish().error_code(), grpc::StatusCode::CANCELLED);
  EXPECT_TRUE(NoUploadInProgress());
}

class DownloadTest : public StoreServiceTest {
 protected:
  void SetUp() override {
    StoreServiceTest::SetUp();
    CheckpointContents contents;
    at::manual_seed(7);
    ASSERT_OK(contents.model.Insert("a.weight", at::randn({1200, 1024})));  // two chunks
    ASSERT_OK(contents.model.Insert("a.bias", at::randn({1024})));
    ASSERT_OK(contents.model.Insert("empty", at::empty({0})));
    ASSERT_OK(contents.model.Insert("b.weight", at::randn({3, 5}).to(at::kHalf)));
    Value extra = Value::Dict();
    extra.Set("rng", Value::Tensor(at::arange(10, at::kLong)));
    contents.extra = extra;
    ASSERT_OK(CommitCheckpoint(*local_, "m", contents).status());
    for (const StateDict::Entry& entry : contents.model) {
      expected_.push_back(TensorBytes(entry.tensor));
    }
    expected_.push_back(TensorBytes(extra.Find("rng")->tensor()));
    StartServer();
  }

  // Checks that `data` carries whole tensors `indices`, in order, in pieces of at most `piece`.
  void ExpectTensors(const std::vector<v1::TensorData>& data, std::vector<int> indices,
                     size_t piece) {
    std::vector<int> seen;
    std::vector<std::string> bytes;
    for (const v1::TensorData& message : data) {
      EXPECT_LE(message.data().size(), piece);
      EXPECT_GT(message.data().size(), 0u);
      if (seen.empty() || seen.back() != message.tensor_index()) {
        seen.push_back(message.tensor_index());
        bytes.emplace_back();
      }
      EXPECT_EQ(message.offset(), static_cast<int64_t>(bytes.back().size()));
      bytes.back() += message.data();
    }
    ASSERT_EQ(seen, indices);
    for (size_t i = 0; i < seen.size(); ++i) {
      EXPECT_TRUE(bytes[i] == expected_[seen[i]]) << "tensor " << seen[i];
    }
  }

  std::vector<std::string> expected_;  // bytes by tensor index.
};

TEST_F(DownloadTest, SendsTheManifestThenEveryTensorInManifestOrderInBoundedPieces) {
  v1::DownloadRequest request;
  *request.mutable_ref() = Ref("m");
  request.set_include_state(true);
  request.set_max_message_bytes(300000);
  v1::Manifest manifest;
  std::vector<v1::TensorData> data;
  ASSERT_OK(Download(request, &manifest, &data));
  EXPECT_EQ(manifest.version(), 1);
  ASSERT_EQ(manifest.tensors_size(), 4);
  ASSERT_EQ(manifest.state_tensors_size(), 1);
  // Index 2 ("empty") has no bytes, so no TensorData.
  ExpectTensors(data, {0, 1, 3, 4}, 300000);

  // Without include_state, and with a limit above 1 MiB (capped).
  request.set_include_state(false);
  request.set_max_message_bytes(8 * kMiB);
  data.clear();
  ASSERT_OK(Download(request, &manifest, &data));
  ExpectTensors(data, {0, 1, 3}, kMiB);
  EXPECT_EQ(data.size(), 5u + 1u + 1u);  // 4.7 MiB in 1 MiB pieces, then two small tensors.
}

// A tiny max_message_bytes would make a version millions of messages: it is raised to 64 KiB.
TEST_F(DownloadTest, TinyMaxMessageBytesIsRaisedToSixtyFourKiB) {
  v1::DownloadRequest request;
  *request.mutable_ref() = Ref("m");
  v1::Manifest manifest;
  std::vector<v1::TensorData> data;
  for (int tiny : {1, 1000, 64 * 1024}) {
    request.set_max_message_bytes(tiny);
    data.clear();
    ASSERT_OK(Download(request, &manifest, &data));
    ExpectTensors(data, {0, 1, 3}, 64 * 1024);
    // a.weight's 4.7 MiB in 75 pieces of 64 KiB, then a.bias and b.weight whole.
    EXPECT_EQ(data.size(), 75u + 1u + 1u) << "max_message_bytes " << tiny;
  }
}

TEST_F(DownloadTest, SendsOnlyTheSelectedKeysAndPrefixes) {
  v1::DownloadRequest request;
  *request.mutable_ref() = Ref("m@1");
  request.add_keys("b.weight");
  v1::Manifest manifest;
  std::vector<v1::TensorData> data;
  ASSERT_OK(Download(request, &manifest, &data));
  EXPECT_EQ(manifest.tensors_size(), 4);  // The manifest is always whole.
  ExpectTensors(data, {3}, kMiB);

  request.clear_keys();
  request.add_key_prefixes("a.");
  request.add_key_prefixes("extra/");
  request.set_include_state(true);
  data.clear();
  ASSERT_OK(Download(request, &manifest, &data));
  ExpectTensors(data, {0, 1, 4}, kMiB);

  request.clear_key_prefixes();
  request.add_keys("extra/rng");
  request.set_include_state(false);
  EXPECT_THAT(Download(request, &manifest, &data),
              StatusIs(absl::StatusCode::kNotFound, "set include_state"));
  request.set_keys(0, "nope");
  EXPECT_THAT(Download(request, &manifest, &data),
              StatusIs(absl::StatusCode::kNotFound, "no tensor 'nope' in m@1"));
  request.clear_keys();
  request.set_max_message_bytes(-1);
  EXPECT_THAT(Download(request, &manifest, &data),
              StatusIs(absl::StatusCode::kInvalidArgument, "max_message_bytes"));
  *request.mutable_ref() = Ref("m@5");
  request.set_max_message_bytes(0);
  EXPECT_THAT(Download(request, &manifest, &data), StatusIs(absl::StatusCode::kNotFound, "m@5"));
}

// Flow control: a client that stops reading holds the server at a chunk or two (it reads one
// ahead), it does not make it read (and buffer) the rest of the checkpoint; reading on resumes it;
// a cancel stops it.
TEST_F(StoreServiceTest, SlowReaderHoldsTheServerAtAFewChunks) {
  constexpr int kChunks = 10;
  CheckpointContents contents;
  at::manual_seed(3);
  ASSERT_OK(contents.model.Insert("big", at::randn({kChunks * kMiB})));  // 10 chunks of 4 MiB.
  ASSERT_OK(CommitCheckpoint(*local_, "big", contents).status());
  StartServer();
  grpc::ChannelArguments arguments;
  arguments.SetInt(GRPC_ARG_HTTP2_BDP_PROBE, 0);  // Keep the client's window at its default.
  std::unique_ptr<v1::CheckpointStore::Stub> stub = NewStub(arguments);
  v1::DownloadRequest request;
  *request.mutable_ref() = Ref("big");

  for (bool cancel : {false, true}) {
    {
      absl::MutexLock lock(&mu_);
      chunk_reads_ = 0;
    }
    std::unique_ptr<grpc::ClientContext> context = Context();
    auto reader = stub->Download(context.get(), request);
    v1::DownloadResponse response;
    ASSERT_TRUE(reader->Read(&response));
    ASSERT_TRUE(response.has_manifest());
    // Takes the first chunk, then stalls.
    int64_t received = 0;
    while (received < 4 * kMiB && reader->Read(&response)) {
      ASSERT_TRUE(response.has_data());
      received += response.data().data().size();
    }
    ASSERT_EQ(received, 4 * kMiB);
    // The positive control first, so that the bound below cannot pass only because the server is
    // slow or stuck: while the client is stalled, the server reads the next chunk ahead of it.
    mu_.Lock();
    const bool read_ahead =
        mu_.AwaitWithTimeout(absl::Condition(
                                 +[](int64_t* reads) { return *reads >= 2; }, &chunk_reads_),
                             absl::Seconds(10));
    const int64_t reads_before_bound = chunk_reads_;
    mu_.Unlock();
    ASSERT_TRUE(read_ahead) << reads_before_bound << " chunks read in 10 s for a stalled client";
    // Waits for the server to read more than 3 chunks; it must not while the client is stalled.
    constexpr int kMostReadAhead = 3;
    mu_.Lock();
    const bool ran_ahead = mu_.AwaitWithTimeout(
        absl::Condition(
            +[](int64_t* reads) { return *reads > kMostReadAhead; }, &chunk_reads_),
        absl::Milliseconds(500));
    const int64_t reads_while_stalled = chunk_reads_;
    mu_.Unlock();
    EXPECT_FALSE(ran_ahead) << reads_while_stalled << " chunks read for a stalled client";

    if (cancel) {
      context->TryCancel();
      EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::CANCELLED);
      server_->Shutdown(absl::ZeroDuration());
      server_->Wait();
      server_.reset();
      service_.reset();  // Waits for the download's reactor to finish.
      absl::MutexLock lock(&mu_);
      EXPECT_LE(chunk_reads_, kMostReadAhead + 1);
      break;
    }
    // The other half of the control: reading on resumes the server. The bytes of the chunks it
    // has read arrive without another read; once the client has taken them, it must read on.
    while (received < reads_while_stalled * 4 * kMiB && reader->Read(&response)) {
      received += response.data().data().size();
    }
    ASSERT_EQ(received, reads_while_stalled * 4 * kMiB);
    const auto read_on = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return chunk_reads_ > reads_while_stalled;
    };
    mu_.Lock();
    const bool resumed = mu_.AwaitWithTimeout(absl::Condition(&read_on), absl::Seconds(10));
    const int64_t reads_after_reading_on = chunk_reads_;
    mu_.Unlock();
    ASSERT_TRUE(resumed) << "still " << reads_after_reading_on << " chunks read 10 s after the "
                         << "client took the " << reads_while_stalled << " it was sent";
    while (reader->Read(&response)) received += response.data().data().size();
    EXPECT_OK(FromGrpcStatus(reader->Finish()));
    EXPECT_EQ(received, kChunks * 4 * kMiB);
    absl::MutexLock lock(&mu_);
    EXPECT_EQ(chunk_reads_, kChunks);
  }
}

TEST_F(StoreServiceTest, ListModelsAndListVersionsPageByName) {
  for (const char* model : {"m3", "m0", "m4", "m1", "m2"}) {
    CheckpointContents contents;
    ASSERT_OK(contents.model.Insert("w", at::ones({2})));
    ASSERT_OK(CommitCheckpoint(*local_, model, contents).status());
    if (std::string(model) == "m2") {
      for (int i = 0; i < 4; ++i) ASSERT_OK(CommitCheckpoint(*local_, model, contents).status());
    }
  }
  StartServer();
  std::vector<std::vector<std::string>> pages;
  v1::ListModelsRequest models_request;
  models_request.set_page_size(2);
  do {
    v1::ListModelsResponse response;
    ASSERT_TRUE(stub_->ListModels(Context().get(), models_request, &response).ok());
    pages.emplace_back();
    for (const v1::ModelInfo& model : response.models()) pages.back().push_back(model.name());
    models_request.set_page_token(response.next_page_token());
  } while (!models_request.page_token().empty() && pages.size() < 10);
  EXPECT_THAT(pages,
              ElementsAre(ElementsAre("m0", "m1"), ElementsAre("m2", "m3"), ElementsAre("m4")));

  std::vector<int64_t> versions;
  v1::ListVersionsRequest versions_request;
  versions_request.set_model("m2");
  versions_request.set_page_size(2);
  int calls = 0;
  do {
    v1::ListVersionsResponse response;
    ASSERT_TRUE(stub_->ListVersions(Context().get(), versions_request, &response).ok());
    EXPECT_LE(response.versions_size(), 2);
    for (const v1::VersionInfo& version : response.versions())
      versions.push_back(version.version());
    versions_request.set_page_token(response.next_page_token());
  } while (!versions_request.page_token().empty() && ++calls < 10);
  EXPECT_THAT(versions, ElementsAre(1, 2, 3, 4, 5));

  v1::ListModelsResponse models_response;
  models_request.set_page_token("not a name!");
  EXPECT_EQ(stub_->ListModels(Context().get(), models_request, &models_response).error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
  models_request.set_page_token("");
  models_request.set_page_size(-1);
  EXPECT_EQ(stub_->ListModels(Context().get(), models_request, &models_response).error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
  v1::ListVersionsResponse versions_response;
  versions_request.set_page_token("x");
  EXPECT_EQ(stub_->ListVersions(Context().get(), versions_request, &versions_response).error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
  versions_request.set_page_token("");
  versions_request.set_model("nope");
  EXPECT_EQ(stub_->ListVersions(Context().get(), versions_request, &versions_response).error_code(),
            grpc::StatusCode::NOT_FOUND);
}

TEST_F(StoreServiceTest, EveryCallNeedsTheBearerTokenButHealthChecksDoNot) {
  StartServer(kToken);
  const std::string right = std::string("Bearer ") + kToken;
  // Same-length wrong tokens (last byte, first byte changed) catch a comparison that looks at
  // lengths or prefixes only.
  std::string last_wrong = kToken, first_wrong = kToken;
  last_wrong.back() ^= 1;
  first_wrong.front() ^= 1;
  for (const std::string& authorization :
       {std::string(), std::string("Bearer wrong"), std::string("Basic ") + kToken,
        std::string(kToken), right + "x", "Bearer " + last_wrong, "Bearer " + first_wrong}) {
    SCOPED_TRACE(authorization);
    v1::StoreStats stats;
    EXPECT_EQ(stub_->GetStats(Context(authorization).get(), {}, &stats).error_code(),
              grpc::StatusCode::UNAUTHENTICATED);
    v1::FindMissingChunksResponse missing;
    EXPECT_EQ(stub_->FindMissingChunks(Context(authorization).get(), {}, &missing).error_code(),
              grpc::StatusCode::UNAUTHENTICATED);
    v1::ListModelsResponse models;
    EXPECT_EQ(stub_->ListModels(Context(authorization).get(), {}, &models).error_code(),
              grpc::StatusCode::UNAUTHENTICATED);
    v1::ListVersionsResponse versions;
    EXPECT_EQ(stub_->ListVersions(Context(authorization).get(), {}, &versions).error_code(),
              grpc::StatusCode::UNAUTHENTICATED);
    v1::Manifest manifest;
    EXPECT_EQ(stub_->GetManifest(Context(authorization).get(), {}, &manifest).error_code(),
              grpc::StatusCode::UNAUTHENTICATED);
    v1::SetAliasResponse set_alias;
    EXPECT_EQ(stub_->SetAlias(Context(authorization).get(), {}, &set_alias).error_code(),
              grpc::StatusCode::UNAUTHENTICATED);
    v1::DeleteAliasResponse delete_alias;
    EXPECT_EQ(stub_->DeleteAlias(Context(authorization).get(), {}, &delete_alias).error_code(),
              grpc::StatusCode::UNAUTHENTICATED);
    v1::DeleteVersionResponse delete_version;
    EXPECT_EQ(stub_->DeleteVersion(Context(authorization).get(), {}, &delete_version).error_code(),
              grpc::StatusCode::UNAUTHENTICATED);
    v1::ApplyRetentionResponse retention;
    EXPECT_EQ(stub_->ApplyRetention(Context(authorization).get(), {}, &retention).error_code(),
              grpc::StatusCode::UNAUTHENTICATED);
    v1::GarbageCollectResponse gc;
    EXPECT_EQ(stub_->GarbageCollect(Context(authorization).get(), {}, &gc).error_code(),
              grpc::StatusCode::UNAUTHENTICATED);
    v1::VerifyResponse verify;
    EXPECT_EQ(stub_->Verify(Context(authorization).get(), {}, &verify).error_code(),
              grpc::StatusCode::UNAUTHENTICATED);
    v1::ListAuditResponse audit;
    EXPECT_EQ(stub_->ListAudit(Context(authorization).get(), {}, &audit).error_code(),
              grpc::StatusCode::UNAUTHENTICATED);

    std::unique_ptr<grpc::ClientContext> upload_context = Context(authorization);
    v1::UploadResponse uploaded;
    auto writer = stub_->Upload(upload_context.get(), &uploaded);
    writer->Write(HeaderRequest("m", OneTensorHeader(1)));
    writer->WritesDone();
    EXPECT_EQ(writer->Finish().error_code(), grpc::StatusCode::UNAUTHENTICATED);
    std::unique_ptr<grpc::ClientContext> download_context = Context(authorization);
    v1::DownloadRequest download;
    *download.mutable_ref() = Ref("m");
    auto reader = stub_->Download(download_context.get(), download);
    v1::DownloadResponse part;
    EXPECT_FALSE(reader->Read(&part));
    EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::UNAUTHENTICATED);
  }
  // The scheme is case-insensitive (RFC 7235); the token is not.
  v1::StoreStats stats;
  EXPECT_TRUE(stub_->GetStats(Context(right).get(), {}, &stats).ok());
  EXPECT_TRUE(stub_->GetStats(Context(std::string("bearer ") + kToken).get(), {}, &stats).ok());

  auto health = grpc::health::v1::Health::NewStub(
      grpc::CreateChannel(server_->address(), grpc::InsecureChannelCredentials()));
  HealthCheckRequest health_request;
  health_request.set_service(v1::CheckpointStore::service_full_name());
  HealthCheckResponse health_response;
  ASSERT_TRUE(health->Check(Context().get(), health_request, &health_response).ok());
  EXPECT_EQ(health_response.status(), HealthCheckResponse::SERVING);
}

TEST_F(StoreServiceTest, ChangesAreAuditedAsTheirCallerAndPeerWithTheirOutcome) {
  StartServer();
  v1::Manifest header = OneTensorHeader(2);
  header.mutable_metadata()->set_producer("train.py");
  v1::UploadResponse uploaded;
  ASSERT_OK(Upload({HeaderRequest("m", header, {"best"}), DataRequest(0, 0, std::string(8, 'x')),
                    CommitRequest()},
                   &uploaded));
  v1::SetAliasRequest missing;
  missing.set_model("m");
  missing.set_alias("best");
  missing.set_version(7);
  v1::SetAliasResponse set_alias;
  EXPECT_EQ(stub_->SetAlias(Context().get(), missing, &set_alias).error_code(),
            grpc::StatusCode::NOT_FOUND);
  v1::GarbageCollectRequest dry_run;
  dry_run.set_dry_run(true);
  v1::GarbageCollectResponse collected;
  ASSERT_TRUE(stub_->GarbageCollect(Context().get(), dry_run, &collected).ok());

  v1::ListAuditResponse audit;
  ASSERT_TRUE(stub_->ListAudit(Context().get(), {}, &audit).ok());
  ASSERT_EQ(audit.records_size(), 2);  // the dry run changed nothing and is not there
  EXPECT_EQ(audit.next_after_sequence(), 0);
  const v1::AuditRecord& commit = audit.records(0);
  EXPECT_EQ(commit.sequence(), 1);
  EXPECT_EQ(commit.identity(), "anonymous");
  EXPECT_THAT(commit.peer(), ::testing::StartsWith("ipv4:127.0.0.1:"));
  EXPECT_EQ(commit.action(), "commit");
  EXPECT_EQ(commit.model(), "m");
  EXPECT_EQ(commit.version(), 1);
  EXPECT_EQ(commit.alias(), "best");
  EXPECT_EQ(commit.outcome(), v1::AuditRecord::OK);
  EXPECT_EQ(commit.detail(), "committed m@1: 8 bytes, 8 new; aliases best");
  const v1::AuditRecord& refused = audit.records(1);
  EXPECT_EQ(refused.action(), "set_alias");
  EXPECT_EQ(refused.version(), 7);
  EXPECT_EQ(refused.outcome(), v1::AuditRecord::FAILED);
  EXPECT_EQ(refused.error_code(), static_cast<int>(absl::StatusCode::kNotFound));
  EXPECT_THAT(refused.error_message(), HasSubstr("m@7 not found"));

  // The committing identity is the producer; the client's claim is a label.
  ASSERT_OK_AND_ASSIGN(v1::Manifest manifest, local_->GetManifest(Ref("m@1")));
  EXPECT_EQ(manifest.metadata().producer(), "anonymous");
  EXPECT_EQ(manifest.metadata().labels().at("client_producer"), "train.py");
}

TEST_F(StoreServiceTest, ListAuditPagesBySequence) {
  for (const char* model : {"a", "b", "a", "a", "b"}) {
    v1::AuditRecord record;
    record.set_identity("alice");
    record.set_action("commit");
    record.set_model(model);
    ASSERT_OK(local_->BeginAudit(record).status());
  }
  StartServer();
  std::vector<std::vector<int64_t>> pages;
  v1::ListAuditRequest request;
  request.set_page_size(2);
  do {
    v1::ListAuditResponse response;
    ASSERT_TRUE(stub_->ListAudit(Context().get(), request, &response).ok());
    std::vector<int64_t>& page = pages.emplace_back();
    for (const v1::AuditRecord& record : response.records()) page.push_back(record.sequence());
    request.set_after_sequence(response.next_after_sequence());
  } while (request.after_sequence() != 0 && pages.size() < 10);
  EXPECT_THAT(pages, ElementsAre(ElementsAre(1, 2), ElementsAre(3, 4), ElementsAre(5)));

  request.set_model("a");
  request.set_page_size(0);
  v1::ListAuditResponse only_a;
  ASSERT_TRUE(stub_->ListAudit(Context().get(), request, &only_a).ok());
  ASSERT_EQ(only_a.records_size(), 3);
  EXPECT_EQ(only_a.records(2).sequence(), 4);
  EXPECT_EQ(only_a.next_after_sequence(), 0);

  request.set_since_unix_micros(absl::ToUnixMicros(absl::Now() + absl::Hours(1)));
  v1::ListAuditResponse future;
  ASSERT_TRUE(stub_->ListAudit(Context().get(), request, &future).ok());
  EXPECT_EQ(future.records_size(), 0);

  v1::ListAuditRequest bad;
  bad.set_after_sequence(-1);
  v1::ListAuditResponse refused;
  EXPECT_EQ(stub_->ListAudit(Context().get(), bad, &refused).error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
  bad.set_after_sequence(0);
  bad.set_page_size(-1);
  EXPECT_EQ(stub_->ListAudit(Context().get(), bad, &refused).error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
}

TEST_F(StoreServiceTest, RegistryCallsKeepTheirReasonsAndListHistoryPagesBySequence) {
  StartServer();
  v1::CreateModelRequest create;
  create.set_model("m");
  create.mutable_details()->set_owner("vision");
  create.set_reason("new project");
  v1::ModelInfo created;
  ASSERT_TRUE(stub_->CreateModel(Context().get(), create, &created).ok());
  EXPECT_EQ(created.details().owner(), "vision");
  CheckpointContents contents;
  ASSERT_OK(contents.model.Insert("w", at::ones({2})));
  ASSERT_OK(CommitCheckpoint(*local_, "m", contents).status());
  ASSERT_OK(CommitCheckpoint(*local_, "m", contents).status());
  v1::AnnotateVersionRequest annotate;
  annotate.set_model("m");
  annotate.set_version(2);
  (*annotate.mutable_change()->mutable_set_tags())["stage"] = "eval";
  annotate.set_reason("evaluated");
  v1::VersionAnnotations annotations;
  ASSERT_TRUE(stub_->AnnotateVersion(Context().get(), annotate, &annotations).ok());
  EXPECT_EQ(annotations.tags().at("stage"), "eval");
  v1::SetAliasRequest set;
  set.set_model("m");
  set.set_alias("best");
  set.set_version(2);
  set.set_reason("tagged eval");
  v1::SetAliasResponse previous;
  ASSERT_TRUE(stub_->SetAlias(Context().get(), set, &previous).ok());

  // MODEL_CREATED, 2 x VERSION_COMMITTED, VERSION_ANNOTATED, ALIAS_SET: pages of two.
  std::vector<std::vector<std::string>> pages;
  v1::ListHistoryRequest request;
  request.set_model("m");
  request.set_page_size(2);
  do {
    v1::ListHistoryResponse response;
    ASSERT_TRUE(stub_->ListHistory(Context().get(), request, &response).ok());
    std::vector<std::string>& page = pages.emplace_back();
    for (const v1::RegistryEvent& event : response.events()) {
      page.push_back(absl::StrCat(v1::RegistryEvent::Kind_Name(event.kind()), ":", event.reason(),
                                  ":", event.identity()));
    }
    request.set_after_sequence(response.next_after_sequence());
  } while (request.after_sequence() != 0 && pages.size() < 10);
  EXPECT_THAT(
      pages, ElementsAre(
                 ElementsAre("MODEL_CREATED:new project:anonymous", "VERSION_COMMITTED::unknown"),
                 ElementsAre("VERSION_COMMITTED::unknown", "VERSION_ANNOTATED:evaluated:anonymous"),
                 ElementsAre("ALIAS_SET:tagged eval:anonymous")));
  v1::ListHistoryRequest negative;
  negative.set_after_sequence(-1);
  v1::ListHistoryResponse refused;
  EXPECT_EQ(stub_->ListHistory(Context().get(), negative, &refused).error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);

  // ListVersions with a filter selects; a malformed one is refused.
  v1::ListVersionsRequest versions;
  versions.set_model("m");
  versions.mutable_filter()->add_tags("stage=eval");
  v1::ListVersionsResponse selected;
  ASSERT_TRUE(stub_->ListVersions(Context().get(), versions, &selected).ok());
  ASSERT_EQ(selected.versions_size(), 1);
  EXPECT_EQ(selected.versions(0).version(), 2);
  versions.mutable_filter()->add_metrics()->set_name("val_acc");  // no bound
  EXPECT_EQ(stub_->ListVersions(Context().get(), versions, &selected).error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
}

// Corruption on the serving path: Download reads every chunk it sends with
// VersionReader::ReadTensorInto, straight from the RocksDB store (as main.cc serves it, no
// wrapper), and a chunk whose stored bytes fail their xxh3 must end the call with DATA_LOSS
// before any of its bytes go out, whichever chunk of whichever tensor it is.
class CorruptDownloadTest : public StoreServiceTest {
 protected:
  void SetUp() override {
    StoreServiceTest::SetUp();
    at::manual_seed(11);
    CheckpointContents contents;
    ASSERT_OK(contents.model.Insert("w", at::randn({9 * kMiB / 4})));  // chunks of 4 + 4 + 1 MiB
    ASSERT_OK(contents.model.Insert("small", at::randn({1000})));      // 4000 bytes
    Value extra = Value::Dict();
    extra.Set("rng", Value::Tensor(at::randn({300})));
    contents.extra = extra;
    ASSERT_OK(CommitCheckpoint(*local_, "m", contents).status());
    expected_ = {TensorBytes(contents.model.entry(0).tensor),
                 TensorBytes(contents.model.entry(1).tensor),
                 TensorBytes(extra.Find("rng")->tensor())};
    StoreServiceOptions options;
    options.worker_threads = 2;
    ASSERT_OK_AND_ASSIGN(service_, StoreService::Create(local_.get(), options));
    ASSERT_OK_AND_ASSIGN(
        server_,
        GrpcServer::Start({}, {{service_.get(), v1::CheckpointStore::service_full_name()}}));
    stub_ = NewStub();
  }

  // Flips one bit in the middle of the stored copy of `chunk` (found by its bytes in the pack
  // files; the test data is random, so they occur once) and returns where; FlipAt(that) undoes it.
  std::pair<std::string, int64_t> FlipStoredChunk(const std::string& chunk) {
    const std::string packs = std::string(std::getenv("TEST_TMPDIR")) + "/" +
                              ::testing::UnitTest::GetInstance()->current_test_info()->name() +
                              "/packs";
    std::vector<std::pair<std::string, int64_t>> found;
    DIR* directory = opendir(packs.c_str());
    EXPECT_NE(directory, nullptr) << packs;
    while (directory != nullptr) {
      dirent* entry = readdir(directory);
      if (entry == nullptr) break;
      const std::string name = entry->d_name;
      if (name.size() < 5 || name.substr(name.size() - 5) != ".pack") continue;
      std::ifstream file(packs + "/" + name, std::ios::binary);
      const std::string contents((std::istreambuf_iterator<char>(file)),
                                 std::istreambuf_iterator<char>());
      const size_t at = contents.find(chunk);
      if (at != std::string::npos) {
        found.emplace_back(packs + "/" + name, static_cast<int64_t>(at + chunk.size() / 2));
      }
    }
    if (directory != nullptr) closedir(directory);
    EXPECT_EQ(found.size(), 1u);
    if (found.empty()) return {};
    FlipAt(found[0]);
    return found[0];
  }

  static void FlipAt(const std::pair<std::string, int64_t>& where) {
    std::fstream file(where.first, std::ios::in | std::ios::out | std::ios::binary);
    file.seekg(where.second);
    char byte = 0;
    file.read(&byte, 1);
    file.seekp(where.second);
    file.put(static_cast<char>(byte ^ 0x40));
    EXPECT_TRUE(file.good()) << where.first;
  }

  std::vector<std::string> expected_;  // bytes of w, small, extra/rng
};

TEST_F(CorruptDownloadTest, EveryCorruptChunkEndsTheDownloadWithDataLossBeforeItsBytes) {
  ASSERT_OK_AND_ASSIGN(v1::Manifest stored, local_->GetManifest(Ref("m@1")));
  ASSERT_EQ(stored.tensors_size(), 2);
  ASSERT_EQ(stored.state_tensors_size(), 1);
  ASSERT_EQ(stored.tensors(0).chunks_size(), 3);
  int corrupted = 0;
  for (int index = 0; index < 3; ++index) {
    const v1::TensorMeta& meta =
        index < 2 ? stored.tensors(index) : stored.state_tensors(index - 2);
    int64_t offset = 0;
    for (const v1::ChunkRef& chunk : meta.chunks()) {
      SCOPED_TRACE(absl::StrCat("tensor '", meta.key(), "' bytes ", offset));
      const std::string bytes = expected_[index].substr(offset, chunk.length());
      const std::pair<std::string, int64_t> flipped = FlipStoredChunk(bytes);
      ASSERT_FALSE(flipped.first.empty());
      v1::DownloadRequest request;
      *request.mutable_ref() = Ref("m");
      request.set_include_state(true);
      request.add_keys(meta.key());
      v1::Manifest manifest;
      std::vector<v1::TensorData> data;
      EXPECT_THAT(Download(request, &manifest, &data),
                  StatusIs(absl::StatusCode::kDataLoss,
                           AllOf(HasSubstr(absl::StrCat("reading bytes ", offset, "..",
                                                        offset + chunk.length(), " of tensor '",
                                                        meta.key(), "'")),
                                 HasSubstr("xxh3"))));
      // What did arrive is the sound chunks before the bad one, and none of the bad one.
      std::string received;
      for (const v1::TensorData& message : data) {
        EXPECT_EQ(message.tensor_index(), index);
        received += message.data();
      }
      EXPECT_TRUE(received == expected_[index].substr(0, offset))
          << received.size() << " bytes arrived, " << offset << " were sound";
      FlipAt(flipped);  // restored
      ++corrupted;
      offset += chunk.length();
    }
  }
  EXPECT_EQ(corrupted, 5);
  // Restored, the whole version downloads intact.
  v1::DownloadRequest request;
  *request.mutable_ref() = Ref("m");
  request.set_include_state(true);
  v1::Manifest manifest;
  std::vector<v1::TensorData> data;
  ASSERT_OK(Download(request, &manifest, &data));
  std::vector<std::string> received(3);
  for (const v1::TensorData& message : data) received.at(message.tensor_index()) += message.data();
  EXPECT_TRUE(received == expected_);
}

// DownloadRequest.client_checks_chunks: the server sends a chunk as stored, unchecked, to a
// client that checks every chunk itself, so that client's own check is what must catch the damage
// (RemoteCheckpointStore's is tested by damaging chunks in transit).
TEST_F(CorruptDownloadTest, AClientThatChecksChunksIsSentTheStoredBytesUnchecked) {
  ASSERT_OK_AND_ASSIGN(v1::Manifest stored, local_->GetManifest(Ref("m@1")));
  ASSERT_EQ(stored.tensors(0).chunks_size(), 3);
  const v1::ChunkRef& middle = stored.tensors(0).chunks(1);
  const int64_t offset = stored.tensors(0).chunks(0).length();
  const std::pair<std::string, int64_t> flipped =
      FlipStoredChunk(expected_[0].substr(offset, middle.length()));
  ASSERT_FALSE(flipped.first.empty());
  v1::DownloadRequest request;
  *request.mutable_ref() = Ref("m");
  request.add_keys("w");
  v1::Manifest manifest;
  std::vector<v1::TensorData> data;
  // Unchecked on the server, so the whole tensor arrives...
  // (No ASSERT before FlipAt below: the pack is restored whatever fails.)
  request.set_client_checks_chunks(true);
  EXPECT_OK(Download(request, &manifest, &data));
  std::string received;
  for (const v1::TensorData& message : data) received += message.data();
  EXPECT_EQ(received.size(), expected_[0].size());
  if (received.size() == expected_[0].size() && manifest.tensors_size() > 0) {
    // ...sound chunks intact, the damaged one as stored: its checksum is not the manifest's.
    EXPECT_TRUE(received.substr(0, offset) == expected_[0].substr(0, offset));
    const std::string arrived = received.substr(offset, middle.length());
    EXPECT_FALSE(arrived == expected_[0].substr(offset, middle.length()));
    EXPECT_NE(Xxh3(arrived), manifest.tensors(0).chunks(1).xxh3_64());
  }
  // The same request without the flag ends with DATA_LOSS before the damaged chunk's bytes.
  request.set_client_checks_chunks(false);
  data.clear();
  EXPECT_THAT(Download(request, &manifest, &data),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("xxh3")));
  FlipAt(flipped);
}

// End to end with the real client: RemoteCheckpointStore asks for chunks unchecked, so its own
// check is what stops a chunk damaged on disk, with an error that points at the store.
TEST_F(CorruptDownloadTest, RemoteCheckpointStoreStopsAChunkDamagedOnDiskItself) {
  ASSERT_OK_AND_ASSIGN(v1::Manifest stored, local_->GetManifest(Ref("m@1")));
  ASSERT_EQ(stored.tensors(0).chunks_size(), 3);
  const int64_t offset = stored.tensors(0).chunks(0).length();
  RemoteStoreOptions options;
  options.address = server_->address();
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<RemoteCheckpointStore> remote,
                       RemoteCheckpointStore::Connect(options));
  const std::pair<std::string, int64_t> flipped =
      FlipStoredChunk(expected_[0].substr(offset, stored.tensors(0).chunks(1).length()));
  ASSERT_FALSE(flipped.first.empty());
  // (No ASSERT before FlipAt below: the pack is restored whatever fails.)
  EXPECT_THAT(
      LoadCheckpoint(*remote, Ref("m")).status(),
      StatusIs(absl::StatusCode::kDataLoss,
               AllOf(HasSubstr("tensor 'w'"), HasSubstr(absl::StrCat("bytes ", offset, "..")),
                     HasSubstr("wrong xxh3"), HasSubstr("ckpt verify"))));
  // The tensors whose chunks are sound still read.
  absl::StatusOr<at::Tensor> small = ReadTensor(*remote, "m", 1, "small");
  EXPECT_OK(small.status());
  if (small.ok()) EXPECT_EQ(TensorBytes(*small), expected_[1]);
  FlipAt(flipped);
  ASSERT_OK_AND_ASSIGN(LoadedCheckpoint restored, LoadCheckpoint(*remote, Ref("m")));
  const at::Tensor* w = restored.contents.model.Find("w");
  ASSERT_NE(w, nullptr);
  EXPECT_EQ(TensorBytes(*w), expected_[0]);
}

TEST(StoreServiceCreateTest, RejectsMissingStoreAndZeroThreads) {
  EXPECT_THAT(StoreService::Create(nullptr, {}), StatusIs(absl::StatusCode::kInvalidArgument));
  StoreOptions options;
  options.db_path = std::string(std::getenv("TEST_TMPDIR")) + "/create";
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<RocksDbCheckpointStore> store,
                       RocksDbCheckpointStore::Open(options));
  StoreServiceOptions service_options;
  service_options.worker_threads = 0;
  EXPECT_THAT(StoreService::Create(store.get(), service_options),
              StatusIs(absl::StatusCode::kInvalidArgument, "worker_threads"));
  service_options.worker_threads = 1;
  service_options.watch_write_timeout = absl::ZeroDuration();
  EXPECT_THAT(StoreService::Create(store.get(), service_options),
              StatusIs(absl::StatusCode::kInvalidArgument, "watch_write_timeout"));
}

}  // namespace
}  // namespace ckpt

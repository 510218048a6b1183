// Crash test for the checkpoint store service: SIGKILL the real `checkpoint_store` process at
// random moments while two clients upload over gRPC, restart it on the same database, and check
// against an oracle of acknowledged commits:
//   - every acknowledged commit is still there, byte for byte (lost acknowledged commits: 0),
//   - every visible version is whole: its tensors decode to exactly one writer's checkpoint, and
//     the store's own verify finds no problem (torn versions: 0).
// Prints one summary line with kills done, commits acknowledged, torn and lost counts.

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>
#include <map>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "gtest/gtest.h"
#include "proto/ckpt/v1/checkpoint_store.grpc.pb.h"

namespace ckpt {
namespace {

constexpr int kWriters = 2;
constexpr int kKills = 8;
// Two 4 MiB store chunks and five 1 MiB upload messages per version.
constexpr int64_t kWeightElements = (4 << 20) / 4 + (512 << 10) / 4;
constexpr int64_t kBiasElements = 16;
constexpr int kMaxMessageBytes = 1 << 20;

// Writer w's n-th checkpoint is identified by seed = w * 1'000'000 + n; its bytes are a pure
// function of the seed, so any visible version can be checked for wholeness.
int32_t WeightValue(int64_t seed, int64_t i) { return static_cast<int32_t>(seed * 7919 + i); }

std::string TensorBytes(int64_t seed, bool weight) {
  if (weight) {
    std::string bytes(kWeightElements * 4, '\0');
    for (int64_t i = 0; i < kWeightElements; ++i) {
      const int32_t value = WeightValue(seed, i);
      std::memcpy(&bytes[i * 4], &value, 4);
    }
    return bytes;
  }
  std::string bytes(kBiasElements * 8, '\0');
  for (int64_t i = 0; i < kBiasElements; ++i) std::memcpy(&bytes[i * 8], &seed, 8);
  return bytes;
}

std::string ModelFor(int writer) {
  // Writer 0 has a model to itself; both writers also share one (two writers on one model).
  return writer == 0 ? "crash-solo" : "crash-shared";
}

class ServerProcess {
 public:
  ServerProcess(std::string binary, std::string db)
      : binary_(std::move(binary)), db_(std::move(db)) {}

  // Starts the server and waits for its port file. Returns the address.
  std::string Start() {
    const std::string port_file = absl::StrCat(db_, ".port.", ++starts_);
    pid_ = fork();
    if (pid_ == 0) {
      const std::string db_flag = "--db_path=" + db_;
      const std::string port_flag = "--port_file=" + port_file;
      execl(binary_.c_str(), binary_.c_str(), db_flag.c_str(), "--listen=127.0.0.1:0",
            port_flag.c_str(), "--abandoned_upload_grace=0s", static_cast<char*>(nullptr));
      _exit(127);
    }
    const absl::Time deadline = absl::Now() + absl::Seconds(60);
    while (absl::Now() < deadline) {
      std::ifstream in(port_file);
      int port = 0;
      if (in >> port && port > 0) return absl::StrCat("127.0.0.1:", port);
      int status = 0;
      if (waitpid(pid_, &status, WNOHANG) == pid_) {
        ADD_FAILURE() << "checkpoint_store exited during start-up, status " << status;
        return "";
      }
      absl::SleepFor(absl::Milliseconds(10));  // Polling a file another process writes.
    }
    ADD_FAILURE() << "checkpoint_store did not write " << port_file << " within 60 s";
    return "";
  }

  void Kill() {
    kill(pid_, SIGKILL);
    int status = 0;
    waitpid(pid_, &status, 0);
  }

 private:
  std::string binary_, db_;
  pid_t pid_ = -1;
  int starts_ = 0;
};

struct Oracle {
  absl::Mutex mutex;
  // model@version -> seed, for every commit the server acknowledged.
  std::map<std::pair<std::string, int64_t>, int64_t> acknowledged ABSL_GUARDED_BY(mutex);
};

// Uploads checkpoint `seed` to `model`. Returns the committed version, or 0 if the call failed.
int64_t Upload(v1::CheckpointStore::Stub& stub, const std::string& model, int64_t seed) {
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(20));
  v1::UploadResponse response;
  auto stream = stub.Upload(&context, &response);
  v1::UploadRequest header;
  header.mutable_header()->set_model(model);
  v1::Manifest* manifest = header.mutable_header()->mutable_manifest();
  v1::TensorMeta* weight = manifest->add_tensors();
  weight->set_key("layer.weight");
  weight->set_dtype(v1::DTYPE_INT32);
  weight->add_shape(kWeightElements);
  weight->set_byte_length(kWeightElements * 4);
  v1::TensorMeta* bias = manifest->add_tensors();
  bias->set_key("layer.seed");
  bias->set_dtype(v1::DTYPE_INT64);
  bias->add_shape(kBiasElements);
  bias->set_byte_length(kBiasElements * 8);
  manifest->mutable_metadata()->set_global_step(seed);
  if (!stream->Write(header)) return 0;
  for (int index = 0; index < 2; ++index) {
    const std::string bytes = TensorBytes(seed, index == 0);
    for (size_t offset = 0; offset < bytes.size(); offset += kMaxMessageBytes) {
      v1::UploadRequest data;
      data.mutable_data()->set_tensor_index(index);
      data.mutable_data()->set_offset(offset);
      data.mutable_data()->set_data(bytes.substr(offset, kMaxMessageBytes));
      if (!stream->Write(data)) return 0;
    }
  }
  v1::UploadRequest commit;
  commit.mutable_commit();
  if (!stream->Write(commit) || !stream->WritesDone()) return 0;
  if (!stream->Finish().ok()) return 0;
  return response.version().version();
}

// Downloads MODEL@version and returns the seed its bytes decode to, or -1 if they decode to no
// writer's checkpoint (a torn version). 0 when the download itself failed.
int64_t DownloadSeed(v1::CheckpointStore::Stub& stub, const std::string& model, int64_t version,
                     std::string* error) {
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(20));
  v1::DownloadRequest request;
  request.mutable_ref()->set_model(model);
  request.mutable_ref()->set_version(version);
  auto stream = stub.Download(&context, request);
  v1::DownloadResponse response;
  std::vector<std::string> tensors(2);
  while (stream->Read(&response)) {
    if (response.has_data()) {
      std::string& bytes = tensors.at(response.data().tensor_index());
      if (static_cast<int64_t>(bytes.size()) != response.data().offset()) {
        *error = "out-of-order data";
        return -1;
      }
      bytes += response.data().data();
    }
  }
  const grpc::Status status = stream->Finish();
  if (!status.ok()) {
    *error = absl::StrCat("download failed: ", status.error_message());
    return status.error_code() == grpc::StatusCode::DATA_LOSS ? -1 : 0;
  }
  if (tensors[1].size() != kBiasElements * 8) {
    *error = "seed tensor has the wrong size";
    return -1;
  }
  int64_t seed = 0;
  std::memcpy(&seed, tensors[1].data(), 8);
  if (tensors[0] != TensorBytes(seed, true) || tensors[1] != TensorBytes(seed, false)) {
    *error = absl::StrCat("bytes do not match checkpoint ", seed);
    return -1;
  }
  return seed;
}

struct WaitState {
  int* generation;
  bool* done;
  int seen;
};

TEST(StoreCrashTest, KillsAtRandomMomentsLoseNoAcknowledgedCommitAndTearNoVersion) {
  const std::string db = std::string(std::getenv("TEST_TMPDIR")) + "/crash-db";
  ServerProcess server("services/checkpoint_store/checkpoint_store", db);
  Oracle oracle;
  std::mt19937 rng(20261202);

  absl::Mutex address_mutex;
  std::string address;
  int generation = 0;
  bool done = false;
  std::atomic<int64_t> attempts{0};

  std::vector<std::thread> writers;
  for (int writer = 0; writer < kWriters; ++writer) {
    writers.emplace_back([&, writer] {
      int64_t sequence = 0;
      int seen_generation = 0;
      while (true) {
        // Wait for a server generation this writer has not used yet (or the end).
        std::string current;
        {
          absl::MutexLock lock(&address_mutex);
          WaitState state{&generation, &done, seen_generation};
          address_mutex.Await(absl::Condition(
              +[](WaitState* s) { return *s->generation > s->seen || *s->done; }, &state));
          if (done) return;
          current = address;
          seen_generation = generation;
        }
        auto stub = v1::CheckpointStore::NewStub(
            grpc::CreateChannel(current, grpc::InsecureChannelCredentials()));
        while (true) {
          const int64_t seed = writer * 1'000'000 + ++sequence;
          attempts.fetch_add(1);
          const int64_t version = Upload(*stub, ModelFor(writer), seed);
          if (version == 0) break;  // The server died under us.
          absl::MutexLock lock(&oracle.mutex);
          oracle.acknowledged[{ModelFor(writer), version}] = seed;
        }
      }
    });
  }

  int torn = 0, lost = 0, kills = 0;
  auto check_everything = [&](const std::string& at) {
    auto stub =
        v1::CheckpointStore::NewStub(grpc::CreateChannel(at, grpc::InsecureChannelCredentials()));
    std::map<std::pair<std::string, int64_t>, int64_t> acknowledged;
    {
      absl::MutexLock lock(&oracle.mutex);
      acknowledged = oracle.acknowledged;
    }
    for (const std::string& model : {ModelFor(0), ModelFor(1)}) {
      grpc::ClientContext context;
      context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(20));
      v1::ListVersionsRequest request;
      request.set_model(model);
      v1::ListVersionsResponse versions;
      const grpc::Status listed = stub->ListVersions(&context, request, &versions);
      if (!listed.ok()) continue;  // Nothing committed to this model yet.
      for (const v1::VersionInfo& info : versions.versions()) {
        std::string error;
        const int64_t seed = DownloadSeed(*stub, model, info.version(), &error);
        auto it = acknowledged.find({model, info.version()});
        if (seed < 0 || (it != acknowledged.end() && seed != it->second)) {
          ++torn;
          ADD_FAILURE() << model << "@" << info.version() << " is torn: " << error;
        }
      }
    }
    for (const auto& [key, seed] : acknowledged) {
      std::string error;
      const int64_t found = DownloadSeed(*stub, key.first, key.second, &error);
      if (found != seed) {
        ++lost;
        ADD_FAILURE() << "acknowledged " << key.first << "@" << key.second << " (checkpoint "
                      << seed << ") lost: " << error;
      }
    }
    // The registry's history is written in each commit's own batch: after any kill it names
    // exactly the versions that exist, each once.
    std::set<std::pair<std::string, int64_t>> listed, committed_events;
    for (const std::string& model : {ModelFor(0), ModelFor(1)}) {
      grpc::ClientContext context;
      context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(20));
      v1::ListVersionsRequest request;
      request.set_model(model);
      v1::ListVersionsResponse versions;
      if (!stub->ListVersions(&context, request, &versions).ok()) continue;
      for (const v1::VersionInfo& info : versions.versions()) listed.emplace(model, info.version());
    }
    for (int64_t after = 0;;) {
      grpc::ClientContext context;
      context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(20));
      v1::ListHistoryRequest request;
      request.set_after_sequence(after);
      v1::ListHistoryResponse page;
      const grpc::Status read = stub->ListHistory(&context, request, &page);
      ASSERT_TRUE(read.ok()) << read.error_message();
      for (const v1::RegistryEvent& event : page.events()) {
        if (event.kind() != v1::RegistryEvent::VERSION_COMMITTED) continue;
        if (!committed_events.emplace(event.model(), event.version()).second) {
          ++torn;
          ADD_FAILURE() << "the history commits " << event.model() << "@" << event.version()
                        << " twice";
        }
      }
      after = page.next_after_sequence();
      if (after == 0) break;
    }
    if (committed_events != listed) {
      ++torn;
      ADD_FAILURE() << "the history's commits (" << committed_events.size()
                    << ") are not the versions that exist (" << listed.size() << ")";
    }

    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
    v1::VerifyResponse verified;
    ASSERT_TRUE(stub->Verify(&context, v1::VerifyRequest(), &verified).ok());
    torn += verified.problems_size();
    for (const v1::VerifyProblem& problem : verified.problems()) {
      ADD_FAILURE() << "verify: " << problem.model() << "@" << problem.version() << " "
                    << problem.message();
    }
  };

  auto acknowledged_count = [&oracle] {
    absl::MutexLock lock(&oracle.mutex);
    return oracle.acknowledged.size();
  };
  absl::Duration time_per_commit;
  for (int round = 0; round <= kKills; ++round) {
    const std::string current = server.Start();
    ASSERT_FALSE(current.empty());
    check_everything(current);
    if (round == kKills) break;
    {
      absl::MutexLock lock(&address_mutex);
      address = current;
      ++generation;
    }
    if (round == 0) {
      // Calibrate to this machine's speed, which varies tenfold with load: let two commits land
      // before the first kill and time them.
      const absl::Time start = absl::Now();
      while (acknowledged_count() < 2 && absl::Now() - start < absl::Seconds(120)) {
        absl::SleepFor(absl::Milliseconds(5));
      }
      time_per_commit = std::max(absl::Milliseconds(20), (absl::Now() - start) / 2);
    } else {
      // The random moment: anywhere from mid-header to mid-commit of some upload, between half a
      // commit's time and three.
      absl::SleepFor(time_per_commit * std::uniform_real_distribution<double>(0.5, 3.0)(rng));
    }
    server.Kill();
    ++kills;
  }
  {
    absl::MutexLock lock(&address_mutex);
    done = true;
  }
  for (std::thread& writer : writers) writer.join();
  server.Kill();

  int64_t acknowledged = 0;
  {
    absl::MutexLock lock(&oracle.mutex);
    acknowledged = oracle.acknowledged.size();
  }
  std::cout << "store crash test: " << kills << " kills, " << attempts.load()
            << " uploads attempted, " << acknowledged << " commits acknowledged, " << torn
            << " torn versions seen, " << lost << " acknowledged commits lost\n";
  EXPECT_EQ(torn, 0);
  EXPECT_EQ(lost, 0);
  // The test really wrote while it killed: commits landed between most kills.
  EXPECT_GT(acknowledged, kKills / 2);
}

}  // namespace
}  // namespace ckpt

// Crash test for the checkpoint store service: SIGKILL the real `checkpoint_store` process while
// two clients upload over gRPC and a third deletes versions, applies retention and collects
// garbage, restart it on the same database, and check against an oracle:
//   - every acknowledged commit that no acknowledged delete removed is listed and byte for byte
//     whole (lost acknowledged commits: 0); one named by an interrupted delete or retention may
//     be gone, and is then held to stay gone,
//   - every acknowledged delete stays deleted: never listed again, NOT_FOUND to Download,
//   - every listed version reads back whole: any failed read counts as torn, as do bytes that
//     decode to no writer's checkpoint, verify's findings, and a history that disagrees with the
//     versions that exist (torn versions: 0),
//   - every version carries one frozen tensor with the same bytes (one chunk, deduplicated across
//     all versions of both models), so a GC that frees a chunk a live version still references, or
//     a delete that miscounts references, shows up as a torn version or a verify finding.
// Kills are aimed: after a calibration round, one in three lands at a random moment of the
// uploads, one while a GarbageCollect is in flight, one while a DeleteVersion or ApplyRetention
// is. The test asserts that the kills really cut uploads and maintenance calls (a call counts as
// cut when it began before the kill and got no reply), so it cannot pass by killing idle servers.
// Prints one summary line with the counts.

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>
#include <iterator>
#include <map>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <utility>
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
// Round 0 calibrates; then kills cycle through: a random moment, during GC, during a delete.
constexpr int kKills = 12;
// Per version: a unique weight of two 4 MiB store chunks, a frozen tensor every version shares
// (one chunk), and a small unique seed tensor; seven 1 MiB upload messages and a tail.
constexpr int64_t kWeightElements = (4 << 20) / 4 + (512 << 10) / 4;
constexpr int64_t kFrozenElements = (1 << 20) / 4 + (256 << 10) / 4;
constexpr int64_t kSeedElements = 16;
constexpr int kTensors = 3;  // weight, frozen, seed: the manifest's order.
constexpr int kMaxMessageBytes = 1 << 20;
// The maintenance thread leaves a model at least this many acknowledged versions when it picks
// one to delete, so every check has versions to read.
constexpr int kKeepAcknowledged = 3;

using Key = std::pair<std::string, int64_t>;  // model, version.

// Writer w's n-th checkpoint is identified by seed = w * 1'000'000 + n; its unique bytes are a
// pure function of the seed, so any visible version can be checked for wholeness.
std::string TensorBytes(int64_t seed, int index) {
  if (index == 0) {
    std::string bytes(kWeightElements * 4, '\0');
    for (int64_t i = 0; i < kWeightElements; ++i) {
      const int32_t value = static_cast<int32_t>(seed * 7919 + i);
      std::memcpy(&bytes[i * 4], &value, 4);
    }
    return bytes;
  }
  if (index == 1) {
    static const std::string* const frozen = [] {
      auto* bytes = new std::string(kFrozenElements * 4, '\0');
      for (int64_t i = 0; i < kFrozenElements; ++i) {
        const int32_t value = static_cast<int32_t>(i * 2654435761u ^ 0x5eed);
        std::memcpy(&(*bytes)[i * 4], &value, 4);
      }
      return bytes;
    }();
    return *frozen;
  }
  std::string bytes(kSeedElements * 8, '\0');
  for (int64_t i = 0; i < kSeedElements; ++i) std::memcpy(&bytes[i * 8], &seed, 8);
  return bytes;
}

std::string ModelFor(int writer) { return writer == 0 ? "crash-solo" : "crash-shared"; }
const std::vector<std::string>& Models() {
  static const auto* const models = new std::vector<std::string>{ModelFor(0), ModelFor(1)};
  return *models;
}

std::chrono::system_clock::time_point Deadline(int seconds) {
  return std::chrono::system_clock::now() + std::chrono::seconds(seconds);
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
      const std::string db_flag = "--store_dir=" + db_;
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

// What the clients were told, and what therefore must hold after any kill.
struct Oracle {
  absl::Mutex mutex;
  // Acknowledged commits no acknowledged delete removed -> seed: listed and whole after any kill.
  std::map<Key, int64_t> acknowledged ABSL_GUARDED_BY(mutex);
  // Acknowledged commits named by a delete or retention that has not answered (yet, or ever):
  // either listed and whole, or gone. The next check settles each one.
  std::map<Key, int64_t> maybe_deleted ABSL_GUARDED_BY(mutex);
  // Versions whose delete was acknowledged or seen to have happened: never listed again.
  std::set<Key> deleted ABSL_GUARDED_BY(mutex);
  // Models with an acknowledged commit: from then on ListVersions must answer.
  std::set<std::string> models_with_commits ABSL_GUARDED_BY(mutex);
};

// The server generations: which one clients should use, and which one has been killed. A call
// that begins while its generation is not yet killed and fails after the kill was cut by it.
struct Generations {
  absl::Mutex mutex;
  std::string address ABSL_GUARDED_BY(mutex);
  int current ABSL_GUARDED_BY(mutex) = 0;
  int killed ABSL_GUARDED_BY(mutex) = 0;
  bool done ABSL_GUARDED_BY(mutex) = false;

  // Blocks until a generation newer than `seen` is up (returns it and its address) or the test
  // is done (returns 0).
  int WaitForNext(int seen, std::string* at) {
    absl::MutexLock lock(&mutex);
    auto ready = [this, seen]()
                     ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex) { return done || current > seen; };
    mutex.Await(absl::Condition(&ready));
    if (done) return 0;
    *at = address;
    return current;
  }
  bool Killed(int generation) {
    absl::MutexLock lock(&mutex);
    return killed >= generation;
  }
};

enum class Op { kNone, kGc, kDelete, kRetention };

// The maintenance call in flight, for kills aimed at one.
struct InFlight {
  absl::Mutex mutex;
  Op op ABSL_GUARDED_BY(mutex) = Op::kNone;
  int generation ABSL_GUARDED_BY(mutex) = 0;
  int64_t call ABSL_GUARDED_BY(mutex) = 0;  // counts the calls begun.
};

struct Counts {
  std::atomic<int64_t> upload_attempts{0};
  std::atomic<int64_t> uploads_acknowledged{0};
  std::atomic<int64_t> uploads_in_flight{0};
  std::atomic<int64_t> uploads_cut{0};             // began before a kill, never acknowledged.
  std::atomic<int64_t> uploads_cut_after_send{0};  // of those: the client had sent it all.
  std::atomic<int64_t> gcs{0};                     // acknowledged GarbageCollect calls.
  std::atomic<int64_t> gcs_beside_uploads{0};      // of those: uploads in flight at start and end.
  std::atomic<int64_t> gcs_cut{0};
  std::atomic<int64_t> chunks_freed{0};
  std::atomic<int64_t> uploads_reclaimed{0};
  std::atomic<int64_t> deletes{0};  // acknowledged DeleteVersion calls.
  std::atomic<int64_t> retentions{0};
  std::atomic<int64_t> retention_deletes{0};
  std::atomic<int64_t> deletes_cut{0};  // DeleteVersion or ApplyRetention calls cut by a kill.
  std::atomic<int64_t> gc_micros{0};
  std::atomic<int64_t> delete_micros{0};
  absl::Mutex mutex;
  std::set<int> generations_with_cut_upload ABSL_GUARDED_BY(mutex);
};

struct UploadOutcome {
  grpc::Status status;
  int64_t version = 0;
  bool commit_sent = false;
};

// Uploads checkpoint `seed` to `model`.
UploadOutcome Upload(v1::CheckpointStore::Stub& stub, const std::string& model, int64_t seed) {
  UploadOutcome outcome;
  grpc::ClientContext context;
  context.set_deadline(Deadline(30));
  v1::UploadResponse response;
  auto stream = stub.Upload(&context, &response);
  auto sent = [&]() -> bool {
    v1::UploadRequest header;
    header.mutable_header()->set_model(model);
    v1::Manifest* manifest = header.mutable_header()->mutable_manifest();
    const std::pair<const char*, int64_t> tensors[kTensors] = {
        {"layer.weight", kWeightElements},
        {"frozen.embedding", kFrozenElements},
        {"layer.seed", 0}};
    for (int index = 0; index < kTensors; ++index) {
      v1::TensorMeta* meta = manifest->add_tensors();
      meta->set_key(tensors[index].first);
      if (index == 2) {
        meta->set_dtype(v1::DTYPE_INT64);
        meta->add_shape(kSeedElements);
        meta->set_byte_length(kSeedElements * 8);
      } else {
        meta->set_dtype(v1::DTYPE_INT32);
        meta->add_shape(tensors[index].second);
        meta->set_byte_length(tensors[index].second * 4);
      }
    }
    manifest->mutable_metadata()->set_global_step(seed);
    if (!stream->Write(header)) return false;
    for (int index = 0; index < kTensors; ++index) {
      const std::string bytes = TensorBytes(seed, index);
      for (size_t offset = 0; offset < bytes.size(); offset += kMaxMessageBytes) {
        v1::UploadRequest data;
        data.mutable_data()->set_tensor_index(index);
        data.mutable_data()->set_offset(offset);
        data.mutable_data()->set_data(bytes.substr(offset, kMaxMessageBytes));
        if (!stream->Write(data)) return false;
      }
    }
    v1::UploadRequest commit;
    commit.mutable_commit();
    if (!stream->Write(commit)) return false;
    outcome.commit_sent = true;
    return stream->WritesDone();
  }();
  (void)sent;  // A failed write shows in Finish's status.
  outcome.status = stream->Finish();
  if (outcome.status.ok()) outcome.version = response.version().version();
  return outcome;
}

struct Read {
  grpc::StatusCode code = grpc::StatusCode::OK;
  int64_t seed = -1;  // -1 unless the bytes are exactly one writer's checkpoint.
  std::string error;
};

// Downloads MODEL@version; `seed` is the checkpoint its bytes decode to.
Read DownloadSeed(v1::CheckpointStore::Stub& stub, const std::string& model, int64_t version) {
  Read read;
  grpc::ClientContext context;
  context.set_deadline(Deadline(30));
  v1::DownloadRequest request;
  request.mutable_ref()->set_model(model);
  request.mutable_ref()->set_version(version);
  auto stream = stub.Download(&context, request);
  v1::DownloadResponse response;
  std::vector<std::string> tensors(kTensors);
  bool ordered = true;
  while (stream->Read(&response)) {
    if (!response.has_data()) continue;
    if (response.data().tensor_index() < 0 || response.data().tensor_index() >= kTensors) {
      ordered = false;
      continue;
    }
    std::string& bytes = tensors[response.data().tensor_index()];
    if (static_cast<int64_t>(bytes.size()) != response.data().offset()) ordered = false;
    bytes += response.data().data();
  }
  const grpc::Status status = stream->Finish();
  read.code = status.error_code();
  if (!status.ok()) {
    read.error =
        absl::StrCat("download failed (code ", status.error_code(), "): ", status.error_message());
    return read;
  }
  if (!ordered) {
    read.error = "out-of-order or out-of-range data";
    return read;
  }
  if (tensors[2].size() != kSeedElements * 8) {
    read.error = "seed tensor has the wrong size";
    return read;
  }
  int64_t seed = 0;
  std::memcpy(&seed, tensors[2].data(), 8);
  if (tensors[1] != TensorBytes(seed, 1)) {
    read.error = "the frozen (shared) tensor's bytes differ";
    return read;
  }
  if (tensors[0] != TensorBytes(seed, 0) || tensors[2] != TensorBytes(seed, 2)) {
    read.error = absl::StrCat("bytes do not match checkpoint ", seed);
    return read;
  }
  read.seed = seed;
  return read;
}

TEST(StoreCrashTest, KillsDuringUploadsGcAndDeletesLoseNoAcknowledgedChangeAndTearNoVersion) {
  const std::string db = std::string(std::getenv("TEST_TMPDIR")) + "/crash-db";
  ServerProcess server("services/checkpoint_store/checkpoint_store", db);
  Oracle oracle;
  Generations generations;
  InFlight in_flight;
  Counts counts;
  std::mt19937 rng(20261202);
  // Microseconds per commit, measured in round 0; the maintenance thread paces itself by it.
  std::atomic<int64_t> commit_micros{20'000};

  std::vector<std::thread> threads;
  for (int writer = 0; writer < kWriters; ++writer) {
    threads.emplace_back([&, writer] {
      const std::string model = ModelFor(writer);
      int64_t sequence = 0;
      std::string address;
      for (int generation = 0; (generation = generations.WaitForNext(generation, &address));) {
        auto stub = v1::CheckpointStore::NewStub(
            grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
        while (!generations.Killed(generation)) {
          const int64_t seed = writer * 1'000'000 + ++sequence;
          counts.upload_attempts.fetch_add(1);
          counts.uploads_in_flight.fetch_add(1);
          const UploadOutcome outcome = Upload(*stub, model, seed);
          counts.uploads_in_flight.fetch_sub(1);
          if (outcome.status.ok()) {
            absl::MutexLock lock(&oracle.mutex);
            oracle.acknowledged[{model, outcome.version}] = seed;
            oracle.models_with_commits.insert(model);
            counts.uploads_acknowledged.fetch_add(1);
            continue;
          }
          if (!generations.Killed(generation)) {
            ADD_FAILURE() << "upload of checkpoint " << seed << " to " << model
                          << " failed while the server was up: " << outcome.status.error_message();
            continue;
          }
          counts.uploads_cut.fetch_add(1);
          if (outcome.commit_sent) counts.uploads_cut_after_send.fetch_add(1);
          absl::MutexLock lock(&counts.mutex);
          counts.generations_with_cut_upload.insert(generation);
        }
      }
    });
  }

  // Maintenance: deletes acknowledged versions, applies retention and collects garbage, beside
  // the uploads, so kills land in all three and GC runs while uploads pin chunks.
  threads.emplace_back([&] {
    std::mt19937 maintenance_rng(7);
    std::string address;
    for (int generation = 0; (generation = generations.WaitForNext(generation, &address));) {
      auto stub = v1::CheckpointStore::NewStub(
          grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
      while (true) {
        absl::SleepFor(absl::Microseconds(
            std::uniform_int_distribution<int64_t>(0, commit_micros.load() / 2)(maintenance_rng)));
        const int pick = std::uniform_int_distribution<int>(0, 99)(maintenance_rng);
        const Op op = pick < 45 ? Op::kGc : pick < 85 ? Op::kDelete : Op::kRetention;
        const std::string model =
            Models()[std::uniform_int_distribution<int>(0, 1)(maintenance_rng)];
        // What the call may remove, moved to maybe_deleted before it is sent: a check that runs
        // after a kill must not count it lost.
        std::vector<Key> named;
        {
          absl::MutexLock lock(&oracle.mutex);
          std::vector<Key> of_model;
          for (const auto& [key, seed] : oracle.acknowledged) {
            if (key.first == model) of_model.push_back(key);
          }
          if (op == Op::kDelete && of_model.size() > kKeepAcknowledged) {
            // Not one of the newest few, so each model keeps versions for the checks to read.
            named.push_back(of_model[std::uniform_int_distribution<size_t>(
                0, of_model.size() - kKeepAcknowledged)(maintenance_rng)]);
          } else if (op == Op::kRetention) {
            named = of_model;
          }
          // Retention on a model that does not exist yet is NOT_FOUND, rightly.
          if (op == Op::kRetention && oracle.models_with_commits.count(model) == 0) continue;
          for (const Key& key : named) {
            oracle.maybe_deleted[key] = oracle.acknowledged[key];
            oracle.acknowledged.erase(key);
          }
        }
        if (op == Op::kDelete && named.empty()) continue;
        {
          absl::MutexLock lock(&generations.mutex);
          if (generations.killed >= generation) break;
        }
        {
          absl::MutexLock lock(&in_flight.mutex);
          in_flight.op = op;
          in_flight.generation = generation;
          ++in_flight.call;
        }
        const int64_t uploads_at_start = counts.uploads_in_flight.load();
        const absl::Time start = absl::Now();
        grpc::ClientContext context;
        context.set_deadline(Deadline(60));
        grpc::Status status;
        v1::GarbageCollectResponse collected;
        v1::ApplyRetentionResponse retained;
        v1::DeleteVersionResponse deleted;
        if (op == Op::kGc) {
          status = stub->GarbageCollect(&context, v1::GarbageCollectRequest(), &collected);
        } else if (op == Op::kDelete) {
          v1::DeleteVersionRequest request;
          request.set_model(named[0].first);
          request.set_version(named[0].second);
          status = stub->DeleteVersion(&context, request, &deleted);
        } else {
          v1::ApplyRetentionRequest request;
          request.set_model(model);
          request.mutable_policy()->set_keep_last(
              std::uniform_int_distribution<int>(4, 8)(maintenance_rng));
          request.mutable_policy()->set_keep_every(
              std::uniform_int_distribution<int>(0, 1)(maintenance_rng) * 5);
          status = stub->ApplyRetention(&context, request, &retained);
        }
        const int64_t micros = absl::ToInt64Microseconds(absl::Now() - start);
        {
          absl::MutexLock lock(&in_flight.mutex);
          in_flight.op = Op::kNone;
        }
        if (!status.ok()) {
          // Named versions stay in maybe_deleted for the next check to settle.
          if (!generations.Killed(generation)) {
            ADD_FAILURE() << "maintenance call " << static_cast<int>(op)
                          << " failed while the server was up: " << status.error_message();
          } else if (op == Op::kGc) {
            counts.gcs_cut.fetch_add(1);
          } else {
            counts.deletes_cut.fetch_add(1);
          }
          continue;
        }
        if (op == Op::kGc) {
          counts.gcs.fetch_add(1);
          counts.gc_micros.fetch_add(micros);
          counts.chunks_freed.fetch_add(collected.chunks_freed());
          counts.uploads_reclaimed.fetch_add(collected.abandoned_uploads_reclaimed());
          if (uploads_at_start > 0 && counts.uploads_in_flight.load() > 0) {
            counts.gcs_beside_uploads.fetch_add(1);
          }
          continue;
        }
        counts.delete_micros.fetch_add(micros);
        std::set<int64_t> gone;
        if (op == Op::kDelete) {
          counts.deletes.fetch_add(1);
          gone.insert(named[0].second);
        } else {
          counts.retentions.fetch_add(1);
          counts.retention_deletes.fetch_add(retained.deleted_versions_size());
          gone.insert(retained.deleted_versions().begin(), retained.deleted_versions().end());
        }
        absl::MutexLock lock(&oracle.mutex);
        for (int64_t version : gone) {
          oracle.acknowledged.erase({model, version});
          oracle.maybe_deleted.erase({model, version});
          oracle.deleted.emplace(model, version);
        }
        for (const Key& key : named) {
          auto it = oracle.maybe_deleted.find(key);
          if (it == oracle.maybe_deleted.end()) continue;  // settled by a check already.
          oracle.acknowledged[key] = it->second;
          oracle.maybe_deleted.erase(it);
        }
      }
    }
  });

  int torn = 0, lost = 0, resurrected = 0;
  std::set<Key> unacknowledged_commits;  // listed, whole, never acknowledged.
  // Runs while nothing else talks to the server (before clients get its generation).
  auto check_everything = [&](const std::string& at) {
    auto stub =
        v1::CheckpointStore::NewStub(grpc::CreateChannel(at, grpc::InsecureChannelCredentials()));
    absl::MutexLock oracle_lock(&oracle.mutex);
    std::set<Key> listed;
    for (const std::string& model : Models()) {
      for (std::string token;;) {
        grpc::ClientContext context;
        context.set_deadline(Deadline(30));
        v1::ListVersionsRequest request;
        request.set_model(model);
        request.set_page_token(token);
        v1::ListVersionsResponse page;
        const grpc::Status status = stub->ListVersions(&context, request, &page);
        if (!status.ok()) {
          // Only a model nothing was acknowledged for yet may be unknown.
          if (oracle.models_with_commits.count(model) > 0 ||
              status.error_code() != grpc::StatusCode::NOT_FOUND) {
            ++torn;
            ADD_FAILURE() << "ListVersions(" << model << ") failed: " << status.error_message();
          }
          break;
        }
        for (const v1::VersionInfo& info : page.versions()) listed.emplace(model, info.version());
        token = page.next_page_token();
        if (token.empty()) break;
      }
    }
    for (const Key& key : listed) {
      const auto& [model, version] = key;
      const Read read = DownloadSeed(*stub, model, version);
      const int writer = model == ModelFor(0) ? 0 : 1;
      auto acknowledged = oracle.acknowledged.find(key);
      auto maybe = oracle.maybe_deleted.find(key);
      std::optional<int64_t> expected;
      if (acknowledged != oracle.acknowledged.end()) expected = acknowledged->second;
      if (maybe != oracle.maybe_deleted.end()) expected = maybe->second;
      if (read.seed < 0) {
        ++torn;
        ADD_FAILURE() << model << "@" << version << " is listed but torn: " << read.error;
      } else if (expected.has_value() ? read.seed != *expected : read.seed / 1'000'000 != writer) {
        ++torn;
        ADD_FAILURE() << model << "@" << version << " holds checkpoint " << read.seed
                      << ", expected " << (expected.has_value() ? *expected : -1);
      }
      if (oracle.deleted.count(key) > 0) {
        ++resurrected;
        ADD_FAILURE() << model << "@" << version << " was deleted but is listed again";
      }
      if (!expected.has_value()) unacknowledged_commits.insert(key);
      // An interrupted delete that did not happen: the version is held to exist from now on.
      if (maybe != oracle.maybe_deleted.end()) {
        oracle.acknowledged[key] = maybe->second;
        oracle.maybe_deleted.erase(maybe);
      }
    }
    for (const auto& [key, seed] : oracle.acknowledged) {
      if (listed.count(key) > 0) continue;
      ++lost;
      const Read read = DownloadSeed(*stub, key.first, key.second);
      ADD_FAILURE() << "acknowledged " << key.first << "@" << key.second << " (checkpoint " << seed
                    << ") is not listed; download: " << (read.seed < 0 ? read.error : "whole");
    }
    // An interrupted delete that happened: the version must stay deleted.
    for (const auto& [key, seed] : oracle.maybe_deleted) oracle.deleted.insert(key);
    oracle.maybe_deleted.clear();
    for (const Key& key : oracle.deleted) {
      const Read read = DownloadSeed(*stub, key.first, key.second);
      if (read.code != grpc::StatusCode::NOT_FOUND) {
        ++resurrected;
        ADD_FAILURE() << "deleted " << key.first << "@" << key.second
                      << " does not read as NOT_FOUND: " << (read.seed < 0 ? read.error : "whole");
      }
    }

    // The registry's history is written in each commit's and delete's own batch: after any kill
    // it commits each version once, deletes it at most once after that, and what it leaves is
    // exactly the versions that exist.
    std::set<Key> committed_events, deleted_events;
    for (int64_t after = 0;;) {
      grpc::ClientContext context;
      context.set_deadline(Deadline(30));
      v1::ListHistoryRequest request;
      request.set_after_sequence(after);
      v1::ListHistoryResponse page;
      const grpc::Status read = stub->ListHistory(&context, request, &page);
      if (!read.ok()) {
        ++torn;
        ADD_FAILURE() << "ListHistory failed: " << read.error_message();
        break;
      }
      for (const v1::RegistryEvent& event : page.events()) {
        const Key key(event.model(), event.version());
        if (event.kind() == v1::RegistryEvent::VERSION_COMMITTED &&
            !committed_events.insert(key).second) {
          ++torn;
          ADD_FAILURE() << "the history commits " << key.first << "@" << key.second << " twice";
        }
        if (event.kind() == v1::RegistryEvent::VERSION_DELETED &&
            (committed_events.count(key) == 0 || !deleted_events.insert(key).second)) {
          ++torn;
          ADD_FAILURE() << "the history deletes " << key.first << "@" << key.second
                        << " twice or before its commit";
        }
      }
      after = page.next_after_sequence();
      if (after == 0) break;
    }
    std::set<Key> remaining;
    std::set_difference(committed_events.begin(), committed_events.end(), deleted_events.begin(),
                        deleted_events.end(), std::inserter(remaining, remaining.end()));
    if (remaining != listed) {
      ++torn;
      ADD_FAILURE() << "the history's commits less its deletes (" << remaining.size()
                    << ") are not the versions that exist (" << listed.size() << ")";
    }

    grpc::ClientContext context;
    context.set_deadline(Deadline(60));
    v1::VerifyResponse verified;
    const grpc::Status verify = stub->Verify(&context, v1::VerifyRequest(), &verified);
    if (!verify.ok()) {
      ++torn;
      ADD_FAILURE() << "Verify failed: " << verify.error_message();
    }
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
  // Returns once a maintenance call of a kind in `ops` is in flight on `generation`, a random
  // part of `mean` (that kind's mean time) later, if it is still in flight then; else tries the
  // next such call, up to 5 (a short call can end before the sleep does).
  auto aim_at = [&](std::set<Op> ops, int generation, absl::Duration mean) {
    for (int attempt = 0; attempt < 5; ++attempt) {
      int64_t call = 0;
      {
        absl::MutexLock lock(&in_flight.mutex);
        auto flying = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(in_flight.mutex) {
          return in_flight.generation == generation && ops.count(in_flight.op) > 0;
        };
        if (!in_flight.mutex.AwaitWithTimeout(absl::Condition(&flying), absl::Seconds(30))) {
          return;
        }
        call = in_flight.call;
      }
      absl::SleepFor(mean * std::uniform_real_distribution<double>(0.0, 0.5)(rng));
      absl::MutexLock lock(&in_flight.mutex);
      if (in_flight.call == call && in_flight.op != Op::kNone) return;
    }
  };
  auto mean_micros = [](int64_t total, int64_t n) { return n == 0 ? int64_t{5000} : total / n; };
  int kills = 0, kills_aimed_at_gc = 0, kills_aimed_at_delete = 0;
  const absl::Time test_start = absl::Now();
  for (int round = 0; round <= kKills; ++round) {
    const std::string current = server.Start();
    ASSERT_FALSE(current.empty());
    check_everything(current);
    if (round == kKills) {
      // Last: a GC with nothing in flight, then everything again -- a chunk GC freed under a
      // surviving version shows here even if no kill followed the GC that freed it.
      auto stub = v1::CheckpointStore::NewStub(
          grpc::CreateChannel(current, grpc::InsecureChannelCredentials()));
      grpc::ClientContext context;
      context.set_deadline(Deadline(60));
      v1::GarbageCollectResponse collected;
      const grpc::Status status =
          stub->GarbageCollect(&context, v1::GarbageCollectRequest(), &collected);
      EXPECT_TRUE(status.ok()) << status.error_message();
      counts.gcs.fetch_add(1);
      counts.chunks_freed.fetch_add(collected.chunks_freed());
      counts.uploads_reclaimed.fetch_add(collected.abandoned_uploads_reclaimed());
      check_everything(current);
      break;
    }
    const int generation = round + 1;
    {
      absl::MutexLock lock(&generations.mutex);
      generations.address = current;
      generations.current = generation;
    }
    if (round == 0) {
      // Calibrate to this machine's speed, which varies tenfold with load: let two commits land
      // before the first kill and time them.
      const absl::Time start = absl::Now();
      while (acknowledged_count() < 2 && absl::Now() - start < absl::Seconds(120)) {
        absl::SleepFor(absl::Milliseconds(5));
      }
      commit_micros = std::max<int64_t>(20'000, absl::ToInt64Microseconds(absl::Now() - start) / 2);
    } else {
      // Let some commits land first, between one commit's time and two.
      absl::SleepFor(absl::Microseconds(commit_micros.load()) *
                     std::uniform_real_distribution<double>(1.0, 2.0)(rng));
      if (round % 3 == 1) {
        // The random moment: anywhere from mid-header to mid-commit of some upload.
        absl::SleepFor(absl::Microseconds(commit_micros.load()) *
                       std::uniform_real_distribution<double>(0.0, 1.5)(rng));
      } else if (round % 3 == 2) {
        ++kills_aimed_at_gc;
        aim_at({Op::kGc}, generation,
               absl::Microseconds(mean_micros(counts.gc_micros.load(), counts.gcs.load())));
      } else {
        ++kills_aimed_at_delete;
        aim_at({Op::kDelete, Op::kRetention}, generation,
               absl::Microseconds(mean_micros(counts.delete_micros.load(),
                                              counts.deletes.load() + counts.retentions.load())));
      }
    }
    {
      absl::MutexLock lock(&generations.mutex);
      generations.killed = generation;
    }
    server.Kill();
    ++kills;
  }
  {
    absl::MutexLock lock(&generations.mutex);
    generations.done = true;
  }
  for (std::thread& thread : threads) thread.join();
  server.Kill();

  int64_t acknowledged = 0, deleted = 0;
  {
    absl::MutexLock lock(&oracle.mutex);
    acknowledged = oracle.acknowledged.size();
    deleted = oracle.deleted.size();
  }
  int kills_cutting_uploads = 0;
  {
    absl::MutexLock lock(&counts.mutex);
    kills_cutting_uploads = static_cast<int>(counts.generations_with_cut_upload.size());
  }
  std::cout << "store crash test: " << kills << " kills (" << kills_cutting_uploads
            << " cut uploads), " << counts.upload_attempts.load() << " uploads attempted, "
            << counts.uploads_acknowledged.load() << " acknowledged, " << counts.uploads_cut.load()
            << " cut by a kill (" << counts.uploads_cut_after_send.load()
            << " after the client sent its last message), " << unacknowledged_commits.size()
            << " unacknowledged commits seen; " << counts.gcs.load() << " GCs ("
            << counts.gcs_beside_uploads.load() << " beside uploads, " << counts.gcs_cut.load()
            << " cut by a kill of " << kills_aimed_at_gc << " aimed, " << counts.chunks_freed.load()
            << " chunks freed, " << counts.uploads_reclaimed.load()
            << " abandoned uploads reclaimed), " << counts.deletes.load() << " deletes and "
            << counts.retentions.load() << " retentions (" << counts.retention_deletes.load()
            << " versions), " << counts.deletes_cut.load() << " of them cut by a kill of "
            << kills_aimed_at_delete << " aimed; " << acknowledged << " acknowledged versions and "
            << deleted << " deletions standing, " << torn << " torn versions seen, " << lost
            << " acknowledged commits lost, " << resurrected << " deleted versions back; "
            << commit_micros.load() / 1000 << " ms per commit calibrated, "
            << absl::ToDoubleSeconds(absl::Now() - test_start) << " s\n";
  EXPECT_EQ(torn, 0);
  EXPECT_EQ(lost, 0);
  EXPECT_EQ(resurrected, 0);
  // Not vacuous: commits landed between most kills, most kills cut an upload, GC and deletes ran
  // and freed chunks, and kills cut GC and delete calls in flight.
  EXPECT_GT(counts.uploads_acknowledged.load(), kKills / 2);
  EXPECT_GE(kills_cutting_uploads, kKills / 2);
  EXPECT_GT(counts.gcs_beside_uploads.load(), 0);
  EXPECT_GT(counts.chunks_freed.load(), 0);
  EXPECT_GT(counts.deletes.load(), 0);
  EXPECT_GT(deleted, 0);
  EXPECT_GE(counts.gcs_cut.load(), kills_aimed_at_gc / 2);
  EXPECT_GE(counts.deletes_cut.load(), kills_aimed_at_delete / 2);
}

}  // namespace
}  // namespace ckpt

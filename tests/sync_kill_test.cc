// `ckpt sync` SIGKILLed at random points while it exports, with a poller reading the serving
// directory the whole time, the way a model server that follows CURRENT would.
//
// The real checkpoint_store binary serves a model of several versions (36 MiB each, random bytes,
// so an export takes noticeable time). Each round moves resnet@production to another version --
// before the sync starts (it exports at startup) or while it runs (it exports on the watch event)
// -- and SIGKILLs the sync at a random time (seed printed): some time after its start, or, in most
// rounds, some time into the export it began (delays scaled by the start-up and export times
// measured first). At least one kill must land mid-export (a .tmp- export directory left behind).
// After the last round the alias moves once more, the sync restarts and must serve the target:
// CURRENT names it, its directory is complete and byte-identical, nothing in progress is left.
//
// What the poller may never see (serving_sync.h: "a version directory appears whole or not at
// all"; "CURRENT is replaced atomically after that"):
//  - a DIR/resnet/<N>/ that is not a complete export of version N: metadata.json missing or
//    unparsable, naming another version, other tensors or content hashes than the store's, or a
//    model.safetensors whose size differs from metadata's file_bytes, or (checked once per
//    directory) whose header and every tensor byte differ from what was committed;
//  - a CURRENT that is not "<N>\n", or that names a version whose directory is missing or
//    incomplete, or a CURRENT that disappears once it existed.
// A directory that vanishes while it is read was pruned (renamed away, then removed): the poller
// only reports a problem after seeing the same directory (inode) and the same CURRENT still in
// place afterwards.

#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "libs/client/remote_checkpoint_store.h"
#include "libs/status/status_matchers.h"
#include "libs/store/chunk_hasher.h"
#include "libs/testing/child_process.h"
#include "nlohmann/json.hpp"

namespace ckpt {
namespace {

namespace fs = std::filesystem;
using testing::ChildProcess;
using testing::ReadFileOrEmpty;
using testing::RunfilesPath;

constexpr char kModel[] = "resnet";
constexpr char kAlias[] = "production";
constexpr int kVersions = 5;
constexpr int kTensors = 6;
constexpr int64_t kTensorBytes = int64_t{6} << 20;  // 36 MiB a version.
constexpr int kKillRounds = 10;
// How long a sync may take to serve the alias after its last start.
constexpr absl::Duration kServeWithin = absl::Seconds(60);

std::string Dir() { return std::getenv("TEST_TMPDIR"); }

std::string TensorKey(int tensor) { return absl::StrCat("block", tensor, ".weight"); }

// What was committed as one version, and what the store recorded of it.
struct CommittedVersion {
  std::vector<std::string> tensors;  // the bytes of each tensor, in key order.
  v1::Manifest manifest;
};

// The version's tensors: random bytes from (seed, version), so no chunk is shared.
std::vector<std::string> MakeTensors(uint64_t seed, int version) {
  std::mt19937_64 generator(seed * 1000003 + static_cast<uint64_t>(version));
  std::vector<std::string> tensors(kTensors, std::string(kTensorBytes, '\0'));
  for (std::string& bytes : tensors) {
    for (int64_t i = 0; i < kTensorBytes; i += 8) {
      const uint64_t word = generator();
      std::memcpy(bytes.data() + i, &word, 8);
    }
  }
  return tensors;
}

absl::StatusOr<v1::Manifest> Commit(CheckpointStore& store,
                                    const std::vector<std::string>& tensors) {
  v1::Manifest header;
  for (int tensor = 0; tensor < kTensors; ++tensor) {
    v1::TensorMeta* meta = header.add_tensors();
    meta->set_key(TensorKey(tensor));
    meta->set_dtype(v1::DTYPE_UINT8);
    meta->add_shape(kTensorBytes);
    meta->set_byte_length(kTensorBytes);
  }
  absl::StatusOr<std::unique_ptr<UploadSession>> session =
      store.BeginUpload(kModel, header, CommitOptions{});
  if (!session.ok()) return session.status();
  constexpr int64_t kPiece = int64_t{1} << 20;
  for (int tensor = 0; tensor < kTensors; ++tensor) {
    for (int64_t offset = 0; offset < kTensorBytes; offset += kPiece) {
      absl::Status added = (*session)->AddTensorData(
          tensor, offset, absl::string_view(tensors[tensor]).substr(offset, kPiece));
      if (!added.ok()) return added;
    }
  }
  absl::StatusOr<CommitResult> committed = (*session)->Commit();
  if (!committed.ok()) return committed.status();
  return store.GetManifest(committed->version);
}

// The problem with DIR/<version>/ as a complete export of `version`; "" when there is none.
// `full` also parses the safetensors file and compares every byte with what was committed.
std::string ExportProblemOrThrow(const std::string& dir, int64_t version,
                                 const CommittedVersion& expected, bool full) {
  const std::string metadata_text = ReadFileOrEmpty(dir + "/metadata.json");
  if (metadata_text.empty()) return "metadata.json is missing or empty";
  const nlohmann::json metadata = nlohmann::json::parse(metadata_text, nullptr, false);
  if (metadata.is_discarded()) return "metadata.json does not parse (partly written?)";
  if (metadata.value("model", "") != kModel || metadata.value("version", int64_t{0}) != version ||
      metadata.value("alias", "") != kAlias || metadata.value("file", "") != "model.safetensors" ||
      metadata.value("tensor_count", 0) != kTensors) {
    return "metadata.json describes another export: " + metadata.dump();
  }
  if (!metadata.contains("tensors") || metadata.at("tensors").size() != kTensors) {
    return "metadata.json lists no or other tensors: " + metadata.dump();
  }
  for (int tensor = 0; tensor < kTensors; ++tensor) {
    const v1::TensorMeta& meta = expected.manifest.tensors(tensor);
    const nlohmann::json& listed = metadata.at("tensors").at(tensor);
    if (listed.value("key", "") != meta.key() ||
        listed.value("content_hash", "") != HexEncode(meta.content_hash())) {
      return absl::StrCat("metadata.json lists ", listed.dump(), "; the store has ", meta.key(),
                          " with content hash ", HexEncode(meta.content_hash()));
    }
  }
  const std::string file = dir + "/model.safetensors";
  struct stat file_stat;
  if (stat(file.c_str(), &file_stat) != 0) return "model.safetensors is missing";
  if (file_stat.st_size != metadata.value("file_bytes", int64_t{-1})) {
    return absl::StrCat("model.safetensors holds ", file_stat.st_size,
                        " bytes; metadata.json says ", metadata.value("file_bytes", int64_t{-1}));
  }
  if (!full) return "";
  const std::string bytes = ReadFileOrEmpty(file);
  if (static_cast<int64_t>(bytes.size()) != file_stat.st_size) {
    return absl::StrCat("model.safetensors read back ", bytes.size(), " bytes of ",
                        file_stat.st_size);
  }
  if (bytes.size() < 8) return "model.safetensors is shorter than its header length";
  uint64_t header_length = 0;
  std::memcpy(&header_length, bytes.data(), 8);
  if (header_length > bytes.size() - 8) return "model.safetensors: header runs past the end";
  const nlohmann::json header =
      nlohmann::json::parse(bytes.substr(8, header_length), nullptr, false);
  if (header.is_discarded()) return "model.safetensors: the header does not parse";
  const size_t data_start = 8 + header_length;
  for (int tensor = 0; tensor < kTensors; ++tensor) {
    const std::string key = TensorKey(tensor);
    if (!header.contains(key)) return "model.safetensors lacks " + key;
    const nlohmann::json& entry = header.at(key);
    if (entry.value("dtype", "") != "U8" ||
        entry.at("shape") != nlohmann::json::array({kTensorBytes})) {
      return "model.safetensors: " + key + " is " + entry.dump();
    }
    const uint64_t begin = entry.at("data_offsets").at(0), end = entry.at("data_offsets").at(1);
    if (end - begin != static_cast<uint64_t>(kTensorBytes) || data_start + end > bytes.size()) {
      return "model.safetensors: " + key + " has offsets " + entry.at("data_offsets").dump();
    }
    if (std::memcmp(bytes.data() + data_start + begin, expected.tensors[tensor].data(),
                    kTensorBytes) != 0) {
      return "model.safetensors: the bytes of " + key + " differ from what was committed";
    }
  }
  return "";
}

std::string ExportProblem(const std::string& dir, int64_t version, const CommittedVersion& expected,
                          bool full) {
  try {
    return ExportProblemOrThrow(dir, version, expected, full);
  } catch (const nlohmann::json::exception& error) {
    return absl::StrCat("metadata.json or the safetensors header has unexpected contents: ",
                        error.what());
  }
}

std::optional<ino_t> InodeOf(const std::string& path) {
  struct stat path_stat;
  if (stat(path.c_str(), &path_stat) != 0) return std::nullopt;
  return path_stat.st_ino;
}

// Reads DIR/resnet in a loop until stopped, and records what a reader may never see. Owns its
// thread: Stop() (or the destructor) joins it. Thread-safe.
class ServingDirPoller {
 public:
  ServingDirPoller(std::string model_dir, const std::map<int64_t, CommittedVersion>* versions)
      : model_dir_(std::move(model_dir)), versions_(*versions), thread_([this] { Loop(); }) {}
  ~ServingDirPoller() { Stop(); }

  void Stop() {
    if (!stop_.HasBeenNotified()) stop_.Notify();
    if (thread_.joinable()) thread_.join();
  }

  std::vector<std::string> violations() const {
    absl::MutexLock lock(&mu_);
    std::vector<std::string> lines;
    for (const auto& [what, first_and_count] : violations_) {
      lines.push_back(absl::StrCat(what, " (first at ", absl::FormatTime(first_and_count.first),
                                   ", seen ", first_and_count.second, " times)"));
    }
    return lines;
  }
  std::string Summary() const {
    absl::MutexLock lock(&mu_);
    std::vector<std::string> strays(strays_.begin(), strays_.end());
    return absl::StrCat(
        polls_, " polls, ", full_checks_, " full byte checks, CURRENT seen naming {",
        absl::StrJoin(currents_seen_, ","), "}, ", inconclusive_,
        " reads raced with a prune or a move of CURRENT (re-read), .tmp- entries "
        "seen in ",
        polls_with_temporaries_, " polls",
        strays.empty() ? std::string() : ", other entries seen: " + absl::StrJoin(strays, " "));
  }

 private:
  enum class DirState { kComplete, kGone, kIncomplete };

  // Each distinct violation once, with when it was first seen and how often.
  void Violation(const std::string& what) {
    absl::MutexLock lock(&mu_);
    auto [it, added] = violations_.try_emplace(what, absl::Now(), 0);
    ++it->second.second;
  }

  // Whether DIR/<version> is complete; kGone when it is not there, or was replaced or removed
  // while being read (prune renames it away first).
  DirState CheckVersionDir(int64_t version, std::string* problem) {
    const std::string dir = absl::StrCat(model_dir_, "/", version);
    const std::optional<ino_t> before = InodeOf(dir);
    if (!before.has_value()) return DirState::kGone;
    auto expected = versions_.find(version);
    if (expected == versions_.end()) {
      *problem = "a directory of a version that was never committed";
    } else {
      bool full;
      {
        absl::MutexLock lock(&mu_);
        full = fully_checked_.count({*before, version}) == 0;
      }
      *problem = ExportProblem(dir, version, expected->second, full);
      if (problem->empty() && full) {
        absl::MutexLock lock(&mu_);
        fully_checked_.insert({*before, version});
        ++full_checks_;
      }
    }
    if (problem->empty()) return DirState::kComplete;
    if (InodeOf(dir) != before) {
      absl::MutexLock lock(&mu_);
      ++inconclusive_;
      return DirState::kGone;
    }
    return DirState::kIncomplete;
  }

  void PollOnce() {
    std::vector<int64_t> version_dirs;
    bool temporaries = false;
    std::error_code error;
    for (const fs::directory_entry& entry : fs::directory_iterator(model_dir_, error)) {
      const std::string name = entry.path().filename().string();
      int64_t version = 0;
      if (absl::SimpleAtoi(name, &version) &&
          std::all_of(name.begin(), name.end(), absl::ascii_isdigit)) {
        version_dirs.push_back(version);
      } else if (absl::StartsWith(name, ".tmp-")) {
        temporaries = true;
      } else if (name != "CURRENT" && name != ".lock") {
        absl::MutexLock lock(&mu_);
        strays_.insert(name);
      }
    }
    for (int64_t version : version_dirs) {
      std::string problem;
      if (CheckVersionDir(version, &problem) == DirState::kIncomplete) {
        Violation(absl::StrCat("version directory ", version, " is incomplete: ", problem));
      }
    }

    const std::string current_path = model_dir_ + "/CURRENT";
    const std::optional<ino_t> current_inode = InodeOf(current_path);
    const std::string current_text = ReadFileOrEmpty(current_path);
    if (!current_inode.has_value()) {
      if (seen_current_) Violation("CURRENT disappeared after it existed");
    } else {
      seen_current_ = true;
      int64_t current = 0;
      const bool well_formed = absl::EndsWith(current_text, "\n") &&
                               absl::SimpleAtoi(current_text, &current) && current > 0;
      std::string problem;
      const DirState state =
          well_formed ? CheckVersionDir(current, &problem) : DirState::kIncomplete;
      if (state != DirState::kComplete) {
        // Only a problem if CURRENT still is the file that was read: else it moved meanwhile
        // and the version it named may have been pruned, which is allowed.
        if (InodeOf(current_path) == current_inode &&
            ReadFileOrEmpty(current_path) == current_text) {
          Violation(
              !well_formed
                  ? absl::StrCat("CURRENT holds '", absl::CEscape(current_text), "'")
                  : absl::StrCat("CURRENT names version ", current, " but its directory is ",
                                 state == DirState::kGone ? "missing" : "incomplete: ", problem));
        } else {
          absl::MutexLock lock(&mu_);
          ++inconclusive_;
        }
      } else {
        absl::MutexLock lock(&mu_);
        currents_seen_.insert(current);
      }
    }
    absl::MutexLock lock(&mu_);
    ++polls_;
    if (temporaries) ++polls_with_temporaries_;
  }

  void Loop() {
    do {
      PollOnce();
      // A short pause leaves the 2 cores of a CI machine to the sync and the store.
    } while (!stop_.WaitForNotificationWithTimeout(absl::Milliseconds(2)));
  }

  const std::string model_dir_;
  const std::map<int64_t, CommittedVersion>& versions_;
  absl::Notification stop_;
  bool seen_current_ = false;  // the poller thread's own.
  mutable absl::Mutex mu_;
  std::map<std::string, std::pair<absl::Time, int64_t>> violations_ ABSL_GUARDED_BY(mu_);
  std::set<std::pair<ino_t, int64_t>> fully_checked_ ABSL_GUARDED_BY(mu_);
  std::set<int64_t> currents_seen_ ABSL_GUARDED_BY(mu_);
  std::set<std::string> strays_ ABSL_GUARDED_BY(mu_);
  int64_t polls_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t polls_with_temporaries_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t full_checks_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t inconclusive_ ABSL_GUARDED_BY(mu_) = 0;
  std::thread thread_;  // last: starts once the members above exist.
};

// Polls `done` until it holds (true) or `timeout` passes (false).
bool WaitUntil(const std::function<bool()>& done, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  while (!done()) {
    if (absl::Now() > deadline) return false;
    absl::SleepFor(absl::Milliseconds(5));
  }
  return true;
}

// The version directories and in-progress exports (.tmp-<version>-...) in DIR/resnet.
struct DirListing {
  std::set<int64_t> versions;
  std::set<std::string> exports_in_progress;
};

DirListing ListModelDir(const std::string& model_dir) {
  DirListing listing;
  std::error_code error;
  for (const fs::directory_entry& entry : fs::directory_iterator(model_dir, error)) {
    const std::string name = entry.path().filename().string();
    int64_t version = 0;
    if (absl::SimpleAtoi(name, &version) &&
        std::all_of(name.begin(), name.end(), absl::ascii_isdigit)) {
      listing.versions.insert(version);
    } else if (absl::StartsWith(name, ".tmp-") && !absl::StartsWith(name, ".tmp-removed-")) {
      listing.exports_in_progress.insert(name);
    }
  }
  return listing;
}

// Starts and kills `ckpt sync resnet@production DIR` against the store; each start logs to a
// directory of its own.
class SyncProcess {
 public:
  SyncProcess(std::string serving, int store_port)
      : serving_(std::move(serving)), store_port_(store_port) {}

  void Start() {
    const std::string dir = absl::StrCat(Dir(), "/sync-", ++starts_);
    fs::create_directories(dir);
    process_ = std::make_unique<ChildProcess>(RunfilesPath("tools/ckpt/ckpt"), dir);
    ASSERT_TRUE(process_->Start({"sync", absl::StrCat(kModel, "@", kAlias), serving_, "--keep", "2",
                                 absl::StrCat("--store=127.0.0.1:", store_port_)}));
  }

  void Kill() {
    process_->Signal(SIGKILL);
    const std::optional<int> status = process_->WaitForExit(absl::Seconds(30));
    ASSERT_TRUE(status.has_value());
    // A sync that exited by itself (an error) would make the round test nothing.
    EXPECT_TRUE(WIFSIGNALED(*status) && WTERMSIG(*status) == SIGKILL)
        << "status " << *status << "; its log:\n"
        << process_->stderr_text();
  }

  // Waits until this start's log says it synced `version`; how long that took from now.
  std::optional<absl::Duration> WaitForSynced(int64_t version, absl::Duration timeout) {
    const std::string line = absl::StrCat("synced ", kModel, "@", kAlias, " -> version ", version);
    const absl::Time start = absl::Now();
    while (absl::Now() - start < timeout) {
      if (absl::StrContains(process_->stderr_text(), line)) return absl::Now() - start;
      absl::SleepFor(absl::Milliseconds(10));
    }
    return std::nullopt;
  }

  ChildProcess& process() { return *process_; }

 private:
  const std::string serving_;
  const int store_port_;
  int starts_ = 0;
  std::unique_ptr<ChildProcess> process_;
};

TEST(SyncKillTest, ServingDirectoryIsNeverPartialWhileSyncIsKilledMidExport) {
  const char* seed_env = std::getenv("CKPT_SYNC_KILL_SEED");
  const uint64_t seed = seed_env != nullptr
                            ? std::strtoull(seed_env, nullptr, 10)
                            : static_cast<uint64_t>(absl::ToUnixMicros(absl::Now()));
  std::cout << "seed " << seed << " (rerun with CKPT_SYNC_KILL_SEED=" << seed << ")\n";
  std::mt19937_64 random(seed);
  const absl::Time test_start = absl::Now();

  fs::create_directories(Dir() + "/store-run");
  ChildProcess store(RunfilesPath("services/checkpoint_store/checkpoint_store"),
                     Dir() + "/store-run");
  ASSERT_TRUE(store.Start({"--store_dir=" + Dir() + "/store", "--listen=127.0.0.1:0",
                           "--port_file=" + Dir() + "/store-run/port"}));
  const int store_port = store.WaitForPort(Dir() + "/store-run/port", absl::Seconds(60));
  ASSERT_GT(store_port, 0) << store.stderr_text();
  RemoteStoreOptions options;
  options.address = absl::StrCat("127.0.0.1:", store_port);
  options.deadline = absl::Seconds(60);
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<RemoteCheckpointStore> remote,
                       RemoteCheckpointStore::Connect(options));

  std::map<int64_t, CommittedVersion> versions;
  for (int version = 1; version <= kVersions; ++version) {
    CommittedVersion& committed = versions[version];
    committed.tensors = MakeTensors(seed, version);
    ASSERT_OK_AND_ASSIGN(committed.manifest, Commit(*remote, committed.tensors));
    ASSERT_EQ(committed.manifest.version(), version);
  }
  std::cout << "committed " << kVersions << " versions of " << (kTensors * kTensorBytes >> 20)
            << " MiB in " << absl::FormatDuration(absl::Now() - test_start) << "\n";

  const std::string serving = Dir() + "/serving";
  const std::string model_dir = serving + "/" + kModel;
  fs::create_directories(model_dir);
  ServingDirPoller poller(model_dir, &versions);
  SyncProcess sync(serving, store_port);

  // Whether an export of `version` that was not in `left_before` is under way.
  auto export_started = [&](int64_t version, const std::set<std::string>& left_before) {
    const std::string prefix = absl::StrCat(".tmp-", version, "-");
    for (const std::string& name : ListModelDir(model_dir).exports_in_progress) {
      if (absl::StartsWith(name, prefix) && left_before.count(name) == 0) return true;
    }
    return false;
  };
  // Calibration, unkilled: how long a start takes here (until the export begins), and an export.
  ASSERT_OK(remote->SetAlias(kModel, kAlias, 1).status());
  const absl::Time calibration_start = absl::Now();
  ASSERT_NO_FATAL_FAILURE(sync.Start());
  ASSERT_TRUE(WaitUntil([&] { return export_started(1, {}); }, kServeWithin))
      << sync.process().stderr_text();
  const absl::Duration startup_time = absl::Now() - calibration_start;
  ASSERT_TRUE(sync.WaitForSynced(1, kServeWithin).has_value()) << sync.process().stderr_text();
  const absl::Duration export_time = absl::Now() - calibration_start - startup_time;
  std::cout << "a start took " << absl::FormatDuration(startup_time) << ", an export "
            << absl::FormatDuration(export_time) << "\n";
  ASSERT_NO_FATAL_FAILURE(sync.Kill());
  // A random duration between 0 and `duration`.
  auto up_to = [&](absl::Duration duration) {
    return duration * (static_cast<double>(random() % 1000) / 1000);
  };

  int64_t target = 1;
  int kills_mid_export = 0;
  // Mostly a version not on disk (an export), sometimes one that is (a CURRENT switch).
  auto next_target = [&](bool must_export) {
    const DirListing listing = ListModelDir(model_dir);
    std::vector<int64_t> candidates;
    for (int64_t version = 1; version <= kVersions; ++version) {
      if (version == target) continue;
      if (must_export && listing.versions.count(version) > 0) continue;
      candidates.push_back(version);
    }
    return candidates[random() % candidates.size()];
  };
  for (int round = 1; round <= kKillRounds; ++round) {
    const bool must_export = random() % 4 != 0;
    target = next_target(must_export);
    const bool move_while_running = random() % 2 == 0;
    // Some kills come at a random time after the start (startup, watch, export, rename, CURRENT,
    // pruning); most at a random time once this target's export is under way.
    const bool kill_in_export = must_export && random() % 3 != 0;
    const std::set<std::string> left_before = ListModelDir(model_dir).exports_in_progress;
    if (!move_while_running) {
      ASSERT_OK(remote->SetAlias(kModel, kAlias, target).status());
    }
    ASSERT_NO_FATAL_FAILURE(sync.Start());
    if (move_while_running) {
      // Sometimes before the sync watches, sometimes after.
      absl::SleepFor(up_to(startup_time * 1.5));
      ASSERT_OK(remote->SetAlias(kModel, kAlias, target).status());
    }
    if (kill_in_export) {
      ASSERT_TRUE(WaitUntil([&] { return export_started(target, left_before); }, kServeWithin))
          << sync.process().stderr_text();
    }
    const absl::Duration delay =
        kill_in_export ? up_to(export_time * 0.75) : up_to(startup_time + export_time * 1.3);
    absl::SleepFor(delay);
    ASSERT_NO_FATAL_FAILURE(sync.Kill());
    const DirListing after = ListModelDir(model_dir);
    // An export directory this start made (one left by an earlier kill may still be there when
    // this start was killed before its cleanup).
    bool mid_export = false;
    for (const std::string& name : after.exports_in_progress) {
      mid_export = mid_export || left_before.count(name) == 0;
    }
    if (mid_export) ++kills_mid_export;
    std::cout << "round " << round << ": alias -> " << target
              << (move_while_running ? " while the sync ran" : " before the sync started")
              << ", killed " << absl::FormatDuration(delay)
              << (kill_in_export ? " into its export" : " after the start (or the move)")
              << "; on disk {" << absl::StrJoin(after.versions, ",") << "}, CURRENT "
              << absl::StripAsciiWhitespace(ReadFileOrEmpty(model_dir + "/CURRENT"))
              << (mid_export ? ", killed mid-export" : "") << "\n";
  }

  // The last start: the alias moves once more, and the sync must serve it.
  target = next_target(/*must_export=*/true);
  ASSERT_OK(remote->SetAlias(kModel, kAlias, target).status());
  ASSERT_NO_FATAL_FAILURE(sync.Start());
  const std::optional<absl::Duration> served = sync.WaitForSynced(target, kServeWithin);
  ASSERT_TRUE(served.has_value()) << sync.process().stderr_text();
  poller.Stop();
  std::cout << "the restarted sync served version " << target << " in "
            << absl::FormatDuration(*served) << "\npoller: " << poller.Summary() << "\n";

  EXPECT_THAT(poller.violations(), ::testing::IsEmpty());
  EXPECT_EQ(ReadFileOrEmpty(model_dir + "/CURRENT"), absl::StrCat(target, "\n"));
  EXPECT_EQ(ExportProblem(absl::StrCat(model_dir, "/", target), target, versions[target],
                          /*full=*/true),
            "");
  const DirListing final_listing = ListModelDir(model_dir);
  EXPECT_THAT(final_listing.exports_in_progress, ::testing::IsEmpty());
  std::vector<std::string> left_at_the_end;
  std::error_code error;
  for (const fs::directory_entry& entry : fs::directory_iterator(model_dir, error)) {
    left_at_the_end.push_back(entry.path().filename().string());
  }
  std::sort(left_at_the_end.begin(), left_at_the_end.end());
  std::cout << "DIR/resnet at the end: " << absl::StrJoin(left_at_the_end, " ") << "\n";
  EXPECT_LE(final_listing.versions.size(), 2u) << absl::StrJoin(final_listing.versions, ",");
  EXPECT_EQ(final_listing.versions.count(target), 1u);
  // The campaign must have killed exports in flight, or it tested nothing.
  std::cout << kills_mid_export << " of " << kKillRounds
            << " kills landed mid-export; the test took "
            << absl::FormatDuration(absl::Now() - test_start) << "\n";
  EXPECT_GE(kills_mid_export, 1);
  sync.process().Signal(SIGTERM);
  EXPECT_TRUE(sync.process().WaitForExit(absl::Seconds(30)).has_value());
  store.Signal(SIGTERM);
  EXPECT_TRUE(store.WaitForExit(absl::Seconds(30)).has_value());
}

}  // namespace
}  // namespace ckpt

// Commit and garbage-collection atomicity and durability, by failpoint rather than by luck
// (issue #23 item 2).
//
// A child process (this binary again, see main()) opens a store built with failpoints, commits
// versions 1..3 (later ones sharing a frozen tensor's chunk with version 1), and then runs one more
// operation with one failpoint armed: a fourth commit, or a delete followed by GarbageCollect. The
// failpoint kills it with SIGKILL in the middle. The parent then looks at the store twice:
//   - killed: a copy of it as the kill left it (the page cache keeps every write, synced or not);
//   - power cut: the store itself after every file is cut back to what the child had synced
//     (testing/sync_recording_fs.h), as a power failure would leave it;
// and asserts each time: every version acknowledged before the interrupted operation is listed and
// reads back byte for byte; the interrupted version is either absent or listed and whole; Verify
// finds no problem; the interrupted operation's content can be committed again and read back, and
// GC then leaves everything readable.
//
// Each break named in the issue fails this test (seen when it was written): syncing the pack after
// the batch (power cut at commit.after_batch: the version is listed but its pack is gone), an
// unsynced commit batch (power cut: acknowledged versions are lost), a commit batch split in two
// writes (a failpoint between them: the version is listed but its chunks have no location), and an
// unsynced GC batch (power cut at gc.after_pack_removal: the chunks come back, their pack does
// not, and committing the same bytes again deduplicates against them).

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"
#include "libs/status/status_macros.h"
#include "libs/status/status_matchers.h"
#include "libs/store/checkpoint_store.h"
#include "libs/store/rocksdb_checkpoint_store.h"
#include "libs/store/testing/sync_recording_fs.h"
#include "libs/store/version_ref.h"
#include "proto/ckpt/v1/checkpoint_store.pb.h"

extern char** environ;

namespace ckpt {
namespace {

// The child's environment: the store directory and the operation to interrupt. (CKPT_FAILPOINT
// and CKPT_SYNC_LOG are read by the failpoint build itself: internal/failpoint.h.)
constexpr char kChildStoreEnv[] = "CKPT_CRASH_CHILD_STORE";
constexpr char kChildOperationEnv[] = "CKPT_CRASH_CHILD_OPERATION";

constexpr char kModel[] = "crash";
constexpr int kCommitsBefore = 3;
// One chunk shared by every version (frozen layers: deduplicated), two chunks of each version's
// own, and an 8-byte tensor naming the version's seed.
constexpr int64_t kFrozenElements = ((int64_t{1} << 20) + 4096) / 4;
constexpr int64_t kWeightElements = ((int64_t{4} << 20) + (64 << 10)) / 4;

enum class Operation { kCommit, kCollect };

struct Scenario {
  const char* failpoint;
  Operation operation;
  int hit;  // the hit of the failpoint that kills: commits 1..3 pass the commit ones first.
};

// gtest prints parameters with it (the failpoint names the scenario).
void PrintTo(const Scenario& scenario, std::ostream* out) { *out << scenario.failpoint; }

constexpr Scenario kScenarios[] = {
    {"commit.before_pack_sync", Operation::kCommit, kCommitsBefore + 1},
    {"commit.after_pack_sync", Operation::kCommit, kCommitsBefore + 1},
    {"commit.after_batch", Operation::kCommit, kCommitsBefore + 1},
    {"gc.after_batch", Operation::kCollect, 1},
    {"gc.after_pack_removal", Operation::kCollect, 1},
};

// The collect operation deletes this version first (acknowledged), then collects: its own pack
// holds only its own chunks, so GC removes the whole file.
constexpr int64_t kDeletedVersion = 2;
// The commit operation's version.
constexpr int64_t kInterruptedSeed = kCommitsBefore + 1;

// ---- Checkpoint contents: a pure function of a seed.

std::string Int32Bytes(int64_t elements, uint32_t seed) {
  std::string bytes(static_cast<size_t>(elements) * 4, '\0');
  for (int64_t i = 0; i < elements; ++i) {
    const uint32_t value = seed * 2654435761u + static_cast<uint32_t>(i);
    std::memcpy(&bytes[static_cast<size_t>(i) * 4], &value, 4);
  }
  return bytes;
}

// Key -> bytes of checkpoint `seed`, in manifest order.
std::vector<std::pair<std::string, std::string>> Contents(int64_t seed) {
  std::string step(8, '\0');
  std::memcpy(step.data(), &seed, 8);
  return {{"frozen", Int32Bytes(kFrozenElements, 0)},
          {"weight", Int32Bytes(kWeightElements, static_cast<uint32_t>(seed))},
          {"step", step}};
}

absl::StatusOr<int64_t> Commit(CheckpointStore& store, int64_t seed) {
  v1::Manifest header;
  header.set_model(kModel);
  header.mutable_metadata()->set_global_step(seed);
  const auto contents = Contents(seed);
  for (const auto& [key, bytes] : contents) {
    v1::TensorMeta* meta = header.add_tensors();
    meta->set_key(key);
    const bool step = key == "step";
    meta->set_dtype(step ? v1::DTYPE_INT64 : v1::DTYPE_INT32);
    meta->add_shape(static_cast<int64_t>(bytes.size()) / (step ? 8 : 4));
    meta->set_byte_length(static_cast<int64_t>(bytes.size()));
  }
  ASSIGN_OR_RETURN(std::unique_ptr<UploadSession> session,
                   store.BeginUpload(kModel, std::move(header), CommitOptions()));
  for (size_t i = 0; i < contents.size(); ++i) {
    RETURN_IF_ERROR(session->AddTensorData(static_cast<int>(i), 0, contents[i].second));
  }
  ASSIGN_OR_RETURN(CommitResult result, session->Commit());
  return result.version.version();
}

// OK when MODEL@version holds exactly checkpoint `seed`, every byte read back.
absl::Status CheckVersion(CheckpointStore& store, int64_t version, int64_t seed) {
  const std::string where = FormatVersionRef(kModel, version);
  ASSIGN_OR_RETURN(std::unique_ptr<VersionReader> reader,
                   store.OpenVersion(MakeVersionRef(kModel, version)));
  const auto contents = Contents(seed);
  const v1::Manifest& manifest = reader->manifest();
  if (manifest.tensors_size() != static_cast<int>(contents.size())) {
    return absl::DataLossError(absl::StrCat(where, " has ", manifest.tensors_size(),
                                            " tensors, expected ", contents.size()));
  }
  for (size_t i = 0; i < contents.size(); ++i) {
    const v1::TensorMeta& meta = manifest.tensors(static_cast<int>(i));
    const auto& [key, expected] = contents[i];
    if (meta.key() != key || meta.byte_length() != static_cast<int64_t>(expected.size())) {
      return absl::DataLossError(absl::StrCat(where, " tensor ", i, " is '", meta.key(), "' of ",
                                              meta.byte_length(), " bytes, expected '", key,
                                              "' of ", expected.size()));
    }
    std::string bytes(expected.size(), '\0');
    RETURN_IF_ERROR(reader->ReadTensorInto(meta, bytes.data()));
    if (bytes != expected) {
      return absl::DataLossError(
          absl::StrCat(where, " tensor '", key, "' differs from checkpoint ", seed));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::set<int64_t>> ListedVersions(CheckpointStore& store) {
  ASSIGN_OR_RETURN(std::vector<v1::VersionInfo> infos, store.ListVersions(kModel));
  std::set<int64_t> versions;
  for (const v1::VersionInfo& info : infos) versions.insert(info.version());
  return versions;
}

absl::Status VerifyWholeStore(CheckpointStore& store) {
  ASSIGN_OR_RETURN(v1::VerifyResponse verified, store.Verify("", 0));
  if (verified.problems_size() == 0) return absl::OkStatus();
  std::string problems;
  for (const v1::VerifyProblem& problem : verified.problems()) {
    absl::StrAppend(&problems, "\n  ", problem.message());
  }
  return absl::DataLossError(absl::StrCat("Verify found problems:", problems));
}

// ---- The child.

// Commits 1..3, then the interrupted operation; the armed failpoint should kill it there.
// Returns an exit code (2: the failpoint never fired).
int RunChild(const std::string& store_dir, const std::string& operation) {
  auto fail = [](absl::string_view what, const absl::Status& status) {
    std::cerr << "child: " << what << ": " << status << std::endl;
    return 1;
  };
  StoreOptions options;
  options.db_path = store_dir;
  options.rocksdb_file_system = testing::NewSyncRecordingFileSystem();
  absl::StatusOr<std::unique_ptr<RocksDbCheckpointStore>> store =
      RocksDbCheckpointStore::Open(options);
  if (!store.ok()) return fail("opening the store", store.status());
  for (int64_t seed = 1; seed <= kCommitsBefore; ++seed) {
    absl::StatusOr<int64_t> version = Commit(**store, seed);
    if (!version.ok()) return fail(absl::StrCat("commit ", seed), version.status());
    if (*version != seed) {
      return fail("commit", absl::InternalError(absl::StrCat("got version ", *version)));
    }
  }
  if (operation == "commit") {
    absl::StatusOr<int64_t> version = Commit(**store, kInterruptedSeed);
    if (!version.ok()) return fail("the interrupted commit", version.status());
  } else if (operation == "collect") {
    absl::StatusOr<int64_t> freed = (*store)->DeleteVersion(kModel, kDeletedVersion, false);
    if (!freed.ok()) return fail("deleting a version", freed.status());
    absl::StatusOr<v1::GarbageCollectResponse> collected = (*store)->GarbageCollect(false);
    if (!collected.ok()) return fail("collecting garbage", collected.status());
  } else {
    return fail("operation", absl::InvalidArgumentError(operation));
  }
  std::cerr << "child: the operation finished: the armed failpoint never fired" << std::endl;
  return 2;
}

// ---- The parent.

struct ChildResult {
  int wait_status = 0;
  std::string stderr_text;
};

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// Runs this binary as the child of `scenario` in `dir`, waits for it (60 s at most).
ChildResult RunChildProcess(const Scenario& scenario, const std::string& dir) {
  std::vector<std::string> env;
  for (char** entry = environ; *entry != nullptr; ++entry) {
    const absl::string_view text = *entry;
    // The child must not write the parent's test.xml or premature-exit marker.
    if (absl::StartsWith(text, "XML_OUTPUT_FILE=") || absl::StartsWith(text, "GTEST_OUTPUT=") ||
        absl::StartsWith(text, "TEST_PREMATURE_EXIT_FILE=")) {
      continue;
    }
    env.emplace_back(text);
  }
  env.push_back(absl::StrCat(kChildStoreEnv, "=", dir, "/store"));
  env.push_back(absl::StrCat(kChildOperationEnv, "=",
                             scenario.operation == Operation::kCommit ? "commit" : "collect"));
  env.push_back(absl::StrCat("CKPT_FAILPOINT=", scenario.failpoint, ":", scenario.hit));
  env.push_back(absl::StrCat("CKPT_SYNC_LOG=", dir, "/sync.log"));
  std::vector<char*> envp;
  for (std::string& entry : env) envp.push_back(entry.data());
  envp.push_back(nullptr);
  std::string self = "/proc/self/exe";
  char* argv[] = {self.data(), nullptr};

  const std::string stderr_path = dir + "/child.stderr";
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, (dir + "/child.stdout").c_str(),
                                   O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_addopen(&actions, STDERR_FILENO, stderr_path.c_str(),
                                   O_WRONLY | O_CREAT | O_TRUNC, 0644);
  pid_t pid = 0;
  const int error = posix_spawn(&pid, self.c_str(), &actions, nullptr, argv, envp.data());
  posix_spawn_file_actions_destroy(&actions);
  ChildResult result;
  if (error != 0) {
    ADD_FAILURE() << "posix_spawn: " << std::strerror(error);
    return result;
  }
  const absl::Time deadline = absl::Now() + absl::Seconds(60);
  while (waitpid(pid, &result.wait_status, WNOHANG) == 0) {
    if (absl::Now() > deadline) {
      ::kill(pid, SIGKILL);
      waitpid(pid, &result.wait_status, 0);
      ADD_FAILURE() << "the child ran for over 60 s";
      break;
    }
    absl::SleepFor(absl::Milliseconds(5));  // polling a child process; nothing to wait on.
  }
  result.stderr_text = ReadFile(stderr_path);
  return result;
}

// After the child died in `scenario`: the store at `store_dir` (opened here for the first time
// since) keeps what was acknowledged, has the interrupted operation wholly or not at all, verifies,
// and takes the interrupted content again.
void CheckRecovered(const Scenario& scenario, const std::string& store_dir) {
  StoreOptions options;
  options.db_path = store_dir;
  options.create_if_missing = false;
  options.abandoned_upload_grace = absl::ZeroDuration();  // the interrupted upload is garbage.
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<RocksDbCheckpointStore> store,
                       RocksDbCheckpointStore::Open(options));

  // Version -> the seed it holds, for what was acknowledged before the interrupted operation.
  std::map<int64_t, int64_t> acknowledged;
  for (int64_t seed = 1; seed <= kCommitsBefore; ++seed) acknowledged[seed] = seed;
  int64_t again_seed = kInterruptedSeed;
  if (scenario.operation == Operation::kCollect) {
    acknowledged.erase(kDeletedVersion);  // the delete was acknowledged too.
    again_seed = kDeletedVersion;
  }

  ASSERT_OK_AND_ASSIGN(std::set<int64_t> listed, ListedVersions(*store));
  for (const auto& [version, seed] : acknowledged) {
    EXPECT_TRUE(listed.count(version) == 1)
        << FormatVersionRef(kModel, version) << " was acknowledged but is not listed";
    EXPECT_OK(CheckVersion(*store, version, seed));
  }
  for (int64_t version : listed) {
    if (acknowledged.count(version) == 1) continue;
    if (scenario.operation == Operation::kCommit && version == kInterruptedSeed) {
      EXPECT_OK(CheckVersion(*store, version, kInterruptedSeed))
          << "the interrupted commit is listed, so it must be whole";
    } else {
      ADD_FAILURE() << FormatVersionRef(kModel, version) << " is listed but should not be";
    }
  }
  if (scenario.operation == Operation::kCommit && listed.count(kInterruptedSeed) == 0) {
    EXPECT_THAT(store->GetManifest(MakeVersionRef(kModel, kInterruptedSeed)),
                testing::StatusIs(absl::StatusCode::kNotFound))
        << "the interrupted commit is not listed, but something of it is there";
  }
  EXPECT_OK(VerifyWholeStore(*store));

  // The interrupted operation's content again: its chunks now deduplicate against whatever the
  // crash left (refcounts, locations, packs), which must all agree.
  ASSERT_OK_AND_ASSIGN(const int64_t again, Commit(*store, again_seed));
  EXPECT_OK(CheckVersion(*store, again, again_seed)) << "the commit after the crash";
  ASSERT_OK(store->GarbageCollect(false).status());
  EXPECT_OK(VerifyWholeStore(*store)) << "after GC";
  ASSERT_OK_AND_ASSIGN(listed, ListedVersions(*store));
  for (int64_t version : listed) {
    const int64_t seed = version == again                   ? again_seed
                         : acknowledged.count(version) == 1 ? acknowledged[version]
                                                            : kInterruptedSeed;
    EXPECT_OK(CheckVersion(*store, version, seed)) << "after GC";
  }
}

class CrashConsistencyTest : public ::testing::TestWithParam<Scenario> {};

// One child per failpoint; its store is checked as the kill left it (on a copy), then after the
// power cut.
TEST_P(CrashConsistencyTest, AcknowledgedVersionsSurviveAndTheInterruptedOneIsWholeOrAbsent) {
  const Scenario& scenario = GetParam();
  const std::string dir = absl::StrCat(std::getenv("TEST_TMPDIR"), "/", scenario.failpoint);
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);

  const ChildResult child = RunChildProcess(scenario, dir);
  // The failpoint, not something else, must have ended the child: otherwise nothing was cut.
  ASSERT_TRUE(WIFSIGNALED(child.wait_status) && WTERMSIG(child.wait_status) == SIGKILL)
      << "wait status " << child.wait_status << "; the child's stderr:\n"
      << child.stderr_text;
  ASSERT_TRUE(absl::StrContains(child.stderr_text,
                                absl::StrCat("failpoint ", scenario.failpoint, " fired")))
      << child.stderr_text;

  // Killed: every write the child made is there, synced or not.
  std::filesystem::copy(dir + "/store", dir + "/killed", std::filesystem::copy_options::recursive);
  {
    SCOPED_TRACE("killed");
    CheckRecovered(scenario, dir + "/killed");
  }

  // Power cut: only what the child synced.
  ASSERT_OK_AND_ASSIGN(const testing::PowerCut cut, testing::CutToSynced(dir + "/sync.log"));
  std::cout << scenario.failpoint << " power cut: " << cut.files_tracked << " files tracked, "
            << cut.files_removed << " removed, " << cut.files_truncated << " truncated, "
            << cut.bytes_dropped << " bytes dropped" << std::endl;
  ASSERT_GT(cut.files_tracked, 0) << "the child recorded no file: the sync log is not written";
  if (absl::string_view(scenario.failpoint) == "commit.before_pack_sync") {
    // Not vacuous: the interrupted upload's pack was never synced, so the cut takes all of it.
    EXPECT_GE(cut.bytes_dropped, kWeightElements * 4);
  }
  {
    SCOPED_TRACE("power cut");
    CheckRecovered(scenario, dir + "/store");
  }
}

INSTANTIATE_TEST_SUITE_P(EveryFailpoint, CrashConsistencyTest, ::testing::ValuesIn(kScenarios),
                         [](const ::testing::TestParamInfo<Scenario>& info) {
                           std::string name = info.param.failpoint;
                           std::replace(name.begin(), name.end(), '.', '_');
                           return name;
                         });

}  // namespace
}  // namespace ckpt

int main(int argc, char** argv) {
  if (const char* store_dir = std::getenv(ckpt::kChildStoreEnv)) {
    const char* operation = std::getenv(ckpt::kChildOperationEnv);
    return ckpt::RunChild(store_dir, operation == nullptr ? "" : operation);
  }
  // The parent links the failpoint build too: it must never arm one itself.
  ::unsetenv("CKPT_FAILPOINT");
  ::unsetenv("CKPT_SYNC_LOG");
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}

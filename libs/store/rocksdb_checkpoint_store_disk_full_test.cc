// The store on a full disk: a real RocksDB store on a real tmpfs, filled by commits. The failing
// commit is a clean RESOURCE_EXHAUSTED (again right after it: the sequence that once aborted the
// process in RocksDB's file logger), earlier versions stay byte-equal, and deleting versions plus
// garbage collection free space through the store itself, after which commits succeed again.
//
// The tmpfs is mounted in a child process with a mount namespace of its own (and a user
// namespace when not root), so the mount can never outlive the test, even when the child aborts;
// the child's exit status is the verdict. Where neither namespace can be had (not root, and
// unprivileged user namespaces disabled) the test is skipped, and fails in CI
// (libs/testing/requirements.h).

#include <sched.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <string>

#include "ATen/Context.h"
#include "ATen/core/Tensor.h"
#include "ATen/ops/rand.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "libs/store/checkpoint_contents.h"
#include "libs/store/checkpoint_store.h"
#include "libs/store/rocksdb_checkpoint_store.h"
#include "libs/testing/requirements.h"

namespace ckpt {
namespace {

constexpr int64_t kMiB = 1 << 20;

// Failure messages of the child: printed, and the exit status says how many there were.
int failures = 0;
void Fail(const std::string& message) {
  std::fprintf(stderr, "FAILED: %s\n", message.c_str());
  ++failures;
}

bool WriteProcFile(const std::string& path, const std::string& text) {
  std::ofstream out(path);
  out << text;
  return static_cast<bool>(out);
}

// A private mount namespace in which this process may mount a tmpfs.
bool EnterPrivateMountNamespace() {
  if (::geteuid() != 0) {
    const uid_t uid = ::geteuid();
    const gid_t gid = ::getegid();
    if (::unshare(CLONE_NEWUSER | CLONE_NEWNS) != 0) return false;
    WriteProcFile("/proc/self/setgroups", "deny");
    if (!WriteProcFile("/proc/self/uid_map", absl::StrCat("0 ", uid, " 1")) ||
        !WriteProcFile("/proc/self/gid_map", absl::StrCat("0 ", gid, " 1"))) {
      return false;
    }
  } else if (::unshare(CLONE_NEWNS) != 0) {
    return false;
  }
  // Nothing mounted here propagates to the parent's namespace.
  return ::mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) == 0;
}

at::Tensor DistinctTensor(int64_t bytes, int seed) {
  at::manual_seed(seed);
  return at::rand({bytes / 4});
}

// The scenario, in the child. Returns the number of failures.
int FillAndRecover(const std::string& disk) {
  StoreOptions options;
  options.db_path = disk + "/db";
  // The failed commit's partial pack is reclaimed by the next GarbageCollect.
  options.abandoned_upload_grace = absl::ZeroDuration();
  absl::StatusOr<std::unique_ptr<RocksDbCheckpointStore>> store =
      RocksDbCheckpointStore::Open(options);
  if (!store.ok()) {
    Fail(absl::StrCat("open: ", store.status().ToString()));
    return failures;
  }
  std::map<int64_t, at::Tensor> committed;
  int seed = 0;
  const auto commit = [&](int64_t bytes = 2 * kMiB) -> absl::Status {
    CheckpointContents contents;
    at::Tensor tensor = DistinctTensor(bytes, ++seed);
    absl::Status inserted = contents.model.Insert("w", tensor);
    if (!inserted.ok()) return inserted;
    absl::StatusOr<CommitResult> result = CommitCheckpoint(**store, "m", contents);
    if (result.ok()) committed[result->version.version()] = tensor;
    return result.status();
  };
  const auto check_versions = [&](absl::string_view when) {
    for (const auto& [version, tensor] : committed) {
      absl::StatusOr<at::Tensor> read = ReadTensor(**store, "m", version, "w");
      if (!read.ok()) {
        Fail(absl::StrCat(when, ": m@", version, ": ", read.status().ToString()));
      } else if (!read->equal(tensor)) {
        Fail(absl::StrCat(when, ": m@", version, " differs from what was committed"));
      }
    }
  };

  for (int round = 0; round < 3; ++round) {
    absl::Status status;
    for (int i = 0; i < 100 && status.ok(); ++i) status = commit();
    if (!absl::IsResourceExhausted(status)) {
      Fail(absl::StrCat("round ", round, ": filling ended with ", status.ToString()));
    }
    // Then smaller and smaller versions into what is left, as many writers of small files would:
    // the disk must not fill to its last byte, or deleting (RocksDB writes) could not free it.
    for (const int64_t bytes : {256 * 1024, 16 * 1024, 1024, 64}) {
      status = absl::OkStatus();
      for (int i = 0; i < 400 && status.ok(); ++i) status = commit(bytes);
      if (!absl::IsResourceExhausted(status)) {
        Fail(absl::StrCat("round ", round, ": filling with ", bytes, "-byte versions ended with ",
                          status.ToString()));
      }
    }
    // Right after the failure: the same clean refusal, no abort.
    status = commit();
    if (!absl::IsResourceExhausted(status)) {
      Fail(absl::StrCat("round ", round, ": the commit after ENOSPC: ", status.ToString()));
    }
    check_versions(absl::StrCat("round ", round, " on a full disk"));
    // Free space through the store itself.
    const int64_t oldest = committed.begin()->first;
    for (int64_t version = oldest; version < oldest + 3; ++version) {
      absl::StatusOr<int64_t> deleted = (*store)->DeleteVersion("m", version, /*force=*/true);
      if (!deleted.ok()) {
        Fail(absl::StrCat("round ", round, ": deleting m@", version,
                          " on a full disk: ", deleted.status().ToString()));
      }
      committed.erase(version);
    }
    absl::StatusOr<v1::GarbageCollectResponse> collected = (*store)->GarbageCollect(false);
    if (!collected.ok()) {
      Fail(absl::StrCat("round ", round, ": gc on a full disk: ", collected.status().ToString()));
    }
    status = commit();
    if (!status.ok()) {
      Fail(absl::StrCat("round ", round, ": commit after freeing space: ", status.ToString()));
    }
    if (failures > 0) return failures;
  }
  store->reset();
  store = RocksDbCheckpointStore::Open(options);
  if (!store.ok()) {
    Fail(absl::StrCat("reopen: ", store.status().ToString()));
    return failures;
  }
  check_versions("after reopening");
  return failures;
}

TEST(RocksDbCheckpointStoreDiskFullTest, FullDiskIsResourceExhaustedAndDeletesFreeSpace) {
  const char* tmp = std::getenv("TEST_TMPDIR");
  ASSERT_NE(tmp, nullptr);
  const std::string disk = absl::StrCat(tmp, "/disk");
  ASSERT_EQ(::mkdir(disk.c_str(), 0755), 0);
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    // 100 and 101: no tmpfs of its own here (the parent skips, or fails in CI).
    if (!EnterPrivateMountNamespace()) {
      std::fprintf(stderr, "no private mount namespace (unshare: %s)\n", std::strerror(errno));
      std::_Exit(100);
    }
    if (::mount("tmpfs", disk.c_str(), "tmpfs", 0, "size=24m") != 0) {
      std::fprintf(stderr, "mount -t tmpfs: %s\n", std::strerror(errno));
      std::_Exit(101);
    }
    std::_Exit(std::min(FillAndRecover(disk), 99));
  }
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status)) << "the child died of signal " << WTERMSIG(status)
                                 << " (an abort is RocksDB's assertion on a reused writer)";
  CKPT_REQUIRE(WEXITSTATUS(status) != 100 && WEXITSTATUS(status) != 101,
               "root or unprivileged user namespaces, to mount a tmpfs in a private mount "
               "namespace (see the child's message above)");
  EXPECT_EQ(WEXITSTATUS(status), 0) << "see FAILED lines above";
}

}  // namespace
}  // namespace ckpt

#ifndef CKPT_LIBS_STORE_TESTING_SEEDED_CHECKPOINTS_H_
#define CKPT_LIBS_STORE_TESTING_SEEDED_CHECKPOINTS_H_

// What the store's crash tests share (testonly): checkpoints that are a pure function of a seed,
// so that after a crash a test can say what every version must hold, and the test binary run
// again as the child process that crashes.
//
// Each seeded checkpoint holds one chunk every seed shares (frozen layers: deduplicated), two
// chunks of its own, and an 8-byte tensor naming the seed.
//
// Example:
//   ASSERT_OK_AND_ASSIGN(int64_t version, testing::CommitSeeded(*store, "m", 7));
//   EXPECT_OK(testing::CheckSeeded(*store, "m", version, 7));

#include <cstdint>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "libs/store/checkpoint_store.h"

namespace ckpt::testing {

// The shared tensor's and the seed's own tensor's element counts (int32): a chunk of 1 MiB and
// 4 KiB, and two chunks of 4 MiB and 64 KiB.
inline constexpr int64_t kFrozenElements = ((int64_t{1} << 20) + 4096) / 4;
inline constexpr int64_t kWeightElements = ((int64_t{4} << 20) + (64 << 10)) / 4;

// Key -> bytes of checkpoint `seed`, in manifest order: "frozen", "weight", "step".
std::vector<std::pair<std::string, std::string>> SeededContents(int64_t seed);

// Commits checkpoint `seed` as a new version of `model` (metadata.global_step = seed) and
// returns its number; the store's error otherwise.
absl::StatusOr<int64_t> CommitSeeded(CheckpointStore& store, absl::string_view model, int64_t seed);

// OK when MODEL@version holds exactly checkpoint `seed`, every byte read back; DATA_LOSS saying
// what differs, or the store's error.
absl::Status CheckSeeded(CheckpointStore& store, absl::string_view model, int64_t version,
                         int64_t seed);

// The versions ListVersions names.
absl::StatusOr<std::set<int64_t>> ListedVersions(CheckpointStore& store, absl::string_view model);

// OK when Verify of the whole store finds nothing; DATA_LOSS listing what it found.
absl::Status VerifyWholeStore(CheckpointStore& store);

// How a child process ended.
struct ChildResult {
  int wait_status = 0;
  std::string stderr_text;
};

// Runs this test binary again (/proc/self/exe, no arguments) with this process's environment plus
// `extra_env` ("NAME=VALUE"), its stdout and stderr in `dir`/child.stdout and child.stderr, and
// waits for it; after `timeout` it is killed and the test fails. The parent's test.xml and
// premature-exit marker are not passed on, so that the child cannot write them.
ChildResult RunThisBinaryAsChild(const std::vector<std::string>& extra_env, const std::string& dir,
                                 absl::Duration timeout);

}  // namespace ckpt::testing

#endif  // CKPT_LIBS_STORE_TESTING_SEEDED_CHECKPOINTS_H_

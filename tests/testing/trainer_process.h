#ifndef CKPT_TESTS_TESTING_TRAINER_PROCESS_H_
#define CKPT_TESTS_TESTING_TRAINER_PROCESS_H_

// The trainer binary (//services/trainer) run from end-to-end tests: started in the background
// with its output in a log file, waited for with a deadline, its ranks found and its progress
// read from the log; and the embedded store it leaves behind opened. testonly; tests that use it
// list //services/trainer in their data.

#include <sys/types.h>

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/time/time.h"
#include "libs/store/checkpoint_contents.h"
#include "libs/store/rocksdb_checkpoint_store.h"

namespace ckpt::testing {

// The trainer binary, relative to the test's runfiles root.
inline constexpr char kTrainer[] = "services/trainer/trainer";

// TEST_TMPDIR/name.
std::string TempPath(const std::string& name);
// The directory `python_script make DIR` filled with a team's files (a scripted model, its data),
// made on the first call for that script and reused by the binary's later tests.
const std::string& TeamDir(const std::string& python_script);
// The whole file; "" when it cannot be read (ReadFileOrEmpty, under the name the trainer tests use).
std::string ReadFile(const std::string& path);

// A trainer launcher running in the background, its stdout+stderr going to `log`.
struct TrainerProcess {
  pid_t pid = -1;
  std::string log;
};

TrainerProcess StartTrainer(const std::vector<std::string>& flags, const std::string& log);
// The exit status, or -1 when it is still running after `timeout` (then it is killed).
int WaitForExit(const TrainerProcess& process, absl::Duration timeout);
// StartTrainer, then WaitForExit.
int RunTrainer(const std::vector<std::string>& flags, const std::string& log,
               absl::Duration timeout = absl::Seconds(120));
// The child of `parent` whose environment says RANK=<rank>; -1 if none.
pid_t FindRank(pid_t parent, int rank);
// Waits until the log shows rank 0 at or past `step`.
bool WaitForStep(const TrainerProcess& process, int64_t step, absl::Duration timeout);
// (step, loss) of every progress line rank 0 logged.
std::vector<std::pair<int64_t, double>> LossLines(const std::string& log);

// The store a run left in `dir` (a test failure and null when it does not open).
std::unique_ptr<RocksDbCheckpointStore> OpenStore(const std::string& dir);
// `model` (a version reference) from the store in `dir` (a test failure and {} when it fails).
LoadedCheckpoint LoadLatest(const std::string& dir, const std::string& model);

}  // namespace ckpt::testing

#endif  // CKPT_TESTS_TESTING_TRAINER_PROCESS_H_

#include "tests/testing/trainer_process.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <map>
#include <regex>
#include <sstream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "libs/status/status_matchers.h"
#include "libs/store/checkpoint_contents.h"
#include "libs/store/version_ref.h"
#include "libs/testing/child_process.h"
#include "libs/testing/python_runner.h"

namespace ckpt::testing {

std::string TempPath(const std::string& name) {
  return std::string(std::getenv("TEST_TMPDIR")) + "/" + name;
}

std::string ReadFile(const std::string& path) { return ReadFileOrEmpty(path); }

const std::string& TeamDir(const std::string& python_script) {
  static auto* dirs = new std::map<std::string, std::string>();
  auto it = dirs->find(python_script);
  if (it == dirs->end()) {
    const std::string dir = TempPath(absl::StrCat("team", dirs->size()));
    RunPythonOrAddFailure(python_script, "make " + dir);
    it = dirs->emplace(python_script, dir).first;
  }
  return it->second;
}

TrainerProcess StartTrainer(const std::vector<std::string>& flags, const std::string& log) {
  TrainerProcess process;
  process.log = log;
  std::vector<std::string> args = {kTrainer};
  args.insert(args.end(), flags.begin(), flags.end());
  process.pid = fork();
  if (process.pid == 0) {
    const int fd = open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    dup2(fd, STDOUT_FILENO);
    dup2(fd, STDERR_FILENO);
    std::vector<char*> argv;
    for (std::string& arg : args) argv.push_back(arg.data());
    argv.push_back(nullptr);
    execv(kTrainer, argv.data());
    _exit(127);
  }
  return process;
}

int WaitForExit(const TrainerProcess& process, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  while (absl::Now() < deadline) {
    int status = 0;
    if (waitpid(process.pid, &status, WNOHANG) == process.pid) {
      return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    }
    absl::SleepFor(absl::Milliseconds(20));
  }
  kill(process.pid, SIGKILL);
  waitpid(process.pid, nullptr, 0);
  return -1;
}

int RunTrainer(const std::vector<std::string>& flags, const std::string& log,
               absl::Duration timeout) {
  return WaitForExit(StartTrainer(flags, log), timeout);
}

pid_t FindRank(pid_t parent, int rank) {
  DIR* proc = opendir("/proc");
  pid_t found = -1;
  while (dirent* entry = readdir(proc)) {
    pid_t pid = 0;
    if (!absl::SimpleAtoi(entry->d_name, &pid)) continue;
    const std::string stat = ReadFile(absl::StrCat("/proc/", pid, "/stat"));
    // "pid (comm) state ppid ...": comm may hold spaces, so split after the last ')'.
    const size_t close = stat.rfind(')');
    if (close == std::string::npos) continue;
    std::vector<std::string> fields = absl::StrSplit(stat.substr(close + 2), ' ');
    pid_t ppid = 0;
    if (fields.size() < 2 || !absl::SimpleAtoi(fields[1], &ppid) || ppid != parent) continue;
    std::ifstream environ_file(absl::StrCat("/proc/", pid, "/environ"), std::ios::binary);
    std::string variable;
    while (std::getline(environ_file, variable, '\0')) {
      if (variable == absl::StrCat("RANK=", rank)) found = pid;
    }
  }
  closedir(proc);
  return found;
}

bool WaitForStep(const TrainerProcess& process, int64_t step, absl::Duration timeout) {
  const std::regex progress(R"(step (\d+)/)");
  const absl::Time deadline = absl::Now() + timeout;
  while (absl::Now() < deadline) {
    const std::string log = ReadFile(process.log);
    for (auto it = std::sregex_iterator(log.begin(), log.end(), progress);
         it != std::sregex_iterator(); ++it) {
      if (std::stoll((*it)[1]) >= step) return true;
    }
    absl::SleepFor(absl::Milliseconds(5));
  }
  return false;
}

std::vector<std::pair<int64_t, double>> LossLines(const std::string& log) {
  std::vector<std::pair<int64_t, double>> losses;
  const std::regex line(R"(step (\d+)/\d+  loss ([0-9.]+))");
  for (auto it = std::sregex_iterator(log.begin(), log.end(), line); it != std::sregex_iterator();
       ++it) {
    losses.emplace_back(std::stoll((*it)[1]), std::stod((*it)[2]));
  }
  return losses;
}

std::unique_ptr<RocksDbCheckpointStore> OpenStore(const std::string& dir) {
  StoreOptions options;
  options.db_path = dir;
  options.create_if_missing = false;
  absl::StatusOr<std::unique_ptr<RocksDbCheckpointStore>> store =
      RocksDbCheckpointStore::Open(options);
  EXPECT_THAT(store.status(), IsOk());
  return store.ok() ? *std::move(store) : nullptr;
}

LoadedCheckpoint LoadLatest(const std::string& dir, const std::string& model) {
  std::unique_ptr<RocksDbCheckpointStore> store = OpenStore(dir);
  if (store == nullptr) return {};
  absl::StatusOr<LoadedCheckpoint> loaded = LoadCheckpoint(*store, *ParseVersionRef(model));
  EXPECT_THAT(loaded.status(), IsOk());
  return loaded.ok() ? *std::move(loaded) : LoadedCheckpoint();
}

}  // namespace ckpt::testing

#include "libs/train/lineage.h"

#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <optional>
#include <random>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

extern char** environ;

namespace ckpt::train {
namespace {

// Runs `args` (found on PATH) with stderr discarded; its stdout when it exits 0, else nullopt
// (also when it cannot be started, e.g. git is not installed).
std::optional<std::string> RunForOutput(std::vector<std::string> args) {
  int pipe_fds[2];
  if (pipe2(pipe_fds, O_CLOEXEC) != 0) return std::nullopt;
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, pipe_fds[1], STDOUT_FILENO);
  posix_spawn_file_actions_addopen(&actions, STDERR_FILENO, "/dev/null", O_WRONLY, 0);
  posix_spawn_file_actions_addopen(&actions, STDIN_FILENO, "/dev/null", O_RDONLY, 0);
  std::vector<char*> argv;
  for (std::string& arg : args) argv.push_back(arg.data());
  argv.push_back(nullptr);
  pid_t pid = -1;
  const int spawned = posix_spawnp(&pid, argv[0], &actions, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  close(pipe_fds[1]);
  if (spawned != 0) {
    close(pipe_fds[0]);
    return std::nullopt;
  }
  std::string output;
  char buffer[4096];
  for (;;) {
    const ssize_t n = read(pipe_fds[0], buffer, sizeof(buffer));
    if (n > 0) {
      output.append(buffer, static_cast<size_t>(n));
    } else if (n == 0 || errno != EINTR) {
      break;
    }
  }
  close(pipe_fds[0]);
  int status = 0;
  while (waitpid(pid, &status, 0) < 0) {
    if (errno != EINTR) return std::nullopt;
  }
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) return std::nullopt;
  return output;
}

}  // namespace

std::string NewRunId(absl::string_view model_name, absl::Time now) {
  std::random_device random;
  const uint32_t suffix = random();
  return absl::StrCat(model_name, "-", absl::FormatTime("%Y%m%dT%H%M%SZ", now, absl::UTCTimeZone()),
                      "-", absl::StrFormat("%08x", suffix));
}

std::string GitCodeRevision(const std::string& dir) {
  std::optional<std::string> head = RunForOutput({"git", "-C", dir, "rev-parse", "HEAD"});
  if (!head) return "";
  const std::string commit(absl::StripAsciiWhitespace(*head));
  if (commit.empty()) return "";
  std::optional<std::string> status = RunForOutput({"git", "-C", dir, "status", "--porcelain"});
  // A checkout whose state cannot be read is not claimed clean.
  if (!status || !absl::StripAsciiWhitespace(*status).empty()) return commit + "+dirty";
  return commit;
}

}  // namespace ckpt::train

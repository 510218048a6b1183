#include "libs/ddp/local_launcher.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "c10/util/Exception.h"

extern char** environ;

namespace ckpt::ddp {
namespace {

// The environment of this process with the torchrun variables (and extra_env) replaced.
std::vector<std::string> ChildEnvironment(
    const std::vector<std::pair<std::string, std::string>>& overrides) {
  std::vector<std::string> env;
  for (char** entry = environ; *entry != nullptr; ++entry) {
    const std::string text = *entry;
    bool overridden = false;
    for (const auto& [name, value] : overrides) {
      if (text.compare(0, name.size() + 1, name + "=") == 0) overridden = true;
    }
    if (!overridden) env.push_back(text);
  }
  for (const auto& [name, value] : overrides) env.push_back(name + "=" + value);
  return env;
}

int ExitStatus(int wait_status) {
  if (WIFEXITED(wait_status)) return WEXITSTATUS(wait_status);
  if (WIFSIGNALED(wait_status)) return 128 + WTERMSIG(wait_status);
  return -1;
}

}  // namespace

int PickFreeLoopbackPort() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  TORCH_CHECK(fd >= 0, "PickFreeLoopbackPort: socket() failed: ", std::strerror(errno));
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  address.sin_port = 0;
  socklen_t length = sizeof(address);
  const bool ok = ::bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) == 0 &&
                  ::getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length) == 0;
  const int error = errno;
  ::close(fd);
  TORCH_CHECK(ok, "PickFreeLoopbackPort: binding 127.0.0.1:0 failed: ", std::strerror(error));
  return ntohs(address.sin_port);
}

std::vector<int> RunLocalRanks(const std::vector<std::string>& args, int world_size,
                               int master_port,
                               const std::vector<std::pair<std::string, std::string>>& extra_env,
                               std::chrono::milliseconds timeout) {
  TORCH_CHECK(world_size >= 1, "RunLocalRanks: world_size must be >= 1, got ", world_size);
  std::vector<pid_t> pids;
  auto kill_all = [&pids] {
    for (pid_t pid : pids) {
      if (pid > 0) ::kill(pid, SIGKILL);
    }
    for (pid_t pid : pids) {
      if (pid > 0) ::waitpid(pid, nullptr, 0);
    }
  };
  const std::string executable = "/proc/self/exe";
  for (int rank = 0; rank < world_size; ++rank) {
    std::vector<std::pair<std::string, std::string>> overrides = {
        {"RANK", std::to_string(rank)},
        {"LOCAL_RANK", std::to_string(rank)},
        {"WORLD_SIZE", std::to_string(world_size)},
        {"MASTER_ADDR", "127.0.0.1"},
        {"MASTER_PORT", std::to_string(master_port)},
    };
    overrides.insert(overrides.end(), extra_env.begin(), extra_env.end());
    std::vector<std::string> env = ChildEnvironment(overrides);
    std::vector<char*> envp;
    for (std::string& entry : env) envp.push_back(entry.data());
    envp.push_back(nullptr);
    std::vector<std::string> argv_strings = {executable};
    argv_strings.insert(argv_strings.end(), args.begin(), args.end());
    std::vector<char*> argv;
    for (std::string& arg : argv_strings) argv.push_back(arg.data());
    argv.push_back(nullptr);
    pid_t pid = 0;
    const int error =
        ::posix_spawn(&pid, executable.c_str(), nullptr, nullptr, argv.data(), envp.data());
    if (error != 0) {
      kill_all();
      TORCH_CHECK(false, "RunLocalRanks: starting rank ", rank, " (", executable,
                  ") failed: ", std::strerror(error));
    }
    pids.push_back(pid);
  }

  std::vector<int> exits(pids.size(), -1);
  std::vector<bool> done(pids.size(), false);
  size_t remaining = pids.size();
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  // waitpid has no timeout; poll every few milliseconds until all exit or the deadline passes.
  while (remaining > 0 && std::chrono::steady_clock::now() < deadline) {
    for (size_t i = 0; i < pids.size(); ++i) {
      if (done[i]) continue;
      int status = 0;
      if (::waitpid(pids[i], &status, WNOHANG) == pids[i]) {
        exits[i] = ExitStatus(status);
        done[i] = true;
        pids[i] = -1;
        --remaining;
      }
    }
    if (remaining > 0) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  kill_all();  // only the ones still running; their status stays -1
  return exits;
}

}  // namespace ckpt::ddp

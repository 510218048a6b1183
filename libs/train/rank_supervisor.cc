#include "libs/train/rank_supervisor.h"

#include <signal.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <iostream>
#include <map>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "libs/ddp/local_launcher.h"

extern char** environ;

namespace ckpt::train {
namespace {

std::atomic<int> g_stop_signals{0};

std::string DescribeExit(int rank, pid_t pid, int status) {
  if (WIFSIGNALED(status)) {
    const int signal_number = WTERMSIG(status);
    return absl::StrCat("rank ", rank, " (pid ", pid, ") was killed by signal ", signal_number,
                        " (", strsignal(signal_number), ")");
  }
  return absl::StrCat("rank ", rank, " (pid ", pid, ") exited with status ", WEXITSTATUS(status));
}

// Starts one rank; -1 (with errno) on failure.
pid_t SpawnRank(const SupervisorOptions& options, int local_rank, int master_port,
                int restart_count) {
  std::vector<std::string> env_strings;
  const int world_size = options.nnodes * options.nproc_per_node;
  const std::map<std::string, std::string> ours = {
      {"RANK", std::to_string(options.node_rank * options.nproc_per_node + local_rank)},
      {"LOCAL_RANK", std::to_string(local_rank)},
      {"WORLD_SIZE", std::to_string(world_size)},
      {"LOCAL_WORLD_SIZE", std::to_string(options.nproc_per_node)},
      {"MASTER_ADDR", options.master_addr},
      {"MASTER_PORT", std::to_string(master_port)},
      {"TORCHELASTIC_RESTART_COUNT", std::to_string(restart_count)},
  };
  for (char** entry = environ; *entry != nullptr; ++entry) {
    const std::string text = *entry;
    if (ours.count(text.substr(0, text.find('='))) == 0) env_strings.push_back(text);
  }
  for (const auto& [name, value] : ours) env_strings.push_back(name + "=" + value);

  std::vector<char*> argv;
  argv.push_back(const_cast<char*>(options.executable.c_str()));
  for (const std::string& arg : options.args) argv.push_back(const_cast<char*>(arg.c_str()));
  argv.push_back(nullptr);
  std::vector<char*> envp;
  for (std::string& entry : env_strings) envp.push_back(entry.data());
  envp.push_back(nullptr);

  const pid_t pid = fork();
  if (pid == 0) {
    execve(options.executable.c_str(), argv.data(), envp.data());
    _exit(127);
  }
  return pid;
}

}  // namespace

void ForwardStopSignal() { g_stop_signals.fetch_add(1, std::memory_order_relaxed); }

SupervisorResult SuperviseRanks(const SupervisorOptions& options) {
  SupervisorResult result;
  ddp::NodeRendezvous* const nodes = options.node_rendezvous;
  for (int attempt = 0;; ++attempt) {
    int master_port = options.master_port;
    if (nodes != nullptr) {
      absl::StatusOr<int> joined = nodes->Join(attempt);
      if (!joined.ok()) {
        result.exit_code = 1;
        result.cause = absl::StrCat("the other nodes did not join (restart ", attempt,
                                    "): ", joined.status().message());
        return result;
      }
      master_port = *joined;
    } else if (master_port == 0) {
      master_port = ddp::PickFreeLoopbackPort();
    }
    std::map<pid_t, int> running;  // pid -> local rank
    std::string cause;
    for (int local_rank = 0; local_rank < options.nproc_per_node; ++local_rank) {
      const pid_t pid = SpawnRank(options, local_rank, master_port, attempt);
      if (pid < 0) {
        cause = absl::StrCat("could not start rank ", local_rank, ": ", strerror(errno));
        break;
      }
      running[pid] = options.node_rank * options.nproc_per_node + local_rank;
    }
    if (options.verbose && cause.empty()) {
      std::cerr << "launcher: started " << running.size() << " rank(s) (world size "
                << options.nnodes * options.nproc_per_node << ", master " << options.master_addr
                << ":" << master_port << ")"
                << (attempt > 0 ? absl::StrCat(", restart ", attempt) : std::string()) << "\n";
    }

    if (nodes != nullptr && !cause.empty()) nodes->ReportFailure(attempt, cause);
    int signals_forwarded = 0;
    absl::Time kill_deadline = absl::InfiniteFuture();
    absl::Time next_peer_poll = absl::Now();
    while (!running.empty()) {
      // Another node's ranks failed: this node's ranks would wait for them in a collective, so
      // they stop too and every node restarts together.
      if (nodes != nullptr && cause.empty() && absl::Now() >= next_peer_poll) {
        next_peer_poll = absl::Now() + absl::Milliseconds(200);
        if (std::string peer = nodes->PeerFailure(attempt); !peer.empty()) {
          cause = std::move(peer);
          if (options.verbose) {
            std::cerr << "launcher: " << cause << "; stopping this node's ranks so that all "
                      << "nodes restart together\n";
          }
        }
      }
      // Stop signals from the user: first a graceful SIGTERM, then SIGKILL.
      const int signals = g_stop_signals.load(std::memory_order_relaxed);
      if (signals > signals_forwarded) {
        const int how = signals >= 2 ? SIGKILL : SIGTERM;
        for (const auto& [pid, rank] : running) kill(pid, how);
        signals_forwarded = signals;
      }
      // A failure stops the rest: SIGTERM now, SIGKILL when they outlive the timeout.
      if (!cause.empty() && kill_deadline == absl::InfiniteFuture()) {
        for (const auto& [pid, rank] : running) kill(pid, SIGTERM);
        kill_deadline = absl::Now() + options.stop_timeout;
      }
      if (absl::Now() >= kill_deadline) {
        for (const auto& [pid, rank] : running) kill(pid, SIGKILL);
        kill_deadline = absl::InfiniteFuture() - absl::Seconds(1);  // sent once.
      }
      int status = 0;
      const pid_t pid = waitpid(-1, &status, WNOHANG);
      if (pid > 0) {
        auto it = running.find(pid);
        if (it == running.end()) continue;
        const int rank = it->second;
        running.erase(it);
        const bool failed = !(WIFEXITED(status) && WEXITSTATUS(status) == 0);
        if (failed && cause.empty()) {
          cause = DescribeExit(rank, pid, status);
          if (nodes != nullptr) nodes->ReportFailure(attempt, cause);
          if (options.verbose) {
            std::cerr << "launcher: " << cause << "; stopping the other ranks (SIGTERM, then "
                      << "SIGKILL after " << absl::FormatDuration(options.stop_timeout) << ")\n";
          }
        }
        continue;
      }
      if (pid < 0 && errno == ECHILD) break;
      absl::SleepFor(absl::Milliseconds(20));
    }

    if (nodes != nullptr) nodes->Done(attempt, cause.empty());
    // A rank that fails after another node's ranks finished the run (and rank 0 committed its
    // final checkpoint) leaves nothing to redo, and no node to restart with.
    if (cause.empty() || (nodes != nullptr && nodes->AnyNodeSucceeded(attempt))) {
      if (!cause.empty() && options.verbose) {
        std::cerr << "launcher: " << cause << ", but another node's ranks finished the run; "
                  << "not restarting\n";
      }
      if (nodes != nullptr) nodes->Leave(attempt, options.stop_timeout + absl::Seconds(30));
      result.exit_code = 0;
      result.cause.clear();
      return result;
    }
    result.exit_code = 1;
    result.cause = cause;
    const bool user_stopped = g_stop_signals.load(std::memory_order_relaxed) > 0;
    if (user_stopped || result.restarts >= options.max_restarts) {
      if (nodes != nullptr) nodes->Leave(attempt, options.stop_timeout + absl::Seconds(30));
      return result;
    }
    ++result.restarts;
    if (options.verbose) {
      std::cerr << "launcher: restarting all ranks (" << result.restarts << " of "
                << options.max_restarts << "); they resume from the last committed version\n";
    }
  }
}

}  // namespace ckpt::train

#ifndef CKPT_LIBS_DDP_LOCAL_LAUNCHER_H_
#define CKPT_LIBS_DDP_LOCAL_LAUNCHER_H_

// Runs a data-parallel job on one host the way torchrun does: world_size copies of the current
// executable, each told its rank through the torchrun environment (RANK, WORLD_SIZE, LOCAL_RANK,
// MASTER_ADDR, MASTER_PORT), read back with RendezvousOptionsFromEnvironment. Used by the
// multi-process tests and ddp_smoke_main: real processes, so each rank has its own LibTorch and
// Gloo state, as in production.
//
// Example:
//   const int port = PickFreeLoopbackPort();
//   std::vector<int> exits = RunLocalRanks({"--worker"}, 2, port, {}, std::chrono::seconds(60));

#include <chrono>
#include <string>
#include <utility>
#include <vector>

namespace ckpt::ddp {

// A TCP port on 127.0.0.1 that was free when asked (bound with port 0, read back, released).
// Throws c10::Error if no socket can be bound.
int PickFreeLoopbackPort();

// Starts world_size copies of /proc/self/exe with `args` (after argv[0]) and the torchrun
// environment for 127.0.0.1:master_port, plus `extra_env` (name, value), inheriting stdout and
// stderr. Waits for all of them, up to `timeout`, after which the survivors are killed (SIGKILL).
// Returns each rank's exit status: the exit code, 128 + signal if it died from a signal, or -1
// if it was killed on timeout. Throws c10::Error if a process cannot be started.
std::vector<int> RunLocalRanks(const std::vector<std::string>& args, int world_size,
                               int master_port,
                               const std::vector<std::pair<std::string, std::string>>& extra_env,
                               std::chrono::milliseconds timeout);

}  // namespace ckpt::ddp

#endif  // CKPT_LIBS_DDP_LOCAL_LAUNCHER_H_

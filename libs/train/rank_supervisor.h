#ifndef CKPT_LIBS_TRAIN_RANK_SUPERVISOR_H_
#define CKPT_LIBS_TRAIN_RANK_SUPERVISOR_H_

// The launcher half of the trainer (torchrun for C++): starts this node's ranks as child
// processes of one executable, supervises them, and restarts them all after a failure.
//
// Every child gets the torchrun environment: RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE,
// MASTER_ADDR, MASTER_PORT, plus TORCHELASTIC_RESTART_COUNT. When any rank fails (non-zero exit
// or a signal) the others get SIGTERM and, after `stop_timeout`, SIGKILL, so no rank is left
// hanging in a collective whose peer is gone. With restarts left, all ranks are started again
// (they resume from the last committed checkpoint); otherwise the run fails with the cause.
//
// A SIGINT or SIGTERM to the launcher (ForwardStopSignal from a handler) is passed to the ranks
// as SIGTERM: a graceful stop (checkpoint, then exit 0). A second one kills them.
//
// Thread-safety: one Supervise call per process (signals reach it through a global).

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "libs/ddp/node_rendezvous.h"

namespace ckpt::train {

struct SupervisorOptions {
  std::string executable;         // run for every rank, e.g. /proc/self/exe resolved.
  std::vector<std::string> args;  // argv[1..] of every rank.
  int nproc_per_node = 1;
  int nnodes = 1;
  int node_rank = 0;
  std::string master_addr = "127.0.0.1";
  int master_port = 0;  // 0: a free local port, chosen anew for every attempt.
  int max_restarts = 0;
  absl::Duration stop_timeout = absl::Seconds(10);
  bool verbose = true;  // one stderr line per start / failure / restart.
  // With nnodes > 1: the launchers' rendezvous (not owned). When set, the rank rendezvous port
  // of every attempt comes from it and master_port is not used.
  ddp::NodeRendezvous* node_rendezvous = nullptr;
};

struct SupervisorResult {
  int exit_code = 0;  // 0 when every rank of the last attempt exited 0.
  int restarts = 0;   // attempts after the first.
  std::string cause;  // the first failure of the last attempt; empty on success.
};

SupervisorResult SuperviseRanks(const SupervisorOptions& options);

// Async-signal-safe; see above.
void ForwardStopSignal();

}  // namespace ckpt::train

#endif  // CKPT_LIBS_TRAIN_RANK_SUPERVISOR_H_

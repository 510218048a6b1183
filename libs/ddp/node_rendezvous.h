#ifndef CKPT_LIBS_DDP_NODE_RENDEZVOUS_H_
#define CKPT_LIBS_DDP_NODE_RENDEZVOUS_H_

#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace ckpt::ddp {

// How the launchers of a multi-node job (one per node) restart together, as torchrun's elastic
// agents do through their rendezvous: every attempt is a round that all nodes join before any
// starts ranks, and a failure on one node ends the round on all of them. Without it a node whose
// ranks died restarts alone: its new ranks can meet the old rank 0's store, still up on node 0,
// and the other nodes' ranks wait in a collective until Gloo's timeout.
// Implemented over a c10d TCPStore on node 0 by tcp_store_node_rendezvous.h; the launcher
// (libs/train/rank_supervisor.h) drives it.
class NodeRendezvous {
 public:
  virtual ~NodeRendezvous() = default;
  // Blocks until the launchers of all nodes have joined round `attempt` (each only after its
  // ranks of the previous round have exited). Returns the rendezvous port of this round's rank
  // 0, the same on every node; an error when the others do not come in time.
  virtual absl::StatusOr<int> Join(int attempt) = 0;
  // This node's ranks of round `attempt` failed with `cause`: tells the other nodes.
  virtual void ReportFailure(int attempt, const std::string& cause) = 0;
  // Non-blocking (one round trip): the failure another node reported in round `attempt`, e.g.
  // "node 1: rank 3 (pid 42) was killed by signal 9 (Killed)"; "" when there is none.
  virtual std::string PeerFailure(int attempt) = 0;
  // This node's ranks of round `attempt` have all exited, `succeeded` when all with status 0.
  virtual void Done(int attempt, bool succeeded) = 0;
  // Whether some node's ranks all exited 0 in round `attempt`: the run finished (rank 0 wrote
  // the final checkpoint), so a failure seen after that is no reason to restart.
  virtual bool AnyNodeSucceeded(int attempt) = 0;
  // Before the launcher exits: node 0 (whose store the others read) waits, up to `timeout`, for
  // every node to be Done with round `attempt`.
  virtual void Leave(int attempt, absl::Duration timeout) = 0;
};

}  // namespace ckpt::ddp

#endif  // CKPT_LIBS_DDP_NODE_RENDEZVOUS_H_

#ifndef CKPT_LIBS_DDP_TCP_STORE_NODE_RENDEZVOUS_H_
#define CKPT_LIBS_DDP_TCP_STORE_NODE_RENDEZVOUS_H_

// The launchers' rendezvous of a multi-node job (ddp::NodeRendezvous, node_rendezvous.h), over a
// c10d TCPStore that node 0's launcher serves on --master_port, as torchrun's c10d rendezvous
// backend does. The store outlives every attempt's ranks, so each round gets a fresh rank
// rendezvous port (rank 0's own TCPStore) and no restarted rank can meet the previous round's
// store.
//
// Keys, per round A: round/A/joined (launchers in), round/A/port (node 0's pick),
// round/A/failure ("node N: cause", the first failure), round/A/done (launchers whose ranks
// exited), round/A/succeeded.
//
// Example:
//   NodeRendezvousOptions options{.nnodes = 2, .node_rank = 1, .master_addr = "10.0.0.1",
//                                 .master_port = 29500};
//   ASSIGN_OR_RETURN(std::unique_ptr<ddp::NodeRendezvous> nodes, ConnectNodes(options));
//   supervisor_options.node_rendezvous = nodes.get();

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "libs/ddp/node_rendezvous.h"

namespace ckpt::ddp {

struct NodeRendezvousOptions {
  int nnodes = 2;
  int node_rank = 0;
  std::string master_addr;
  int master_port = 0;  // must be agreed (not 0).
  // How long a launcher waits for the others: to connect, and at every round.
  absl::Duration timeout = absl::Minutes(10);
};

// Node 0 starts serving the store; the others connect to it, waiting up to options.timeout.
// UNAVAILABLE when the store cannot be served or reached. Thread-compatible.
absl::StatusOr<std::unique_ptr<NodeRendezvous>> ConnectNodes(const NodeRendezvousOptions& options);

}  // namespace ckpt::ddp

#endif  // CKPT_LIBS_DDP_TCP_STORE_NODE_RENDEZVOUS_H_

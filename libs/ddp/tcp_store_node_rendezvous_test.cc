#include "libs/ddp/tcp_store_node_rendezvous.h"

#include <memory>
#include <string>
#include <thread>

#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "libs/ddp/local_launcher.h"
#include "libs/status/status_matchers.h"

namespace ckpt::ddp {
namespace {

using ::ckpt::testing::IsOk;
using ::ckpt::testing::StatusIs;
using ::testing::HasSubstr;

NodeRendezvousOptions Node(int node_rank, int port, absl::Duration timeout = absl::Seconds(30)) {
  NodeRendezvousOptions options;
  options.nnodes = 2;
  options.node_rank = node_rank;
  options.master_addr = "127.0.0.1";
  options.master_port = port;
  options.timeout = timeout;
  return options;
}

// Node 0 (serving) and node 1 (connected to it) on a free loopback port.
struct TwoLaunchers {
  TwoLaunchers() {
    const int port = ddp::PickFreeLoopbackPort();
    absl::StatusOr<std::unique_ptr<NodeRendezvous>> zero = ConnectNodes(Node(0, port));
    EXPECT_THAT(zero.status(), IsOk());
    absl::StatusOr<std::unique_ptr<NodeRendezvous>> one = ConnectNodes(Node(1, port));
    EXPECT_THAT(one.status(), IsOk());
    if (zero.ok()) node0 = *std::move(zero);
    if (one.ok()) node1 = *std::move(one);
  }
  std::unique_ptr<NodeRendezvous> node0, node1;
};

TEST(NodeRendezvousTest, EveryRoundGivesAllNodesTheSameRankPort) {
  TwoLaunchers launchers;
  ASSERT_TRUE(launchers.node0 && launchers.node1);
  for (int attempt : {0, 1}) {
    absl::StatusOr<int> port1;
    std::thread other([&] { port1 = launchers.node1->Join(attempt); });
    absl::StatusOr<int> port0 = launchers.node0->Join(attempt);
    other.join();
    ASSERT_THAT(port0.status(), IsOk());
    ASSERT_THAT(port1.status(), IsOk());
    EXPECT_GT(*port0, 0);
    EXPECT_EQ(*port0, *port1) << "round " << attempt;
  }
}

TEST(NodeRendezvousTest, AFailureReachesTheOtherNodesOfItsRoundOnly) {
  TwoLaunchers launchers;
  ASSERT_TRUE(launchers.node0 && launchers.node1);
  EXPECT_EQ(launchers.node0->PeerFailure(0), "");
  launchers.node1->ReportFailure(0, "rank 3 (pid 7) was killed by signal 9 (Killed)");
  EXPECT_EQ(launchers.node0->PeerFailure(0),
            "node 1: rank 3 (pid 7) was killed by signal 9 (Killed)");
  EXPECT_EQ(launchers.node1->PeerFailure(0), "") << "its own failure";
  // The first failure of a round is the one reported; later rounds start clean.
  launchers.node0->ReportFailure(0, "rank 0 exited with status 1");
  EXPECT_THAT(launchers.node0->PeerFailure(0), HasSubstr("node 1: rank 3"));
  EXPECT_EQ(launchers.node0->PeerFailure(1), "");
}

TEST(NodeRendezvousTest, NodeZeroLeavesOnceEveryNodeIsDone) {
  TwoLaunchers launchers;
  ASSERT_TRUE(launchers.node0 && launchers.node1);
  EXPECT_FALSE(launchers.node1->AnyNodeSucceeded(0));
  launchers.node0->Done(0, /*succeeded=*/true);
  EXPECT_TRUE(launchers.node1->AnyNodeSucceeded(0));
  // Node 1 is not done: node 0 waits for it, up to the timeout.
  absl::Time start = absl::Now();
  launchers.node0->Leave(0, absl::Milliseconds(300));
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(300));
  launchers.node1->Done(0, /*succeeded=*/false);
  start = absl::Now();
  launchers.node0->Leave(0, absl::Seconds(30));
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
}

TEST(NodeRendezvousTest, MissingNodesAndALostNodeZeroAreReported) {
  const int port = ddp::PickFreeLoopbackPort();
  // Nobody serves the port yet.
  EXPECT_THAT(ConnectNodes(Node(1, port, absl::Milliseconds(300))).status(),
              StatusIs(absl::StatusCode::kUnavailable, HasSubstr("cannot reach")));
  absl::StatusOr<std::unique_ptr<NodeRendezvous>> zero =
      ConnectNodes(Node(0, port, absl::Seconds(2)));
  ASSERT_THAT(zero.status(), IsOk());
  EXPECT_THAT((*zero)->Join(0).status(),
              StatusIs(absl::StatusCode::kDeadlineExceeded, HasSubstr("1 of 2 nodes joined")));
  absl::StatusOr<std::unique_ptr<NodeRendezvous>> one = ConnectNodes(Node(1, port));
  ASSERT_THAT(one.status(), IsOk());
  zero->reset();  // node 0's launcher is gone, and its store with it.
  EXPECT_THAT((*one)->PeerFailure(0), HasSubstr("lost the launchers' rendezvous on 127.0.0.1:"));
}

}  // namespace
}  // namespace ckpt::ddp

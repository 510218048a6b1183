#include "libs/train/rank_supervisor.h"

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ckpt::train {
namespace {

using ::testing::HasSubstr;

// Ranks are /bin/sh scripts: the supervisor only needs an executable and the environment.
SupervisorOptions ShellRanks(const std::string& script, int ranks) {
  SupervisorOptions options;
  options.executable = "/bin/sh";
  options.args = {"-c", script};
  options.nproc_per_node = ranks;
  options.verbose = false;
  return options;
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

TEST(RankSupervisorTest, RanksGetTheTorchrunEnvironmentAndSucceedTogether) {
  const std::string dir = std::getenv("TEST_TMPDIR");
  SupervisorOptions options =
      ShellRanks("echo \"$RANK $LOCAL_RANK $WORLD_SIZE $LOCAL_WORLD_SIZE $MASTER_ADDR\" > " + dir +
                     "/rank_$RANK; [ \"$MASTER_PORT\" -gt 0 ]",
                 3);
  SupervisorResult result = SuperviseRanks(options);
  EXPECT_EQ(result.exit_code, 0) << result.cause;
  EXPECT_EQ(result.restarts, 0);
  EXPECT_EQ(ReadFile(dir + "/rank_0"), "0 0 3 3 127.0.0.1\n");
  EXPECT_EQ(ReadFile(dir + "/rank_2"), "2 2 3 3 127.0.0.1\n");
}

TEST(RankSupervisorTest, OneFailedRankStopsTheOthersAndNamesTheCause) {
  // Rank 0 would sleep for a minute; rank 1 fails at once.
  SupervisorOptions options = ShellRanks("if [ \"$RANK\" = 1 ]; then exit 3; fi; exec sleep 60", 2);
  const absl::Time start = absl::Now();
  SupervisorResult result = SuperviseRanks(options);
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  EXPECT_EQ(result.exit_code, 1);
  EXPECT_THAT(result.cause, HasSubstr("rank 1"));
  EXPECT_THAT(result.cause, HasSubstr("exited with status 3"));
}

TEST(RankSupervisorTest, ARankThatIgnoresSigtermIsKilledAfterTheTimeout) {
  // Rank 1 dies only once rank 0 ignores SIGTERM (else the SIGTERM could beat the trap).
  const std::string ready = std::string(std::getenv("TEST_TMPDIR")) + "/ignoring_sigterm";
  SupervisorOptions options =
      ShellRanks("if [ \"$RANK\" = 1 ]; then while [ ! -f " + ready +
                     " ]; do sleep 0.01; done; kill -9 $$; fi; trap '' TERM; touch " + ready +
                     "; exec sleep 60",
                 2);
  options.stop_timeout = absl::Milliseconds(300);
  const absl::Time start = absl::Now();
  SupervisorResult result = SuperviseRanks(options);
  const absl::Duration took = absl::Now() - start;
  EXPECT_GE(took, absl::Milliseconds(300));
  EXPECT_LT(took, absl::Seconds(5));
  EXPECT_EQ(result.exit_code, 1);
  EXPECT_THAT(result.cause, HasSubstr("rank 1"));
  EXPECT_THAT(result.cause, HasSubstr("signal 9"));
}

TEST(RankSupervisorTest, RestartsAllRanksAfterAFailure) {
  const std::string dir = std::getenv("TEST_TMPDIR");
  // Rank 1 dies on the first attempt only; every start of every rank is logged.
  SupervisorOptions options = ShellRanks(
      "echo \"$RANK@$TORCHELASTIC_RESTART_COUNT\" >> " + dir +
          "/starts; if [ \"$RANK\" = 1 ] && [ \"$TORCHELASTIC_RESTART_COUNT\" = 0 ]; then "
          "kill -9 $$; fi; exit 0",
      2);
  options.max_restarts = 1;
  SupervisorResult result = SuperviseRanks(options);
  EXPECT_EQ(result.exit_code, 0) << result.cause;
  EXPECT_EQ(result.restarts, 1);
  const std::string starts = ReadFile(dir + "/starts");
  EXPECT_THAT(starts, HasSubstr("0@1"));
  EXPECT_THAT(starts, HasSubstr("1@1"));
}

TEST(RankSupervisorTest, GivesUpWhenRestartsAreSpent) {
  SupervisorOptions options = ShellRanks("exit 5", 2);
  options.max_restarts = 2;
  SupervisorResult result = SuperviseRanks(options);
  EXPECT_EQ(result.exit_code, 1);
  EXPECT_EQ(result.restarts, 2);
  EXPECT_THAT(result.cause, HasSubstr("exited with status 5"));
}

// A NodeRendezvous whose other node fails in round 0, once this node's ranks are up.
class PeerFailsInRoundZero final : public ddp::NodeRendezvous {
 public:
  explicit PeerFailsInRoundZero(std::string started) : started_(std::move(started)) {}
  absl::StatusOr<int> Join(int attempt) override {
    log += absl::StrCat("join ", attempt, ";");
    return 40000 + attempt;
  }
  void ReportFailure(int attempt, const std::string& cause) override {
    log += absl::StrCat("failure ", attempt, ";");
  }
  std::string PeerFailure(int attempt) override {
    const bool ranks_up = !ReadFile(started_).empty();
    return attempt == 0 && ranks_up ? "node 1: rank 3 was killed by signal 9" : "";
  }
  void Done(int attempt, bool succeeded) override {
    log += absl::StrCat("done ", attempt, succeeded ? " ok;" : " failed;");
  }
  bool AnyNodeSucceeded(int attempt) override { return false; }
  void Leave(int attempt, absl::Duration timeout) override {
    log += absl::StrCat("leave ", attempt, ";");
  }
  std::string log;

 private:
  const std::string started_;
};

TEST(RankSupervisorTest, AnotherNodesFailureRestartsThisNodesRanksInTheNextRound) {
  const std::string dir = std::getenv("TEST_TMPDIR");
  // Round 0's ranks would train for a minute; round 1's finish. Each logs its rendezvous port.
  SupervisorOptions options = ShellRanks(
      "echo \"$RANK@$MASTER_PORT\" >> " + dir +
          "/peer_starts; if [ \"$TORCHELASTIC_RESTART_COUNT\" = 0 ]; then exec sleep 60; fi",
      2);
  options.nnodes = 2;
  options.max_restarts = 1;
  PeerFailsInRoundZero nodes(dir + "/peer_starts");
  options.node_rendezvous = &nodes;
  const absl::Time start = absl::Now();
  SupervisorResult result = SuperviseRanks(options);
  EXPECT_LT(absl::Now() - start, absl::Seconds(15));
  EXPECT_EQ(result.exit_code, 0) << result.cause;
  EXPECT_EQ(result.restarts, 1);
  EXPECT_EQ(nodes.log, "join 0;done 0 failed;join 1;done 1 ok;leave 1;");
  const std::string starts = ReadFile(dir + "/peer_starts");
  EXPECT_THAT(starts, HasSubstr("@40000"));
  EXPECT_THAT(starts, HasSubstr("0@40001"));
  EXPECT_THAT(starts, HasSubstr("1@40001"));
}

}  // namespace
}  // namespace ckpt::train

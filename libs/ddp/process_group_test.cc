#include "libs/ddp/process_group.h"

#include <chrono>
#include <cstdlib>
#include <iostream>
#include <string>
#include <vector>

#include "c10/util/Exception.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "libs/ddp/local_launcher.h"
#include "libs/testing/torch_error.h"

namespace ckpt::ddp {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

constexpr char kWorkerVariable[] = "CKPT_DDP_PROCESS_GROUP_TEST_WORKER";

// One rank of CollectivesAgreeAcrossTwoProcesses, in a child process: checks what every
// collective returned and exits non-zero (with the reason on stderr) on any mismatch.
int RunWorker() {
  try {
    std::optional<RendezvousOptions> options = RendezvousOptionsFromEnvironment();
    TORCH_CHECK(options.has_value(), "worker started without RANK/WORLD_SIZE");
    options->timeout = std::chrono::seconds(20);
    ProcessGroupHandle pg = InitProcessGroup(*options);
    const int rank = pg.rank;
    TORCH_CHECK(pg.world_size == 2 && pg.backend == "gloo" && pg.comm.size() == 2 &&
                    pg.comm.rank() == rank && pg.comm.device() == c10::Device(c10::kCPU),
                "unexpected handle: rank ", pg.rank, " world ", pg.world_size);

    const std::string from_root0 =
        pg.comm.BroadcastString(rank == 0 ? "hello from rank 0" : "ignored on rank 1");
    TORCH_CHECK(from_root0 == "hello from rank 0", "rank ", rank, " got \"", from_root0, "\"");
    // A payload with every byte value, larger than one Gloo chunk, from root 1.
    std::string binary;
    for (int i = 0; i < 300000; ++i) binary.push_back(static_cast<char>(i * 7 % 256));
    const std::string from_root1 = pg.comm.BroadcastString(rank == 1 ? binary : "", 1);
    TORCH_CHECK(from_root1 == binary, "rank ", rank, " got a different ", from_root1.size(),
                "-byte payload from root 1");
    const std::string empty = pg.comm.BroadcastString("", 0);
    TORCH_CHECK(empty.empty(), "rank ", rank, " got \"", empty, "\" for an empty broadcast");

    const double mean = pg.comm.AllReduceMean(rank == 0 ? 1.25 : 4.0);
    TORCH_CHECK(mean == 2.625, "rank ", rank, " got mean ", mean, ", expected 2.625");
    // float64 end to end: 1 + 2^-40 would round away in float32.
    const double tiny =
        pg.comm.AllReduceMean(1.0 + (rank == 0 ? 0.0 : 2.0 * 9.094947017729282e-13));
    TORCH_CHECK(tiny == 1.0 + 9.094947017729282e-13, "rank ", rank,
                " lost float64 precision: ", tiny);
    pg.comm.Barrier();
    std::cerr << "rank " << rank << ": collectives OK\n";
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "worker failed: " << e.what() << "\n";
    return 1;
  }
}

TEST(ProcessGroupTest, CollectivesAgreeAcrossTwoProcesses) {
  const int port = PickFreeLoopbackPort();
  const std::vector<int> exits =
      RunLocalRanks({}, 2, port, {{kWorkerVariable, "1"}}, std::chrono::seconds(60));
  EXPECT_THAT(exits, ElementsAre(0, 0)) << "see the workers' stderr above";
}

TEST(ProcessGroupTest, SingleRankWorksOnAnOsChosenPort) {
  RendezvousOptions options;
  options.master_port = 0;
  ProcessGroupHandle pg = InitProcessGroup(options);
  EXPECT_EQ(pg.world_size, 1);
  EXPECT_EQ(pg.comm.BroadcastString("alone"), "alone");
  EXPECT_EQ(pg.comm.AllReduceMean(3.5), 3.5);
  pg.comm.Barrier();
}

std::string ErrorOf(const RendezvousOptions& options) {
  return ::ckpt::testing::TorchErrorOf([&] { InitProcessGroup(options); });
}

TEST(ProcessGroupTest, NcclInABuildWithoutNcclIsAClearError) {
  RendezvousOptions options;
  options.master_port = 0;
  options.backend = "nccl";
  options.device_type = c10::DeviceType::CUDA;
  EXPECT_THAT(ErrorOf(options), HasSubstr("this build has no NCCL; rebuild with --config=cuda"));
}

TEST(ProcessGroupTest, NcclNeedsTheCudaDevice) {
  RendezvousOptions options;
  options.master_port = 0;
  options.backend = "nccl";
  EXPECT_THAT(ErrorOf(options), HasSubstr("backend \"nccl\" moves only CUDA tensors"));
}

TEST(ProcessGroupTest, CudaDeviceWithoutCudaIsAClearErrorBeforeTheRendezvous) {
  RendezvousOptions options;
  options.master_port = PickFreeLoopbackPort();  // nobody listens: a rendezvous would time out
  options.rank = 1;
  options.world_size = 2;
  options.device_type = c10::DeviceType::CUDA;
  options.timeout = std::chrono::seconds(30);
  const auto start = std::chrono::steady_clock::now();
  EXPECT_THAT(ErrorOf(options), HasSubstr("device cuda requested, but this LibTorch has no CUDA"));
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
}

TEST(ProcessGroupTest, RankDeviceIsCudaLocalRank) {
  RendezvousOptions options;
  options.rank = 5;
  options.world_size = 8;
  EXPECT_EQ(RankDevice(options), c10::Device(c10::kCPU));
  options.device_type = c10::DeviceType::CUDA;
  EXPECT_EQ(RankDevice(options), c10::Device(c10::kCUDA, 5));  // no LOCAL_RANK: the rank
  options.local_rank = 1;
  EXPECT_EQ(RankDevice(options), c10::Device(c10::kCUDA, 1));
}

TEST(ProcessGroupTest, UnreachableMasterFailsWithinTheTimeout) {
  RendezvousOptions options;
  options.master_port = PickFreeLoopbackPort();  // nobody listens there
  options.rank = 1;
  options.world_size = 2;
  options.timeout = std::chrono::milliseconds(1500);
  const auto start = std::chrono::steady_clock::now();
  const std::string error = ErrorOf(options);
  const auto elapsed = std::chrono::steady_clock::now() - start;
  EXPECT_THAT(error, HasSubstr("rendezvous failed for rank 1 of 2 with master 127.0.0.1:" +
                               std::to_string(options.master_port)));
  EXPECT_LT(elapsed, std::chrono::seconds(30));
}

TEST(ProcessGroupTest, RejectsInvalidOptions) {
  RendezvousOptions options;
  options.world_size = 2;
  options.master_port = 0;
  EXPECT_THAT(ErrorOf(options), HasSubstr("master_port 0 (pick a free port) works only for "
                                          "world_size 1"));
  options = RendezvousOptions();
  options.rank = 3;
  options.world_size = 2;
  EXPECT_THAT(ErrorOf(options), HasSubstr("rank must be in [0, 2), got 3"));
  options = RendezvousOptions();
  options.backend = "mpi";
  EXPECT_THAT(ErrorOf(options), HasSubstr("unknown process group backend \"mpi\""));
}

class EnvironmentTest : public ::testing::Test {
 protected:
  void SetUp() override { Clear(); }
  void TearDown() override { Clear(); }
  static void Clear() {
    for (const char* name : {"RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"}) {
      ::unsetenv(name);
    }
  }
  static std::string ErrorOfEnvironment() {
    try {
      RendezvousOptionsFromEnvironment();
    } catch (const c10::Error& e) {
      return e.what_without_backtrace();
    }
    return "(no error)";
  }
};

TEST_F(EnvironmentTest, ReadsTheTorchrunVariables) {
  ::setenv("RANK", "3", 1);
  ::setenv("WORLD_SIZE", "8", 1);
  ::setenv("LOCAL_RANK", "1", 1);
  ::setenv("MASTER_ADDR", "10.1.2.3", 1);
  ::setenv("MASTER_PORT", "23456", 1);
  const std::optional<RendezvousOptions> options = RendezvousOptionsFromEnvironment();
  ASSERT_TRUE(options.has_value());
  EXPECT_EQ(options->rank, 3);
  EXPECT_EQ(options->world_size, 8);
  EXPECT_EQ(options->master_addr, "10.1.2.3");
  EXPECT_EQ(options->master_port, 23456);
  EXPECT_EQ(options->backend, "gloo");
  EXPECT_EQ(options->local_rank, 1);
}

TEST_F(EnvironmentTest, DefaultsMasterAndLocalRank) {
  ::setenv("RANK", "1", 1);
  ::setenv("WORLD_SIZE", "2", 1);
  const std::optional<RendezvousOptions> options = RendezvousOptionsFromEnvironment();
  ASSERT_TRUE(options.has_value());
  EXPECT_EQ(options->master_addr, "127.0.0.1");
  EXPECT_EQ(options->master_port, 29500);
  EXPECT_EQ(options->local_rank, 1);
}

TEST_F(EnvironmentTest, IsNulloptWithoutRankOrWorldSize) {
  EXPECT_FALSE(RendezvousOptionsFromEnvironment().has_value());
  ::setenv("RANK", "0", 1);
  EXPECT_FALSE(RendezvousOptionsFromEnvironment().has_value());
  ::unsetenv("RANK");
  ::setenv("WORLD_SIZE", "2", 1);
  EXPECT_FALSE(RendezvousOptionsFromEnvironment().has_value());
}

TEST_F(EnvironmentTest, RejectsMalformedValues) {
  ::setenv("RANK", "one", 1);
  ::setenv("WORLD_SIZE", "2", 1);
  EXPECT_THAT(ErrorOfEnvironment(), HasSubstr("RANK=\"one\" is not an integer"));
  ::setenv("RANK", "2", 1);
  EXPECT_THAT(ErrorOfEnvironment(), HasSubstr("RANK=2 must be less than WORLD_SIZE=2"));
  ::setenv("RANK", "0", 1);
  ::setenv("WORLD_SIZE", "0", 1);
  EXPECT_THAT(ErrorOfEnvironment(), HasSubstr("WORLD_SIZE=0 is out of range"));
  ::setenv("WORLD_SIZE", "2", 1);
  ::setenv("MASTER_PORT", "70000", 1);
  EXPECT_THAT(ErrorOfEnvironment(), HasSubstr("MASTER_PORT=70000 is out of range"));
  ::setenv("MASTER_PORT", "12x", 1);
  EXPECT_THAT(ErrorOfEnvironment(), HasSubstr("MASTER_PORT=\"12x\" is not an integer"));
}

}  // namespace
}  // namespace ckpt::ddp

// The test binary doubles as the worker: RunLocalRanks starts /proc/self/exe with
// kWorkerVariable set, and those copies run one rank instead of the tests.
int main(int argc, char** argv) {
  if (std::getenv(ckpt::ddp::kWorkerVariable) != nullptr) return ckpt::ddp::RunWorker();
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}

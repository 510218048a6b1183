#include "libs/ddp/communicator.h"

#include <chrono>
#include <cstdlib>
#include <iostream>
#include <string>
#include <vector>

#include "ATen/core/Tensor.h"
#include "ATen/ops/arange.h"
#include "ATen/ops/empty.h"
#include "ATen/ops/full.h"
#include "ATen/ops/ones.h"
#include "ATen/ops/tensor.h"
#include "ATen/ops/zeros.h"
#include "c10/util/Exception.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "libs/ddp/local_launcher.h"
#include "libs/ddp/process_group.h"
#include "libs/ddp/testing/device_checking_process_group.h"
#include "libs/testing/torch_error.h"

namespace ckpt::ddp {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

constexpr char kWorkerVariable[] = "CKPT_DDP_COMMUNICATOR_TEST_WORKER";

using ::ckpt::testing::TorchErrorOf;

ProcessGroupHandle SingleRank() {
  RendezvousOptions options;
  options.master_port = 0;
  return InitProcessGroup(options);
}

// What every rank checks, under a group that declares cuda:<rank> (1 or 2 ranks): the helpers
// work, and a tensor that bypassed Place is refused as NCCL would refuse it.
void CheckCollectivesUnderDeclaredDevice(const ProcessGroupHandle& real) {
  const ProcessGroupHandle pg =
      testing::WithDeclaredDevice(real, c10::Device(c10::kCUDA, real.rank));
  const Communicator& comm = pg.comm;
  const int rank = comm.rank();
  const int world = comm.size();
  TORCH_CHECK(comm.device() == c10::Device(c10::kCUDA, rank), "declared device ", comm.device());

  TORCH_CHECK(comm.BroadcastString(rank == 0 ? "from root" : "") == "from root", "broadcast");
  const std::vector<double> sums = comm.AllReduceSum({1.0, rank * 2.0, 0.5});
  TORCH_CHECK(sums == std::vector<double>({1.0 * world, world * (world - 1.0), 0.5 * world}),
              "sums ", sums[0], " ", sums[1], " ", sums[2]);
  TORCH_CHECK(comm.AllReduceMean(rank == 0 ? 3.0 : 5.0) == (world == 1 ? 3.0 : 4.0), "mean");
  at::Tensor placed = comm.Place(at::full({3}, static_cast<double>(rank + 1), at::kDouble));
  comm.Broadcast(placed, /*root=*/world - 1);
  TORCH_CHECK(placed.equal(at::full({3}, static_cast<double>(world), at::kDouble)), "broadcast");
  // A view of a placed tensor shares its memory, as a view of a CUDA tensor stays on the GPU.
  at::Tensor view = placed.narrow(0, 1, 2);
  comm.AllReduceSumAsync(view)->wait();

  // Today's AgreeOnStep: a tensor made on the CPU and handed to the group directly.
  std::vector<at::Tensor> raw = {at::tensor({1.0, 0.0}, at::kDouble)};
  const std::string direct = TorchErrorOf([&] { comm.group().allreduce(raw)->wait(); });
  TORCH_CHECK(direct.find("was not placed on the group's device cuda:" + std::to_string(rank)) !=
                  std::string::npos,
              "a raw allreduce was not refused: ", direct);
  std::vector<at::Tensor> raw_broadcast = {at::zeros({4}, at::kLong)};
  TORCH_CHECK(TorchErrorOf([&] { comm.group().broadcast(raw_broadcast)->wait(); }) != "(no error)",
              "a raw broadcast was not refused");
  // Through the communicator, an unplaced tensor is refused before it reaches the group.
  at::Tensor unplaced = at::ones({2});
  const std::string through = TorchErrorOf([&] { comm.AllReduceSumAsync(unplaced); });
  TORCH_CHECK(through.find("is not on the collective device cuda:" + std::to_string(rank)) !=
                  std::string::npos,
              "an unplaced all-reduce was not refused: ", through);
  // The refusals happened before anything was sent, so the ranks are still in step.
  comm.Barrier();
}

int RunWorker() {
  try {
    std::optional<RendezvousOptions> options = RendezvousOptionsFromEnvironment();
    TORCH_CHECK(options.has_value(), "worker started without RANK/WORLD_SIZE");
    options->timeout = std::chrono::seconds(20);
    CheckCollectivesUnderDeclaredDevice(InitProcessGroup(*options));
    std::cerr << "rank " << options->rank << ": declared-device collectives OK\n";
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "worker failed: " << e.what() << "\n";
    return 1;
  }
}

TEST(CommunicatorTest, DeclaredDeviceCollectivesOnOneRank) {
  EXPECT_EQ(TorchErrorOf([] { CheckCollectivesUnderDeclaredDevice(SingleRank()); }), "(no error)");
}

TEST(CommunicatorTest, DeclaredDeviceCollectivesOnTwoRanks) {
  const std::vector<int> exits = RunLocalRanks({}, 2, PickFreeLoopbackPort(),
                                               {{kWorkerVariable, "1"}}, std::chrono::seconds(60));
  EXPECT_THAT(exits, ElementsAre(0, 0)) << "see the workers' stderr above";
}

TEST(CommunicatorTest, PlaceCopiesOnlyWhatIsNotPlacedYet) {
  const ProcessGroupHandle pg = testing::WithDeclaredDevice(SingleRank(), c10::Device("cuda:0"));
  const at::Tensor host = at::arange(4, at::kFloat);
  at::Tensor placed = pg.comm.Place(host);
  EXPECT_FALSE(pg.comm.IsPlaced(host));
  EXPECT_TRUE(pg.comm.IsPlaced(placed));
  // A move to another device copies: writing into the result leaves the source alone.
  placed.fill_(7);
  EXPECT_TRUE(host.equal(at::arange(4, at::kFloat)));
  // A tensor already on the device is returned as it is (Tensor::to does the same).
  EXPECT_TRUE(pg.comm.Place(placed).is_same(placed));
  // Memory freed and reused is not placed any more.
  const void* address = placed.data_ptr();
  placed = at::Tensor();
  const at::Tensor fresh = at::empty({4}, at::kFloat);
  EXPECT_FALSE(pg.comm.IsPlaced(fresh))
      << "fresh storage at " << fresh.data_ptr() << ", freed " << address;
}

TEST(CommunicatorTest, RealPlacementComparesDevices) {
  const ProcessGroupHandle pg = SingleRank();
  EXPECT_EQ(pg.comm.device(), c10::Device(c10::kCPU));
  const at::Tensor host = at::ones({2});
  EXPECT_TRUE(pg.comm.IsPlaced(host));
  EXPECT_TRUE(pg.comm.Place(host).is_same(host));

  // A group whose collectives run on cuda:1 refuses a CPU tensor before calling the backend, so
  // the check holds in a CPU build too (no CUDA memory is touched).
  const Communicator on_gpu(pg.comm.group_ptr(), c10::Device(c10::kCUDA, 1));
  at::Tensor cpu = at::ones({2});
  EXPECT_FALSE(on_gpu.IsPlaced(cpu));
  EXPECT_THAT(TorchErrorOf([&] { on_gpu.AllReduceSumAsync(cpu); }),
              HasSubstr("a Float tensor of shape [2] on cpu is not on the collective device "
                        "cuda:1"));
  EXPECT_THAT(TorchErrorOf([&] { on_gpu.Broadcast(cpu, 0); }),
              HasSubstr("is not on the collective device cuda:1"));
}

TEST(CommunicatorTest, RejectsBadArguments) {
  const ProcessGroupHandle pg = SingleRank();
  at::Tensor tensor = at::ones({1});
  EXPECT_THAT(TorchErrorOf([&] { pg.comm.Broadcast(tensor, 1); }),
              HasSubstr("broadcast root must be in [0, 1), got 1"));
  EXPECT_THAT(TorchErrorOf([&] { pg.comm.BroadcastString("x", -1); }),
              HasSubstr("BroadcastString root must be in [0, 1), got -1"));
  EXPECT_TRUE(pg.comm.AllReduceSum({}).empty());
  EXPECT_FALSE(Communicator().valid());
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

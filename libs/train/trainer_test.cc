// RunTrainingRank as a library: one Gloo rank trains against a store it is given (a real RocksDB
// store in TEST_TMPDIR), checkpoints, and a second call resumes from what the first wrote. No
// gRPC, no launcher: where the store runs is the binary's business (services/trainer).
//
// Every run here is on a process group that declares rank r's collectives to be on cuda:r while
// the model stays on the CPU (libs/ddp/testing/device_checking_process_group.h): a collective
// handed a tensor that did not go through the Communicator fails as it would under NCCL. One
// rank in-process; two ranks as two processes (this binary) over Gloo.

#include "libs/train/trainer.h"

#include <chrono>
#include <cstdlib>
#include <functional>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "libs/ddp/local_launcher.h"
#include "libs/ddp/process_group.h"
#include "libs/ddp/testing/device_checking_process_group.h"
#include "libs/status/status_matchers.h"
#include "libs/store/checkpoint_contents.h"
#include "libs/store/rocksdb_checkpoint_store.h"
#include "libs/store/testing/instrumented_store.h"
#include "libs/store/version_ref.h"
#include "libs/train/trainer_state.h"

namespace ckpt::train {
namespace {

using ::ckpt::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

constexpr char kWorkerVariable[] = "CKPT_TRAINER_TEST_WORKER";

ddp::ProcessGroupHandle OnDeclaredDevice(ddp::ProcessGroupHandle group) {
  const c10::Device device(c10::kCUDA, static_cast<c10::DeviceIndex>(group.rank));
  return ddp::testing::WithDeclaredDevice(std::move(group), device);
}

std::string StorePath(const std::string& name) {
  return std::string(std::getenv("TEST_TMPDIR")) + "/" + name;
}

class TrainerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    StoreOptions options;
    options.db_path = StorePath(::testing::UnitTest::GetInstance()->current_test_info()->name());
    ASSERT_OK_AND_ASSIGN(store_, RocksDbCheckpointStore::Open(options));
    ddp::RendezvousOptions rendezvous;
    rendezvous.master_port = 0;  // one rank: the OS picks the TCPStore's port.
    group_ = OnDeclaredDevice(ddp::InitProcessGroup(rendezvous));
  }

  static TrainerConfig SmallRun(int64_t steps) { return SmallTrainerRun(steps); }

 public:
  static TrainerConfig SmallTrainerRun(int64_t steps) {
    TrainerConfig config;
    config.data.synthetic_examples = 64;
    config.batch_size = 16;
    config.steps = steps;
    config.checkpoint_every = 3;
    config.log_every = 1000;
    config.optimizer.kind = "sgd";
    config.scheduler.kind = "step";
    config.scheduler.step_size = 2;
    config.store_location = "in-process";
    config.eval_fraction = 0.25;  // so the evaluation's collective runs too
    return config;
  }

  std::unique_ptr<RocksDbCheckpointStore> store_;
  ddp::ProcessGroupHandle group_;
};

// One rank of TwoRanksTrainEvaluateAndCheckpoint: each rank has a store of its own (only rank 0
// commits: parallel checkpoints off; a fresh run reads nothing), held-out evaluation on, so every
// collective the trainer issues runs: the resume and run-id broadcasts, DDP's parameter broadcast
// and buckets, the per-step agreement, the evaluation sums and the final barrier.
int RunWorker() {
  try {
    std::optional<ddp::RendezvousOptions> rendezvous = ddp::RendezvousOptionsFromEnvironment();
    if (!rendezvous) throw std::runtime_error("worker started without RANK/WORLD_SIZE");
    rendezvous->timeout = std::chrono::seconds(30);
    const ddp::ProcessGroupHandle group = OnDeclaredDevice(ddp::InitProcessGroup(*rendezvous));
    StoreOptions options;
    options.db_path = StorePath("two_ranks_store" + std::to_string(group.rank));
    absl::StatusOr<std::unique_ptr<RocksDbCheckpointStore>> store =
        RocksDbCheckpointStore::Open(options);
    if (!store.ok()) throw std::runtime_error(store.status().ToString());
    TrainerConfig config = TrainerTest::SmallTrainerRun(6);
    // Each rank has a store of its own here, so rank 0 writes every checkpoint (parallel ones
    // need one store: tests/trainer_test.cc runs them through the binary, which lends it).
    config.parallel_checkpoints = false;
    absl::StatusOr<TrainingSummary> summary = RunTrainingRank(config, group, **store, nullptr);
    if (!summary.ok()) throw std::runtime_error(summary.status().ToString());
    if (summary->final_step != 6 || !summary->last_eval) {
      throw std::runtime_error("rank " + std::to_string(group.rank) + " ended at step " +
                               std::to_string(summary->final_step));
    }
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "trainer worker failed: " << e.what() << "\n";
    return 1;
  }
}

TEST(TrainerTwoRankTest, TwoRanksTrainEvaluateAndCheckpoint) {
  const std::vector<int> exits = ddp::RunLocalRanks(
      {}, 2, ddp::PickFreeLoopbackPort(), {{kWorkerVariable, "1"}}, std::chrono::seconds(120));
  ASSERT_THAT(exits, ElementsAre(0, 0)) << "see the workers' stderr above";
  StoreOptions options;
  options.db_path = StorePath("two_ranks_store0");
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<RocksDbCheckpointStore> store,
                       RocksDbCheckpointStore::Open(options));
  ASSERT_OK_AND_ASSIGN(v1::Manifest latest, store->GetManifest(*ParseVersionRef("mlp-synthetic")));
  EXPECT_EQ(latest.metadata().world_size(), 2);
  EXPECT_EQ(latest.metadata().global_step(), 6);
  EXPECT_TRUE(latest.metadata().metrics().contains("val_acc"));
}

TEST_F(TrainerTest, TrainsCheckpointsAndResumesFromTheStoreItIsGiven) {
  ASSERT_OK_AND_ASSIGN(TrainingSummary first,
                       RunTrainingRank(SmallRun(6), group_, *store_, nullptr));
  EXPECT_EQ(first.final_step, 6);
  EXPECT_FALSE(first.resumed_from.has_value());
  EXPECT_EQ(first.store_location, "in-process");
  ASSERT_FALSE(first.versions_written.empty());
  ASSERT_OK_AND_ASSIGN(LoadedCheckpoint latest,
                       LoadCheckpoint(*store_, *ParseVersionRef("mlp-synthetic")));
  ASSERT_OK_AND_ASSIGN(TrainerState state, DecodeTrainerState(latest.contents.extra, "latest"));
  EXPECT_EQ(state.global_step, 6);
  EXPECT_EQ(state.target_step, 6);
  EXPECT_EQ(state.world_size, 1);
  EXPECT_EQ(state.backend, "gloo");
  EXPECT_TRUE(latest.contents.optimizer.has_value());
  EXPECT_EQ(latest.manifest.metadata().source_format(), "trainer");

  // The goal was reached, so the next leg trains `steps` more from the latest version.
  ASSERT_OK_AND_ASSIGN(TrainingSummary second,
                       RunTrainingRank(SmallRun(4), group_, *store_, nullptr));
  ASSERT_TRUE(second.resumed_from.has_value());
  EXPECT_EQ(second.resumed_from->version(), latest.manifest.version());
  EXPECT_EQ(second.start_step, 6);
  EXPECT_EQ(second.final_step, 10);
}

// Makes `store` refuse the commits `failing` names (1 = the run's first), as a full disk would.
void FailCommits(InstrumentedStore& store, std::function<bool(int)> failing) {
  store.set_commit_fault([commits = 0, failing](absl::string_view) mutable {
    return failing(++commits) ? absl::ResourceExhaustedError("no space left on device (test)")
                              : absl::OkStatus();
  });
}

TEST_F(TrainerTest, AFailedCheckpointIsReportedAndTrainingGoesOn) {
  // Checkpoints at steps 3, 6 and 9 (the final one); the one at step 6 hits a full disk.
  InstrumentedStore store(store_.get());
  FailCommits(store, [](int commit) { return commit == 2; });
  TrainerConfig config = SmallRun(9);
  config.synchronous_checkpoints = true;  // so the failure is seen at its own step.
  ASSERT_OK_AND_ASSIGN(TrainingSummary summary, RunTrainingRank(config, group_, store, nullptr));
  EXPECT_EQ(summary.final_step, 9);
  EXPECT_EQ(summary.failed_checkpoints, 1);
  EXPECT_THAT(summary.last_checkpoint_error, HasSubstr("no space left on device"));
  ASSERT_EQ(summary.versions_written.size(), 2u);
  ASSERT_OK_AND_ASSIGN(LoadedCheckpoint latest,
                       LoadCheckpoint(*store_, *ParseVersionRef("mlp-synthetic")));
  ASSERT_OK_AND_ASSIGN(TrainerState state, DecodeTrainerState(latest.contents.extra, "latest"));
  EXPECT_EQ(state.global_step, 9);
  EXPECT_THAT(FormatSummary(summary), HasSubstr("failed checkpoints (trained past): 1"));
}

TEST_F(TrainerTest, AFailedBackgroundUploadIsReportedAtTheNextCheckpoint) {
  InstrumentedStore store(store_.get());
  FailCommits(store, [](int commit) { return commit == 1; });
  ASSERT_OK_AND_ASSIGN(TrainingSummary summary,
                       RunTrainingRank(SmallRun(9), group_, store, nullptr));
  EXPECT_EQ(summary.final_step, 9);
  EXPECT_EQ(summary.failed_checkpoints, 1);
  EXPECT_EQ(summary.versions_written.size(), 2u);
}

TEST_F(TrainerTest, TooManyFailedCheckpointsInARowStopTheRun) {
  InstrumentedStore store(store_.get());
  FailCommits(store, [](int) { return true; });
  TrainerConfig config = SmallRun(30);
  config.checkpoint_every = 1;
  config.synchronous_checkpoints = true;
  config.max_consecutive_failed_checkpoints = 2;
  EXPECT_THAT(RunTrainingRank(config, group_, store, nullptr).status(),
              StatusIs(absl::StatusCode::kResourceExhausted,
                       HasSubstr("2 checkpoints in a row failed, the last: no space left")));
}

TEST_F(TrainerTest, AFailedFinalCheckpointFailsTheRun) {
  // Steps 3 and 6 commit; the final one at step 7 does not: the run's result would be lost.
  InstrumentedStore store(store_.get());
  FailCommits(store, [](int commit) { return commit == 3; });
  EXPECT_THAT(RunTrainingRank(SmallRun(7), group_, store, nullptr).status(),
              StatusIs(absl::StatusCode::kResourceExhausted,
                       HasSubstr("checkpoint at step 7 failed: no space left on device")));
}

TEST_F(TrainerTest, BadSettingsAreNamedBeforeAnythingRuns) {
  TrainerConfig config = SmallRun(1);
  config.batch_size = 0;
  EXPECT_THAT(RunTrainingRank(config, group_, *store_, nullptr).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, "batch_size must be positive"));
  config = SmallRun(1);
  config.eval_fraction = 1;
  EXPECT_THAT(RunTrainingRank(config, group_, *store_, nullptr).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, "eval_fraction must be in [0, 1)"));
  config = SmallRun(1);
  config.device = "tpu";
  EXPECT_THAT(RunTrainingRank(config, group_, *store_, nullptr).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, "device must be cpu or cuda"));
  ASSERT_OK_AND_ASSIGN(std::vector<v1::ModelInfo> models, store_->ListModels());
  EXPECT_TRUE(models.empty());
}

TEST_F(TrainerTest, AVersionOfAnotherModelShapeIsRefusedWithTheWayOut) {
  ASSERT_OK(RunTrainingRank(SmallRun(3), group_, *store_, nullptr).status());
  TrainerConfig wider = SmallRun(3);
  wider.model.hidden = 32;
  EXPECT_THAT(RunTrainingRank(wider, group_, *store_, nullptr).status(),
              StatusIs(absl::StatusCode::kFailedPrecondition, "set resume to false to start over"));
  wider.resume = false;
  EXPECT_OK(RunTrainingRank(wider, group_, *store_, nullptr).status());
}

}  // namespace
}  // namespace ckpt::train

// The test binary doubles as the worker: RunLocalRanks starts /proc/self/exe with
// kWorkerVariable set, and those copies run one rank instead of the tests.
int main(int argc, char** argv) {
  if (std::getenv(ckpt::train::kWorkerVariable) != nullptr) return ckpt::train::RunWorker();
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}

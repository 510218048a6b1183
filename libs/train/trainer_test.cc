// RunTrainingRank as a library: one Gloo rank trains against a store it is given (a real RocksDB
// store in TEST_TMPDIR), checkpoints, and a second call resumes from what the first wrote. No
// gRPC, no launcher: where the store runs is the binary's business (services/trainer).

#include "libs/train/trainer.h"

#include <cstdlib>
#include <memory>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "libs/ddp/process_group.h"
#include "libs/status/status_matchers.h"
#include "libs/store/rocksdb_checkpoint_store.h"
#include "libs/store/version_ref.h"
#include "libs/train/trainer_state.h"

namespace ckpt::train {
namespace {

using ::ckpt::testing::StatusIs;

class TrainerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    StoreOptions options;
    options.db_path = std::string(std::getenv("TEST_TMPDIR")) + "/" +
                      ::testing::UnitTest::GetInstance()->current_test_info()->name();
    ASSERT_OK_AND_ASSIGN(store_, RocksDbCheckpointStore::Open(options));
    ddp::RendezvousOptions rendezvous;
    rendezvous.master_port = 0;  // one rank: the OS picks the TCPStore's port.
    group_ = ddp::InitProcessGroup(rendezvous);
  }

  static TrainerConfig SmallRun(int64_t steps) {
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
    return config;
  }

  std::unique_ptr<RocksDbCheckpointStore> store_;
  ddp::ProcessGroupHandle group_;
};

TEST_F(TrainerTest, TrainsCheckpointsAndResumesFromTheStoreItIsGiven) {
  ASSERT_OK_AND_ASSIGN(TrainingSummary first,
                       RunTrainingRank(SmallRun(6), group_, *store_, nullptr));
  EXPECT_EQ(first.final_step, 6);
  EXPECT_FALSE(first.resumed_from.has_value());
  EXPECT_EQ(first.store_location, "in-process");
  ASSERT_FALSE(first.versions_written.empty());
  ASSERT_OK_AND_ASSIGN(LoadedCheckpoint latest,
                       store_->LoadCheckpoint(*ParseVersionRef("mlp-synthetic")));
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

#include "libs/train/trainer_control.h"

#include <thread>

#include "gtest/gtest.h"
#include "libs/status/status_matchers.h"
#include "libs/store/version_ref.h"

namespace ckpt::train {
namespace {

using ::ckpt::testing::IsOk;
using ::ckpt::testing::StatusIs;

// Plays the training loop: acts on requests at "step boundaries" until told to stop.
void RunLoop(TrainerControl& control, int* checkpoints_taken) {
  for (int step = 1;; ++step) {
    TrainerControl::Requests requests = control.pending();
    if (requests.checkpoint || (requests.stop && !requests.skip_checkpoint)) {
      ++*checkpoints_taken;
      control.CheckpointFinished(MakeVersionRef("net", *checkpoints_taken));
    }
    if (requests.stop) {
      control.Finished(requests.skip_checkpoint ? std::nullopt
                                                : std::optional<v1::VersionRef>(
                                                      MakeVersionRef("net", *checkpoints_taken)));
      return;
    }
    absl::SleepFor(absl::Milliseconds(1));
  }
}

TEST(TrainerControlTest, CheckpointNowReturnsTheCommittedVersionThenStopReturnsTheFinalOne) {
  TrainerControl control;
  int checkpoints_taken = 0;
  std::thread loop([&] { RunLoop(control, &checkpoints_taken); });
  absl::StatusOr<v1::VersionRef> version = control.CheckpointNow(absl::Seconds(10));
  ASSERT_THAT(version.status(), IsOk());
  EXPECT_EQ(FormatVersionRef(*version), "net@1");
  EXPECT_EQ(FormatVersionRef(control.status().last_committed_version()), "net@1");

  absl::StatusOr<std::optional<v1::VersionRef>> final_version =
      control.Stop(/*skip_checkpoint=*/false, absl::Seconds(10));
  loop.join();
  ASSERT_THAT(final_version.status(), IsOk());
  ASSERT_TRUE(final_version->has_value());
  EXPECT_EQ(FormatVersionRef(**final_version), "net@2");
  // Training has ended: further requests fail at once instead of hanging.
  EXPECT_THAT(control.CheckpointNow(absl::Seconds(10)).status(),
              StatusIs(absl::StatusCode::kFailedPrecondition, "ended"));
}

TEST(TrainerControlTest, StopWithoutCheckpointReturnsNoVersion) {
  TrainerControl control;
  int checkpoints_taken = 0;
  std::thread loop([&] { RunLoop(control, &checkpoints_taken); });
  absl::StatusOr<std::optional<v1::VersionRef>> final_version =
      control.Stop(/*skip_checkpoint=*/true, absl::Seconds(10));
  loop.join();
  ASSERT_THAT(final_version.status(), IsOk());
  EXPECT_FALSE(final_version->has_value());
  EXPECT_EQ(checkpoints_taken, 0);
}

TEST(TrainerControlTest, RequestsTimeOutWhenTheLoopDoesNotAnswer) {
  TrainerControl control;
  EXPECT_THAT(control.CheckpointNow(absl::Milliseconds(20)).status(),
              StatusIs(absl::StatusCode::kDeadlineExceeded));
  EXPECT_TRUE(control.pending().checkpoint);
  EXPECT_THAT(control.Stop(false, absl::Milliseconds(20)).status(),
              StatusIs(absl::StatusCode::kDeadlineExceeded));
  EXPECT_TRUE(control.pending().stop);
}

TEST(TrainerControlTest, SignalRequestsAGracefulStop) {
  TrainerControl control;
  EXPECT_FALSE(control.pending().stop);
  control.RequestStopFromSignal();
  EXPECT_TRUE(control.pending().stop);
  EXPECT_FALSE(control.pending().skip_checkpoint);
}

}  // namespace
}  // namespace ckpt::train

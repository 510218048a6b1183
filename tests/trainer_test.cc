// End-to-end tests of `//services/trainer`: the real launcher starting real ranks (separate
// processes, Gloo over loopback), the embedded RocksDB store, SIGKILLed ranks, the control API,
// and the final checkpoint read by real PyTorch into the model's Python twin.

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "ATen/core/Tensor.h"
#include "ATen/ops/allclose.h"
#include "ATen/ops/equal.h"
#include "ATen/ops/log_softmax.h"
#include "ATen/ops/nll_loss.h"
#include "ATen/ops/scalar_tensor.h"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "libs/format/torch_writer.h"
#include "libs/loader/export.h"
#include "libs/loader/loader.h"
#include "libs/status/status_matchers.h"
#include "libs/store/checkpoint_contents.h"
#include "libs/store/rocksdb_checkpoint_store.h"
#include "libs/store/version_ref.h"
#include "libs/testing/python_runner.h"
#include "libs/train/dataset.h"
#include "libs/train/models.h"
#include "libs/train/optimizer.h"
#include "libs/train/testing/bundle_comparison.h"
#include "proto/ckpt/v1/trainer.grpc.pb.h"
#include "tests/testing/trainer_process.h"

namespace ckpt {
namespace {

using ::ckpt::testing::FindRank;
using ::ckpt::testing::IsOk;
using ::ckpt::testing::LoadLatest;
using ::ckpt::testing::LossLines;
using ::ckpt::testing::OpenStore;
using ::ckpt::testing::ReadFile;
using ::ckpt::testing::RunTrainer;
using ::ckpt::testing::StartTrainer;
using ::ckpt::testing::StatusIs;
using ::ckpt::testing::TempPath;
using ::ckpt::testing::TrainerProcess;
using ::ckpt::testing::WaitForExit;
using ::ckpt::testing::WaitForStep;

using ::testing::HasSubstr;

std::vector<std::string> SmallRun(const std::string& store_dir, int ranks, int64_t batch,
                                  int64_t steps) {
  return {"--store_dir=" + store_dir,
          absl::StrCat("--nproc_per_node=", ranks),
          absl::StrCat("--batch_size=", batch),
          absl::StrCat("--steps=", steps),
          "--log_every=1",
          "--checkpoint_every=0"};
}

TEST(TrainerTest, TwoRanksFollowOneRankOverTheSameGlobalBatches) {
  // DistributedSampler gives rank r the indices r, r+2, ... of the epoch's permutation, so two
  // ranks of 32 see exactly the 64 examples one rank of 64 sees: same mean loss, same gradient.
  const std::string two = TempPath("two_ranks"), one = TempPath("one_rank");
  ASSERT_EQ(RunTrainer(SmallRun(two, 2, 32, 30), two + ".log"), 0) << ReadFile(two + ".log");
  ASSERT_EQ(RunTrainer(SmallRun(one, 1, 64, 30), one + ".log"), 0) << ReadFile(one + ".log");
  std::vector<std::pair<int64_t, double>> two_losses = LossLines(ReadFile(two + ".log"));
  std::vector<std::pair<int64_t, double>> one_losses = LossLines(ReadFile(one + ".log"));
  ASSERT_EQ(two_losses.size(), 30u) << ReadFile(two + ".log");
  ASSERT_EQ(one_losses.size(), 30u);
  for (size_t i = 0; i < two_losses.size(); ++i) {
    EXPECT_EQ(two_losses[i].first, one_losses[i].first);
    EXPECT_NEAR(two_losses[i].second, one_losses[i].second, 2e-4) << "step " << i + 1;
  }
  // The loss falls: the default task is learnable.
  EXPECT_LT(two_losses.back().second, two_losses.front().second);
  // Rank 0 lent its embedded store to rank 1 on loopback only.
  EXPECT_THAT(ReadFile(two + ".log"),
              HasSubstr("lending the embedded store to the other ranks on 127.0.0.1:"));
  EXPECT_THAT(ReadFile(two + ".log"), HasSubstr("(loopback only)"));

  // Two micro-batches of 16 per rank, the first under NoSync, make the same steps again.
  const std::string accumulated = TempPath("accumulated");
  std::vector<std::string> flags = SmallRun(accumulated, 2, 16, 30);
  flags.push_back("--accumulation_steps=2");
  ASSERT_EQ(RunTrainer(flags, accumulated + ".log"), 0) << ReadFile(accumulated + ".log");
  std::vector<std::pair<int64_t, double>> accumulated_losses =
      LossLines(ReadFile(accumulated + ".log"));
  ASSERT_EQ(accumulated_losses.size(), 30u);
  for (size_t i = 0; i < accumulated_losses.size(); ++i) {
    EXPECT_NEAR(accumulated_losses[i].second, one_losses[i].second, 2e-4) << "step " << i + 1;
  }

  LoadedCheckpoint two_final = LoadLatest(two, "mlp-synthetic");
  LoadedCheckpoint one_final = LoadLatest(one, "mlp-synthetic");
  EXPECT_EQ(two_final.manifest.metadata().global_step(), 30);
  EXPECT_EQ(two_final.manifest.metadata().world_size(), 2);
  EXPECT_EQ(two_final.manifest.metadata().backend(), "gloo");
  for (const StateDict::Entry& entry : two_final.contents.model) {
    const at::Tensor* other = one_final.contents.model.Find(entry.key);
    ASSERT_NE(other, nullptr) << entry.key;
    EXPECT_TRUE(at::allclose(entry.tensor, *other, 1e-4, 1e-5)) << entry.key;
    EXPECT_EQ(entry.key.rfind("module.", 0), std::string::npos) << "saved wrapped: " << entry.key;
  }
}

// Every rank writes its part of each checkpoint (the default with several ranks), and the
// versions are the very ones rank 0 alone writes: every tensor's content hash matches, BatchNorm
// statistics (which differ between ranks after a forward pass) and RNG state included, which come
// from rank 0 only.
TEST(TrainerTest, ParallelCheckpointsStoreWhatRankZeroAloneWould) {
  const std::string parallel = TempPath("parallel"), alone = TempPath("rank_zero_alone");
  std::vector<std::string> flags = SmallRun(parallel, 2, 16, 6);
  // Plain SGD keeps no optimizer state, so the model's own tensors are what the ranks split:
  // bn2's statistics fall in rank 1's half, where only rank 0's copy may be stored.
  flags.insert(flags.end(),
               {"--model=cnn", "--checkpoint_every=3", "--optimizer=sgd", "--momentum=0"});
  ASSERT_EQ(RunTrainer(flags, parallel + ".log"), 0) << ReadFile(parallel + ".log");
  flags[0] = "--store_dir=" + alone;
  flags.push_back("--noparallel_checkpoints");
  ASSERT_EQ(RunTrainer(flags, alone + ".log"), 0) << ReadFile(alone + ".log");
  EXPECT_THAT(ReadFile(parallel + ".log"),
              ::testing::ContainsRegex("rank 1 wrote its part of 2 parallel checkpoint\\(s\\): "
                                       "[1-9][0-9]* bytes"));
  EXPECT_THAT(ReadFile(alone + ".log"), ::testing::Not(HasSubstr("parallel checkpoint")));

  std::unique_ptr<RocksDbCheckpointStore> parallel_store = OpenStore(parallel);
  std::unique_ptr<RocksDbCheckpointStore> alone_store = OpenStore(alone);
  for (const char* ref : {"cnn-synthetic@1", "cnn-synthetic@2"}) {
    absl::StatusOr<v1::Manifest> got = parallel_store->GetManifest(*ParseVersionRef(ref));
    absl::StatusOr<v1::Manifest> want = alone_store->GetManifest(*ParseVersionRef(ref));
    ASSERT_OK(got.status());
    ASSERT_OK(want.status());
    ASSERT_EQ(got->tensors_size(), want->tensors_size()) << ref;
    ASSERT_EQ(got->state_tensors_size(), want->state_tensors_size()) << ref;
    for (int i = 0; i < want->tensors_size(); ++i) {
      EXPECT_EQ(got->tensors(i).key(), want->tensors(i).key());
      EXPECT_EQ(got->tensors(i).content_hash(), want->tensors(i).content_hash())
          << ref << " " << want->tensors(i).key();
    }
    for (int i = 0; i < want->state_tensors_size(); ++i) {
      EXPECT_EQ(got->state_tensors(i).key(), want->state_tensors(i).key());
      EXPECT_EQ(got->state_tensors(i).content_hash(), want->state_tensors(i).content_hash())
          << ref << " " << want->state_tensors(i).key();
    }
  }
}

// The digest a log line gives for `what` ("rank 0 step 6", "rank 2 restored cnn-synthetic@2"),
// "" when there is none.
std::string LoggedStateDigest(const std::string& log, const std::string& what) {
  std::smatch match;
  const std::regex line("trainer: " + what + " state ([0-9a-f]{16})");
  return std::regex_search(log, match, line) ? match[1].str() : "";
}

// A version two ranks wrote in parallel resumes on three ranks and on one: every rank reads it
// from the store itself and holds exactly the saved state (parameters, rank 0's BatchNorm
// statistics, AdamW's moments: one digest over all of them), then trains on.
TEST(TrainerTest, AVersionTwoRanksWroteResumesOnThreeRanksAndOnOneWithTheSavedState) {
  const std::string three = TempPath("resharded_three"), one = TempPath("resharded_one");
  std::vector<std::string> flags = SmallRun(three, 2, 16, 6);
  flags.insert(flags.end(), {"--model=cnn", "--checkpoint_every=3", "--log_state_digests"});
  ASSERT_EQ(RunTrainer(flags, three + "_saved.log"), 0) << ReadFile(three + "_saved.log");
  const std::string saved = LoggedStateDigest(ReadFile(three + "_saved.log"), "rank 0 step 6");
  ASSERT_FALSE(saved.empty()) << ReadFile(three + "_saved.log");
  std::filesystem::copy(three, one, std::filesystem::copy_options::recursive);

  for (const auto& [dir, ranks] : {std::pair<std::string, int>{three, 3}, {one, 1}}) {
    std::vector<std::string> resumed = SmallRun(dir, ranks, 16, 2);
    resumed.insert(resumed.end(), {"--model=cnn", "--log_state_digests"});
    const std::string log = dir + "_resumed.log";
    ASSERT_EQ(RunTrainer(resumed, log), 0) << ReadFile(log);
    EXPECT_THAT(ReadFile(log),
                HasSubstr("was written by 2 ranks, this run has " + std::to_string(ranks)));
    for (int rank = 0; rank < ranks; ++rank) {
      EXPECT_EQ(LoggedStateDigest(ReadFile(log),
                                  absl::StrCat("rank ", rank, " restored cnn-synthetic@2")),
                saved)
          << "rank " << rank << " of " << ranks << ":\n"
          << ReadFile(log);
    }
    EXPECT_EQ(LoadLatest(dir, "cnn-synthetic").manifest.metadata().global_step(), 8);
  }
}

// ZeRO-1 against plain DDP, same seed, 50 steps: each rank steps only its slice of AdamW's state,
// yet every stored tensor (parameters, and the optimizer state gathered from both ranks) is the
// plain run's, chunk for chunk (AdamW is element-wise: no tolerance needed). The version then
// resumes on three ZeRO ranks, each holding exactly the saved state.
TEST(TrainerTest, ZeroOneStoresWhatPlainDdpStoresAndResumesOnThreeRanks) {
  const std::string plain = TempPath("plain_ddp"), zero = TempPath("zero_one");
  std::vector<std::string> flags = SmallRun(plain, 2, 16, 50);
  flags.insert(flags.end(), {"--checkpoint_every=25", "--log_state_digests"});
  ASSERT_EQ(RunTrainer(flags, plain + ".log"), 0) << ReadFile(plain + ".log");
  flags[0] = "--store_dir=" + zero;
  flags.push_back("--zero=1");
  ASSERT_EQ(RunTrainer(flags, zero + ".log"), 0) << ReadFile(zero + ".log");
  const std::string zero_log = ReadFile(zero + ".log");
  // Each rank held part of the optimizer state, not all of it.
  const std::regex held("held ([0-9]+) bytes of optimizer state");
  std::vector<int64_t> held_bytes;
  for (auto it = std::sregex_iterator(zero_log.begin(), zero_log.end(), held);
       it != std::sregex_iterator(); ++it) {
    held_bytes.push_back(std::stoll((*it)[1].str()));
  }
  ASSERT_EQ(held_bytes.size(), 2u) << zero_log;

  std::unique_ptr<RocksDbCheckpointStore> plain_store = OpenStore(plain);
  std::unique_ptr<RocksDbCheckpointStore> zero_store = OpenStore(zero);
  for (const char* ref : {"mlp-synthetic@1", "mlp-synthetic@2"}) {
    SCOPED_TRACE(ref);
    absl::StatusOr<v1::Manifest> got = zero_store->GetManifest(*ParseVersionRef(ref));
    absl::StatusOr<v1::Manifest> want = plain_store->GetManifest(*ParseVersionRef(ref));
    ASSERT_OK(got.status());
    ASSERT_OK(want.status());
    EXPECT_EQ(got->metadata().labels().at("zero_stage"), "1");
    ASSERT_EQ(got->tensors_size(), want->tensors_size()) << ref;
    for (int i = 0; i < want->tensors_size(); ++i) {
      EXPECT_EQ(got->tensors(i).content_hash(), want->tensors(i).content_hash())
          << ref << " " << want->tensors(i).key();
    }
    ASSERT_EQ(got->state_tensors_size(), want->state_tensors_size()) << ref;
    int64_t state_bytes = 0;
    for (int i = 0; i < want->state_tensors_size(); ++i) {
      EXPECT_EQ(got->state_tensors(i).key(), want->state_tensors(i).key());
      EXPECT_EQ(got->state_tensors(i).content_hash(), want->state_tensors(i).content_hash())
          << ref << " " << want->state_tensors(i).key();
      state_bytes += want->state_tensors(i).byte_length();
    }
    for (int64_t bytes : held_bytes) {
      EXPECT_GT(bytes, 0);
      EXPECT_LT(bytes, state_bytes) << "a rank held the whole optimizer state";
    }
  }

  zero_store.reset();  // the resumed run opens it.

  const std::string saved = LoggedStateDigest(zero_log, "rank 0 step 50");
  ASSERT_FALSE(saved.empty());
  EXPECT_EQ(LoggedStateDigest(ReadFile(plain + ".log"), "rank 0 step 50"), saved);
  std::vector<std::string> resumed = SmallRun(zero, 3, 16, 2);
  resumed.insert(resumed.end(), {"--zero=1", "--log_state_digests"});
  ASSERT_EQ(RunTrainer(resumed, zero + "_three.log"), 0) << ReadFile(zero + "_three.log");
  for (int rank = 0; rank < 3; ++rank) {
    EXPECT_EQ(LoggedStateDigest(ReadFile(zero + "_three.log"),
                                absl::StrCat("rank ", rank, " restored mlp-synthetic@2")),
              saved)
        << "rank " << rank;
  }
}

TEST(TrainerTest, RunningAgainResumesFromLatestAndTrainsFurther) {
  const std::string dir = TempPath("rerun");
  ASSERT_EQ(RunTrainer(SmallRun(dir, 2, 16, 12), dir + "_1.log"), 0) << ReadFile(dir + "_1.log");
  ASSERT_EQ(RunTrainer(SmallRun(dir, 2, 16, 12), dir + "_2.log"), 0) << ReadFile(dir + "_2.log");
  const std::string second = ReadFile(dir + "_2.log");
  EXPECT_THAT(second, HasSubstr("resuming mlp-synthetic@1"));
  EXPECT_THAT(second, HasSubstr("from step 12 to 24"));
  EXPECT_THAT(second, HasSubstr("versions written: @2"));
  EXPECT_THAT(second, HasSubstr("bazel run //tools/ckpt --"));
  EXPECT_THAT(second, HasSubstr("fresh learning-rate schedule"));
  LoadedCheckpoint latest = LoadLatest(dir, "mlp-synthetic");
  EXPECT_EQ(latest.manifest.version(), 2);
  EXPECT_EQ(latest.manifest.metadata().global_step(), 24);
  // The second leg learned: its schedule did not stay at the first leg's final rate (0).
  LoadedCheckpoint first = LoadLatest(dir, "mlp-synthetic@1");
  EXPECT_FALSE(at::equal(*first.contents.model.Find("head.weight"),
                         *latest.contents.model.Find("head.weight")));
}

// One ZeRO-1 rank has no parallel checkpoint: it holds the whole optimizer state and saves it.
TEST(TrainerTest, ZeroOneOnOneRankCheckpointsItsWholeState) {
  const std::string dir = TempPath("zero_one_rank");
  std::vector<std::string> flags = SmallRun(dir, 1, 16, 6);
  flags.insert(flags.end(), {"--zero=1", "--checkpoint_every=3"});
  ASSERT_EQ(RunTrainer(flags, dir + ".log"), 0) << ReadFile(dir + ".log");
  const LoadedCheckpoint latest = LoadLatest(dir, "mlp-synthetic");
  EXPECT_EQ(latest.manifest.metadata().global_step(), 6);
  EXPECT_EQ(latest.manifest.metadata().labels().at("zero_stage"), "1");
  ASSERT_TRUE(latest.contents.optimizer.has_value());
  EXPECT_GT(latest.contents.optimizer->TensorCount(), 0);
}

std::vector<std::string> LongRun(const std::string& store_dir) {
  return {"--store_dir=" + store_dir, "--nproc_per_node=2", "--steps=2500",
          "--checkpoint_every=100",   "--log_every=20",     "--hidden=128",
          "--rank_exit_timeout=3s"};
}

TEST(TrainerTest, KilledRankIsRestartedAndTheRunEndsBitIdenticalToAnUninterruptedOne) {
  const std::string clean = TempPath("uninterrupted"), killed = TempPath("killed");
  const absl::Time clean_start = absl::Now();
  ASSERT_EQ(RunTrainer(LongRun(clean), clean + ".log"), 0) << ReadFile(clean + ".log");
  // The killed run trains the same steps plus those it repeats and a restart; three times the
  // clean run's time (at least 120 s) keeps a slow machine from failing it.
  const absl::Duration killed_budget =
      std::max(absl::Seconds(120), 3 * (absl::Now() - clean_start));

  std::vector<std::string> flags = LongRun(killed);
  flags.push_back("--max_restarts=1");
  TrainerProcess process = StartTrainer(flags, killed + ".log");
  ASSERT_TRUE(WaitForStep(process, 400, absl::Seconds(60))) << ReadFile(process.log);
  const pid_t rank1 = FindRank(process.pid, 1);
  ASSERT_GT(rank1, 0);
  ASSERT_EQ(kill(rank1, SIGKILL), 0);
  ASSERT_EQ(WaitForExit(process, killed_budget), 0) << ReadFile(process.log);
  const std::string log = ReadFile(process.log);
  EXPECT_THAT(log, HasSubstr("rank 1"));
  EXPECT_THAT(log, HasSubstr("signal 9"));
  EXPECT_THAT(log, HasSubstr("restarting all ranks"));

  // Training is deterministic, so a restart that retrained from step 0 would end with the same
  // tensors: the resumed step, the steps logged after the restart and every version's full state
  // tell a resume from a retrain.
  std::smatch resumed;
  ASSERT_TRUE(std::regex_search(
      log, resumed, std::regex(R"(resuming mlp-synthetic@(\d+) from step (\d+) to 2500)")))
      << log;
  const int64_t resumed_version = std::stoll(resumed[1]), resumed_step = std::stoll(resumed[2]);
  // --checkpoint_every=100 and the kill came after step 400, so step 300 at least was committed.
  EXPECT_GE(resumed_step, 300);
  // Each start of the ranks logs its run id, which every version it commits carries in its
  // lineage: the killed one's and the restarted one's.
  std::vector<std::string> run_ids;
  for (absl::string_view line : absl::StrSplit(log, '\n')) {
    if (absl::ConsumePrefix(&line, "trainer: run ")) {
      run_ids.emplace_back(line.substr(0, line.find(',')));
    }
  }
  ASSERT_EQ(run_ids.size(), 2u) << log;
  ASSERT_NE(run_ids[0], run_ids[1]);
  const size_t restart = log.find("restarting all ranks");
  std::vector<std::pair<int64_t, double>> after_restart = LossLines(log.substr(restart));
  ASSERT_FALSE(after_restart.empty()) << log;
  // --log_every=20: the restarted ranks log from the step after the resumed one, not step 20.
  EXPECT_GT(after_restart.front().first, resumed_step);
  EXPECT_LE(after_restart.front().first, resumed_step + 20);
  EXPECT_EQ(after_restart.back().first, 2500);

  std::unique_ptr<RocksDbCheckpointStore> clean_store = OpenStore(clean);
  std::unique_ptr<RocksDbCheckpointStore> killed_store = OpenStore(killed);
  ASSERT_TRUE(clean_store && killed_store);
  ASSERT_OK_AND_ASSIGN(std::vector<v1::VersionInfo> clean_versions,
                       clean_store->ListVersions("mlp-synthetic"));
  ASSERT_OK_AND_ASSIGN(std::vector<v1::VersionInfo> killed_versions,
                       killed_store->ListVersions("mlp-synthetic"));
  // The restart resumed from the last checkpoint acknowledged before the kill: the newest version
  // the killed ranks committed (an upload in flight at the kill counts once the store holds it),
  // at its step; and the restarted ranks' first version comes right after it.
  int64_t last_acknowledged = 0, last_acknowledged_step = -1, first_after_restart = 0;
  for (const v1::VersionInfo& info : killed_versions) {
    const std::string& run_id = info.metadata().lineage().run_id();
    if (run_id == run_ids[0] && info.version() > last_acknowledged) {
      last_acknowledged = info.version();
      last_acknowledged_step = info.metadata().global_step();
    }
    if (run_id == run_ids[1] && first_after_restart == 0) first_after_restart = info.version();
    EXPECT_TRUE(run_id == run_ids[0] || run_id == run_ids[1])
        << "@" << info.version() << " was committed by run '" << run_id << "'";
  }
  EXPECT_EQ(resumed_version, last_acknowledged)
      << "the restart resumed from @" << resumed_version << ", but the last checkpoint the killed "
      << "ranks committed is @" << last_acknowledged << " (step " << last_acknowledged_step << ")";
  EXPECT_EQ(resumed_step, last_acknowledged_step);
  EXPECT_EQ(first_after_restart, last_acknowledged + 1);

  // The same versions at the same steps (every 100 and each epoch end) in both: a retrain would
  // have written the steps before the kill twice.
  ASSERT_GT(clean_versions.size(), 25u);
  ASSERT_EQ(killed_versions.size(), clean_versions.size());
  EXPECT_EQ(clean_versions.back().metadata().global_step(), 2500);
  EXPECT_EQ(killed_versions.back().metadata().global_step(), 2500);
  bool resumed_version_seen = false;
  for (size_t i = 0; i < clean_versions.size(); ++i) {
    const int64_t version = clean_versions[i].version();
    ASSERT_EQ(killed_versions[i].version(), version);
    EXPECT_EQ(killed_versions[i].metadata().global_step(),
              clean_versions[i].metadata().global_step())
        << "@" << version;
    if (i > 0) {
      EXPECT_GT(killed_versions[i].metadata().global_step(),
                killed_versions[i - 1].metadata().global_step())
          << "@" << version;
    }
    if (version == resumed_version) {
      resumed_version_seen = true;
      EXPECT_EQ(killed_versions[i].metadata().global_step(), resumed_step);
    }
    const v1::VersionRef ref = MakeVersionRef("mlp-synthetic", version);
    // Everything a resume restores: model, optimizer, scheduler, the trainer's state and RNG.
    EXPECT_THAT(train::testing::CompareStoredBundles(*clean_store, ref, *killed_store, ref),
                IsOk());
  }
  EXPECT_TRUE(resumed_version_seen) << resumed_version;
}

TEST(TrainerTest, KilledRankWithoutRestartsStopsEveryRankWithinTheTimeout) {
  const std::string dir = TempPath("no_restart");
  std::vector<std::string> flags = LongRun(dir);
  flags.push_back("--steps=1000000");
  TrainerProcess process = StartTrainer(flags, dir + ".log");
  ASSERT_TRUE(WaitForStep(process, 100, absl::Seconds(60))) << ReadFile(process.log);
  const pid_t rank0 = FindRank(process.pid, 0);
  const pid_t rank1 = FindRank(process.pid, 1);
  ASSERT_GT(rank0, 0);
  ASSERT_GT(rank1, 0);
  const absl::Time killed_at = absl::Now();
  ASSERT_EQ(kill(rank1, SIGKILL), 0);
  // --rank_exit_timeout=3s, plus slack for a loaded machine.
  EXPECT_EQ(WaitForExit(process, absl::Seconds(15)), 1) << ReadFile(process.log);
  EXPECT_LT(absl::Now() - killed_at, absl::Seconds(15));
  EXPECT_THAT(ReadFile(process.log), HasSubstr("trainer: failed: rank 1"));
  EXPECT_NE(kill(rank0, 0), 0) << "rank 0 outlived the launcher";
}

// The issue's whole story for ZeRO-1: a 2-rank ZeRO-1 run checkpoints in parallel (each rank
// writing its own slices), a rank is killed (no restarts: the run stops), and its last version
// resumes on 3 ZeRO ranks, each holding exactly the state the killed run had at that step (one
// digest over parameters and optimizer state), then trains on to the run's target.
TEST(TrainerTest, KilledZeroOneRunResumesOnThreeRanksWithTheStateOfItsLastCheckpoint) {
  const std::string dir = TempPath("zero_killed");
  std::vector<std::string> flags = LongRun(dir);
  flags.insert(flags.end(), {"--steps=600", "--zero=1", "--log_state_digests"});
  TrainerProcess process = StartTrainer(flags, dir + ".log");
  ASSERT_TRUE(WaitForStep(process, 250, absl::Seconds(90))) << ReadFile(process.log);
  const pid_t rank1 = FindRank(process.pid, 1);
  ASSERT_GT(rank1, 0);
  ASSERT_EQ(kill(rank1, SIGKILL), 0);
  EXPECT_EQ(WaitForExit(process, absl::Seconds(30)), 1) << ReadFile(process.log);
  const std::string killed_log = ReadFile(process.log);

  // The latest version: the last parallel checkpoint (every 100 steps and at each epoch's end)
  // whose parts were all written before the kill.
  const LoadedCheckpoint latest = LoadLatest(dir, "mlp-synthetic");
  const int64_t step = latest.manifest.metadata().global_step();
  const std::string ref = absl::StrCat("mlp-synthetic@", latest.manifest.version());
  ASSERT_GE(step, 200);
  ASSERT_LT(step, 600) << "the run ended before the kill";
  EXPECT_EQ(latest.manifest.metadata().labels().at("zero_stage"), "1");
  const std::string saved = LoggedStateDigest(killed_log, absl::StrCat("rank 0 step ", step));
  ASSERT_FALSE(saved.empty()) << killed_log;

  const std::vector<std::string> resumed = {
      "--store_dir=" + dir,   "--nproc_per_node=3", "--hidden=128", "--steps=600",
      "--checkpoint_every=0", "--log_every=1",      "--zero=1",     "--log_state_digests"};
  const std::string log = dir + "_three.log";
  ASSERT_EQ(RunTrainer(resumed, log), 0) << ReadFile(log);
  EXPECT_THAT(ReadFile(log), HasSubstr("was written by 2 ranks, this run has 3"));
  for (int rank = 0; rank < 3; ++rank) {
    EXPECT_EQ(LoggedStateDigest(ReadFile(log), absl::StrCat("rank ", rank, " restored ", ref)),
              saved)
        << "rank " << rank << ":\n"
        << ReadFile(log);
  }
  EXPECT_EQ(LoadLatest(dir, "mlp-synthetic").manifest.metadata().global_step(), 600);
}

TEST(TrainerTest, ControlApiCheckpointsOnRequestAndStopsGracefully) {
  const std::string dir = TempPath("control");
  const std::string port_file = dir + ".port";
  std::vector<std::string> flags = LongRun(dir);
  flags.push_back("--steps=1000000");
  flags.push_back("--checkpoint_every=0");
  flags.push_back("--control_listen=127.0.0.1:0");
  flags.push_back("--control_port_file=" + port_file);
  TrainerProcess process = StartTrainer(flags, dir + ".log");
  ASSERT_TRUE(WaitForStep(process, 20, absl::Seconds(60))) << ReadFile(process.log);
  int port = 0;
  ASSERT_TRUE(absl::SimpleAtoi(absl::StripAsciiWhitespace(ReadFile(port_file)), &port));
  auto stub = v1::Trainer::NewStub(
      grpc::CreateChannel(absl::StrCat("127.0.0.1:", port), grpc::InsecureChannelCredentials()));
  {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
    v1::TrainerStatus status;
    ASSERT_TRUE(stub->GetStatus(&context, v1::GetStatusRequest(), &status).ok());
    EXPECT_EQ(status.state(), v1::TrainerStatus::STATE_TRAINING);
    EXPECT_EQ(status.world_size(), 2);
    EXPECT_GE(status.global_step(), 20);
  }
  v1::CheckpointNowResponse checkpoint;
  {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
    grpc::Status status = stub->CheckpointNow(&context, v1::CheckpointNowRequest(), &checkpoint);
    ASSERT_TRUE(status.ok()) << status.error_message();
    EXPECT_EQ(FormatVersionRef(checkpoint.version()), "mlp-synthetic@1");
  }
  v1::StopResponse stopped;
  {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
    grpc::Status status = stub->Stop(&context, v1::StopRequest(), &stopped);
    ASSERT_TRUE(status.ok()) << status.error_message();
    EXPECT_EQ(FormatVersionRef(stopped.final_version()), "mlp-synthetic@2");
  }
  EXPECT_EQ(WaitForExit(process, absl::Seconds(30)), 0) << ReadFile(process.log);
  EXPECT_THAT(ReadFile(process.log), HasSubstr("stopped at step"));
  LoadedCheckpoint latest = LoadLatest(dir, "mlp-synthetic");
  EXPECT_EQ(latest.manifest.version(), 2);
  EXPECT_GT(latest.manifest.metadata().global_step(), 20);
}

TEST(TrainerTest, SigtermStopsGracefullyWithAFinalCheckpoint) {
  const std::string dir = TempPath("sigterm");
  std::vector<std::string> flags = LongRun(dir);
  flags.push_back("--steps=1000000");
  flags.push_back("--checkpoint_every=0");
  TrainerProcess process = StartTrainer(flags, dir + ".log");
  ASSERT_TRUE(WaitForStep(process, 20, absl::Seconds(60))) << ReadFile(process.log);
  ASSERT_EQ(kill(process.pid, SIGTERM), 0);
  EXPECT_EQ(WaitForExit(process, absl::Seconds(30)), 0) << ReadFile(process.log);
  LoadedCheckpoint latest = LoadLatest(dir, "mlp-synthetic");
  EXPECT_EQ(latest.manifest.version(), 1);
  EXPECT_GE(latest.manifest.metadata().global_step(), 20);
}

// The final checkpoint, exported through the loader as a torch .pt file, loads
// into the model's PyTorch twin with strict=True and computes the same outputs.
class PythonTwinTest : public ::testing::TestWithParam<std::string> {};

TEST_P(PythonTwinTest, FinalCheckpointLoadsStrictlyIntoThePythonTwin) {
  const std::string kind = GetParam();
  const std::string dir = TempPath("twin_" + kind);
  std::vector<std::string> flags = SmallRun(dir, 2, 16, 15);
  flags.push_back("--model=" + kind);
  ASSERT_EQ(RunTrainer(flags, dir + ".log"), 0) << ReadFile(dir + ".log");

  std::unique_ptr<RocksDbCheckpointStore> store = OpenStore(dir);
  ASSERT_NE(store, nullptr);
  const v1::VersionRef ref = *ParseVersionRef(kind + "-synthetic");
  absl::StatusOr<LoadedState> loaded = Load(*store, ref, LoadTarget());
  ASSERT_THAT(loaded.status(), IsOk());
  const std::string twin = loaded->manifest.metadata().labels().at("python_twin");

  // The C++ model rebuilt from the store, and its outputs on a fixed batch.
  train::DataSpec data_spec;
  data_spec.model_kind = kind;
  absl::StatusOr<std::unique_ptr<train::Dataset>> data = train::OpenDataset(data_spec);
  ASSERT_THAT(data.status(), IsOk());
  train::ModelSpec model_spec;
  model_spec.kind = kind;
  absl::StatusOr<std::shared_ptr<train::Model>> model = train::MakeModel(model_spec, **data);
  ASSERT_THAT(model.status(), IsOk());
  ASSERT_THAT(LoadInto(*store, ref, **model).status(), IsOk());
  (*model)->eval();
  train::Batch batch = (*data)->Get({0, 1, 2, 3, 4, 5, 6, 7});
  at::Tensor outputs = (*model)->forward(batch.inputs).detach();

  const std::string weights = dir + "_weights.pt", io = dir + "_io.pt";
  absl::StatusOr<std::unique_ptr<VersionReader>> reader = store->OpenVersion(ref);
  ASSERT_THAT(reader.status(), IsOk());
  ExportOptions export_options;  // torch .pt, canonical keys, dtypes kept.
  ASSERT_THAT(ExportToFile(**reader, export_options, weights).status(), IsOk());
  StateDict inputs_outputs;
  inputs_outputs.InsertOrAssign("inputs", batch.inputs);
  inputs_outputs.InsertOrAssign("outputs", outputs);
  ASSERT_THAT(WriteTorchFile(io, StateDictToValue(inputs_outputs)).status(), IsOk());
  const std::string script = absl::StrCat(
      "import sys, torch; sys.path.insert(0, 'libs/train/python'); from twins import *\n"
      "model = ",
      twin, "\n", "state = torch.load('", weights,
      "', weights_only=True)\n"
      "model.load_state_dict(state, strict=True)\n"
      "model.eval()\n"
      "io = torch.load('",
      io,
      "', weights_only=True)\n"
      "with torch.no_grad():\n"
      "    out = model(io['inputs'])\n"
      "err = (out - io['outputs']).abs().max().item()\n"
      "assert torch.allclose(out, io['outputs'], atol=1e-5, rtol=1e-4), err\n"
      "print('twin ok', list(state)[:2], err)\n");
  const std::string script_path = dir + "_check.py";
  std::ofstream(script_path) << script;
  EXPECT_THAT(testing::RunPythonOrAddFailure(script_path, ""), HasSubstr("twin ok"));
}

INSTANTIATE_TEST_SUITE_P(Models, PythonTwinTest, ::testing::Values("mlp", "cnn", "transformer"));

// The trainer's final version exported with --bundle's options is a training bundle Python
// resumes from with real torch.optim / lr_scheduler classes: the twin's loss on a batch, one
// optimizer step on it, and the loss after that step all match the C++ model and optimizer
// restored from the same version.
TEST(TrainerTest, FinalVersionExportedAsABundleResumesInThePythonTwin) {
  // The third: two ranks with ZeRO-1, whose version holds the optimizer state gathered from both.
  for (const auto& [kind, zero] :
       {std::pair<std::string, bool>{"sgd", false}, {"adamw", false}, {"adamw", true}}) {
    SCOPED_TRACE(kind + (zero ? " zero=1" : ""));
    const std::string dir = TempPath("bundle_" + kind + (zero ? "_zero" : ""));
    std::vector<std::string> flags = SmallRun(dir, zero ? 2 : 1, 16, 12);
    for (const char* flag : {"--model=mlp", "--scheduler=step", "--step_size=5", "--gamma=0.5"}) {
      flags.push_back(flag);
    }
    flags.push_back("--optimizer=" + kind);
    if (zero) flags.push_back("--zero=1");
    ASSERT_EQ(RunTrainer(flags, dir + ".log"), 0) << ReadFile(dir + ".log");

    std::unique_ptr<RocksDbCheckpointStore> store = OpenStore(dir);
    ASSERT_NE(store, nullptr);
    const v1::VersionRef ref = *ParseVersionRef("mlp-synthetic");
    absl::StatusOr<std::unique_ptr<VersionReader>> reader = store->OpenVersion(ref);
    ASSERT_THAT(reader.status(), IsOk());
    const std::string bundle = dir + "_bundle.pt";
    ExportOptions export_options;
    export_options.target.include_optimizer = true;
    export_options.target.include_scheduler = true;
    absl::StatusOr<ExportResult> exported = ExportToFile(**reader, export_options, bundle);
    ASSERT_THAT(exported.status(), IsOk());
    EXPECT_TRUE(exported->bundle);
    EXPECT_TRUE(exported->left_out.empty());

    // The C++ side: model and optimizer restored from the store, one step on a fixed batch.
    absl::StatusOr<LoadedCheckpoint> loaded = LoadCheckpoint(*store, ref);
    ASSERT_THAT(loaded.status(), IsOk());
    train::DataSpec data_spec;
    data_spec.model_kind = "mlp";
    absl::StatusOr<std::unique_ptr<train::Dataset>> data = train::OpenDataset(data_spec);
    ASSERT_THAT(data.status(), IsOk());
    train::ModelSpec model_spec;
    model_spec.kind = "mlp";
    absl::StatusOr<std::shared_ptr<train::Model>> model = train::MakeModel(model_spec, **data);
    ASSERT_THAT(model.status(), IsOk());
    ASSERT_THAT(LoadInto(*store, ref, **model).status(), IsOk());
    absl::StatusOr<train::OptimizerSpec> spec = train::ParseOptimizerKind(kind);
    ASSERT_THAT(spec.status(), IsOk());
    absl::StatusOr<std::unique_ptr<torch::optim::Optimizer>> optimizer =
        train::MakeOptimizer(*spec, (*model)->parameters());
    ASSERT_THAT(optimizer.status(), IsOk());
    ASSERT_THAT(train::LoadOptimizerStateDict(**optimizer, *loaded->contents.optimizer), IsOk());
    (*model)->train();
    train::Batch batch = (*data)->Get({0, 1, 2, 3, 4, 5, 6, 7});
    auto loss_of = [&] {
      return at::nll_loss(at::log_softmax((*model)->forward(batch.inputs), 1), batch.targets);
    };
    at::Tensor loss_before = loss_of();
    (*optimizer)->zero_grad();
    loss_before.backward();
    (*optimizer)->step();
    at::Tensor loss_after;
    {
      at::NoGradGuard no_grad;
      loss_after = loss_of();
    }
    StateDict io;
    io.InsertOrAssign("inputs", batch.inputs);
    io.InsertOrAssign("targets", batch.targets);
    io.InsertOrAssign("loss_before", loss_before.detach());
    io.InsertOrAssign("loss_after", loss_after);
    io.InsertOrAssign("lr",
                      at::scalar_tensor(train::CurrentLearningRate(**optimizer), at::kDouble));
    const std::string io_path = dir + "_io.pt";
    ASSERT_THAT(WriteTorchFile(io_path, StateDictToValue(io)).status(), IsOk());

    const std::string twin = loaded->manifest.metadata().labels().at("python_twin");
    const std::string optimizer_class = kind == "sgd" ? "SGD" : "AdamW";
    const std::string script = absl::StrCat(
        "import sys, torch; sys.path.insert(0, 'libs/train/python'); from twins import *\n"
        "bundle = torch.load('",
        bundle,
        "')\n"
        "assert list(bundle)[:5] == ['epoch', 'global_step', 'model', 'optimizer', 'scheduler'], "
        "list(bundle)\n"
        "assert bundle['global_step'] == 12 and bundle['trainer']['global_step'] == 12\n"
        "model = ",
        twin, "\n",
        "model.load_state_dict(bundle['model'], strict=True)\n"
        "model.train()\n"
        "optimizer = torch.optim.",
        optimizer_class,
        "(model.parameters(), lr=1.0)\n"
        "optimizer.load_state_dict(bundle['optimizer'])\n"
        "scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=5, gamma=0.5)\n"
        "scheduler.load_state_dict(bundle['scheduler'])\n"
        "io = torch.load('",
        io_path,
        "')\n"
        "assert scheduler.get_last_lr()[0] == io['lr'].item(), (scheduler.get_last_lr(), "
        "io['lr'])\n"
        "loss = torch.nn.functional.cross_entropy(model(io['inputs']), io['targets'])\n"
        "assert abs(loss.item() - io['loss_before'].item()) < 1e-5, (loss, io['loss_before'])\n"
        "optimizer.zero_grad(); loss.backward(); optimizer.step(); scheduler.step()\n"
        "with torch.no_grad():\n"
        "    after = torch.nn.functional.cross_entropy(model(io['inputs']), io['targets'])\n"
        "assert abs(after.item() - io['loss_after'].item()) < 1e-5, (after, io['loss_after'])\n"
        "assert after.item() != loss.item()\n"
        "print('bundle ok', loss.item(), after.item())\n");
    const std::string script_path = dir + "_resume.py";
    std::ofstream(script_path) << script;
    EXPECT_THAT(testing::RunPythonOrAddFailure(script_path, ""), HasSubstr("bundle ok"));
  }
}

TEST(TrainerTest, TrainsOnATensorFileWrittenByPython) {
  const std::string data = TempPath("data.pt"), dir = TempPath("pt_data");
  const std::string script = TempPath("make_data.py");
  std::ofstream(script) << "import sys, torch\n"
                           "torch.manual_seed(0)\n"
                           "x = torch.randn(300, 20)\n"
                           "y = (x[:, 0] > 0).long() + (x[:, 1] > 0).long()\n"
                           "torch.save({'x': x, 'y': y}, sys.argv[1])\n";
  testing::RunPythonOrAddFailure(script, data);
  std::vector<std::string> flags = SmallRun(dir, 2, 25, 12);
  flags.push_back("--data=pt:" + data);
  ASSERT_EQ(RunTrainer(flags, dir + ".log"), 0) << ReadFile(dir + ".log");
  EXPECT_THAT(ReadFile(dir + ".log"), HasSubstr("300 examples"));
  LoadedCheckpoint latest = LoadLatest(dir, "mlp-pt");
  EXPECT_EQ(latest.manifest.metadata().global_step(), 12);
  EXPECT_EQ(latest.manifest.metadata().labels().at("data"), "pt:" + data);
  // 300 examples over 2 ranks in batches of 25: 6 steps an epoch, so 12 steps end epoch 2.
  EXPECT_EQ(latest.manifest.metadata().epoch(), 2);

  // A file without labels is refused with a clear message, before any rank trains.
  std::ofstream(script) << "import sys, torch\ntorch.save({'x': torch.randn(4, 2)}, sys.argv[1])\n";
  testing::RunPythonOrAddFailure(script, data);
  EXPECT_EQ(RunTrainer(flags, dir + "_bad.log"), 1);
  EXPECT_THAT(ReadFile(dir + "_bad.log"), HasSubstr("'y'"));
}

TEST(TrainerTest, BadFlagsExitTwoWithAClearMessage) {
  const std::string log = TempPath("bad_flags.log");
  EXPECT_EQ(
      RunTrainer({"--model=resnet9000", "--nproc_per_node=1", "--store_dir=" + TempPath("bad")},
                 log),
      1);
  EXPECT_THAT(ReadFile(log), HasSubstr("resnet9000"));
  EXPECT_EQ(RunTrainer({"--batch_size=0"}, log), 2);
  EXPECT_THAT(ReadFile(log), HasSubstr("--batch_size"));
  EXPECT_EQ(RunTrainer({"--model=torchscript"}, log), 2);
  EXPECT_THAT(ReadFile(log), HasSubstr("--model=torchscript:PATH"));
  EXPECT_EQ(RunTrainer({"--model=torchscript:net.ts", "--loss=hinge"}, log), 2);
  EXPECT_THAT(ReadFile(log), HasSubstr("unknown loss 'hinge'"));
  EXPECT_EQ(RunTrainer({"--loss=mse"}, log), 2);
  EXPECT_THAT(ReadFile(log), HasSubstr("--loss applies to --model=torchscript:PATH"));
  EXPECT_EQ(RunTrainer({"--help"}, log), 1);  // Abseil's --help exits 1 after printing usage.
  EXPECT_THAT(ReadFile(log), HasSubstr("--nproc_per_node"));
  EXPECT_THAT(ReadFile(log), HasSubstr("torchscript:PATH"));
}

}  // namespace
}  // namespace ckpt

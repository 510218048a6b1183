// A rank killed at each phase of a parallel checkpoint (SIGKILL from a failpoint in a test build
// of AsyncCheckpointer, libs/store/internal/failpoint.h). Two ranks, real processes over Gloo,
// save to a store service in this process: a first checkpoint commits, the second is cut short by
// the kill. Whatever the phase and whichever rank: no second version appears, the first loads
// exactly as saved, and once the store's grace for abandoned uploads has passed, GC leaves
// exactly what a store holding the first version alone holds.

#include <signal.h>
#include <unistd.h>

#include <cctype>
#include <chrono>
#include <cstdlib>
#include <iostream>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "ATen/core/Tensor.h"
#include "ATen/ops/equal.h"
#include "ATen/ops/full.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"
#include "libs/client/remote_checkpoint_store.h"
#include "libs/ddp/local_launcher.h"
#include "libs/ddp/process_group.h"
#include "libs/rpc/grpc_server.h"
#include "libs/status/status_matchers.h"
#include "libs/store/checkpoint_contents.h"
#include "libs/store/rocksdb_checkpoint_store.h"
#include "libs/store/version_ref.h"
#include "libs/train/async_checkpointer.h"
#include "proto/ckpt/v1/checkpoint_store.grpc.pb.h"
#include "services/checkpoint_store/store_service.h"

namespace ckpt {
namespace {

constexpr char kWorkerVariable[] = "CKPT_PARALLEL_SAVE_KILL_WORKER";
constexpr char kStoreVariable[] = "CKPT_PARALLEL_SAVE_KILL_STORE";
constexpr char kKilledRankVariable[] = "CKPT_PARALLEL_SAVE_KILL_RANK";
constexpr char kFailpointVariable[] = "CKPT_PARALLEL_SAVE_KILL_FAILPOINT";

// The same state on every rank for checkpoint `save`: a weight of three chunks and more, a bias,
// and momentum the size of the weight, so that each rank's share spans several chunks.
CheckpointContents Contents(int save) {
  CheckpointContents contents;
  const float fill = static_cast<float>(save);
  contents.model.InsertOrAssign("fc.weight", at::full({3 * 1024 * 1024 + 100}, fill));
  contents.model.InsertOrAssign("fc.bias", at::full({64}, fill));
  contents.optimizer = Value::Dict(
      {{"state",
        Value::Dict(
            {{0, Value::Dict({{"momentum_buffer",
                               Value::Tensor(at::full({3 * 1024 * 1024 + 100}, -fill))}})}})},
       {"param_groups",
        Value::List({Value::Dict({{"lr", Value::Float(0.1)},
                                  {"params", Value::List({Value::Int(0), Value::Int(1)})}})})}});
  return contents;
}

std::vector<at::Tensor> TensorsOf(const CheckpointContents& contents) {
  std::vector<at::Tensor> tensors;
  for (const StateDict::Entry& entry : contents.model) tensors.push_back(entry.tensor);
  contents.optimizer->ForEachTensor(
      [&](const std::string&, const at::Tensor& tensor) { tensors.push_back(tensor); });
  return tensors;
}

// One rank: two parallel checkpoints the way the trainer takes them (each rank's part, the
// verdict over an all-reduce of the parts written). The rank named in kKilledRankVariable arms
// the failpoint for its second hit, which is in the second checkpoint.
int RunWorker() {
  try {
    std::optional<ddp::RendezvousOptions> rendezvous = ddp::RendezvousOptionsFromEnvironment();
    if (!rendezvous) throw std::runtime_error("worker started without RANK/WORLD_SIZE");
    if (rendezvous->rank == std::atoi(std::getenv(kKilledRankVariable))) {
      setenv("CKPT_FAILPOINT", absl::StrCat(std::getenv(kFailpointVariable), ":2").c_str(), 1);
    }
    rendezvous->timeout = std::chrono::seconds(30);
    const ddp::ProcessGroupHandle group = ddp::InitProcessGroup(*rendezvous);
    RemoteStoreOptions options;
    options.address = std::getenv(kStoreVariable);
    absl::StatusOr<std::unique_ptr<RemoteCheckpointStore>> store =
        RemoteCheckpointStore::Connect(options);
    if (!store.ok()) throw std::runtime_error(store.status().ToString());
    train::AsyncCheckpointer checkpointer(store->get(), "net");
    for (int save = 1; save <= 2; ++save) {
      const CheckpointContents contents = Contents(save);
      train::AsyncCheckpointer::SharedUpload share;
      share.upload_name = absl::StrCat("kill-test/step-", save);
      share.rank = group.rank;
      share.world_size = group.world_size;
      share.replicated = TensorsOf(contents);
      const absl::Status submitted = checkpointer.SubmitShared(contents, {}, {}, share);
      if (!submitted.ok()) throw std::runtime_error(submitted.ToString());
      const bool written =
          checkpointer.WaitForPart() == train::AsyncCheckpointer::PartState::kWritten;
      // Throws once the other rank is dead: this rank's checkpointer then abandons the upload.
      const std::vector<double> sums = group.comm.AllReduceSum({written ? 1.0 : 0.0});
      checkpointer.EndSharedUpload(static_cast<int>(sums[0]) == group.world_size);
      const absl::StatusOr<std::optional<CommitResult>> committed = checkpointer.Wait();
      if (!committed.ok()) throw std::runtime_error(committed.status().ToString());
    }
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "parallel save worker: " << e.what() << "\n";
    return 1;
  }
}

struct KillCase {
  std::string failpoint;
  int rank;
};

class ParallelSaveKillTest : public ::testing::TestWithParam<KillCase> {};

// What a store that only ever held the first checkpoint holds.
v1::StoreStats FirstVersionAlone() {
  StoreOptions options;
  options.db_path = absl::StrCat(std::getenv("TEST_TMPDIR"), "/reference-", ::getpid(), "-",
                                 absl::ToUnixNanos(absl::Now()));
  absl::StatusOr<std::unique_ptr<RocksDbCheckpointStore>> store =
      RocksDbCheckpointStore::Open(options);
  EXPECT_OK(store.status());
  EXPECT_OK(CommitCheckpoint(**store, "net", Contents(1)).status());
  absl::StatusOr<v1::StoreStats> stats = (*store)->GetStats();
  EXPECT_OK(stats.status());
  return *stats;
}

TEST_P(ParallelSaveKillTest, NoVersionAppearsThePreviousLoadsAndGcReclaimsTheParts) {
  const KillCase& kill = GetParam();
  StoreOptions options;
  options.db_path = absl::StrCat(std::getenv("TEST_TMPDIR"), "/", kill.failpoint, "-", kill.rank);
  options.abandoned_upload_grace = absl::Seconds(1);
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<RocksDbCheckpointStore> store,
                       RocksDbCheckpointStore::Open(options));
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<StoreService> service,
                       StoreService::Create(store.get(), StoreServiceOptions()));
  ASSERT_OK_AND_ASSIGN(
      std::unique_ptr<GrpcServer> server,
      GrpcServer::Start(GrpcServerOptions(),
                        {{service.get(), v1::CheckpointStore::service_full_name()}}));

  const std::vector<int> exits =
      ddp::RunLocalRanks({}, 2, ddp::PickFreeLoopbackPort(),
                         {{kWorkerVariable, "1"},
                          {kStoreVariable, absl::StrCat("127.0.0.1:", server->port())},
                          {kKilledRankVariable, std::to_string(kill.rank)},
                          {kFailpointVariable, kill.failpoint}},
                         std::chrono::seconds(120));
  EXPECT_EQ(exits[kill.rank], 128 + SIGKILL) << "the failpoint did not kill rank " << kill.rank;

  // The first checkpoint is the model's latest, as it was saved.
  ASSERT_OK_AND_ASSIGN(v1::Manifest latest, store->GetManifest(*ParseVersionRef("net")));
  EXPECT_EQ(latest.version(), 1);
  ASSERT_OK_AND_ASSIGN(LoadedCheckpoint loaded, LoadCheckpoint(*store, *ParseVersionRef("net@1")));
  const CheckpointContents first = Contents(1);
  for (const StateDict::Entry& entry : first.model) {
    const at::Tensor* stored = loaded.contents.model.Find(entry.key);
    ASSERT_NE(stored, nullptr) << entry.key;
    EXPECT_TRUE(at::equal(*stored, entry.tensor)) << entry.key;
  }
  EXPECT_TRUE(at::equal(
      loaded.contents.optimizer->Find("state")->Find(0)->Find("momentum_buffer")->tensor(),
      first.optimizer->Find("state")->Find(0)->Find("momentum_buffer")->tensor()));

  // The dead rank's streams end on the server; past the grace, GC reclaims every orphaned part.
  int64_t in_progress = -1;
  for (absl::Time deadline = absl::Now() + absl::Seconds(20);
       in_progress != 0 && absl::Now() < deadline; absl::SleepFor(absl::Milliseconds(20))) {
    ASSERT_OK_AND_ASSIGN(v1::StoreStats live, store->GetStats());
    in_progress = live.uploads_in_progress();
  }
  ASSERT_EQ(in_progress, 0);
  absl::SleepFor(options.abandoned_upload_grace + absl::Milliseconds(200));
  ASSERT_OK_AND_ASSIGN(v1::GarbageCollectResponse collected, store->GarbageCollect(false));
  EXPECT_GE(collected.abandoned_uploads_reclaimed(), 1);
  ASSERT_OK_AND_ASSIGN(v1::StoreStats after, store->GetStats());
  const v1::StoreStats reference = FirstVersionAlone();
  EXPECT_EQ(after.chunks(), reference.chunks());
  EXPECT_EQ(after.physical_bytes(), reference.physical_bytes());
}

INSTANTIATE_TEST_SUITE_P(EachPhase, ParallelSaveKillTest,
                         ::testing::Values(KillCase{"shared_upload.before_join", 1},
                                           KillCase{"shared_upload.mid_part", 1},
                                           KillCase{"shared_upload.part_written", 1},
                                           KillCase{"shared_upload.mid_part", 0},
                                           KillCase{"shared_upload.before_commit", 0}),
                         [](const ::testing::TestParamInfo<KillCase>& info) {
                           std::string name =
                               absl::StrCat("rank", info.param.rank, "_", info.param.failpoint);
                           for (char& c : name) {
                             if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
                           }
                           return name;
                         });

}  // namespace
}  // namespace ckpt

// The test binary doubles as the worker: RunLocalRanks starts /proc/self/exe with
// kWorkerVariable set, and those copies run one rank instead of the tests.
int main(int argc, char** argv) {
  if (std::getenv(ckpt::kWorkerVariable) != nullptr) return ckpt::RunWorker();
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}

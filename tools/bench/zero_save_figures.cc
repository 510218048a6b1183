#include "tools/bench/zero_save_figures.h"

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "ATen/Context.h"
#include "ATen/core/Tensor.h"
#include "ATen/ops/randn.h"
#include "ATen/ops/randn_like.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "libs/client/remote_checkpoint_store.h"
#include "libs/ddp/local_launcher.h"
#include "libs/ddp/process_group.h"
#include "libs/status/status_macros.h"
#include "libs/status/torch_status.h"
#include "libs/store/checkpoint_contents.h"
#include "libs/store/chunk_hasher.h"
#include "libs/store/rocksdb_checkpoint_store.h"
#include "libs/train/async_checkpointer.h"
#include "libs/train/optimizer.h"
#include "libs/train/zero_optimizer.h"
#include "tools/bench/measurements.h"
#include "tools/bench/served_store.h"
#include "tools/bench/stats.h"

namespace ckpt::bench {
namespace {

namespace fs = std::filesystem;

constexpr int kM3Ranks = 2;
constexpr int kM3Tensors = 16;

// One rank's measurement, as RunM3Rank writes it.
struct M3Line {
  int64_t baseline_kib = 0;
  int64_t peak_kib = 0;
  int64_t part_bytes = 0;
  int64_t snapshot_bytes = 0;
  int64_t shard_state_bytes = 0;

  // Peak extra memory against the bound: this rank's shard (what it writes) and two chunks.
  double Ratio() const {
    return (peak_kib - baseline_kib) * 1024.0 / static_cast<double>(part_bytes + 2 * kChunkBytes);
  }
};

// Every rank's line of one job: runs the ranks and reads their files.
absl::StatusOr<std::vector<M3Line>> RunM3Job(const BenchOptions& options, const std::string& mode,
                                             int port) {
  const std::string out = absl::StrCat(options.work_dir, "/m3-", mode);
  ASSIGN_OR_RETURN(
      std::vector<int> exits, CatchTorchErrors([&] {
        return ddp::RunLocalRanks(
            {absl::StrCat("--m3_rank=", mode), absl::StrCat("--m3_store=127.0.0.1:", port),
             absl::StrCat("--m3_out=", out),
             absl::StrCat("--m3_param_mib=", options.m3_param_bytes / kMiB)},
            kM3Ranks, ddp::PickFreeLoopbackPort(), {}, std::chrono::milliseconds(600000));
      }));
  std::vector<M3Line> lines;
  for (int rank = 0; rank < kM3Ranks; ++rank) {
    if (exits[rank] != 0) {
      return absl::InternalError(
          absl::StrCat("M3 ", mode, " rank ", rank, " exited with ", exits[rank]));
    }
    const std::string path = absl::StrCat(out, ".", rank);
    std::ifstream in(path);
    M3Line line;
    if (!(in >> line.baseline_kib >> line.peak_kib >> line.part_bytes >> line.snapshot_bytes >>
          line.shard_state_bytes) ||
        line.part_bytes <= 0) {
      return absl::InternalError("the M3 rank wrote no measurement to " + path);
    }
    fs::remove(path);
    lines.push_back(line);
  }
  return lines;
}

std::string DescribeRanks(const std::vector<M3Line>& lines) {
  std::vector<std::string> ranks;
  for (size_t rank = 0; rank < lines.size(); ++rank) {
    const M3Line& line = lines[rank];
    ranks.push_back(absl::StrFormat(
        "rank %d: peak +%.1f MiB, wrote %.1f MiB (snapshot %.1f MiB), holds %.1f MiB of state",
        rank, (line.peak_kib - line.baseline_kib) / 1024.0, line.part_bytes / kMiB,
        line.snapshot_bytes / kMiB, line.shard_state_bytes / kMiB));
  }
  return absl::StrJoin(ranks, "; ");
}

}  // namespace

absl::Status RunM3Rank(const std::string& mode, const std::string& store_address,
                       const std::string& out, int64_t param_bytes) {
  if (mode != "sharded" && mode != "gathered") {
    return absl::InvalidArgumentError("--m3_rank must be 'sharded' or 'gathered', got '" + mode +
                                      "'");
  }
  std::optional<ddp::RendezvousOptions> rendezvous = ddp::RendezvousOptionsFromEnvironment();
  if (!rendezvous) return absl::FailedPreconditionError("M3 rank started without RANK/WORLD_SIZE");
  ASSIGN_OR_RETURN(ddp::ProcessGroupHandle group,
                   CatchTorchErrors([&] { return ddp::InitProcessGroup(*rendezvous); }));
  // The same parameters on every rank, and one AdamW step so that the optimizer holds its state.
  ASSIGN_OR_RETURN(std::vector<at::Tensor> parameters, CatchTorchErrors([&] {
                     at::manual_seed(1);
                     std::vector<at::Tensor> made;
                     for (int i = 0; i < kM3Tensors; ++i) {
                       made.push_back(at::randn({param_bytes / kM3Tensors / 4}));
                       made.back().mutable_grad() = at::randn_like(made.back());
                     }
                     return made;
                   }));
  ASSIGN_OR_RETURN(std::unique_ptr<train::ZeroOptimizer> zero,
                   train::ZeroOptimizer::Create(train::OptimizerSpec(), parameters, group.comm));
  RETURN_IF_ERROR(CatchTorchErrors([&] { zero->Step(); }));
  RemoteStoreOptions store_options;
  store_options.address = store_address;
  ASSIGN_OR_RETURN(std::unique_ptr<RemoteCheckpointStore> store,
                   RemoteCheckpointStore::Connect(store_options));
  RETURN_IF_ERROR(store->ListModels().status());  // the channel is up before the baseline.
  train::AsyncCheckpointer checkpointer(store.get(), "m3");
  RETURN_IF_ERROR(CatchTorchErrors([&] { group.comm.Barrier(); }));

  // Everything from here is the save: what the trainer's TakeCheckpoint does for it.
  ResetPeakMemory();
  ASSIGN_OR_RETURN(const ProcMemory baseline, ReadProcMemory());
  CheckpointContents contents;
  for (int i = 0; i < kM3Tensors; ++i)
    contents.model.InsertOrAssign(absl::StrCat("p", i), parameters[i]);
  train::AsyncCheckpointer::SharedUpload share;
  share.upload_name = absl::StrCat("m3-", mode);
  share.rank = group.rank;
  share.world_size = group.world_size;
  std::vector<at::Tensor> step_writes = parameters;
  if (mode == "sharded") {
    ASSIGN_OR_RETURN(train::ZeroOptimizer::ShardedState sharded, zero->ShardedStateDict());
    contents.optimizer = std::move(sharded.state_dict);
    for (const OwnedTensorBytes& owned : sharded.owned) step_writes.push_back(owned.source);
    share.partitioned = std::move(sharded.partitioned);
    share.owned = std::move(sharded.owned);
  } else {
    ASSIGN_OR_RETURN(contents.optimizer, zero->GatherStateDict());
    contents.optimizer->ForEachTensor(
        [&](const std::string&, const at::Tensor& tensor) { step_writes.push_back(tensor); });
  }
  share.replicated = step_writes;
  RETURN_IF_ERROR(checkpointer.SubmitShared(contents, {}, step_writes, share));
  const bool written = checkpointer.WaitForPart() == train::AsyncCheckpointer::PartState::kWritten;
  ASSIGN_OR_RETURN(const std::vector<double> sums, CatchTorchErrors([&] {
                     return group.comm.AllReduceSum({written ? 1.0 : 0.0});
                   }));
  checkpointer.EndSharedUpload(static_cast<int>(sums[0]) == group.world_size);
  RETURN_IF_ERROR(checkpointer.Wait().status());
  ASSIGN_OR_RETURN(const ProcMemory peak, ReadProcMemory());
  RETURN_IF_ERROR(CatchTorchErrors([&] { group.comm.Barrier(); }));
  const train::AsyncCheckpointer::Stats stats = checkpointer.stats();
  std::ofstream(absl::StrCat(out, ".", group.rank))
      << baseline.rss_kib << " " << peak.hwm_kib << " " << stats.part_bytes_written << " "
      << stats.last_snapshot_bytes << " " << zero->shard_state_bytes() << "\n";
  return absl::OkStatus();
}

absl::Status FigureM3(const BenchOptions& options, Report& report) {
  StoreOptions store_options;
  store_options.db_path = options.work_dir + "/m3-store";
  ASSIGN_OR_RETURN(std::unique_ptr<RocksDbCheckpointStore> store,
                   RocksDbCheckpointStore::Open(store_options));
  ASSIGN_OR_RETURN(const ServedStore served, ServeStore(*store));
  const std::string workload = absl::StrFormat("%d ranks, %.0f MiB fp32 parameters + AdamW state",
                                               kM3Ranks, options.m3_param_bytes / kMiB);
  for (const std::string mode : {"sharded", "gathered"}) {
    std::vector<double> ratios;
    std::vector<M3Line> last;
    for (int run = 0; run < options.runs; ++run) {
      Progress(absl::StrCat("M3 ", mode, " run ", run + 1, "/", options.runs));
      ASSIGN_OR_RETURN(last, RunM3Job(options, mode, served.port()));
      double worst = 0;
      for (const M3Line& line : last) worst = std::max(worst, line.Ratio());
      ratios.push_back(worst);
    }
    FigureRow row{"M3", workload,
                  mode == "sharded"
                      ? "ZeRO-1 save: a rank's peak extra memory / (its shard + 2 chunks)"
                      : "the same, optimizer state gathered first (before #40's sharded save)"};
    row.ratio = Summarize(ratios);
    if (mode == "sharded") {
      row.goal = Goal::kAtMost;
      row.target = 1.0;
    } else {
      row.goal = Goal::kReference;
    }
    row.detail = DescribeRanks(last) + " (last run; the worse rank is the figure)";
    report.AddFigure(std::move(row));
  }
  return absl::OkStatus();
}

}  // namespace ckpt::bench

#include "tools/bench/parallel_save_figures.h"

#include <unistd.h>

#include <filesystem>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "libs/status/status_macros.h"
#include "libs/store/checkpoint_contents.h"
#include "libs/store/checkpoint_store.h"
#include "libs/store/upload_split.h"
#include "libs/store/version_ref.h"
#include "tools/bench/measurements.h"
#include "tools/bench/stats.h"
#include "tools/bench/workloads.h"

namespace ckpt::bench {
namespace {

namespace fs = std::filesystem;

constexpr int kRanks = 2;
constexpr int kResumeReaders = 3;

// Fresh pseudo-random bytes in every tensor, so that no save deduplicates against an earlier one.
absl::Status Refill(const Workload& workload, uint64_t seed) {
  for (const at::Tensor& tensor : workload.tensors) RETURN_IF_ERROR(FillRandom(tensor, seed++));
  return absl::OkStatus();
}

// What the trainer's ranks do for one parallel checkpoint, without the host snapshot (neither
// side of R10 copies): rank 0 begins the upload, each rank (a thread here, sharing the store as
// the trainer's ranks share rank 0's embedded store) joins it for its SplitUpload share and writes
// it, and rank 0 commits once every part is in. Returns the seconds from the begin to the commit.
absl::StatusOr<double> TimeParallelSave(const Workload& workload, const std::string& db_path,
                                        int ranks) {
  ASSIGN_OR_RETURN(std::unique_ptr<RocksDbCheckpointStore> store, OpenStore(db_path));
  CommitOptions options;
  options.joinable_as = "r10";
  ASSIGN_OR_RETURN(PreparedUpload prepared, PrepareUpload(workload.contents, options));
  const std::vector<std::vector<UploadRange>> shares = SplitUpload(prepared.header, ranks);
  const Clock::time_point start = Clock::now();
  ASSIGN_OR_RETURN(std::unique_ptr<UploadSession> session,
                   store->BeginUpload(workload.name, prepared.header, options));
  std::vector<absl::Status> written(ranks);
  std::vector<std::thread> threads;
  for (int rank = 0; rank < ranks; ++rank) {
    threads.emplace_back([&, rank] {
      if (shares[rank].empty()) return;
      absl::StatusOr<std::unique_ptr<UploadPart>> part =
          store->JoinUpload(options.joinable_as, shares[rank]);
      written[rank] = part.ok() ? UploadTensorRanges(**part, prepared.tensors) : part.status();
    });
  }
  for (std::thread& thread : threads) thread.join();
  for (const absl::Status& status : written) RETURN_IF_ERROR(status);
  ASSIGN_OR_RETURN(CommitResult committed, session->Commit());
  const double seconds = SecondsSince(start);
  if (committed.logical_bytes != workload.bytes) {
    return absl::InternalError(absl::StrCat("the parallel save stored ", committed.logical_bytes,
                                            " logical bytes, expected ", workload.bytes));
  }
  return seconds;
}

// Reads every tensor byte of `model`'s latest version in `db_path`, split between `readers`
// threads (SplitUpload's shares of the manifest, each read with VersionReader::ReadTensorRange,
// as the ranks of a resumed ZeRO run read their slices) into destination memory allocated and
// faulted in beforehand. Returns the seconds of the reads alone.
absl::StatusOr<double> TimeRangedReads(const std::string& db_path, const std::string& model,
                                       int readers) {
  ASSIGN_OR_RETURN(std::unique_ptr<RocksDbCheckpointStore> store, OpenStore(db_path));
  ASSIGN_OR_RETURN(std::unique_ptr<VersionReader> reader,
                   store->OpenVersion(*ParseVersionRef(model)));
  const v1::Manifest& manifest = reader->manifest();
  std::vector<const v1::TensorMeta*> metas;
  for (const v1::TensorMeta& meta : manifest.tensors()) metas.push_back(&meta);
  for (const v1::TensorMeta& meta : manifest.state_tensors()) metas.push_back(&meta);
  const std::vector<std::vector<UploadRange>> shares = SplitUpload(manifest, readers);
  std::vector<std::vector<char>> destinations(readers);
  for (int r = 0; r < readers; ++r) {
    int64_t bytes = 0;
    for (const UploadRange& range : shares[r]) bytes += range.end - range.begin;
    destinations[r].assign(static_cast<size_t>(bytes), 1);  // faulted in: the warm regime.
  }
  std::vector<absl::Status> read(readers);
  const Clock::time_point start = Clock::now();
  std::vector<std::thread> threads;
  for (int r = 0; r < readers; ++r) {
    threads.emplace_back([&, r] {
      char* destination = destinations[r].data();
      for (const UploadRange& range : shares[r]) {
        read[r] = reader->ReadTensorRange(*metas[range.tensor_index], range.begin, range.end,
                                          destination);
        if (!read[r].ok()) return;
        destination += range.end - range.begin;
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  const double seconds = SecondsSince(start);
  for (const absl::Status& status : read) RETURN_IF_ERROR(status);
  return seconds;
}

}  // namespace

absl::Status FigureR10(const BenchOptions& options, Report& report) {
  // "A replicated 1 GiB state": parameters plus Adam's two moments, a third each.
  const int64_t param_bytes = options.quick ? 16 * kMiB : (int64_t{1} << 30) / 3;
  ASSIGN_OR_RETURN(Workload workload, MakeLargeWorkload(param_bytes));
  workload.name = "replicated";
  Progress(absl::StrFormat("R10: %d tensors, %.2f GiB, %d ranks against one",
                           workload.tensors.size(), workload.bytes / kGiB, kRanks));
  std::vector<double> alone_s, parallel_s, one_reader_s, three_readers_s;
  for (int run = 0; run < options.runs; ++run) {
    const std::string alone_dir = absl::StrCat(options.work_dir, "/r10-alone-", run);
    const std::string parallel_dir = absl::StrCat(options.work_dir, "/r10-parallel-", run);
    // Alternate which side goes first, so a drift in the machine's state favours neither.
    for (int side = 0; side < 2; ++side) {
      const bool parallel = (side + run) % 2 == 1;
      RETURN_IF_ERROR(Refill(workload, 1000 * (run + 1) + 100 * side));
      // Both sides start with nothing of the other's left to write back: the disk is what
      // bounds a synced save of 1 GiB on one machine, and its backlog would go to whoever is next.
      ::sync();
      if (parallel) {
        ASSIGN_OR_RETURN(double seconds, TimeParallelSave(workload, parallel_dir, kRanks));
        parallel_s.push_back(seconds);
      } else {
        ASSIGN_OR_RETURN(double seconds, TimeStoreSave(workload, alone_dir));
        alone_s.push_back(seconds);
      }
    }
    // The resume side: the version the two ranks wrote, read back by three readers each taking
    // a third of its bytes by range, against one reader taking all of them (alternating order;
    // the store's files are in the page cache for both).
    for (int side = 0; side < 2; ++side) {
      const int readers = (side + run) % 2 == 1 ? kResumeReaders : 1;
      ASSIGN_OR_RETURN(double seconds, TimeRangedReads(parallel_dir, workload.name, readers));
      (readers == 1 ? one_reader_s : three_readers_s).push_back(seconds);
    }
    fs::remove_all(alone_dir);
    fs::remove_all(parallel_dir);
    ::sync();
  }
  report.AddTiming("save, one rank writes all (CommitCheckpoint)", workload, alone_s);
  report.AddTiming(absl::StrCat("save, ", kRanks, " ranks write half each (JoinUpload)"), workload,
                   parallel_s);
  std::vector<double> ratios;
  for (size_t i = 0; i < alone_s.size(); ++i) ratios.push_back(parallel_s[i] / alone_s[i]);
  FigureRow row;
  row.id = "R10";
  row.workload = workload.name;
  row.what = absl::StrCat("parallel checkpoint wall time, ", kRanks,
                          " ranks each writing half / rank 0 writing all");
  row.ratio = Summarize(ratios);
  row.goal = Goal::kAtMost;
  row.target = 0.6;
  row.detail = absl::StrFormat("%.2f s vs %.2f s (median), %.2f GiB synced to one local store",
                               Median(parallel_s), Median(alone_s), workload.bytes / kGiB);
  report.AddFigure(std::move(row));

  report.AddTiming("resume reads, one reader reads all", workload, one_reader_s, Regime::kWarm);
  report.AddTiming(absl::StrCat("resume reads, ", kResumeReaders, " readers read a third each"),
                   workload, three_readers_s, Regime::kWarm);
  std::vector<double> read_ratios;
  for (size_t i = 0; i < one_reader_s.size(); ++i) {
    read_ratios.push_back(three_readers_s[i] / one_reader_s[i]);
  }
  FigureRow resume;
  resume.id = "R10 resume";
  resume.workload = workload.name;
  resume.what = absl::StrCat("reading the 2-rank version back, ", kResumeReaders,
                             " readers by range / one reader of the same bytes (time)");
  resume.ratio = Summarize(read_ratios);
  resume.goal = Goal::kReference;
  resume.detail = absl::StrFormat("%.3f s vs %.3f s (median), page cache warm, destination warm",
                                  Median(three_readers_s), Median(one_reader_s));
  resume.regime = Regime::kWarm;
  report.AddFigure(std::move(resume));
  return absl::OkStatus();
}

}  // namespace ckpt::bench

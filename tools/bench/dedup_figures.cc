#include "tools/bench/dedup_figures.h"

#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "libs/auth/model_scope.h"
#include "libs/status/status_macros.h"
#include "libs/store/audited_store.h"
#include "libs/store/checkpoint_contents.h"
#include "libs/store/rocksdb_checkpoint_store.h"
#include "libs/store/scoped_store.h"
#include "libs/store/version_ref.h"
#include "tools/bench/stats.h"
#include "tools/bench/workloads.h"

namespace ckpt::bench {

namespace fs = std::filesystem;

// Ten versions that share a frozen backbone: physical bytes (chunks stored once) over logical
// bytes (summed over versions), against the ideal (backbone + 10 heads) / (10 x model).
// Deterministic, so measured once. "D1 scoped" commits the same ten versions as a scoped team
// does through the store service (AuditedStore over ScopedStore): the store still keeps each
// chunk once, and the row says what the scope's bookkeeping (new_bytes counted against the
// scope's other versions, FindMissingChunks against its references) costs in time.
absl::Status FigureD1(const BenchOptions& options, Report& report) {
  constexpr int kVersions = 10;
  Progress("fine-tune series: 10 versions");
  ASSIGN_OR_RETURN(FineTuneSeries series,
                   MakeFineTuneSeries(options.backbone_bytes, options.head_bytes, kVersions));
  struct Committed {
    v1::StoreStats stats;
    double commit_s = 0;        // the ten commits
    double find_missing_s = 0;  // FindMissingChunks of the last version's chunks
    int64_t last_new_bytes = 0;
  };
  // Commits the series into a fresh store, as `scope` (unrestricted: as the store itself).
  const auto commit_series = [&](const ModelScope& scope) -> absl::StatusOr<Committed> {
    const std::string db = options.work_dir + "/store-finetune";
    Committed committed;
    {
      StoreOptions store_options;
      store_options.db_path = db;
      ASSIGN_OR_RETURN(std::unique_ptr<RocksDbCheckpointStore> store,
                       RocksDbCheckpointStore::Open(store_options));
      AuditedStore audited(std::make_unique<ScopedStore>(*store, scope, "identity 'bench'"),
                           {"bench", "local"});
      const absl::Time start = absl::Now();
      for (const CheckpointContents& contents : series.versions) {
        ASSIGN_OR_RETURN(CommitResult result,
                         CommitCheckpoint(audited, "team-a-finetune", contents));
        committed.last_new_bytes = result.new_bytes;
      }
      committed.commit_s = absl::ToDoubleSeconds(absl::Now() - start);
      ASSIGN_OR_RETURN(v1::Manifest last,
                       store->GetManifest(MakeVersionRef("team-a-finetune", kVersions)));
      std::vector<std::string> chunks;
      for (const v1::TensorMeta& meta : last.tensors()) {
        for (const v1::ChunkRef& chunk : meta.chunks()) chunks.push_back(chunk.sha256());
      }
      const absl::Time find_start = absl::Now();
      RETURN_IF_ERROR(audited.FindMissingChunks(chunks).status());
      committed.find_missing_s = absl::ToDoubleSeconds(absl::Now() - find_start);
      ASSIGN_OR_RETURN(committed.stats, store->GetStats());
    }
    fs::remove_all(db);
    return committed;
  };
  // Alternated, so that neither side alone pays this VM's first touches of fresh memory; the
  // medians of `options.runs` pairs are reported.
  Committed whole, scoped;
  std::vector<double> whole_commit_s, scoped_commit_s, whole_find_s, scoped_find_s;
  for (int run = 0; run < options.runs; ++run) {
    Progress(absl::StrCat("fine-tune series, run ", run + 1, ": whole store, then a scoped team"));
    ASSIGN_OR_RETURN(whole, commit_series(ModelScope()));
    ASSIGN_OR_RETURN(scoped, commit_series(ModelScope({"team-a-*"})));
    whole_commit_s.push_back(whole.commit_s);
    scoped_commit_s.push_back(scoped.commit_s);
    whole_find_s.push_back(whole.find_missing_s);
    scoped_find_s.push_back(scoped.find_missing_s);
  }
  whole.commit_s = Summarize(whole_commit_s).median;
  scoped.commit_s = Summarize(scoped_commit_s).median;
  whole.find_missing_s = Summarize(whole_find_s).median;
  scoped.find_missing_s = Summarize(scoped_find_s).median;
  const double model = series.backbone_bytes + series.head_bytes;
  const double ideal =
      (series.backbone_bytes + kVersions * series.head_bytes) / (kVersions * model);
  for (const Committed* run : {&whole, &scoped}) {
    const bool is_scoped = run == &scoped;
    FigureRow row{is_scoped ? "D1 scoped" : "D1", "fine-tune x10", "physical / logical bytes"};
    row.ratio = Summarize({static_cast<double>(run->stats.physical_bytes()) /
                           static_cast<double>(run->stats.logical_bytes())});
    row.goal = Goal::kClose;
    row.target = ideal;
    row.detail = absl::StrFormat("%d physical / %d logical bytes; backbone %d, head %d bytes",
                                 run->stats.physical_bytes(), run->stats.logical_bytes(),
                                 series.backbone_bytes, series.head_bytes);
    if (is_scoped) {
      absl::StrAppendFormat(
          &row.detail,
          "; 10 commits %.2f s (unscoped %.2f s, medians of %d), last new_bytes %d (unscoped %d); "
          "FindMissingChunks of the last version %.1f ms (unscoped %.1f ms)",
          scoped.commit_s, whole.commit_s, options.runs, scoped.last_new_bytes,
          whole.last_new_bytes, 1e3 * scoped.find_missing_s, 1e3 * whole.find_missing_s);
    }
    report.AddFigure(std::move(row));
  }
  return absl::OkStatus();
}

}  // namespace ckpt::bench

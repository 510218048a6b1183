#include "libs/train/trainer.h"

#include <algorithm>
#include <string>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "c10/util/Exception.h"
#include "libs/store/version_ref.h"
#include "libs/train/rank_run.h"
#include "libs/train/scripted_model.h"

namespace ckpt::train {
namespace internal {

// Declared, with what they return, in rank_run.h.
std::string FormatClock(absl::Duration duration) {
  const int64_t seconds = absl::ToInt64Seconds(duration);
  return absl::StrFormat("%d:%02d:%02d", seconds / 3600, (seconds / 60) % 60, seconds % 60);
}

std::string DescribeTensor(const at::Tensor& tensor) {
  if (!tensor.defined()) return "an undefined tensor";
  return absl::StrCat("a tensor of shape ", c10::str(tensor.sizes()), " and dtype ",
                      c10::toString(tensor.scalar_type()));
}

std::string DefaultModelName(const TrainerConfig& config) {
  const std::string data_kind = config.data.source.substr(0, config.data.source.find(':'));
  if (config.model.kind != kTorchScriptKind) return absl::StrCat(config.model.kind, "-", data_kind);
  std::string stem = config.model.path.substr(config.model.path.find_last_of('/') + 1);
  if (const size_t dot = stem.rfind('.'); dot != std::string::npos && dot > 0) stem.resize(dot);
  for (char& c : stem) {
    if (!absl::ascii_isalnum(c) && c != '_' && c != '-' && c != '.') c = '_';
  }
  return absl::StrCat(stem.empty() ? "model" : stem, "-", data_kind);
}

}  // namespace internal

namespace {

using internal::FormatClock;
using internal::RankRun;

absl::Status ValidateConfig(const TrainerConfig& config) {
  if (config.batch_size <= 0) return absl::InvalidArgumentError("batch_size must be positive");
  if (config.max_consecutive_failed_checkpoints <= 0) {
    return absl::InvalidArgumentError("max_failed_checkpoints must be positive");
  }
  if (config.accumulation_steps <= 0) {
    return absl::InvalidArgumentError("accumulation_steps must be positive");
  }
  if (config.steps < 0) return absl::InvalidArgumentError("steps must be >= 0");
  if (!(config.eval_fraction >= 0 && config.eval_fraction < 1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("eval_fraction must be in [0, 1), not ", config.eval_fraction));
  }
  if (config.zero_stage != 0 && config.zero_stage != 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "zero must be 0 or 1 (ZeRO stage 1: sharded optimizer state), not ", config.zero_stage));
  }
  if (config.zero_stage == 1 && !config.parallel_checkpoints) {
    return absl::InvalidArgumentError(
        "zero=1 needs parallel_checkpoints: each rank holds part of the optimizer state, so every "
        "rank takes part in each checkpoint");
  }
  if (config.device != "cpu" && config.device != "cuda") {
    return absl::InvalidArgumentError(
        absl::StrCat("device must be cpu or cuda, not \"", config.device, "\""));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<TrainingSummary> RunTrainingRank(const TrainerConfig& config,
                                                const ddp::ProcessGroupHandle& group,
                                                CheckpointStore& store, TrainerControl* control) {
  RETURN_IF_ERROR(ValidateConfig(config));
  if (!group.comm.valid()) return absl::InvalidArgumentError("no process group");
  TrainerControl local_control;
  RankRun run(config, group, store, control != nullptr ? *control : local_control);
  return run.Run();
}

std::string FormatSummary(const TrainingSummary& summary) {
  std::string out = absl::StrFormat(
      "\n== %s: %s at step %d of %d (epoch %d), %d rank(s) over %s\n", summary.model_name,
      summary.stopped_early ? "stopped" : "finished", summary.final_step, summary.target_step,
      summary.final_epoch, summary.world_size, summary.backend);
  absl::StrAppend(&out, "   run ", summary.run_id, "\n");
  if (summary.resumed_from) {
    absl::StrAppend(&out, "   resumed from ", FormatVersionRef(*summary.resumed_from), " (step ",
                    summary.start_step, ")\n");
  }
  absl::StrAppendFormat(&out, "   %d steps in %s, %.0f samples/s; checkpoint stall %.3f s\n",
                        summary.final_step - summary.start_step, FormatClock(summary.wall_time),
                        summary.samples_per_second,
                        absl::ToDoubleSeconds(summary.checkpoint_stall));
  if (!summary.loss_curve.empty()) {
    // At most ~12 points, evenly spread, always the last.
    const size_t stride = std::max<size_t>(1, (summary.loss_curve.size() + 11) / 12);
    absl::StrAppend(&out, "   loss:");
    for (size_t i = 0; i < summary.loss_curve.size(); ++i) {
      if (i % stride != 0 && i + 1 != summary.loss_curve.size()) continue;
      absl::StrAppendFormat(&out, " %d:%.3g", summary.loss_curve[i].first,
                            summary.loss_curve[i].second);
    }
    absl::StrAppend(&out, "\n");
  }
  if (summary.last_eval) {
    absl::StrAppendFormat(&out, "   held out (%d examples) at step %d: val_loss %.4f%s\n",
                          summary.last_eval->examples, summary.last_eval->global_step,
                          summary.last_eval->loss,
                          summary.last_eval->accuracy
                              ? absl::StrFormat("  val_acc %.4f", *summary.last_eval->accuracy)
                              : std::string());
  }
  std::vector<std::string> versions;
  for (const v1::VersionRef& ref : summary.versions_written) {
    versions.push_back(absl::StrCat("@", ref.version()));
  }
  absl::StrAppend(&out,
                  "   versions written: ", versions.empty() ? "none" : absl::StrJoin(versions, " "),
                  "\n");
  if (summary.failed_checkpoints > 0) {
    absl::StrAppend(&out, "   failed checkpoints (trained past): ", summary.failed_checkpoints,
                    "; the last: ", summary.last_checkpoint_error, "\n");
  }
  absl::StrAppend(&out, "   ", summary.model_summary, "\n");
  if (!summary.versions_written.empty()) {
    const bool remote = summary.store_location.find(':') != std::string::npos &&
                        summary.store_location.find('/') == std::string::npos;
    const std::string where =
        remote ? "--store=" + summary.store_location : "--store_dir=" + summary.store_location;
    absl::StrAppend(&out, "   inspect:  bazel run //tools/ckpt -- ", where, " ls ",
                    summary.model_name, "\n", "             bazel run //tools/ckpt -- ", where,
                    " show ", summary.model_name, "@latest\n", "   run again to continue from ",
                    summary.model_name, "@latest\n");
  }
  return out;
}

}  // namespace ckpt::train

#include "tools/bench/scripted_training_bench.h"

#include <cstdio>
#include <filesystem>
#include <iostream>
#include <map>
#include <regex>
#include <sstream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "libs/status/status_macros.h"
#include "tools/bench/run_command.h"

namespace ckpt::bench {
namespace {

constexpr int kWorldSize = 2;

// `command` with its stderr joined to its stdout (the trainer logs to stderr).
absl::StatusOr<std::string> Run(const std::string& command) {
  return RunCommand(command + " 2>&1");
}

}  // namespace

absl::StatusOr<double> TrainerSamplesPerSecond(const std::string& log, int from, int to) {
  // samples/s since the first step, at each logged step.
  static const std::regex kLine(R"(step (\d+)/\d+ .* ([0-9.]+) samples/s)");
  std::map<int, double> cumulative;
  std::istringstream lines(log);
  std::string line;
  std::smatch match;
  while (std::getline(lines, line)) {
    if (!std::regex_search(line, match, kLine)) continue;
    int step = 0;
    double rate = 0;
    if (absl::SimpleAtoi(match[1].str(), &step) && absl::SimpleAtod(match[2].str(), &rate)) {
      cumulative[step] = rate;
    }
  }
  if (cumulative.count(from) == 0 || cumulative.count(to) == 0 || cumulative[from] <= 0 ||
      cumulative[to] <= 0 || to <= from) {
    return absl::InvalidArgumentError(
        absl::StrCat("the trainer's log has no samples/s at steps ", from, " and ", to));
  }
  // Each rate is step * S / elapsed (S: samples per step), so step / rate is elapsed / S, and
  // (to - from) * S samples over the time between is (to - from) / (to/rate_to - from/rate_from).
  // The trainer prints rates to the unit (%.0f): about 0.5% at the ~100 samples/s here.
  const double from_time = from / cumulative[from];
  const double to_time = to / cumulative[to];
  if (to_time <= from_time) {
    return absl::InvalidArgumentError("the trainer's progress lines go back in time");
  }
  return (to - from) / (to_time - from_time);
}

absl::StatusOr<ScriptedTrainingSamples> MeasureScriptedTraining(
    const ScriptedTrainingOptions& options) {
  const std::string team = options.work_dir + "/r9-team";
  const int total_steps = options.warmup_steps + options.timed_steps;
  // One epoch covers every step, so no epoch-end checkpoint falls inside the timed window.
  const int examples = kWorldSize * options.batch_per_rank * (total_steps + 1);
  if (!std::filesystem::exists(team + "/resnet18.ts")) {
    std::cerr << "[bench] R9: scripting torchvision's resnet18, " << examples
              << " [3,32,32] examples in 4 shards" << std::endl;
    RETURN_IF_ERROR(Run(absl::StrCat(options.python, " ", options.baseline_script, " make ", team,
                                     " ", examples))
                        .status());
  }
  ScriptedTrainingSamples samples;
  for (int run = 0; run < options.runs; ++run) {
    std::cerr << "[bench] R9 run " << run + 1 << "/" << options.runs
              << ": the C++ trainer, then Python DDP (2 ranks each)" << std::endl;
    const std::string store = absl::StrCat(options.work_dir, "/r9-store-", run);
    std::filesystem::remove_all(store);
    ASSIGN_OR_RETURN(
        const std::string log,
        Run(absl::StrCat(
            options.environment, " ", options.trainer, " --model=torchscript:", team,
            "/resnet18.ts", " --data=shards:", team, "/shards --nproc_per_node=", kWorldSize,
            " --batch_size=", options.batch_per_rank, " --steps=", total_steps,
            " --threads_per_rank=", options.threads_per_rank,
            // What the Python loop does: AdamW, no gradient clipping.
            " --optimizer=adamw --lr=0.001 --clip_grad_norm=0",
            " --log_every=1 --checkpoint_every=0", " --eval_fraction=0 --store_dir=", store)));
    ASSIGN_OR_RETURN(const double trainer,
                     TrainerSamplesPerSecond(log, options.warmup_steps, total_steps));
    samples.trainer_samples_per_s.push_back(trainer);

    ASSIGN_OR_RETURN(
        const std::string printed,
        Run(absl::StrCat(options.environment, " ", options.python, " ", options.baseline_script,
                         " ddp ", team, " ", options.warmup_steps, " ", options.timed_steps, " ",
                         options.batch_per_rank, " ", options.threads_per_rank)));
    std::smatch match;
    static const std::regex kFigure(R"(samples_per_s ([0-9.]+))");
    double python = 0;
    if (!std::regex_search(printed, match, kFigure) || !absl::SimpleAtod(match[1].str(), &python) ||
        python <= 0) {
      return absl::InternalError("R9's Python side printed no samples_per_s: " + printed);
    }
    samples.python_samples_per_s.push_back(python);
  }
  return samples;
}

}  // namespace ckpt::bench

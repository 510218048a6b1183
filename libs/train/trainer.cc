#include "libs/train/trainer.h"

#include <unistd.h>
#include <xxhash.h>

#include <cmath>
#include <cstdio>
#include <iostream>
#include <memory>
#include <mutex>
#include <sstream>
#include <utility>
#include <vector>

#include "ATen/ATen.h"
#include "ATen/CPUGeneratorImpl.h"
#include "ATen/Context.h"
#include "ATen/Parallel.h"
#include "ATen/core/grad_mode.h"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "libs/ddp/distributed_data_parallel.h"
#include "libs/ddp/distributed_sampler.h"
#include "libs/status/status_macros.h"
#include "libs/status/torch_status.h"
#include "libs/store/version_ref.h"
#include "libs/train/async_checkpointer.h"
#include "libs/train/lineage.h"
#include "libs/train/scripted_model.h"
#include "libs/train/trainable_model.h"
#include "libs/train/trainer_state.h"
#include "torch/nn/utils/clip_grad.h"
#include "torch/version.h"

namespace ckpt::train {
namespace {

void AppendTensors(const Value& value, std::vector<at::Tensor>& out) {
  if (value.is_tensor()) {
    out.push_back(value.tensor());
  } else if (value.is_sequence()) {
    for (const Value& item : value.items()) AppendTensors(item, out);
  } else if (value.is_dict()) {
    for (const Value::Entry& entry : value.entries()) AppendTensors(entry.second, out);
  }
}

// What optimizer.step() writes in place, in the order it writes it: each parameter with its state
// (`optimizer_state`'s "state" entry under the parameter's id). A checkpoint copies these on the
// upload thread in this order while the next forward and backward passes run, and TrainStep waits
// for that copy right before the step (AsyncCheckpointer::SubmitOverlapped). The forward pass
// writes only buffers (BatchNorm statistics), which are not here: those are copied at once.
std::vector<at::Tensor> StepWrites(const torch::optim::Optimizer& optimizer,
                                   const Value& optimizer_state) {
  std::vector<at::Tensor> writes;
  const Value* state = optimizer_state.Find("state");
  int64_t id = 0;
  for (const torch::optim::OptimizerParamGroup& group : optimizer.param_groups()) {
    for (const at::Tensor& parameter : group.params()) {
      writes.push_back(parameter);
      const Value* own = state != nullptr && state->is_dict() ? state->Find(id) : nullptr;
      if (own != nullptr) AppendTensors(*own, writes);
      ++id;
    }
  }
  return writes;
}

// Where the data continues and the run's goal: what the loop advances and a checkpoint records.
struct LoopState {
  int64_t epoch = 0;
  int64_t sampler_position = 0;  // samples of `epoch` each rank has consumed.
  int64_t global_step = 0;
  int64_t target_step = 0;
};

// Copies a checkpoint's model tensors into `model` (strict: same keys, same shapes).
absl::Status RestoreModel(const StateDict& checkpoint, const TrainableModel& model,
                          const std::string& version) {
  StateDict live = model.Weights();
  std::vector<std::string> problems;
  for (const StateDict::Entry& entry : live) {
    const at::Tensor* saved = checkpoint.Find(entry.key);
    if (saved == nullptr) {
      problems.push_back("missing " + entry.key);
    } else if (saved->sizes() != entry.tensor.sizes()) {
      problems.push_back(absl::StrCat(entry.key, ": ", c10::str(saved->sizes()), " in checkpoint, ",
                                      c10::str(entry.tensor.sizes()), " in model"));
    }
  }
  for (const StateDict::Entry& entry : checkpoint) {
    if (!live.contains(entry.key)) problems.push_back("unexpected " + entry.key);
  }
  if (!problems.empty()) {
    return absl::FailedPreconditionError(
        absl::StrCat(version, " does not fit this model (", absl::StrJoin(problems, "; "),
                     "). Train under another model_name, or set resume to false to start over."));
  }
  return CatchTorchErrors([&] {
    at::NoGradGuard no_grad;
    for (const StateDict::Entry& entry : live) {
      entry.tensor.copy_(*checkpoint.Find(entry.key));
    }
  });
}

// The per-step collective: mean loss plus control flags, so every rank agrees on when to stop
// and checkpoint without an extra round trip.
struct StepConsensus {
  double mean_loss = 0;
  bool stop = false;
  bool skip_checkpoint = false;
  bool checkpoint_now = false;
};

StepConsensus AgreeOnStep(const ddp::Communicator& comm, double loss,
                          const TrainerControl::Requests& requests) {
  const std::vector<double> sums =
      comm.AllReduceSum({loss, requests.stop ? 1.0 : 0.0, requests.skip_checkpoint ? 1.0 : 0.0,
                         requests.checkpoint ? 1.0 : 0.0});
  StepConsensus consensus;
  consensus.mean_loss = sums[0] / comm.size();
  consensus.stop = sums[1] > 0;
  consensus.skip_checkpoint = sums[2] > 0;
  consensus.checkpoint_now = sums[3] > 0;
  return consensus;
}

// "<model kind>-<data kind>", e.g. "mlp-synthetic"; a scripted model goes by its file's name
// ("/teams/vision/resnet18.ts" with shards: "resnet18-shards").
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

// "a tensor of shape [16, 10] and dtype Float", or "an undefined tensor", for messages.
std::string DescribeTensor(const at::Tensor& tensor) {
  if (!tensor.defined()) return "an undefined tensor";
  return absl::StrCat("a tensor of shape ", c10::str(tensor.sizes()), " and dtype ",
                      c10::toString(tensor.scalar_type()));
}

std::string FormatClock(absl::Duration duration) {
  const int64_t seconds = absl::ToInt64Seconds(duration);
  return absl::StrFormat("%d:%02d:%02d", seconds / 3600, (seconds / 60) % 60, seconds % 60);
}

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
  if (config.device != "cpu" && config.device != "cuda") {
    return absl::InvalidArgumentError(
        absl::StrCat("device must be cpu or cuda, not \"", config.device, "\""));
  }
  return absl::OkStatus();
}

// One rank's run, from building the model to the final checkpoint. The phases are methods so
// that each reads on its own; the state they share is the members below. Used once, by
// RunTrainingRank, on one thread.
class RankRun {
 public:
  RankRun(const TrainerConfig& config, const ddp::ProcessGroupHandle& group, CheckpointStore& store,
          TrainerControl& control)
      : config_(config),
        group_(group),
        store_(store),
        control_(control),
        leader_(group.rank == 0) {}

  absl::StatusOr<TrainingSummary> Run() {
    RETURN_IF_ERROR(Build());
    RETURN_IF_ERROR(Resume());
    RETURN_IF_ERROR(SetUpLineage());
    loop_.target_step = loop_.global_step < loop_.target_step ? loop_.target_step
                                                              : loop_.global_step + config_.steps;
    summary_.target_step = loop_.target_step;
    RETURN_IF_ERROR(SetUpDataParallel());
    RETURN_IF_ERROR(TrainLoop());
    RETURN_IF_ERROR(Finish());
    return summary_;
  }

 private:
  // Device, data, model, optimizer and scheduler: the same on every rank (same seed).
  absl::Status Build();
  // The model's loss on the first training batch, in eval mode without gradients: a model that
  // does not fit the data (shapes, dtypes, a loss that is not a scalar) is named here, before
  // any collective and any checkpoint, with the batch it was given.
  absl::Status CheckModelOnFirstBatch();
  // Rank 0 picks the version to resume from (the model's latest), every rank loads that one.
  absl::Status Resume();
  absl::Status RestoreFrom(const v1::VersionRef& ref);
  // The run id (rank 0's, so every rank reports the same) and the lineage every version carries.
  absl::Status SetUpLineage();
  absl::Status SetUpDataParallel();
  absl::Status TrainLoop();
  // One optimizer step over `micro_batches`; the mean loss of this rank.
  absl::StatusOr<double> TrainStep(const std::vector<std::vector<int64_t>>& micro_batches);
  // XXH3 over the bytes of every parameter and buffer, in the module's order.
  uint64_t StateDigest() const;
  // Rank 0: the progress line and status after a step, then a checkpoint when one is due.
  absl::Status AfterStep(const StepConsensus& consensus, bool checkpoint_due, bool final,
                         bool last_step, int64_t steps_done, absl::Duration elapsed);
  // All ranks, before a checkpoint: the held-out metrics (a no-op without a held-out part).
  absl::Status Evaluate();
  // Fatal errors only: a failed checkpoint that training may go past is recorded instead
  // (failed_checkpoint_step_, CheckpointFailed).
  absl::Status TakeCheckpoint(bool wait);
  // Counts and reports a failed checkpoint; the error once too many failed in a row.
  absl::Status CheckpointFailed(const absl::Status& error);
  void RecordCommitted();
  absl::Status Finish();

  const TrainerConfig& config_;
  const ddp::ProcessGroupHandle& group_;
  CheckpointStore& store_;
  TrainerControl& control_;
  const bool leader_;

  at::Device device_{at::kCPU};
  std::unique_ptr<Dataset> data_;
  DataSplit split_;  // the sampler deals indices into split_.train.
  std::unique_ptr<TrainableModel> model_;
  ModelIdentity identity_;
  std::vector<at::Tensor> parameters_;
  std::unique_ptr<torch::optim::Optimizer> optimizer_;
  std::unique_ptr<LrScheduler> scheduler_;
  std::unique_ptr<ddp::DistributedDataParallel> data_parallel_;
  std::unique_ptr<ddp::DistributedSampler> sampler_;
  std::unique_ptr<AsyncCheckpointer> checkpointer_;  // rank 0 only.

  LoopState loop_;
  v1::Lineage lineage_;
  // The latest evaluation: with a held-out part, every checkpoint is preceded by one.
  std::optional<EvalMetrics> eval_;
  TrainingSummary summary_;
  v1::TrainerStatus status_;
  absl::Time start_;
  int64_t first_step_ = 0;
  int64_t last_checkpoint_step_ = -1;
  int64_t failed_checkpoint_step_ = -1;  // the step whose own checkpoint failed last.
  absl::Status last_checkpoint_error_;
  int consecutive_failed_checkpoints_ = 0;
  bool skip_final_checkpoint_ = false;
  double last_loss_ = 0;
  double samples_per_second_ = 0;
  // The loop waiting for uploads: for the previous one before each checkpoint (what Submit used to
  // wait for itself), and with synchronous_checkpoints for every one.
  absl::Duration upload_waits_;
};

absl::Status RankRun::Build() {
  at::set_num_threads(config_.threads_per_rank);
  if (config_.device == "cuda") {
    if (!at::hasCUDA()) {
      return absl::FailedPreconditionError(
          "device cuda, but this build of LibTorch has no CUDA: build with --config=cuda "
          "against a CUDA LibTorch (README, \"CUDA\")");
    }
    device_ = at::Device(at::kCUDA, static_cast<c10::DeviceIndex>(config_.local_rank));
    if (group_.comm.device() != device_) {
      // Checked here rather than by the first collective, which could hang under NCCL.
      return absl::FailedPreconditionError(absl::StrCat(
          "this rank trains on ", device_.str(), " but its process group communicates on ",
          group_.comm.device().str(), "; join the group with device cuda and local rank ",
          config_.local_rank, " (ddp::RendezvousOptions)"));
    }
  }
  summary_.world_size = group_.world_size;
  summary_.backend = group_.backend;
  summary_.store_location = config_.store_location;

  ASSIGN_OR_RETURN(data_, OpenDataset(config_.data));
  ASSIGN_OR_RETURN(split_, SplitHeldOut(data_->size(), config_.eval_fraction, config_.seed));
  at::manual_seed(config_.seed);
  if (config_.model.kind == kTorchScriptKind) {
    ScriptedModelOptions options;
    options.path = config_.model.path;
    options.loss = config_.model.loss;
    ASSIGN_OR_RETURN(model_, LoadScriptedModel(options));
  } else {
    ASSIGN_OR_RETURN(model_, WrapBuiltInModel(MakeModel(config_.model, *data_)));
  }
  identity_ = model_->Identity();
  summary_.model_name = config_.model_name.empty() ? DefaultModelName(config_) : config_.model_name;
  summary_.python_twin = identity_.label == "python_twin" ? identity_.value : "";
  summary_.model_summary = identity_.summary_line;
  RETURN_IF_ERROR(CatchTorchErrors([&] { model_->To(device_); }));
  parameters_ = model_->parameters();
  RETURN_IF_ERROR(CheckModelOnFirstBatch());
  ASSIGN_OR_RETURN(optimizer_, MakeOptimizer(config_.optimizer, parameters_));
  ASSIGN_OR_RETURN(scheduler_, MakeScheduler(config_.scheduler, *optimizer_));
  return absl::OkStatus();
}

absl::Status RankRun::CheckModelOnFirstBatch() {
  const size_t count = std::min(split_.train.size(), static_cast<size_t>(config_.batch_size));
  if (count == 0) return absl::OkStatus();  // SetUpDataParallel names an empty data set.
  const std::vector<int64_t> examples(split_.train.begin(), split_.train.begin() + count);
  Batch batch;
  ASSIGN_OR_RETURN(batch, CatchTorchErrors([&] { return data_->Get(examples); }));
  const std::string given = absl::StrCat("inputs ", c10::str(batch.inputs.sizes()), " ",
                                         c10::toString(batch.inputs.scalar_type()), " and targets ",
                                         c10::str(batch.targets.sizes()), " ",
                                         c10::toString(batch.targets.scalar_type()));
  at::Tensor loss;
  absl::Status ran = CatchTorchErrors([&] {
    // Restored afterwards: the check must not shift the training's random stream.
    at::Generator generator = at::detail::getDefaultCPUGenerator();
    at::Tensor rng_state;
    {
      std::lock_guard<std::mutex> lock(generator.mutex());
      rng_state = generator.get_state();
    }
    {
      at::NoGradGuard no_grad;
      model_->SetTraining(false);
      loss = model_->Loss(batch.inputs.to(device_), batch.targets.to(device_)).loss;
      model_->SetTraining(true);
    }
    std::lock_guard<std::mutex> lock(generator.mutex());
    generator.set_state(rng_state);
  });
  if (!ran.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the model does not run on the data: its loss on the first batch (", given, " from ",
        data_->Describe(), ") failed: ", TorchScriptErrorCause(std::string(ran.message()))));
  }
  if (!loss.defined() || loss.dim() != 0 || !at::isFloatingType(loss.scalar_type())) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the model's loss on the first batch (", given, ") is ", DescribeTensor(loss),
        ", not a floating-point scalar: reduce it (e.g. .mean()) before returning it"));
  }
  return absl::OkStatus();
}

absl::Status RankRun::Resume() {
  std::string resume_version;
  if (leader_ && config_.resume) {
    absl::StatusOr<v1::Manifest> latest = store_.GetManifest(*ParseVersionRef(summary_.model_name));
    if (latest.ok()) {
      resume_version = std::to_string(latest->version());
    } else if (latest.status().code() != absl::StatusCode::kNotFound) {
      return latest.status();
    }
  }
  if (group_.world_size > 1) {
    ASSIGN_OR_RETURN(resume_version,
                     CatchTorchErrors([&] { return group_.comm.BroadcastString(resume_version); }));
  }
  if (resume_version.empty()) return absl::OkStatus();
  int64_t version = 0;
  if (!absl::SimpleAtoi(resume_version, &version)) {
    return absl::InternalError("rank 0 sent a malformed version: " + resume_version);
  }
  return RestoreFrom(MakeVersionRef(summary_.model_name, version));
}

absl::Status RankRun::RestoreFrom(const v1::VersionRef& ref) {
  const std::string name = FormatVersionRef(ref);
  ASSIGN_OR_RETURN(LoadedCheckpoint loaded, store_.LoadCheckpoint(ref));
  const auto& labels = loaded.manifest.metadata().labels();
  for (const char* label : {"python_twin", "torchscript_class"}) {
    auto saved = labels.find(label);
    if (saved == labels.end()) continue;
    if (identity_.label != label || saved->second != identity_.value) {
      return absl::FailedPreconditionError(absl::StrCat(
          name, " holds a ", saved->second, " but this run builds a ", identity_.value,
          ". Train under another model_name, or set resume to false to start over."));
    }
  }
  RETURN_IF_ERROR(RestoreModel(loaded.contents.model, *model_, name));
  if (!loaded.contents.optimizer || !loaded.contents.scheduler) {
    return absl::FailedPreconditionError(
        absl::StrCat(name,
                     " has no optimizer or scheduler state (retention may have dropped it), so it "
                     "cannot be resumed exactly; set resume to false to start over from scratch"));
  }
  ASSIGN_OR_RETURN(TrainerState state, DecodeTrainerState(loaded.contents.extra, name));
  loop_.epoch = state.epoch;
  loop_.sampler_position = state.sampler_position;
  loop_.global_step = state.global_step;
  loop_.target_step = state.target_step;
  RETURN_IF_ERROR(LoadOptimizerStateDict(*optimizer_, *loaded.contents.optimizer));
  if (loop_.global_step < loop_.target_step) {
    // An interrupted leg continues exactly where it was.
    RETURN_IF_ERROR(scheduler_->LoadStateDict(*loaded.contents.scheduler));
  } else {
    // A finished leg (its schedule ran out, e.g. cosine down to 0): the new leg keeps the
    // weights and optimizer moments but starts a fresh schedule from the configured rate.
    for (auto& param_group : optimizer_->param_groups()) {
      param_group.options().set_lr(config_.optimizer.lr);
    }
    ASSIGN_OR_RETURN(scheduler_, MakeScheduler(config_.scheduler, *optimizer_));
    if (leader_) {
      std::cerr << "trainer: " << name << " ended its run at step " << loop_.global_step
                << "; training " << config_.steps
                << " more steps with a fresh learning-rate schedule\n";
    }
  }
  const int saved_world = state.world_size > 0 ? state.world_size : group_.world_size;
  if (saved_world != group_.world_size) {
    // Positions are per rank: keep the number of samples consumed across all ranks.
    loop_.sampler_position = loop_.sampler_position * saved_world / group_.world_size;
    if (leader_) {
      std::cerr << "trainer: " << name << " was written by " << saved_world
                << " ranks, this run has " << group_.world_size
                << "; the epoch continues at the same global sample count\n";
    }
  }
  if (state.eval_fraction != config_.eval_fraction && leader_) {
    // Not refused: the run continues, but on another split, so the samples it deals differ from
    // the ones the saved position counted, and earlier training may have seen the new held-out
    // examples.
    std::cerr << "trainer: " << name << " was trained with eval_fraction " << state.eval_fraction
              << ", this run holds out " << config_.eval_fraction
              << "; the data split changes, so val_* metrics are not comparable across the "
                 "two and the epoch's order differs\n";
  }
  if (state.rng_cpu.defined()) {
    RETURN_IF_ERROR(CatchTorchErrors([&] {
      at::Generator generator = at::detail::getDefaultCPUGenerator();
      std::lock_guard<std::mutex> lock(generator.mutex());
      generator.set_state(state.rng_cpu);
    }));
  }
  if (state.rng_device.defined() && device_.type() != at::kCPU) {
    // A run that moved between the CPU and a GPU keeps only the CPU stream: a CUDA generator's
    // state means nothing to the CPU one (and the sizes differ).
    RETURN_IF_ERROR(CatchTorchErrors([&] {
      at::Generator generator = at::globalContext().defaultGenerator(device_);
      std::lock_guard<std::mutex> lock(generator.mutex());
      generator.set_state(state.rng_device);
    }));
  }
  summary_.resumed_from = ref;
  summary_.start_step = loop_.global_step;
  return absl::OkStatus();
}

absl::Status RankRun::SetUpLineage() {
  std::string run_id = config_.run_id;
  if (run_id.empty() && leader_) run_id = NewRunId(summary_.model_name, absl::Now());
  if (config_.run_id.empty() && group_.world_size > 1) {
    ASSIGN_OR_RETURN(run_id, CatchTorchErrors([&] { return group_.comm.BroadcastString(run_id); }));
  }
  summary_.run_id = run_id;
  lineage_.set_run_id(run_id);
  if (summary_.resumed_from) {
    // Every version of this run, not only its first: see "Lineage" in trainer.h.
    lineage_.set_parent(FormatVersionRef(*summary_.resumed_from));
    lineage_.set_parent_relation("resumed_from");
  }
  lineage_.set_code_revision(config_.code_revision);
  // Describe() names the source ("synthetic", "mnist:DIR", "pt:FILE") and its shape.
  std::string dataset = data_->Describe();
  if (config_.data.source == "synthetic") {
    absl::StrAppend(&dataset, " (generated for ", config_.data.model_kind, ", seed ",
                    config_.data.seed, ")");
  }
  absl::StrAppend(&dataset, "; shuffled with seed ", config_.seed);
  if (!split_.held_out.empty()) {
    absl::StrAppend(&dataset, "; ", split_.held_out.size(), " held out for evaluation (fraction ",
                    config_.eval_fraction, ", split seed ", config_.seed, "), trained on ",
                    split_.train.size());
  }
  lineage_.set_dataset(dataset);
  auto& info = *lineage_.mutable_producer_info();
  info["world_size"] = std::to_string(group_.world_size);
  info["backend"] = group_.backend;
  info["device"] = device_.str();
  char host[256] = {};
  gethostname(host, sizeof(host) - 1);
  info["hostname"] = host;
  info["trainer_build"] =
      absl::StrCat("ckpt trainer, LibTorch ", TORCH_VERSION, at::hasCUDA() ? " (CUDA)" : " (CPU)",
#ifdef NDEBUG
                   ", optimized"
#else
                   ", debug"
#endif
      );
  return absl::OkStatus();
}

absl::Status RankRun::Evaluate() {
  if (split_.held_out.empty()) return absl::OkStatus();
  // This rank's share: held-out examples rank, rank + world_size, ...
  std::vector<int64_t> share;
  for (size_t i = group_.rank; i < split_.held_out.size(); i += group_.world_size) {
    share.push_back(split_.held_out[i]);
  }
  ASSIGN_OR_RETURN(
      const std::vector<double> totals, CatchTorchErrors([&] {
        // Rank 0's buffers (BatchNorm statistics), as the next forward would use.
        data_parallel_->PrepareForward();
        // Nothing below should draw random numbers; restoring the generator makes
        // sure evaluation cannot shift the training's stream.
        at::Generator generator = at::detail::getDefaultCPUGenerator();
        at::Tensor rng_state;
        {
          std::lock_guard<std::mutex> lock(generator.mutex());
          rng_state = generator.get_state();
        }
        // Accuracy where the outputs are class scores for class-id targets; a module whose own
        // loss() computes the loss records val_loss only.
        double loss_sum = 0, correct = 0, classified = 0;
        {
          at::NoGradGuard no_grad;
          model_->SetTraining(false);
          for (size_t begin = 0; begin < share.size(); begin += config_.batch_size) {
            const size_t end =
                std::min(share.size(), begin + static_cast<size_t>(config_.batch_size));
            Batch batch =
                data_->Get(std::vector<int64_t>(share.begin() + begin, share.begin() + end));
            const at::Tensor targets = batch.targets.to(device_);
            const LossResult result = model_->Loss(batch.inputs.to(device_), targets);
            const double examples = static_cast<double>(end - begin);
            // The batch's mean loss weighted by its size: the mean over the held-out part.
            loss_sum += result.loss.item<double>() * examples;
            const at::Tensor& outputs = result.outputs;
            if (outputs.defined() && outputs.dim() == 2 && targets.dim() == 1 &&
                targets.scalar_type() == at::kLong && outputs.size(0) == targets.size(0)) {
              correct += outputs.argmax(1).eq(targets).sum().item<double>();
              classified += examples;
            }
          }
          model_->SetTraining(true);
        }
        {
          std::lock_guard<std::mutex> lock(generator.mutex());
          generator.set_state(rng_state);
        }
        return group_.comm.AllReduceSum(
            {loss_sum, correct, static_cast<double>(share.size()), classified});
      }));
  const double examples = totals[2];
  EvalMetrics metrics;
  metrics.global_step = loop_.global_step;
  metrics.examples = static_cast<int64_t>(examples);
  metrics.loss = totals[0] / examples;
  if (totals[3] == examples) metrics.accuracy = totals[1] / examples;
  eval_ = metrics;
  summary_.last_eval = metrics;
  return absl::OkStatus();
}

absl::Status RankRun::SetUpDataParallel() {
  ddp::DataParallelOptions ddp_options;
  ddp_options.bucket_cap_bytes = config_.bucket_cap_bytes;
  ASSIGN_OR_RETURN(data_parallel_, CatchTorchErrors([&] {
                     return std::make_unique<ddp::DistributedDataParallel>(model_->Replica(),
                                                                           group_.comm,
                                                                           ddp_options);
                   }));
  ASSIGN_OR_RETURN(
      sampler_, CatchTorchErrors([&] {
        auto sampler = std::make_unique<ddp::DistributedSampler>(
            static_cast<int64_t>(split_.train.size()), group_.rank, group_.world_size,
            config_.shuffle, config_.seed, config_.drop_last);
        sampler->set_epoch(loop_.epoch);
        sampler->set_position(std::min(loop_.sampler_position, sampler->num_samples()));
        return sampler;
      }));
  const int64_t samples_per_step = config_.batch_size * config_.accumulation_steps;
  const int64_t steps_per_epoch =
      (sampler_->num_samples() + samples_per_step - 1) / samples_per_step;
  if (steps_per_epoch == 0) {
    return absl::InvalidArgumentError(absl::StrCat("the training data (", split_.train.size(),
                                                   " examples) gives no batches to ",
                                                   group_.world_size, " ranks with drop_last"));
  }
  if (leader_) checkpointer_ = std::make_unique<AsyncCheckpointer>(&store_, summary_.model_name);

  status_.set_state(v1::TrainerStatus::STATE_TRAINING);
  status_.set_model(summary_.model_name);
  status_.set_world_size(group_.world_size);
  status_.set_backend(group_.backend);
  status_.set_device(device_.str());
  status_.set_total_steps(loop_.target_step);
  control_.SetStatus(status_);
  if (leader_) {
    std::cerr << absl::StrFormat(
        "trainer: %s, %d rank(s) over %s, %s; %s%s\n"
        "trainer: run %s%s\n"
        "trainer: %s from step %d to %d (%d steps/epoch, batch %d x %d per rank), store %s\n",
        summary_.model_name, group_.world_size, group_.backend, device_.str(), data_->Describe(),
        split_.held_out.empty()
            ? std::string()
            : absl::StrCat("; ", split_.held_out.size(), " held out for evaluation"),
        summary_.run_id,
        lineage_.code_revision().empty() ? std::string() : ", code " + lineage_.code_revision(),
        summary_.resumed_from ? "resuming " + FormatVersionRef(*summary_.resumed_from)
                              : std::string("starting fresh"),
        loop_.global_step, loop_.target_step, steps_per_epoch, config_.batch_size,
        config_.accumulation_steps, summary_.store_location);
  }
  return absl::OkStatus();
}

uint64_t RankRun::StateDigest() const {
  const ddp::ReplicaTensors replica = model_->Replica();
  std::vector<at::Tensor> tensors = replica.parameters;
  for (const at::Tensor& buffer : replica.buffers()) tensors.push_back(buffer);
  XXH64_hash_t digest = 0;
  for (const at::Tensor& tensor : tensors) {
    const at::Tensor bytes = tensor.detach().to(at::kCPU).contiguous();
    digest = XXH3_64bits_withSeed(bytes.data_ptr(), bytes.nbytes(), digest);
  }
  return digest;
}

absl::StatusOr<double> RankRun::TrainStep(const std::vector<std::vector<int64_t>>& micro_batches) {
  return CatchTorchErrors([&] {
    model_->SetTraining(true);
    optimizer_->zero_grad();
    double loss_sum = 0;
    const double scale = 1.0 / static_cast<double>(micro_batches.size());
    for (size_t i = 0; i < micro_batches.size(); ++i) {
      std::vector<int64_t> examples;
      examples.reserve(micro_batches[i].size());
      for (int64_t index : micro_batches[i]) examples.push_back(split_.train[index]);
      Batch batch = data_->Get(examples);
      std::optional<ddp::DistributedDataParallel::NoSyncGuard> no_sync;
      if (i + 1 < micro_batches.size()) no_sync.emplace(data_parallel_->NoSync());
      data_parallel_->PrepareForward();
      at::Tensor loss = model_->Loss(batch.inputs.to(device_), batch.targets.to(device_)).loss;
      TORCH_CHECK(loss.defined() && loss.dim() == 0 && at::isFloatingType(loss.scalar_type()),
                  "the loss at step ", loop_.global_step + 1, " is ", DescribeTensor(loss),
                  ", not a floating-point scalar: reduce it (e.g. .mean()) before returning it");
      (micro_batches.size() > 1 ? loss * scale : loss).backward();
      loss_sum += loss.item<double>();
    }
    data_parallel_->FinishGradientSync();
    if (config_.clip_grad_norm > 0) {
      torch::nn::utils::clip_grad_norm_(parameters_, config_.clip_grad_norm);
    }
    // The last checkpoint may still be copying the parameters and optimizer state this step
    // writes; it has had the forward and backward passes to finish.
    if (checkpointer_ != nullptr) checkpointer_->BeforeOptimizerStep();
    optimizer_->step();
    scheduler_->Step();
    return loss_sum * scale;
  });
}

absl::Status RankRun::TrainLoop() {
  start_ = absl::Now();
  first_step_ = loop_.global_step;
  last_checkpoint_step_ = summary_.resumed_from ? loop_.global_step : -1;
  bool stop = false;
  while (loop_.global_step < loop_.target_step && !stop) {
    // One optimizer step: accumulation_steps micro-batches (fewer at the end of an epoch), all
    // but the last inside NoSync so only the last backward pass communicates.
    std::vector<std::vector<int64_t>> micro_batches;
    for (int64_t i = 0; i < config_.accumulation_steps; ++i) {
      std::vector<int64_t> indices = sampler_->NextBatch(config_.batch_size);
      if (indices.empty()) break;
      micro_batches.push_back(std::move(indices));
    }
    if (micro_batches.empty()) {  // epoch end (its checkpoint was taken with its last step).
      ++loop_.epoch;
      sampler_->set_epoch(loop_.epoch);
      sampler_->set_position(0);
      continue;
    }
    ASSIGN_OR_RETURN(const double step_loss, TrainStep(micro_batches));
    ++loop_.global_step;
    if (config_.log_state_digests) {
      ASSIGN_OR_RETURN(const uint64_t digest, CatchTorchErrors([&] { return StateDigest(); }));
      std::cerr << absl::StrFormat("trainer: rank %d step %d state %016x\n", group_.rank,
                                   loop_.global_step, digest);
    }
    loop_.sampler_position = sampler_->position();
    const bool epoch_end = sampler_->position() >= sampler_->num_samples();
    if (epoch_end) {  // the checkpoint should continue with the next epoch.
      ++loop_.epoch;
      loop_.sampler_position = 0;
      sampler_->set_epoch(loop_.epoch);
      sampler_->set_position(0);
    }

    ASSIGN_OR_RETURN(StepConsensus consensus, CatchTorchErrors([&] {
                       return AgreeOnStep(group_.comm, step_loss, control_.pending());
                     }));
    last_loss_ = consensus.mean_loss;
    if (!std::isfinite(last_loss_)) {
      // Every rank sees the same mean, so all stop here together; the state this step made is
      // never checkpointed (an upload of an earlier step still completes).
      const std::string latest =
          !summary_.versions_written.empty() ? FormatVersionRef(summary_.versions_written.back())
          : summary_.resumed_from             ? FormatVersionRef(*summary_.resumed_from)
                                              : std::string("none");
      return absl::FailedPreconditionError(absl::StrFormat(
          "the loss at step %d is %f (mean over %d rank(s)): training stopped without "
          "checkpointing that state, so the latest good version stays the model's latest (%s, "
          "or one whose upload was in flight). Lower the learning rate, clip gradients, or check "
          "the data for NaN / inf.",
          loop_.global_step, last_loss_, group_.world_size, latest));
    }
    stop = consensus.stop;
    skip_final_checkpoint_ = consensus.skip_checkpoint;

    const absl::Duration elapsed = absl::Now() - start_;
    const int64_t steps_done = loop_.global_step - first_step_;
    samples_per_second_ = steps_done * config_.batch_size * config_.accumulation_steps *
                          group_.world_size / std::max(absl::ToDoubleSeconds(elapsed), 1e-9);
    const bool last_step = loop_.global_step == loop_.target_step;
    if (steps_done % std::max<int64_t>(config_.log_every, 1) == 0 || last_step) {
      summary_.loss_curve.emplace_back(loop_.global_step, last_loss_);
    }
    // Every rank knows whether a checkpoint is due (all inputs are agreed), so all can evaluate.
    const bool periodic =
        config_.checkpoint_every > 0 && loop_.global_step % config_.checkpoint_every == 0;
    const bool final = last_step || (consensus.stop && !skip_final_checkpoint_);
    const bool checkpoint_due = periodic || (epoch_end && config_.checkpoint_at_epoch_end) ||
                                consensus.checkpoint_now || final;
    if (checkpoint_due) RETURN_IF_ERROR(Evaluate());
    if (leader_) {
      RETURN_IF_ERROR(AfterStep(consensus, checkpoint_due, final, last_step, steps_done, elapsed));
    }
    if (checkpoint_due) last_checkpoint_step_ = loop_.global_step;
  }
  if (config_.progress_line && leader_) std::cerr << "\n";
  return absl::OkStatus();
}

absl::Status RankRun::AfterStep(const StepConsensus& consensus, bool checkpoint_due, bool final,
                                bool last_step, int64_t steps_done, absl::Duration elapsed) {
  const double seconds_per_step = absl::ToDoubleSeconds(elapsed) / steps_done;
  const absl::Duration eta =
      absl::Seconds(seconds_per_step * (loop_.target_step - loop_.global_step));
  const std::string line =
      absl::StrFormat("epoch %d  step %d/%d  loss %.4f  lr %.3g  %.0f samples/s  ETA %s",
                      loop_.epoch, loop_.global_step, loop_.target_step, last_loss_,
                      CurrentLearningRate(*optimizer_), samples_per_second_, FormatClock(eta));
  if (config_.progress_line) {
    std::cerr << "\r\x1b[K" << line << std::flush;
  } else if (steps_done % std::max<int64_t>(config_.log_every, 1) == 0 || last_step) {
    std::cerr << "trainer: " << line << "\n";
  }
  status_.set_epoch(loop_.epoch);
  status_.set_global_step(loop_.global_step);
  status_.set_loss(last_loss_);
  status_.set_samples_per_second(samples_per_second_);
  if (!summary_.versions_written.empty()) {
    *status_.mutable_last_committed_version() = summary_.versions_written.back();
  }
  control_.SetStatus(status_);

  if (!checkpoint_due) return absl::OkStatus();
  status_.set_state(v1::TrainerStatus::STATE_CHECKPOINTING);
  control_.SetStatus(status_);
  // A requested or final checkpoint is waited for; the others upload in the background.
  absl::Status taken = TakeCheckpoint(
      /*wait=*/consensus.checkpoint_now || final || config_.synchronous_checkpoints);
  if (taken.ok() && failed_checkpoint_step_ == loop_.global_step &&
      (consensus.checkpoint_now || final)) {
    // Trained past in the middle of a run, but not when a client waits for this very version or
    // when it is the run's result.
    taken = last_checkpoint_error_;
  }
  if (!taken.ok()) {
    control_.CheckpointFinished(taken);
    return absl::Status(taken.code(), absl::StrCat("checkpoint at step ", loop_.global_step,
                                                   " failed: ", taken.message()));
  }
  if ((consensus.checkpoint_now || final) && !summary_.versions_written.empty()) {
    control_.CheckpointFinished(summary_.versions_written.back());
  }
  status_.set_state(v1::TrainerStatus::STATE_TRAINING);
  if (!summary_.versions_written.empty()) {
    *status_.mutable_last_committed_version() = summary_.versions_written.back();
  }
  control_.SetStatus(status_);
  return absl::OkStatus();
}

void RankRun::RecordCommitted() {
  std::optional<CommitResult> last = checkpointer_->stats().last_commit;
  if (!last) return;
  if (summary_.versions_written.empty() ||
      summary_.versions_written.back().version() != last->version.version()) {
    summary_.versions_written.push_back(last->version);
    consecutive_failed_checkpoints_ = 0;
  }
}

absl::Status RankRun::CheckpointFailed(const absl::Status& error) {
  ++summary_.failed_checkpoints;
  ++consecutive_failed_checkpoints_;
  summary_.last_checkpoint_error = error.ToString();
  last_checkpoint_error_ = error;
  if (consecutive_failed_checkpoints_ >= config_.max_consecutive_failed_checkpoints) {
    return absl::Status(error.code(),
                        absl::StrCat(consecutive_failed_checkpoints_,
                                     " checkpoints in a row failed, the last: ", error.message(),
                                     "; stopping rather than training on with nothing saved "
                                     "(max_failed_checkpoints)"));
  }
  std::cerr << "trainer: a checkpoint failed (" << consecutive_failed_checkpoints_
            << " in a row; training goes on, the next one retries): " << error << "\n";
  return absl::OkStatus();
}

absl::Status RankRun::TakeCheckpoint(bool wait) {
  CheckpointContents contents;
  contents.model = model_->Weights();
  ASSIGN_OR_RETURN(Value optimizer_state, OptimizerStateDict(*optimizer_));
  contents.optimizer = std::move(optimizer_state);
  contents.scheduler = scheduler_->StateDict();
  contents.optimizer_param_names = model_->OptimizerParamNames();
  TrainerState state;
  state.epoch = loop_.epoch;
  state.sampler_position = loop_.sampler_position;
  state.global_step = loop_.global_step;
  state.target_step = loop_.target_step;
  state.world_size = group_.world_size;
  state.backend = group_.backend;
  state.seed = config_.seed;
  state.batch_size = config_.batch_size;
  state.accumulation_steps = config_.accumulation_steps;
  state.model = config_.model;
  state.data = config_.data.source;
  state.eval_fraction = config_.eval_fraction;
  ASSIGN_OR_RETURN(state.rng_cpu, CatchTorchErrors([&] {
                     at::Generator generator = at::detail::getDefaultCPUGenerator();
                     std::lock_guard<std::mutex> lock(generator.mutex());
                     return generator.get_state();
                   }));
  if (device_.type() != at::kCPU) {
    ASSIGN_OR_RETURN(state.rng_device, CatchTorchErrors([&] {
                       at::Generator generator = at::globalContext().defaultGenerator(device_);
                       std::lock_guard<std::mutex> lock(generator.mutex());
                       return generator.get_state();
                     }));
  }
  contents.extra = EncodeTrainerState(state);
  v1::VersionMetadata& metadata = contents.metadata;
  metadata.set_epoch(loop_.epoch);
  metadata.set_global_step(loop_.global_step);
  (*metadata.mutable_metrics())["loss"] = last_loss_;
  (*metadata.mutable_metrics())["samples_per_second"] = samples_per_second_;
  (*metadata.mutable_metrics())["learning_rate"] = CurrentLearningRate(*optimizer_);
  if (eval_) {
    (*metadata.mutable_metrics())["val_loss"] = eval_->loss;
    (*metadata.mutable_metrics())["val_acc"] = eval_->accuracy;
  }
  *metadata.mutable_lineage() = lineage_;
  metadata.set_world_size(group_.world_size);
  metadata.set_backend(group_.backend);
  metadata.set_source_format("trainer");
  char host[256] = {};
  gethostname(host, sizeof(host) - 1);
  metadata.set_producer(absl::StrCat("ckpt trainer on ", host));
  (*metadata.mutable_labels())["model_kind"] = config_.model.kind;
  (*metadata.mutable_labels())["data"] = config_.data.source;
  (*metadata.mutable_labels())[identity_.label] = identity_.value;
  if (config_.model.kind == kTorchScriptKind) {
    (*metadata.mutable_labels())["model_file"] = config_.model.path;
  }
  metadata.set_description(absl::StrCat(config_.model.kind, " step ", loop_.global_step, " epoch ",
                                        loop_.epoch, " loss ", last_loss_));
  CommitOptions options;
  options.attribution.reason = absl::StrCat("checkpoint at epoch ", loop_.epoch, " step ",
                                            loop_.global_step, " of run ", summary_.run_id);
  // The previous upload first (Submit would wait for it as well, and the stall counts it just
  // the same): its failure is that checkpoint's, reported before this one is taken.
  const absl::Time join_start = absl::Now();
  const absl::Status previous = checkpointer_->Wait().status();
  upload_waits_ += absl::Now() - join_start;
  RecordCommitted();
  if (!previous.ok()) RETURN_IF_ERROR(CheckpointFailed(previous));
  // Parameters and optimizer state are copied while the next step's forward and backward passes
  // run; TrainStep's guard waits for them before the optimizer writes them.
  const std::vector<at::Tensor> step_writes = StepWrites(*optimizer_, *contents.optimizer);
  if (absl::Status submitted =
          checkpointer_->SubmitOverlapped(contents, std::move(options), step_writes);
      !submitted.ok()) {
    failed_checkpoint_step_ = loop_.global_step;
    return CheckpointFailed(submitted);
  }
  if (wait) {
    const absl::Time wait_start = absl::Now();
    const absl::Status uploaded = checkpointer_->Wait().status();
    if (config_.synchronous_checkpoints) upload_waits_ += absl::Now() - wait_start;
    RecordCommitted();
    if (!uploaded.ok()) {
      failed_checkpoint_step_ = loop_.global_step;
      return CheckpointFailed(uploaded);
    }
  }
  return absl::OkStatus();
}

absl::Status RankRun::Finish() {
  std::optional<v1::VersionRef> final_version;
  // e.g. a zero-step leg; known on every rank, which all evaluate for it.
  const bool final_due = last_checkpoint_step_ != loop_.global_step && !skip_final_checkpoint_;
  if (final_due) RETURN_IF_ERROR(Evaluate());
  if (leader_) {
    if (final_due) {
      RETURN_IF_ERROR(TakeCheckpoint(/*wait=*/true));
      if (failed_checkpoint_step_ == loop_.global_step) {
        return absl::Status(last_checkpoint_error_.code(),
                            absl::StrCat("the final checkpoint at step ", loop_.global_step,
                                         " failed: ", last_checkpoint_error_.message()));
      }
    }
    ASSIGN_OR_RETURN(std::optional<CommitResult> last, checkpointer_->Wait());
    RecordCommitted();
    if (!skip_final_checkpoint_ && last) final_version = last->version;
    summary_.checkpoint_stall = checkpointer_->stats().total_stall + upload_waits_;
  }
  // Nobody leaves before rank 0's store has committed: the other ranks may still be reading it.
  RETURN_IF_ERROR(CatchTorchErrors([&] { group_.comm.Barrier(); }));
  status_.set_state(v1::TrainerStatus::STATE_FINISHED);
  control_.SetStatus(status_);
  control_.Finished(final_version);

  summary_.final_step = loop_.global_step;
  summary_.final_epoch = loop_.epoch;
  summary_.stopped_early = loop_.global_step < loop_.target_step;
  summary_.wall_time = absl::Now() - start_;
  summary_.samples_per_second = samples_per_second_;
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
    absl::StrAppendFormat(&out,
                          "   held out (%d examples) at step %d: val_loss %.4f  val_acc %.4f\n",
                          summary.last_eval->examples, summary.last_eval->global_step,
                          summary.last_eval->loss, summary.last_eval->accuracy);
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

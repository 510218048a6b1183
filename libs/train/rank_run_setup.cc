// RankRun's set-up: device, data, model, optimizer and scheduler; the version to resume from and
// everything it restores; lineage; DDP and the sampler.

#include <unistd.h>

#include <algorithm>
#include <iostream>
#include <mutex>

#include "ATen/CPUGeneratorImpl.h"
#include "ATen/Context.h"
#include "ATen/Parallel.h"
#include "ATen/core/Tensor.h"
#include "ATen/core/grad_mode.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "libs/status/status_macros.h"
#include "libs/status/torch_status.h"
#include "libs/store/read_checkpoint.h"
#include "libs/store/version_ref.h"
#include "libs/train/lineage.h"
#include "libs/train/rank_run.h"
#include "libs/train/scripted_model.h"
#include "libs/train/trainer_state.h"
#include "torch/version.h"

namespace ckpt::train::internal {
namespace {

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

}  // namespace

absl::Status RankRun::Build() {
  at::set_num_threads(config_.threads_per_rank);
  if (config_.device == "cuda") {
    if (!at::hasCUDA()) {
      return absl::FailedPreconditionError(
          "device cuda, but this build of LibTorch has no CUDA: build with --config=cuda "
          "against a CUDA LibTorch (docs/gpu.md, \"Building with CUDA (Bazel)\")");
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
  if (config_.zero_stage == 1) {
    ASSIGN_OR_RETURN(zero_, ZeroOptimizer::Create(config_.optimizer, parameters_, group_.comm));
  } else {
    ASSIGN_OR_RETURN(optimizer_, MakeOptimizer(config_.optimizer, parameters_));
  }
  ASSIGN_OR_RETURN(scheduler_, MakeScheduler(config_.scheduler, Optimizer()));
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
  const v1::VersionRef ref = MakeVersionRef(summary_.model_name, version);
  RETURN_IF_ERROR(RestoreFrom(ref));
  if (config_.log_state_digests) {
    // Each rank read the version from the store itself; this shows it holds the saved state,
    // whatever world size wrote it (compare with the saving run's "step N state" line).
    ASSIGN_OR_RETURN(const uint64_t digest, StateDigest());
    std::cerr << absl::StrFormat("trainer: rank %d restored %s state %016x\n", group_.rank,
                                 FormatVersionRef(ref), digest);
  }
  return absl::OkStatus();
}

absl::Status RankRun::RestoreFrom(const v1::VersionRef& ref) {
  const std::string name = FormatVersionRef(ref);
  // Every rank reads the version from the store itself; a ZeRO-1 rank reads only its slices of
  // the optimizer state (ZeroOptimizer::LoadStateFrom), from this same reader.
  ASSIGN_OR_RETURN(const std::unique_ptr<VersionReader> reader, store_.OpenVersion(ref));
  ReadCheckpointOptions read_options;
  read_options.optimizer_state = zero_ == nullptr;
  ASSIGN_OR_RETURN(LoadedCheckpoint loaded, ReadCheckpoint(*reader, read_options));
  const bool has_optimizer_state = zero_ != nullptr ? loaded.manifest.has_optimizer_state()
                                                    : loaded.contents.optimizer.has_value();
  const auto& labels = loaded.manifest.metadata().labels();
  for (const char* label : {"python_twin", "torchscript_class"}) {
    auto saved = labels.find(label);
    if (saved == labels.end()) continue;
    if (identity_.label != label || saved->second != identity_.value) {
      return absl::FailedPreconditionError(
          absl::StrCat(name, " holds a ", saved->second, " but this run builds a ", identity_.value,
                       ". Train under another model_name, or set resume to false to start over."));
    }
  }
  RETURN_IF_ERROR(RestoreModel(loaded.contents.model, *model_, name));
  if (!has_optimizer_state || !loaded.contents.scheduler) {
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
  // With ZeRO-1 each rank reads its slices of the logical state, whatever world size wrote it.
  RETURN_IF_ERROR(zero_ != nullptr
                      ? zero_->LoadStateFrom(*reader)
                      : LoadOptimizerStateDict(*optimizer_, *loaded.contents.optimizer));
  if (loop_.global_step < loop_.target_step) {
    // An interrupted leg continues exactly where it was.
    RETURN_IF_ERROR(scheduler_->LoadStateDict(*loaded.contents.scheduler));
  } else {
    // A finished leg (its schedule ran out, e.g. cosine down to 0): the new leg keeps the
    // weights and optimizer moments but starts a fresh schedule from the configured rate.
    for (auto& param_group : Optimizer().param_groups()) {
      param_group.options().set_lr(config_.optimizer.lr);
    }
    ASSIGN_OR_RETURN(scheduler_, MakeScheduler(config_.scheduler, Optimizer()));
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

std::vector<int64_t> RankRun::TrainingExamplesPerShard(
    const std::vector<int64_t>& shard_sizes) const {
  // split_.train is ascending, so each shard's training examples are one run of it.
  std::vector<int64_t> counts;
  auto from = split_.train.begin();
  int64_t shard_end = 0;
  for (int64_t size : shard_sizes) {
    shard_end += size;
    auto to = std::lower_bound(from, split_.train.end(), shard_end);
    counts.push_back(static_cast<int64_t>(to - from));
    from = to;
  }
  return counts;
}

absl::Status RankRun::SetUpDataParallel() {
  ddp::DataParallelOptions ddp_options;
  ddp_options.bucket_cap_bytes = config_.bucket_cap_bytes;
  ASSIGN_OR_RETURN(data_parallel_, CatchTorchErrors([&] {
                     return std::make_unique<ddp::DistributedDataParallel>(
                         model_->Replica(), group_.comm, ddp_options);
                   }));
  ASSIGN_OR_RETURN(
      sampler_, CatchTorchErrors([&] {
        auto sampler = std::make_unique<ddp::DistributedSampler>(
            static_cast<int64_t>(split_.train.size()), group_.rank, group_.world_size,
            config_.shuffle, config_.seed, config_.drop_last);
        // Data in shards: each rank reads a shard at a time (the sampler shuffles the training
        // examples of each shard as a block, and the blocks' order).
        const std::vector<int64_t> shard_sizes = data_->shard_sizes();
        if (!shard_sizes.empty()) sampler->set_block_sizes(TrainingExamplesPerShard(shard_sizes));
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
  shared_checkpoints_ = config_.parallel_checkpoints && group_.world_size > 1;
  if (leader_ || shared_checkpoints_) {
    checkpointer_ = std::make_unique<AsyncCheckpointer>(&store_, summary_.model_name);
  }

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

}  // namespace ckpt::train::internal

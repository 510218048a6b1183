#include "libs/train/trainer.h"

#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <iostream>
#include <memory>
#include <mutex>
#include <random>
#include <sstream>
#include <utility>

#include "ATen/ATen.h"
#include "ATen/CPUGeneratorImpl.h"
#include "ATen/Context.h"
#include "ATen/Parallel.h"
#include "ATen/core/grad_mode.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "libs/client/remote_checkpoint_store.h"
#include "libs/ddp/distributed_data_parallel.h"
#include "libs/ddp/distributed_sampler.h"
#include "libs/rpc/grpc_server.h"
#include "libs/status/status_macros.h"
#include "libs/status/torch_status.h"
#include "libs/store/rocksdb_checkpoint_store.h"
#include "libs/store/version_ref.h"
#include "libs/train/async_checkpointer.h"
#include "services/checkpoint_store/store_service.h"
#include "torch/nn/utils/clip_grad.h"

namespace ckpt::train {
namespace {

constexpr char kExtraKey[] = "trainer";

// Where the data continues and how the run was set up: what a checkpoint needs beyond the model,
// optimizer and scheduler.
struct LoopState {
  int64_t epoch = 0;
  int64_t sampler_position = 0;  // samples of `epoch` each rank has consumed.
  int64_t global_step = 0;
  int64_t target_step = 0;
};

// Copies a checkpoint's model tensors into `module` (strict: same keys, same shapes).
absl::Status RestoreModule(const StateDict& checkpoint, torch::nn::Module& module,
                           const std::string& version) {
  StateDict live = ModelStateDict(module);
  std::vector<std::string> problems;
  for (const StateDict::Entry& entry : live) {
    const at::Tensor* saved = checkpoint.Find(entry.key);
    if (saved == nullptr) {
      problems.push_back("missing " + entry.key);
    } else if (saved->sizes() != entry.tensor.sizes()) {
      problems.push_back(absl::StrCat(entry.key, ": ", c10::str(saved->sizes()),
                                      " in checkpoint, ", c10::str(entry.tensor.sizes()),
                                      " in model"));
    }
  }
  for (const StateDict::Entry& entry : checkpoint) {
    if (!live.contains(entry.key)) problems.push_back("unexpected " + entry.key);
  }
  if (!problems.empty()) {
    return absl::FailedPreconditionError(absl::StrCat(
        version, " does not fit this model (", absl::StrJoin(problems, "; "),
        "). Train under another --model_name, or pass --noresume to start over."));
  }
  return CatchTorchErrors([&] {
    at::NoGradGuard no_grad;
    for (const StateDict::Entry& entry : live) {
      entry.tensor.copy_(*checkpoint.Find(entry.key));
    }
  });
}

std::string RandomToken() {
  std::random_device device;
  std::string token;
  for (int i = 0; i < 4; ++i) absl::StrAppend(&token, absl::Hex(device(), absl::kZeroPad8));
  return token;
}

int64_t IntField(const Value& dict, const char* key, int64_t fallback) {
  const Value* value = dict.Find(key);
  return value != nullptr && value->is_int() ? value->int_value() : fallback;
}

// The per-step collective: mean loss plus control flags, so every rank agrees on when to stop
// and checkpoint without an extra round trip.
struct StepConsensus {
  double mean_loss = 0;
  bool stop = false;
  bool skip_checkpoint = false;
  bool checkpoint_now = false;
};

StepConsensus AgreeOnStep(c10d::ProcessGroup& group, double loss,
                          const TrainerControl::Requests& requests) {
  at::Tensor values = at::tensor({loss, requests.stop ? 1.0 : 0.0,
                                  requests.skip_checkpoint ? 1.0 : 0.0,
                                  requests.checkpoint ? 1.0 : 0.0},
                                 at::kDouble);
  std::vector<at::Tensor> tensors = {values};
  group.allreduce(tensors)->wait();
  StepConsensus consensus;
  consensus.mean_loss = values[0].item<double>() / group.getSize();
  consensus.stop = values[1].item<double>() > 0;
  consensus.skip_checkpoint = values[2].item<double>() > 0;
  consensus.checkpoint_now = values[3].item<double>() > 0;
  return consensus;
}

std::string FormatClock(absl::Duration duration) {
  const int64_t seconds = absl::ToInt64Seconds(duration);
  return absl::StrFormat("%d:%02d:%02d", seconds / 3600, (seconds / 60) % 60, seconds % 60);
}

// The stores a rank uses: rank 0 may own an embedded RocksDB store and serve it to the others.
struct RankStores {
  std::unique_ptr<RocksDbCheckpointStore> embedded;
  std::unique_ptr<StoreService> service;
  std::unique_ptr<GrpcServer> server;
  std::unique_ptr<RemoteCheckpointStore> remote;
  CheckpointStore* store = nullptr;
  std::string location;

  ~RankStores() {
    if (server != nullptr) server->Shutdown(absl::Seconds(5));
    server.reset();
    service.reset();
  }
};

absl::Status OpenStores(const TrainerConfig& config, const ddp::ProcessGroupHandle& group,
                        RankStores& stores) {
  RemoteStoreOptions remote_options;
  if (!config.store_address.empty()) {
    remote_options.address = config.store_address;
    remote_options.auth_token = config.store_auth_token;
    ASSIGN_OR_RETURN(stores.remote, RemoteCheckpointStore::Connect(remote_options));
    stores.store = stores.remote.get();
    stores.location = config.store_address;
    return absl::OkStatus();
  }
  // Embedded: RocksDB admits one process, so rank 0 opens it and lends it to the others.
  std::string shared_address;
  if (group.rank == 0) {
    StoreOptions store_options;
    store_options.db_path = config.store_dir;
    store_options.create_if_missing = true;
    ASSIGN_OR_RETURN(stores.embedded, RocksDbCheckpointStore::Open(store_options));
    stores.store = stores.embedded.get();
    char resolved[PATH_MAX];
    stores.location =
        realpath(config.store_dir.c_str(), resolved) != nullptr ? resolved : config.store_dir;
    if (group.world_size > 1) {
      StoreServiceOptions service_options;
      service_options.auth_token = RandomToken();
      service_options.worker_threads = 2;
      ASSIGN_OR_RETURN(stores.service,
                       StoreService::Create(stores.embedded.get(), service_options));
      GrpcServerOptions server_options;
      server_options.listen_address = "0.0.0.0:0";
      ASSIGN_OR_RETURN(stores.server,
                       GrpcServer::Start(server_options,
                                         {{stores.service.get(), "ckpt.v1.CheckpointStore"}}));
      shared_address = absl::StrCat(config.rendezvous.master_addr, ":", stores.server->port(),
                                    " ", service_options.auth_token);
    }
  }
  if (group.world_size > 1) {
    ASSIGN_OR_RETURN(shared_address, CatchTorchErrors([&] {
                       return ddp::BroadcastString(*group.group, shared_address);
                     }));
  }
  if (group.rank != 0) {
    const size_t space = shared_address.find(' ');
    remote_options.address = shared_address.substr(0, space);
    remote_options.auth_token = shared_address.substr(space + 1);
    ASSIGN_OR_RETURN(stores.remote, RemoteCheckpointStore::Connect(remote_options));
    stores.store = stores.remote.get();
    stores.location = config.store_dir;
  }
  return absl::OkStatus();
}

Value ModelSpecValue(const ModelSpec& spec) {
  return Value::Dict({{"kind", Value::String(spec.kind)},
                      {"hidden", Value::Int(spec.hidden)},
                      {"layers", Value::Int(spec.layers)},
                      {"heads", Value::Int(spec.heads)}});
}

}  // namespace

absl::StatusOr<TrainingSummary> RunTrainingRank(const TrainerConfig& config,
                                                TrainerControl* control) {
  TrainerControl local_control;
  if (control == nullptr) control = &local_control;
  if (config.batch_size <= 0) return absl::InvalidArgumentError("--batch_size must be positive");
  if (config.accumulation_steps <= 0) {
    return absl::InvalidArgumentError("--accumulation_steps must be positive");
  }
  if (config.steps < 0) return absl::InvalidArgumentError("--steps must be >= 0");

  at::set_num_threads(config.threads_per_rank);
  at::Device device(at::kCPU);
  if (config.device == "cuda") {
    if (!at::hasCUDA()) {
      return absl::FailedPreconditionError(
          "--device=cuda, but this build of LibTorch has no CUDA: build with --config=cuda "
          "against a CUDA LibTorch (README, \"CUDA\")");
    }
    device = at::Device(at::kCUDA, static_cast<c10::DeviceIndex>(config.local_rank));
  } else if (config.device != "cpu") {
    return absl::InvalidArgumentError(
        absl::StrCat("--device must be cpu or cuda, not \"", config.device, "\""));
  }

  TrainingSummary summary;
  ASSIGN_OR_RETURN(ddp::ProcessGroupHandle group, CatchTorchErrors([&] {
                     return ddp::InitProcessGroup(config.rendezvous);
                   }, absl::StatusCode::kUnavailable));
  summary.world_size = group.world_size;
  summary.backend = group.backend;
  const bool leader = group.rank == 0;

  RankStores stores;
  RETURN_IF_ERROR(OpenStores(config, group, stores));
  summary.store_location = stores.location;

  // Data and model: every rank builds the same model from the same seed.
  ASSIGN_OR_RETURN(std::unique_ptr<Dataset> data, OpenDataset(config.data));
  at::manual_seed(config.seed);
  ASSIGN_OR_RETURN(std::shared_ptr<Model> model, MakeModel(config.model, *data));
  std::string data_kind = config.data.source.substr(0, config.data.source.find(':'));
  summary.model_name =
      config.model_name.empty() ? absl::StrCat(config.model.kind, "-", data_kind)
                                : config.model_name;
  summary.python_twin = model->PythonTwin();
  RETURN_IF_ERROR(CatchTorchErrors([&] { model->to(device); }));

  std::vector<at::Tensor> parameters = model->parameters();
  ASSIGN_OR_RETURN(std::unique_ptr<torch::optim::Optimizer> optimizer,
                   MakeOptimizer(config.optimizer, parameters));
  ASSIGN_OR_RETURN(std::unique_ptr<LrScheduler> scheduler,
                   MakeScheduler(config.scheduler, *optimizer));

  // ---- Resume: rank 0 picks the version, every rank loads that one.
  LoopState loop;
  std::string resume_version;
  if (leader && config.resume) {
    absl::StatusOr<v1::Manifest> latest =
        stores.store->GetManifest(*ParseVersionRef(summary.model_name));
    if (latest.ok()) {
      resume_version = std::to_string(latest->version());
    } else if (latest.status().code() != absl::StatusCode::kNotFound) {
      return latest.status();
    }
  }
  if (group.world_size > 1) {
    ASSIGN_OR_RETURN(resume_version, CatchTorchErrors([&] {
                       return ddp::BroadcastString(*group.group, resume_version);
                     }));
  }
  if (!resume_version.empty()) {
    int64_t version = 0;
    if (!absl::SimpleAtoi(resume_version, &version)) {
      return absl::InternalError("rank 0 sent a malformed version: " + resume_version);
    }
    const v1::VersionRef ref = MakeVersionRef(summary.model_name, version);
    const std::string name = FormatVersionRef(ref);
    ASSIGN_OR_RETURN(LoadedCheckpoint loaded, stores.store->LoadCheckpoint(ref));
    const auto& labels = loaded.manifest.metadata().labels();
    if (auto twin = labels.find("python_twin");
        twin != labels.end() && twin->second != summary.python_twin) {
      return absl::FailedPreconditionError(absl::StrCat(
          name, " holds a ", twin->second, " but this run builds a ", summary.python_twin,
          ". Train under another --model_name, or pass --noresume to start over."));
    }
    RETURN_IF_ERROR(RestoreModule(loaded.contents.model, *model, name));
    if (!loaded.contents.optimizer || !loaded.contents.scheduler) {
      return absl::FailedPreconditionError(absl::StrCat(
          name, " has no optimizer or scheduler state (retention may have dropped it), so it "
                "cannot be resumed exactly; pass --noresume to start over from scratch"));
    }
    const Value* extra = loaded.contents.extra.is_dict()
                             ? loaded.contents.extra.Find(kExtraKey)
                             : nullptr;
    if (extra == nullptr || !extra->is_dict()) {
      return absl::FailedPreconditionError(
          absl::StrCat(name, " was not written by the trainer (no extra.trainer state)"));
    }
    loop.epoch = IntField(*extra, "epoch", 0);
    loop.sampler_position = IntField(*extra, "sampler_position", 0);
    loop.global_step = IntField(*extra, "global_step", 0);
    loop.target_step = IntField(*extra, "target_step", loop.global_step);
    RETURN_IF_ERROR(LoadOptimizerStateDict(*optimizer, *loaded.contents.optimizer));
    if (loop.global_step < loop.target_step) {
      // An interrupted leg continues exactly where it was.
      RETURN_IF_ERROR(scheduler->LoadStateDict(*loaded.contents.scheduler));
    } else {
      // A finished leg (its schedule ran out, e.g. cosine down to 0): the new leg keeps the
      // weights and optimizer moments but starts a fresh schedule from the configured rate.
      for (auto& group : optimizer->param_groups()) group.options().set_lr(config.optimizer.lr);
      ASSIGN_OR_RETURN(scheduler, MakeScheduler(config.scheduler, *optimizer));
      if (leader) {
        std::cerr << "trainer: " << name << " ended its run at step " << loop.global_step
                  << "; training " << config.steps
                  << " more steps with a fresh learning-rate schedule\n";
      }
    }
    const int64_t saved_world = IntField(*extra, "world_size", group.world_size);
    if (saved_world != group.world_size) {
      // Positions are per rank: keep the number of samples consumed across all ranks.
      loop.sampler_position = loop.sampler_position * saved_world / group.world_size;
      if (leader) {
        std::cerr << "trainer: " << name << " was written by " << saved_world
                  << " ranks, this run has " << group.world_size
                  << "; the epoch continues at the same global sample count\n";
      }
    }
    if (const Value* rng = extra->Find("rng_cpu"); rng != nullptr && rng->is_tensor()) {
      RETURN_IF_ERROR(CatchTorchErrors([&] {
        at::Generator generator = at::detail::getDefaultCPUGenerator();
        std::lock_guard<std::mutex> lock(generator.mutex());
        generator.set_state(rng->tensor());
      }));
    }
    summary.resumed_from = ref;
    summary.start_step = loop.global_step;
  }
  loop.target_step = loop.global_step < loop.target_step ? loop.target_step
                                                         : loop.global_step + config.steps;
  summary.target_step = loop.target_step;

  // ---- DDP and the sampler.
  ddp::DataParallelOptions ddp_options;
  ddp_options.bucket_cap_bytes = config.bucket_cap_bytes;
  ASSIGN_OR_RETURN(std::unique_ptr<ddp::DistributedDataParallel> data_parallel, CatchTorchErrors([&] {
                     return std::make_unique<ddp::DistributedDataParallel>(model, group.group,
                                                                           ddp_options);
                   }));
  ASSIGN_OR_RETURN(std::unique_ptr<ddp::DistributedSampler> sampler, CatchTorchErrors([&] {
                     auto sampler = std::make_unique<ddp::DistributedSampler>(
                         data->size(), group.rank, group.world_size, config.shuffle, config.seed,
                         config.drop_last);
                     sampler->set_epoch(loop.epoch);
                     sampler->set_position(std::min(loop.sampler_position,
                                                    sampler->num_samples()));
                     return sampler;
                   }));
  const int64_t samples_per_step = config.batch_size * config.accumulation_steps;
  const int64_t steps_per_epoch = (sampler->num_samples() + samples_per_step - 1) / samples_per_step;
  if (steps_per_epoch == 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the data set (", data->size(), " examples) gives no batches to ", group.world_size,
        " ranks with drop_last"));
  }

  // ---- Checkpoints (rank 0).
  std::unique_ptr<AsyncCheckpointer> checkpointer;
  if (leader) checkpointer = std::make_unique<AsyncCheckpointer>(stores.store, summary.model_name);
  double last_loss = 0;
  double samples_per_second = 0;
  auto record_committed = [&] {
    std::optional<CommitResult> last = checkpointer->stats().last_commit;
    if (!last) return;
    if (summary.versions_written.empty() ||
        summary.versions_written.back().version() != last->version.version()) {
      summary.versions_written.push_back(last->version);
    }
  };
  auto take_checkpoint = [&](bool wait) -> absl::Status {
    CheckpointContents contents;
    contents.model = ModelStateDict(*model);
    ASSIGN_OR_RETURN(Value optimizer_state, OptimizerStateDict(*optimizer));
    contents.optimizer = std::move(optimizer_state);
    contents.scheduler = scheduler->StateDict();
    contents.optimizer_param_names = OptimizerParamNames(*model);
    ASSIGN_OR_RETURN(at::Tensor rng_state, CatchTorchErrors([&] {
                       at::Generator generator = at::detail::getDefaultCPUGenerator();
                       std::lock_guard<std::mutex> lock(generator.mutex());
                       return generator.get_state();
                     }));
    contents.extra = Value::Dict({{kExtraKey,
                                   Value::Dict({
                                       {"epoch", Value::Int(loop.epoch)},
                                       {"sampler_position", Value::Int(loop.sampler_position)},
                                       {"global_step", Value::Int(loop.global_step)},
                                       {"target_step", Value::Int(loop.target_step)},
                                       {"world_size", Value::Int(group.world_size)},
                                       {"backend", Value::String(group.backend)},
                                       {"seed", Value::Int(static_cast<int64_t>(config.seed))},
                                       {"batch_size", Value::Int(config.batch_size)},
                                       {"accumulation_steps",
                                        Value::Int(config.accumulation_steps)},
                                       {"model", ModelSpecValue(config.model)},
                                       {"data", Value::String(config.data.source)},
                                       {"rng_cpu", Value::Tensor(rng_state)},
                                   })}});
    v1::VersionMetadata& metadata = contents.metadata;
    metadata.set_epoch(loop.epoch);
    metadata.set_global_step(loop.global_step);
    (*metadata.mutable_metrics())["loss"] = last_loss;
    (*metadata.mutable_metrics())["samples_per_second"] = samples_per_second;
    (*metadata.mutable_metrics())["learning_rate"] = CurrentLearningRate(*optimizer);
    metadata.set_world_size(group.world_size);
    metadata.set_backend(group.backend);
    metadata.set_source_format("trainer");
    char host[256] = {};
    gethostname(host, sizeof(host) - 1);
    metadata.set_producer(absl::StrCat("ckpt trainer on ", host));
    (*metadata.mutable_labels())["model_kind"] = config.model.kind;
    (*metadata.mutable_labels())["data"] = config.data.source;
    (*metadata.mutable_labels())["python_twin"] = summary.python_twin;
    metadata.set_description(absl::StrCat(config.model.kind, " step ", loop.global_step,
                                          " epoch ", loop.epoch, " loss ", last_loss));
    RETURN_IF_ERROR(checkpointer->Submit(contents, CommitOptions()));
    record_committed();
    if (wait) {
      RETURN_IF_ERROR(checkpointer->Wait().status());
      record_committed();
    }
    return absl::OkStatus();
  };

  v1::TrainerStatus status;
  status.set_state(v1::TrainerStatus::STATE_TRAINING);
  status.set_model(summary.model_name);
  status.set_world_size(group.world_size);
  status.set_backend(group.backend);
  status.set_device(device.str());
  status.set_total_steps(loop.target_step);
  control->SetStatus(status);

  if (leader) {
    std::cerr << absl::StrFormat(
        "trainer: %s, %d rank(s) over %s, %s; %s\n"
        "trainer: %s from step %d to %d (%d steps/epoch, batch %d x %d per rank), store %s\n",
        summary.model_name, group.world_size, group.backend, device.str(), data->Describe(),
        summary.resumed_from ? "resuming " + FormatVersionRef(*summary.resumed_from)
                             : std::string("starting fresh"),
        loop.global_step, loop.target_step, steps_per_epoch, config.batch_size,
        config.accumulation_steps, summary.store_location);
  }

  // ---- The loop.
  const absl::Time start = absl::Now();
  const int64_t first_step = loop.global_step;
  int64_t last_checkpoint_step = summary.resumed_from ? loop.global_step : -1;
  bool stop = false;
  bool skip_final_checkpoint = false;
  while (loop.global_step < loop.target_step && !stop) {
    // One optimizer step: accumulation_steps micro-batches (fewer at the end of an epoch), all
    // but the last inside NoSync so only the last backward pass communicates.
    std::vector<std::vector<int64_t>> micro_batches;
    for (int64_t i = 0; i < config.accumulation_steps; ++i) {
      std::vector<int64_t> indices = sampler->NextBatch(config.batch_size);
      if (indices.empty()) break;
      micro_batches.push_back(std::move(indices));
    }
    if (micro_batches.empty()) {  // epoch end (its checkpoint was taken with its last step).
      ++loop.epoch;
      sampler->set_epoch(loop.epoch);
      sampler->set_position(0);
      continue;
    }
    absl::StatusOr<double> step_loss = CatchTorchErrors([&] {
      model->train();
      optimizer->zero_grad();
      double loss_sum = 0;
      const double scale = 1.0 / static_cast<double>(micro_batches.size());
      for (size_t i = 0; i < micro_batches.size(); ++i) {
        Batch batch = data->Get(micro_batches[i]);
        std::optional<ddp::DistributedDataParallel::NoSyncGuard> no_sync;
        if (i + 1 < micro_batches.size()) no_sync.emplace(data_parallel->NoSync());
        data_parallel->PrepareForward();
        at::Tensor logits = model->forward(batch.inputs.to(device));
        at::Tensor loss = at::nll_loss(at::log_softmax(logits, 1), batch.targets.to(device));
        (micro_batches.size() > 1 ? loss * scale : loss).backward();
        loss_sum += loss.item<double>();
      }
      data_parallel->FinishGradientSync();
      if (config.clip_grad_norm > 0) {
        torch::nn::utils::clip_grad_norm_(parameters, config.clip_grad_norm);
      }
      optimizer->step();
      scheduler->Step();
      return loss_sum * scale;
    });
    if (!step_loss.ok()) return step_loss.status();
    ++loop.global_step;
    loop.sampler_position = sampler->position();
    const bool epoch_end = sampler->position() >= sampler->num_samples();
    if (epoch_end) {  // the checkpoint should continue with the next epoch.
      ++loop.epoch;
      loop.sampler_position = 0;
      sampler->set_epoch(loop.epoch);
      sampler->set_position(0);
    }

    ASSIGN_OR_RETURN(StepConsensus consensus, CatchTorchErrors([&] {
                       return AgreeOnStep(*group.group, *step_loss, control->pending());
                     }));
    last_loss = consensus.mean_loss;
    stop = consensus.stop;
    skip_final_checkpoint = consensus.skip_checkpoint;

    const absl::Duration elapsed = absl::Now() - start;
    const int64_t steps_done = loop.global_step - first_step;
    samples_per_second = steps_done * config.batch_size * config.accumulation_steps *
                         group.world_size /
                         std::max(absl::ToDoubleSeconds(elapsed), 1e-9);
    const bool last_step = loop.global_step == loop.target_step;
    if (steps_done % std::max<int64_t>(config.log_every, 1) == 0 || last_step) {
      summary.loss_curve.emplace_back(loop.global_step, last_loss);
    }

    if (leader) {
      const double seconds_per_step = absl::ToDoubleSeconds(elapsed) / steps_done;
      const absl::Duration eta =
          absl::Seconds(seconds_per_step * (loop.target_step - loop.global_step));
      const std::string line = absl::StrFormat(
          "epoch %d  step %d/%d  loss %.4f  lr %.3g  %.0f samples/s  ETA %s", loop.epoch,
          loop.global_step, loop.target_step, last_loss, CurrentLearningRate(*optimizer),
          samples_per_second, FormatClock(eta));
      if (config.progress_line) {
        std::cerr << "\r\x1b[K" << line << std::flush;
      } else if (steps_done % std::max<int64_t>(config.log_every, 1) == 0 || last_step) {
        std::cerr << "trainer: " << line << "\n";
      }
      status.set_epoch(loop.epoch);
      status.set_global_step(loop.global_step);
      status.set_loss(last_loss);
      status.set_samples_per_second(samples_per_second);
      if (!summary.versions_written.empty()) {
        *status.mutable_last_committed_version() = summary.versions_written.back();
      }
      control->SetStatus(status);

      const bool periodic = config.checkpoint_every > 0 &&
                            loop.global_step % config.checkpoint_every == 0;
      const bool final = last_step || (stop && !skip_final_checkpoint);
      if (periodic || (epoch_end && config.checkpoint_at_epoch_end) ||
          consensus.checkpoint_now || final) {
        status.set_state(v1::TrainerStatus::STATE_CHECKPOINTING);
        control->SetStatus(status);
        // A requested or final checkpoint is waited for; the others upload in the background.
        absl::Status taken = take_checkpoint(/*wait=*/consensus.checkpoint_now || final);
        if (!taken.ok()) {
          control->CheckpointFinished(taken);
          return absl::Status(taken.code(),
                              absl::StrCat("checkpoint at step ", loop.global_step,
                                           " failed: ", taken.message()));
        }
        last_checkpoint_step = loop.global_step;
        if (consensus.checkpoint_now || final) {
          control->CheckpointFinished(summary.versions_written.back());
        }
        status.set_state(v1::TrainerStatus::STATE_TRAINING);
        if (!summary.versions_written.empty()) {
          *status.mutable_last_committed_version() = summary.versions_written.back();
        }
        control->SetStatus(status);
      }
    }
  }
  if (config.progress_line && leader) std::cerr << "\n";

  std::optional<v1::VersionRef> final_version;
  if (leader) {
    if (last_checkpoint_step != loop.global_step && !skip_final_checkpoint) {
      RETURN_IF_ERROR(take_checkpoint(/*wait=*/true));  // e.g. a zero-step leg.
    }
    ASSIGN_OR_RETURN(std::optional<CommitResult> last, checkpointer->Wait());
    record_committed();
    if (!skip_final_checkpoint && last) final_version = last->version;
    summary.checkpoint_stall = checkpointer->stats().total_stall;
  }
  // Nobody leaves before rank 0's store has committed: the other ranks may still be reading it.
  RETURN_IF_ERROR(CatchTorchErrors([&] { ddp::Barrier(*group.group); }));
  status.set_state(v1::TrainerStatus::STATE_FINISHED);
  control->SetStatus(status);
  control->Finished(final_version);

  summary.final_step = loop.global_step;
  summary.final_epoch = loop.epoch;
  summary.stopped_early = loop.global_step < loop.target_step;
  summary.wall_time = absl::Now() - start;
  summary.samples_per_second = samples_per_second;
  return summary;
}

std::string FormatSummary(const TrainingSummary& summary) {
  std::string out = absl::StrFormat(
      "\n== %s: %s at step %d of %d (epoch %d), %d rank(s) over %s\n",
      summary.model_name, summary.stopped_early ? "stopped" : "finished", summary.final_step,
      summary.target_step, summary.final_epoch, summary.world_size, summary.backend);
  if (summary.resumed_from) {
    absl::StrAppend(&out, "   resumed from ", FormatVersionRef(*summary.resumed_from), " (step ",
                    summary.start_step, ")\n");
  }
  absl::StrAppendFormat(&out, "   %d steps in %s, %.0f samples/s; checkpoint stall %.3f s\n",
                        summary.final_step - summary.start_step,
                        FormatClock(summary.wall_time), summary.samples_per_second,
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
  std::vector<std::string> versions;
  for (const v1::VersionRef& ref : summary.versions_written) {
    versions.push_back(absl::StrCat("@", ref.version()));
  }
  absl::StrAppend(&out, "   versions written: ",
                  versions.empty() ? "none" : absl::StrJoin(versions, " "), "\n");
  absl::StrAppend(&out, "   PyTorch twin: ", summary.python_twin,
                  " (libs/train/python/twins.py)\n");
  if (!summary.versions_written.empty()) {
    const bool remote = summary.store_location.find(':') != std::string::npos &&
                        summary.store_location.find('/') == std::string::npos;
    const std::string where = remote ? "--store=" + summary.store_location
                                     : "--store_dir=" + summary.store_location;
    absl::StrAppend(&out, "   inspect:  bazel run //tools/ckpt -- ", where, " ls ",
                    summary.model_name, "\n",
                    "             bazel run //tools/ckpt -- ", where, " show ",
                    summary.model_name, "@latest\n",
                    "   run again to continue from ", summary.model_name, "@latest\n");
  }
  return out;
}

}  // namespace ckpt::train

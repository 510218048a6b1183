// trainer: data-parallel training with checkpoints in the ckpt store, like torchrun + DDP.
//
//   bazel run //services/trainer                  # 2 CPU ranks over Gloo, ./ckpt-data store
//   bazel run //services/trainer -- --model=cnn --steps=500 --nproc_per_node=4
//   bazel run //services/trainer -- --model=torchscript:$PWD/net.ts --data=pt:$PWD/data.pt
//
// With no RANK / WORLD_SIZE in the environment this process is the launcher: it starts
// --nproc_per_node ranks (this same binary) with the torchrun environment, supervises them and
// restarts them after a failure (--max_restarts). Started by another launcher (torchrun's
// environment present), it is one rank. Exit status: 0 when training finished or was stopped
// gracefully; 1 when a rank failed (the cause is printed); 2 for bad flags.

#include <signal.h>
#include <unistd.h>

#include <climits>
#include <cstdlib>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/flags/usage_config.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "libs/client/open_store.h"
#include "libs/ddp/process_group.h"
#include "libs/ddp/tcp_store_node_rendezvous.h"
#include "libs/rpc/grpc_server.h"
#include "libs/server/server_main.h"
#include "libs/server/server_security.h"
#include "libs/server/service_flags.h"
#include "libs/status/status_macros.h"
#include "libs/status/torch_status.h"
#include "libs/train/lineage.h"
#include "libs/train/rank_supervisor.h"
#include "libs/train/scripted_model.h"
#include "libs/train/trainable_model.h"
#include "libs/train/trainer.h"
#include "libs/train/trainer_control.h"
#include "services/trainer/rank_stores.h"
#include "services/trainer/trainer_service.h"

// ---- Launcher (torchrun's flags).
ABSL_FLAG(int, nproc_per_node, 2, "Ranks to start on this node. Default 2.");
ABSL_FLAG(int, nnodes, 1, "Nodes in the job; each runs this launcher. Default 1.");
ABSL_FLAG(int, node_rank, 0, "This node's index, 0..nnodes-1. Default 0.");
ABSL_FLAG(std::string, master_addr, "127.0.0.1",
          "Address of node 0, where rank 0 runs the rendezvous (c10d TCPStore). Default "
          "127.0.0.1.");
ABSL_FLAG(int, master_port, 0,
          "Rendezvous port on node 0. One node: rank 0's c10d TCPStore; default 0, a free port "
          "chosen for every (re)start. Several nodes (required): node 0's launcher serves the "
          "launchers' rendezvous there, and every (re)start of the ranks gets a fresh port.");
ABSL_FLAG(absl::Duration, rendezvous_timeout, absl::Minutes(10),
          "With --nnodes > 1: how long a launcher waits for the other nodes' launchers, at the "
          "start and at every restart. Default 10m.");
ABSL_FLAG(int, max_restarts, 0,
          "After a rank fails, restart all ranks this many times; they resume from the last "
          "committed checkpoint. Default 0.");
ABSL_FLAG(absl::Duration, rank_exit_timeout, absl::Seconds(10),
          "When a rank fails, the others get SIGTERM and are killed after this long. Default 10s.");
// ---- Distribution.
ABSL_FLAG(std::string, backend, "gloo",
          "Collective backend: gloo (CPU; also moves CUDA tensors) or nccl (CUDA builds only; "
          "needs --device=cuda).");
ABSL_FLAG(std::string, device, "cpu", "cpu, or cuda (rank r uses cuda:<local rank>).");
ABSL_FLAG(int, threads_per_rank, 1,
          "Intra-op threads per rank. Default 1, which keeps runs bit-reproducible.");
ABSL_FLAG(int, bucket_cap_mb, 25, "Gradient all-reduce bucket size in MiB. Default 25.");
// ---- Model and data.
ABSL_FLAG(std::string, model, "mlp",
          "mlp, cnn (BatchNorm), transformer, or torchscript:PATH: your own PyTorch model, saved "
          "from Python with torch.jit.script(model).save(PATH) (or torch.jit.trace). It trains "
          "with its own loss(inputs, targets) method when it has one (@torch.jit.export), else "
          "with --loss on forward(inputs); checkpoints hold its state_dict() keys, so `ckpt "
          "export --bundle` loads back into the Python class. Default mlp.");
ABSL_FLAG(std::string, loss, "",
          "For --model=torchscript:PATH without a loss() method: cross_entropy (int64 class "
          "targets), mse or bce_with_logits (float targets), on forward(inputs). Default "
          "cross_entropy.");
ABSL_FLAG(int64_t, hidden, 64, "Hidden width (mlp), channels (cnn), d_model (transformer).");
ABSL_FLAG(int64_t, layers, 2, "Hidden layers (mlp) or encoder layers (transformer).");
ABSL_FLAG(int64_t, heads, 4, "Attention heads (transformer).");
ABSL_FLAG(std::string, data, "synthetic",
          "synthetic (a learnable generated task), mnist:DIR (IDX files), pt:FILE (a "
          "torch.save'd {'x': inputs, 'y': int64 labels or float targets}), or shards:DIR / "
          "shards:GLOB (every .pt, .pth and .safetensors file of DIR, or those GLOB matches, "
          "in name order, each holding x and y as pt:FILE does; read a shard at a time, at most "
          "two resident per rank, shuffled shard by shard). Default synthetic.");
ABSL_FLAG(int64_t, synthetic_examples, 4096, "Examples in the synthetic data set.");
// ---- Optimization.
ABSL_FLAG(std::string, optimizer, "adamw", "sgd (momentum), adam or adamw. Default adamw.");
ABSL_FLAG(double, lr, 2e-3, "Learning rate. Default 0.002.");
ABSL_FLAG(double, momentum, 0.9, "SGD momentum.");
ABSL_FLAG(double, weight_decay, 0.01, "Weight decay. Default 0.01.");
ABSL_FLAG(std::string, scheduler, "cosine",
          "none, step (StepLR: --step_size, --gamma) or cosine (linear warmup over "
          "--warmup_steps, then cosine decay over the run). Default cosine.");
ABSL_FLAG(int64_t, step_size, 100, "StepLR period in steps.");
ABSL_FLAG(double, gamma, 0.5, "StepLR decay factor.");
ABSL_FLAG(int64_t, warmup_steps, 20, "Cosine warmup steps.");
ABSL_FLAG(double, clip_grad_norm, 1.0, "Clip the gradient norm to this; 0 disables.");
ABSL_FLAG(int64_t, batch_size, 32, "Examples per rank per micro-batch. Default 32.");
ABSL_FLAG(int64_t, accumulation_steps, 1,
          "Micro-batches per optimizer step; all but the last skip the gradient all-reduce "
          "(DDP's no_sync). Default 1.");
ABSL_FLAG(int64_t, steps, 300,
          "Optimizer steps to train. A run resumed before reaching its goal finishes that goal; "
          "one resumed after it trains this many more. Default 300.");
ABSL_FLAG(uint64_t, seed, 1234, "Seed of initialisation, shuffling and the held-out split.");
// ---- Evaluation.
ABSL_FLAG(double, eval_fraction, 0,
          "Fraction of the data held out (a split seeded by --seed), never trained on; at every "
          "checkpoint the model is evaluated on it and the version records the metrics val_loss "
          "and val_acc. In [0, 1). Default 0: no held-out part, no evaluation.");
// ---- Checkpoints.
ABSL_FLAG(std::string, model_name, "",
          "The store's name for this model. Default: <model>-<data kind>, e.g. mlp-synthetic.");
ABSL_FLAG(int64_t, checkpoint_every, 100,
          "Checkpoint every N steps (also at each epoch end and at the end). 0: only those.");
ABSL_FLAG(bool, sync_checkpoints, false,
          "Wait for every checkpoint's upload before training on (as torch.save in the loop "
          "would), counting the wait as checkpoint stall. Default false: the step pays only for "
          "the host copy and the upload runs in the background. For measuring the difference.");
ABSL_FLAG(bool, parallel_checkpoints, true,
          "With several ranks, every rank writes about 1/N of each checkpoint's bytes, in "
          "parallel, as its part of one upload that rank 0 commits when every part is in (a rank "
          "that dies mid-save leaves no version). The stored version is the one rank 0 alone would "
          "write. False: rank 0 uploads all of it.");
ABSL_FLAG(int32_t, zero, 0,
          "ZeRO stage: 0, or 1 to partition the optimizer state across the ranks (each holds and "
          "steps its ~1/N slice; parameters are the same as without it, bit for bit). "
          "Checkpoints hold the whole logical optimizer state_dict, each rank writing its own "
          "slices (nothing is gathered to save), so a version resumes with or without ZeRO on "
          "any number of ranks and exports as a plain torch.optim state dict. Needs "
          "--parallel_checkpoints.");
ABSL_FLAG(int32_t, max_failed_checkpoints, 3,
          "A checkpoint that fails (a full disk, the store restarting) is reported and training "
          "goes on; this many failing in a row stop the run with the error. The final "
          "checkpoint must always succeed.");
ABSL_FLAG(bool, resume, true, "Continue from the model's latest version if there is one.");
// ---- Lineage (recorded in every version this run commits).
ABSL_FLAG(std::string, run_id, "",
          "This run's id in the versions' lineage. Default: a new one per run, "
          "<model_name>-<UTC start time>-<random hex>; a resumed or restarted run is a new run. "
          "Given, it names every run this command starts, restarts included.");
ABSL_FLAG(std::string, code_revision, "",
          "The training code's revision for the versions' lineage. Default: under `bazel run`, "
          "the git commit of the workspace (BUILD_WORKSPACE_DIRECTORY), with +dirty when it has "
          "changes or untracked files; none when that is not a git checkout or git is missing.");
CKPT_DEFINE_STORE_CLIENT_FLAGS("ckpt-data");
// ---- Control.
ABSL_FLAG(std::string, control_listen, "",
          "HOST:PORT where rank 0 serves the ckpt.v1.Trainer API (status, checkpoint now, stop). "
          "Default: off.");
ABSL_FLAG(std::string, control_port_file, "",
          "With --control_listen, write the bound port here once serving.");
// The Trainer API's TLS and identities: the servers' flags, each named --control_*
// (GetStatus needs the reader role, CheckpointNow and Stop the writer role).
CKPT_DEFINE_SERVER_SECURITY_FLAGS(control_);
ABSL_FLAG(int64_t, log_every, 20, "Steps between log lines when stderr is not a terminal.");
ABSL_FLAG(bool, log_state_digests, false,
          "Every rank logs \"rank R step S state HASH\" after every step, and \"rank R restored "
          "MODEL@V state HASH\" after a resume: a hash of its parameters, buffers and optimizer "
          "state, to show that all ranks (e.g. on different hosts), two runs, and a run resumed "
          "on another number of ranks hold the same state. With --zero=1 it gathers the "
          "optimizer state every step (a collective). Default false.");

namespace ckpt {
namespace {

constexpr int kExitFailure = 1;
constexpr int kExitBadFlags = 2;

train::TrainerControl* g_control = nullptr;

void OnStopSignal(int) {
  if (g_control != nullptr) g_control->RequestStopFromSignal();
  train::ForwardStopSignal();
}

void InstallStopHandlers() {
  struct sigaction action = {};
  action.sa_handler = OnStopSignal;
  sigemptyset(&action.sa_mask);
  sigaction(SIGINT, &action, nullptr);
  sigaction(SIGTERM, &action, nullptr);
}

absl::StatusOr<train::TrainerConfig> ConfigFromFlags() {
  train::TrainerConfig config;
  config.model_name = absl::GetFlag(FLAGS_model_name);
  config.model.kind = absl::GetFlag(FLAGS_model);
  const std::string scripted_prefix = absl::StrCat(train::kTorchScriptKind, ":");
  if (absl::StartsWith(config.model.kind, scripted_prefix)) {
    config.model.path = config.model.kind.substr(scripted_prefix.size());
    config.model.kind = train::kTorchScriptKind;
    if (config.model.path.empty()) {
      return absl::InvalidArgumentError("--model=torchscript:PATH needs the module's path");
    }
  } else if (config.model.kind == train::kTorchScriptKind) {
    return absl::InvalidArgumentError(
        "--model=torchscript needs the module's file: --model=torchscript:PATH");
  }
  config.model.loss = absl::GetFlag(FLAGS_loss);
  if (!config.model.loss.empty()) {
    if (config.model.kind != train::kTorchScriptKind) {
      return absl::InvalidArgumentError(
          "--loss applies to --model=torchscript:PATH; the built-in models train with cross "
          "entropy");
    }
    RETURN_IF_ERROR(train::ParseLossKind(config.model.loss).status());
  }
  config.model.hidden = absl::GetFlag(FLAGS_hidden);
  config.model.layers = absl::GetFlag(FLAGS_layers);
  config.model.heads = absl::GetFlag(FLAGS_heads);
  config.data.source = absl::GetFlag(FLAGS_data);
  // A scripted model gets the image task ([1,12,12] floats, 10 classes) as synthetic data.
  config.data.model_kind = config.model.kind == train::kTorchScriptKind ? "cnn" : config.model.kind;
  config.data.synthetic_examples = absl::GetFlag(FLAGS_synthetic_examples);
  config.data.seed = absl::GetFlag(FLAGS_seed);
  config.eval_fraction = absl::GetFlag(FLAGS_eval_fraction);
  config.run_id = absl::GetFlag(FLAGS_run_id);
  config.code_revision = absl::GetFlag(FLAGS_code_revision);
  config.optimizer.kind = absl::GetFlag(FLAGS_optimizer);
  config.optimizer.lr = absl::GetFlag(FLAGS_lr);
  config.optimizer.momentum = absl::GetFlag(FLAGS_momentum);
  config.optimizer.weight_decay = absl::GetFlag(FLAGS_weight_decay);
  config.scheduler.kind = absl::GetFlag(FLAGS_scheduler);
  config.scheduler.step_size = absl::GetFlag(FLAGS_step_size);
  config.scheduler.gamma = absl::GetFlag(FLAGS_gamma);
  config.scheduler.warmup_steps = absl::GetFlag(FLAGS_warmup_steps);
  config.steps = absl::GetFlag(FLAGS_steps);
  config.scheduler.total_steps = std::max<int64_t>(config.steps, 1);
  // A short run has a shorter warmup rather than none at all or an error.
  config.scheduler.warmup_steps =
      std::min(config.scheduler.warmup_steps, config.scheduler.total_steps);
  config.clip_grad_norm = absl::GetFlag(FLAGS_clip_grad_norm);
  config.batch_size = absl::GetFlag(FLAGS_batch_size);
  config.accumulation_steps = absl::GetFlag(FLAGS_accumulation_steps);
  config.seed = absl::GetFlag(FLAGS_seed);
  config.checkpoint_every = absl::GetFlag(FLAGS_checkpoint_every);
  config.synchronous_checkpoints = absl::GetFlag(FLAGS_sync_checkpoints);
  config.parallel_checkpoints = absl::GetFlag(FLAGS_parallel_checkpoints);
  config.zero_stage = absl::GetFlag(FLAGS_zero);
  config.max_consecutive_failed_checkpoints = absl::GetFlag(FLAGS_max_failed_checkpoints);
  config.resume = absl::GetFlag(FLAGS_resume);
  config.threads_per_rank = absl::GetFlag(FLAGS_threads_per_rank);
  config.bucket_cap_bytes = static_cast<int64_t>(absl::GetFlag(FLAGS_bucket_cap_mb)) << 20;
  config.log_every = absl::GetFlag(FLAGS_log_every);
  config.log_state_digests = absl::GetFlag(FLAGS_log_state_digests);
  config.device = absl::GetFlag(FLAGS_device);
  if (config.device != "cpu" && config.device != "cuda") {
    return absl::InvalidArgumentError("--device must be cpu or cuda");
  }
  if (absl::GetFlag(FLAGS_backend) != "gloo" && absl::GetFlag(FLAGS_backend) != "nccl") {
    return absl::InvalidArgumentError("--backend must be gloo or nccl");
  }
  if (absl::GetFlag(FLAGS_backend) == "nccl" && config.device != "cuda") {
    return absl::InvalidArgumentError("--backend=nccl moves only CUDA tensors: add --device=cuda");
  }
  if (config.batch_size <= 0 || config.accumulation_steps <= 0 || config.steps < 0 ||
      config.threads_per_rank <= 0 || absl::GetFlag(FLAGS_bucket_cap_mb) <= 0 ||
      config.checkpoint_every < 0) {
    return absl::InvalidArgumentError(
        "--batch_size, --accumulation_steps, --threads_per_rank and --bucket_cap_mb must be "
        "positive; --steps and "
        "--checkpoint_every must not be negative");
  }
  if (!(config.eval_fraction >= 0 && config.eval_fraction < 1)) {
    return absl::InvalidArgumentError("--eval_fraction must be in [0, 1)");
  }
  return config;
}

absl::StatusOr<RankStoreOptions> StoreOptionsFromFlags() {
  ASSIGN_OR_RETURN(const StoreLocation location,
                   StoreLocationFromFlags(CKPT_STORE_CLIENT_FROM_FLAGS()));
  RankStoreOptions options;
  options.store_dir = absl::GetFlag(FLAGS_store_dir);
  options.store_address = location.address;
  options.store_auth_token = location.auth_token;
  options.store_tls = location.tls;
  return options;
}

// The process group and the store this rank trains with, then the training itself.
absl::StatusOr<train::TrainingSummary> RunWithStore(train::TrainerConfig config,
                                                    const RankStoreOptions& store_options,
                                                    const ddp::RendezvousOptions& rendezvous,
                                                    train::TrainerControl& control) {
  ASSIGN_OR_RETURN(ddp::ProcessGroupHandle group,
                   CatchTorchErrors([&] { return ddp::InitProcessGroup(rendezvous); },
                                    absl::StatusCode::kUnavailable));
  ASSIGN_OR_RETURN(std::unique_ptr<RankStores> stores, OpenRankStores(store_options, group));
  config.store_location = stores->location();
  return train::RunTrainingRank(config, group, stores->store(), &control);
}

// One rank, as started by the launcher (or torchrun).
int RunRank(train::TrainerConfig config, RankStoreOptions store_options,
            ddp::RendezvousOptions rendezvous) {
  rendezvous.backend = absl::GetFlag(FLAGS_backend);
  // The rank computes and communicates on one device: cuda:<LOCAL_RANK> with --device=cuda.
  rendezvous.device_type = config.device == "cuda" ? c10::DeviceType::CUDA : c10::DeviceType::CPU;
  store_options.master_addr = rendezvous.master_addr;
  config.local_rank = rendezvous.local_rank;
  // Only rank 0 commits, so only it asks git (BUILD_WORKSPACE_DIRECTORY is set by `bazel run`).
  if (const char* workspace = std::getenv("BUILD_WORKSPACE_DIRECTORY");
      rendezvous.rank == 0 && config.code_revision.empty() && workspace != nullptr) {
    config.code_revision = train::GitCodeRevision(workspace);
  }
  config.progress_line = rendezvous.rank == 0 && isatty(STDERR_FILENO);

  train::TrainerControl control;
  g_control = &control;
  InstallStopHandlers();

  std::unique_ptr<TrainerService> service;
  std::unique_ptr<GrpcServer> server;
  const std::string control_listen = absl::GetFlag(FLAGS_control_listen);
  if (rendezvous.rank == 0 && !control_listen.empty()) {
    absl::StatusOr<ServerSecurity> security =
        LoadServerSecurity(CKPT_SERVER_SECURITY_FROM_FLAGS(control_), "--control_");
    if (!security.ok()) {
      std::cerr << "trainer: " << security.status().message() << "\n";
      return kExitBadFlags;
    }
    service = std::make_unique<TrainerService>(&control, security->access);
    GrpcServerOptions options;
    options.listen_address = control_listen;
    options.tls = security->tls;
    absl::StatusOr<std::unique_ptr<GrpcServer>> started =
        GrpcServer::Start(options, {{service.get(), "ckpt.v1.Trainer"}});
    if (!started.ok()) {
      std::cerr << "trainer: cannot serve --control_listen=" << control_listen << ": "
                << started.status().message() << "\n";
      return kExitFailure;
    }
    server = *std::move(started);
    if (const std::string port_file = absl::GetFlag(FLAGS_control_port_file); !port_file.empty()) {
      absl::Status written = WritePortFile(port_file, server->port());
      if (!written.ok()) {
        std::cerr << "trainer: " << written.message() << "\n";
        return kExitFailure;
      }
    }
    std::cerr << "trainer: control API (ckpt.v1.Trainer) on " << server->address() << "\n";
  }

  absl::StatusOr<train::TrainingSummary> summary =
      RunWithStore(config, store_options, rendezvous, control);
  if (server != nullptr) server->Shutdown(absl::Seconds(2));
  g_control = nullptr;
  if (!summary.ok()) {
    v1::TrainerStatus failed = control.status();
    failed.set_state(v1::TrainerStatus::STATE_FAILED);
    failed.set_error(std::string(summary.status().message()));
    control.SetStatus(failed);
    control.Finished(std::nullopt);
    std::cerr << "trainer: rank " << rendezvous.rank << ": " << summary.status() << "\n";
    return kExitFailure;
  }
  if (rendezvous.rank == 0) std::cout << train::FormatSummary(*summary) << std::flush;
  return 0;
}

int Launch(int argc, char** argv) {
  train::SupervisorOptions options;
  char executable[PATH_MAX];
  const ssize_t length = readlink("/proc/self/exe", executable, sizeof(executable) - 1);
  if (length <= 0) {
    std::cerr << "trainer: cannot find my own executable (/proc/self/exe)\n";
    return kExitFailure;
  }
  options.executable.assign(executable, length);
  options.args.assign(argv + 1, argv + argc);
  options.nproc_per_node = absl::GetFlag(FLAGS_nproc_per_node);
  options.nnodes = absl::GetFlag(FLAGS_nnodes);
  options.node_rank = absl::GetFlag(FLAGS_node_rank);
  options.master_addr = absl::GetFlag(FLAGS_master_addr);
  options.master_port = absl::GetFlag(FLAGS_master_port);
  options.max_restarts = absl::GetFlag(FLAGS_max_restarts);
  options.stop_timeout = absl::GetFlag(FLAGS_rank_exit_timeout);
  if (options.nproc_per_node < 1 || options.nnodes < 1 || options.node_rank < 0 ||
      options.node_rank >= options.nnodes || options.max_restarts < 0) {
    std::cerr << "trainer: need --nproc_per_node >= 1, --nnodes >= 1, 0 <= --node_rank < "
                 "--nnodes and --max_restarts >= 0 (see --help)\n";
    return kExitBadFlags;
  }
  if (options.nnodes > 1 && options.master_port == 0) {
    std::cerr << "trainer: --nnodes > 1 needs an agreed --master_port\n";
    return kExitBadFlags;
  }
  InstallStopHandlers();
  std::unique_ptr<ddp::NodeRendezvous> nodes;
  if (options.nnodes > 1) {
    ddp::NodeRendezvousOptions rendezvous;
    rendezvous.nnodes = options.nnodes;
    rendezvous.node_rank = options.node_rank;
    rendezvous.master_addr = options.master_addr;
    rendezvous.master_port = options.master_port;
    rendezvous.timeout = absl::GetFlag(FLAGS_rendezvous_timeout);
    absl::StatusOr<std::unique_ptr<ddp::NodeRendezvous>> connected = ddp::ConnectNodes(rendezvous);
    if (!connected.ok()) {
      std::cerr << "trainer: " << connected.status().message() << "\n";
      return kExitFailure;
    }
    nodes = *std::move(connected);
    options.node_rendezvous = nodes.get();
    std::cerr << "launcher: node " << options.node_rank << " of " << options.nnodes
              << "; the launchers meet on " << options.master_addr << ":" << options.master_port
              << " and restart together\n";
  }
  train::SupervisorResult result = train::SuperviseRanks(options);
  if (result.exit_code != 0) {
    std::cerr << "trainer: failed: " << result.cause
              << (result.restarts > 0 ? absl::StrCat(" (after ", result.restarts, " restart(s))")
                                      : std::string())
              << "\n";
  }
  return result.exit_code;
}

}  // namespace
}  // namespace ckpt

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "Data-parallel training (LibTorch c10d DDP) with checkpoints in the ckpt store.\n"
      "  trainer [--nproc_per_node=2] [--model=mlp|cnn|transformer|torchscript:PATH]\n"
      "          [--data=synthetic|mnist:DIR|pt:FILE|shards:DIR]\n"
      "          [--steps=300] [--checkpoint_every=100] [--store_dir=ckpt-data | "
      "--store=HOST:PORT]\n"
      "          [--max_restarts=0] [--control_listen=HOST:PORT] [--eval_fraction=0.1]\n"
      "Started without RANK/WORLD_SIZE in the environment it launches --nproc_per_node ranks of\n"
      "itself (like torchrun); with them (torchrun's environment) it is one rank. Rank 0 writes a\n"
      "checkpoint every --checkpoint_every steps, at each epoch end and at the end (the upload "
      "runs\n"
      "in the background); running again resumes from the model's latest version. SIGINT/SIGTERM\n"
      "stop gracefully (checkpoint, exit 0); a second one kills the ranks. Every version records\n"
      "its lineage (run id, the version the run resumed from, code revision, data) and, with\n"
      "--eval_fraction, the held-out metrics val_loss and val_acc.");
  ckpt::SetHelpFlagsFile("services/trainer/main.cc");
  std::vector<char*> positional = absl::ParseCommandLine(argc, argv);
  if (positional.size() > 1) {
    std::cerr << "trainer: unexpected argument \"" << positional[1] << "\" (see --help)\n";
    return ckpt::kExitBadFlags;
  }
  // Under `bazel run`, relative paths (--store_dir, --data files) mean the caller's directory.
  if (const char* caller = std::getenv("BUILD_WORKING_DIRECTORY"); caller != nullptr) {
    if (chdir(caller) != 0) std::perror("trainer: chdir to BUILD_WORKING_DIRECTORY");
  }
  absl::StatusOr<ckpt::train::TrainerConfig> config = ckpt::ConfigFromFlags();
  absl::StatusOr<ckpt::RankStoreOptions> store_options = ckpt::StoreOptionsFromFlags();
  for (const absl::Status& status : {config.status(), store_options.status()}) {
    if (!status.ok()) {
      std::cerr << "trainer: " << status.message() << " (see --help)\n";
      return ckpt::kExitBadFlags;
    }
  }
  std::optional<ckpt::ddp::RendezvousOptions> rendezvous;
  try {
    rendezvous = ckpt::ddp::RendezvousOptionsFromEnvironment();
  } catch (const std::exception& error) {
    std::cerr << "trainer: bad torchrun environment: " << error.what() << "\n";
    return ckpt::kExitBadFlags;
  }
  if (!rendezvous) return ckpt::Launch(argc, argv);
  return ckpt::RunRank(*std::move(config), *std::move(store_options), *rendezvous);
}

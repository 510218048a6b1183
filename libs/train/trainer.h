#ifndef CKPT_LIBS_TRAIN_TRAINER_H_
#define CKPT_LIBS_TRAIN_TRAINER_H_

// One rank of a data-parallel training run: its process group (libs/ddp/process_group.h; the
// launchers' multi-node rendezvous is libs/ddp/tcp_store_node_rendezvous.h), model, data,
// optimizer, scheduler, the training loop, asynchronous checkpoints to the store, and exact resume
// from it.
//
// What a checkpoint holds (one store version of `model_name`):
//   model       the module's parameters and buffers under canonical keys (never "module.");
//   optimizer   PyTorch's optimizer.state_dict() layout (libs/train/optimizer.h);
//   scheduler   PyTorch's scheduler.state_dict() layout (libs/train/lr_scheduler.h);
//   extra       {"trainer": {...}}: where the data continues, the run's goal and set-up
//               (libs/train/trainer_state.h);
//   metadata    epoch, global step, metrics (loss, learning_rate, samples_per_second; val_loss
//               and val_acc when evaluating), world size, backend; labels model_kind, data,
//               and the model's identity: python_twin (the constructor of a built-in model's
//               PyTorch twin) or torchscript_class and model_file (a scripted model,
//               scripted_model.h), checked on resume; lineage (below).
//
// Lineage (v1::Lineage). Every version a run commits carries the run's id (config.run_id, or one
// made by rank 0 when the run starts: a resumed or restarted run is a new run), the code
// revision and data the run was given, and producer_info (world_size, backend, device, hostname,
// trainer_build). A run that resumed names the version it resumed from as the parent of EVERY
// version it commits, relation "resumed_from"; a fresh run's versions have no parent. So walking
// parents from any version takes one hop per run, back through each resume point to the fresh
// run, and does not break when retention deletes a run's intermediate versions (only a deleted
// resume point ends the walk). A run's own versions are those with its run_id.
//
// Evaluation. With eval_fraction > 0 a seeded part of the data (SplitHeldOut in dataset.h, seed
// `seed`) is held out: the sampler deals only the rest, so the held-out examples are never
// trained on. Whenever a checkpoint is due, every rank evaluates its share of the held-out part
// (eval mode, no gradients, rank 0's buffers), the sums are all-reduced, and the version records
// val_loss (the model's loss, averaged over examples) and, where the outputs are class scores
// for class-id targets, val_acc (top-1 accuracy).
// Evaluation draws no random numbers (the global generator is restored around it, too) and
// changes no training state, so an interrupted and resumed run still ends bit-identical to an
// uninterrupted one.
//
// Only rank 0 writes checkpoints (the ranks' states are identical: DDP keeps them so). Rank 0
// resolves "latest" and broadcasts the version, so every rank resumes from the same one.
//
// The process group and the store are given, as c10d's Reducer is given its ProcessGroup: where
// the store runs (embedded, lent by rank 0 to the others, a remote service) is the binary's
// decision (services/trainer/rank_stores.h), not training logic's.
//
// Resume is exact on the CPU with deterministic settings (one intra-op thread per rank): the
// parameters after an interrupted and resumed run equal, bit for bit, those of an uninterrupted
// one. The run's goal is `target_step` (recorded in each checkpoint): a run resumed before its
// goal finishes that goal; a run resumed after reaching it trains `steps` more.

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "libs/ddp/process_group.h"
#include "libs/store/checkpoint_store.h"
#include "libs/train/dataset.h"
#include "libs/train/lr_scheduler.h"
#include "libs/train/models.h"
#include "libs/train/optimizer.h"
#include "libs/train/trainer_control.h"
#include "proto/ckpt/v1/types.pb.h"

namespace ckpt::train {

struct TrainerConfig {
  // ---- What to train.
  std::string model_name;  // the store's model name; "" -> "<model kind>-<data kind>".
  ModelSpec model;
  DataSpec data;
  OptimizerSpec optimizer;
  SchedulerSpec scheduler;
  int64_t batch_size = 32;  // per rank, per micro-batch.
  // Micro-batches per optimizer step: the first accumulation_steps - 1 backward passes run
  // inside DDP's NoSync (gradients accumulate locally), the last one all-reduces.
  int64_t accumulation_steps = 1;
  int64_t steps = 300;             // optimizer steps in this leg (see target_step above).
  int64_t checkpoint_every = 100;  // steps; 0: only at epoch end and at the end.
  bool checkpoint_at_epoch_end = true;
  // Every checkpoint waits for its upload before training goes on (as torch.save in the loop
  // would), and the wait counts as stall: for measuring what asynchronous saving saves.
  bool synchronous_checkpoints = false;
  // With several ranks, each checkpoint is written by all of them in parallel: every rank
  // snapshots the (replicated) state and uploads about 1/world_size of its bytes as its part of
  // one upload, which rank 0 commits once every part is in (AsyncCheckpointer::SubmitShared).
  // The ranks must share one store. False: rank 0 uploads everything, as torch.save would.
  bool parallel_checkpoints = true;
  // ZeRO stage: 0 (every rank holds the whole optimizer state) or 1 (each rank holds and steps
  // only its slice of it: ZeroOptimizer, libs/train/zero_optimizer.h). Checkpoints hold the
  // logical state either way, so a version restores into a run of either stage and any world
  // size. Stage 1 with several ranks needs parallel_checkpoints.
  int zero_stage = 0;
  // A checkpoint that fails (a full disk, a store that is restarting) is reported and training
  // goes on, as long as fewer than this many fail in a row; then the run stops with the error
  // rather than train on with nothing saved. The final checkpoint, and one a client asked for,
  // must succeed.
  int max_consecutive_failed_checkpoints = 3;
  double clip_grad_norm = 1.0;  // 0: off.
  uint64_t seed = 1234;
  bool shuffle = true;
  bool drop_last = false;
  int64_t bucket_cap_bytes = 25 << 20;
  bool resume = true;          // continue from the model's latest version when there is one.
  int threads_per_rank = 1;    // intra-op threads; 1 keeps runs bit-reproducible.
  int64_t log_every = 20;      // steps between plain log lines (when not on a terminal).
  bool progress_line = false;  // one updating line on stderr (rank 0, on a terminal).
  // Every rank prints "trainer: rank R step S state XXH3" after every optimizer step: a hash of
  // its parameters and buffers, so that ranks on different hosts can be shown to hold the same
  // model at every step, and runs to be compared step by step. Off by default (a line per step
  // per rank, and a copy of the model to CPU with --device=cuda).
  bool log_state_digests = false;

  // ---- Evaluation (see above). The fraction of the data held out, in [0, 1); 0: none.
  double eval_fraction = 0;

  // ---- Lineage (see above).
  std::string run_id;         // "": made by rank 0 (NewRunId in libs/train/lineage.h).
  std::string code_revision;  // e.g. the git commit (GitCodeRevision); "": not recorded.

  // How the summary names the store (a directory, or HOST:PORT of a store service), for the
  // `ckpt` commands it prints; the store itself is given to RunTrainingRank.
  std::string store_location;

  // ---- Placement.
  std::string device = "cpu";  // "cpu" | "cuda" (cuda:<local_rank>).
  int local_rank = 0;
};

// Metrics of one evaluation on the held-out part.
struct EvalMetrics {
  int64_t global_step = 0;
  int64_t examples = 0;  // held-out examples evaluated (all ranks).
  double loss = 0;       // val_loss
  // val_acc: top-1 accuracy, where the outputs are class scores for int64 class targets (the
  // built-in models; a scripted model without its own loss()); none for a model whose loss()
  // computes the loss itself.
  std::optional<double> accuracy;
};

struct TrainingSummary {
  std::string model_name;
  std::string run_id;
  int64_t start_step = 0;  // global step the run resumed from (0: fresh).
  int64_t final_step = 0;
  int64_t target_step = 0;
  int64_t final_epoch = 0;
  std::optional<v1::VersionRef> resumed_from;
  // (global step, mean loss over ranks), one point per log interval plus the last step.
  std::vector<std::pair<int64_t, double>> loss_curve;
  double samples_per_second = 0;  // all ranks, this leg.
  absl::Duration wall_time;
  // What the loop spent in checkpoint snapshots; with synchronous_checkpoints, plus every upload.
  absl::Duration checkpoint_stall;
  std::vector<v1::VersionRef> versions_written;
  int64_t failed_checkpoints = 0;        // reported and trained past (max_consecutive_failed_...).
  std::string last_checkpoint_error;     // the last one's error, when failed_checkpoints > 0.
  std::optional<EvalMetrics> last_eval;  // none without eval_fraction.
  bool stopped_early = false;            // a stop request ended the run before target_step.
  int world_size = 1;
  std::string backend;
  std::string store_location;  // the directory or address.
  std::string python_twin;     // a built-in model's PyTorch twin; "" for a scripted model.
  std::string model_summary;   // ModelIdentity::summary_line: what was trained, from where.
};

// Runs this process's rank of `group` to the end, reading and (rank 0) writing checkpoints in
// `store`. `control` (rank 0; may be null) receives status and is asked for requests at every
// step boundary. Errors: INVALID_ARGUMENT for a bad setting (naming it), collectives failing
// (a dead peer), the store, the data, a checkpoint of another model shape
// (FAILED_PRECONDITION, saying how to start fresh), a failed final or requested checkpoint, or
// max_consecutive_failed_checkpoints failed checkpoints in a row.
absl::StatusOr<TrainingSummary> RunTrainingRank(const TrainerConfig& config,
                                                const ddp::ProcessGroupHandle& group,
                                                CheckpointStore& store, TrainerControl* control);

// Human-readable end-of-run report (rank 0), ending with how to inspect the versions with ckpt.
std::string FormatSummary(const TrainingSummary& summary);

}  // namespace ckpt::train

#endif  // CKPT_LIBS_TRAIN_TRAINER_H_

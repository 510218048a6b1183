// ZeroOptimizer on real ranks (processes over Gloo): each rank steps its slices of AdamW and SGD
// and must end with the parameters, and the gathered state, of the same optimizer over all the
// parameters, bit for bit, for 50 steps; a gathered state restores into another world size.

#include "libs/train/zero_optimizer.h"

#include <chrono>
#include <cstdlib>
#include <iostream>
#include <stdexcept>
#include <string>
#include <vector>

#include "ATen/Context.h"
#include "ATen/core/Tensor.h"
#include "ATen/ops/equal.h"
#include "ATen/ops/randn.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "libs/ddp/local_launcher.h"
#include "libs/ddp/process_group.h"
#include "libs/store/checkpoint_contents.h"
#include "libs/store/rocksdb_checkpoint_store.h"
#include "libs/store/version_ref.h"
#include "libs/train/optimizer.h"

namespace ckpt::train {
namespace {

using ::testing::Each;
using ::testing::Eq;

constexpr char kWorkerVariable[] = "CKPT_ZERO_TEST_WORKER";

// A parameter over one 4 MiB chunk (so a rank's slice cuts it), a matrix, a vector, a scalar.
std::vector<at::Tensor> MakeParameters() {
  at::manual_seed(7);
  return {at::randn({1100, 1024}), at::randn({64, 32}), at::randn({32}), at::randn({1})};
}

// The same "averaged gradients" on every rank for `step` (DDP's all-reduce gives every rank the
// same), set on `parameters`.
void SetGradients(std::vector<at::Tensor>& parameters, int step) {
  at::manual_seed(1000 + step);
  for (at::Tensor& parameter : parameters) parameter.mutable_grad() = at::randn(parameter.sizes());
}

void Check(bool ok, const std::string& what) {
  if (!ok) throw std::runtime_error(what);
}

void ExpectSameTensors(const Value& got, const Value& want, const std::string& where) {
  Check(got.TensorCount() == want.TensorCount(), where + ": " + std::to_string(got.TensorCount()) +
                                                     " state tensors, want " +
                                                     std::to_string(want.TensorCount()));
  std::vector<at::Tensor> got_tensors, want_tensors;
  got.ForEachTensor([&](const std::string&, const at::Tensor& t) { got_tensors.push_back(t); });
  want.ForEachTensor([&](const std::string&, const at::Tensor& t) { want_tensors.push_back(t); });
  for (size_t i = 0; i < want_tensors.size(); ++i) {
    Check(got_tensors[i].sizes() == want_tensors[i].sizes() &&
              at::equal(got_tensors[i], want_tensors[i]),
          where + ": state tensor " + std::to_string(i) + " differs");
  }
}

// Steps [first, end) of both optimizers over the same gradients, then checks that `sharded`
// equals `plain` bit for bit (`what` names the case in the error).
void StepBoth(ZeroOptimizer& zero, std::vector<at::Tensor>& sharded,
              torch::optim::Optimizer& reference, std::vector<at::Tensor>& plain, int first,
              int end, const std::string& what) {
  for (int step = first; step < end; ++step) {
    zero.ZeroGrad();
    SetGradients(sharded, step);
    zero.Step();
    reference.zero_grad();
    SetGradients(plain, step);
    reference.step();
    for (size_t i = 0; i < plain.size(); ++i) {
      Check(at::equal(sharded[i], plain[i]), what + ": parameter " + std::to_string(i) +
                                                 " differs from the plain optimizer's at step " +
                                                 std::to_string(step + 1));
    }
  }
}

// A copy of `tensors` that shares no memory with them.
std::vector<at::Tensor> Copies(const std::vector<at::Tensor>& tensors) {
  std::vector<at::Tensor> copies;
  for (const at::Tensor& tensor : tensors) copies.push_back(tensor.detach().clone());
  return copies;
}

// What a rank writes of a parallel checkpoint (ShardedStateDict) against the plain optimizer's
// state `want`: placeholders of the full shapes in the same layout, and owned bytes that are
// exactly the matching bytes of the parameters and of `want`'s tensors, for this rank's slices.
void CheckShardedState(const ZeroOptimizer& zero, const std::vector<at::Tensor>& parameters,
                       const Value& want, const std::string& kind) {
  absl::StatusOr<ZeroOptimizer::ShardedState> sharded = zero.ShardedStateDict();
  Check(sharded.ok(), sharded.status().ToString());
  std::vector<at::Tensor> placeholders, full;
  sharded->state_dict.ForEachTensor(
      [&](const std::string&, const at::Tensor& t) { placeholders.push_back(t); });
  want.ForEachTensor([&](const std::string&, const at::Tensor& t) { full.push_back(t); });
  Check(placeholders.size() == full.size(), kind + ": sharded state has another layout");
  for (size_t i = 0; i < full.size(); ++i) {
    if (full[i].numel() <= 1) continue;  // 'step': a value, not a placeholder.
    Check(placeholders[i].is_meta() && placeholders[i].sizes() == full[i].sizes(),
          kind + ": state tensor " + std::to_string(i) + " is not a full-shape placeholder");
  }
  size_t owned_bytes = 0;
  for (const OwnedTensorBytes& owned : sharded->owned) {
    at::Tensor expected;
    for (size_t p = 0; p < parameters.size(); ++p) {
      if (owned.tensor.is_same(parameters[p])) expected = parameters[p];
    }
    for (size_t i = 0; i < full.size(); ++i) {
      if (owned.tensor.is_same(placeholders[i])) expected = full[i];
    }
    Check(expected.defined(), kind + ": owned bytes of an unknown tensor");
    const int64_t element = static_cast<int64_t>(expected.element_size());
    const at::Tensor slice =
        expected.reshape({-1}).slice(0, owned.begin / element, owned.end / element);
    Check(at::equal(slice, owned.source.reshape({-1})),
          kind + ": owned bytes differ from the plain optimizer's");
    owned_bytes += owned.end - owned.begin;
  }
  // This rank's slices of the parameters and of each per-element state tensor, nothing more.
  size_t own_elements = 0;
  for (const ZeroOptimizer::Slice& slice : zero.own_slices())
    own_elements += slice.end - slice.begin;
  const size_t per_element_states = kind == "sgd" ? 1 : 2;
  Check(owned_bytes == own_elements * 4 * (1 + per_element_states),
        kind + ": owned bytes are not this rank's slices");
}

// One rank: for `kind`, ZeRO-1 against the plain optimizer over a copy of the same parameters.
void RunKind(const ddp::ProcessGroupHandle& group, const std::string& kind) {
  absl::StatusOr<OptimizerSpec> spec = ParseOptimizerKind(kind);
  Check(spec.ok(), spec.status().ToString());
  spec->lr = 1e-2;
  spec->weight_decay = 0.01;
  std::vector<at::Tensor> sharded = MakeParameters(), plain = MakeParameters();
  absl::StatusOr<std::unique_ptr<ZeroOptimizer>> zero =
      ZeroOptimizer::Create(*spec, sharded, group.comm);
  Check(zero.ok(), zero.status().ToString());
  absl::StatusOr<std::unique_ptr<torch::optim::Optimizer>> reference = MakeOptimizer(*spec, plain);
  Check(reference.ok(), reference.status().ToString());
  if (group.world_size == 2) {
    // The big parameter is cut between the two ranks: each holds part of its state.
    const std::vector<ZeroOptimizer::Slice>& partition = (*zero)->partition();
    Check(partition.size() >= 2 && partition[0].parameter == 0 && partition[1].parameter == 0 &&
              partition[0].owner == 0 && partition[1].owner == 1,
          "parameter 0 is not cut between the two ranks");
  }
  StepBoth(**zero, sharded, **reference, plain, 0, 50, kind);
  absl::StatusOr<Value> gathered = (*zero)->GatherStateDict();
  Check(gathered.ok(), gathered.status().ToString());
  absl::StatusOr<Value> want = OptimizerStateDict(**reference);
  Check(want.ok(), want.status().ToString());
  ExpectSameTensors(*gathered, *want, kind + " gathered state");
  CheckShardedState(**zero, sharded, *want, kind);

  // The plain optimizer's state restores into a fresh ZeRO optimizer (as a version saved by any
  // world size would), and both go on alike.
  std::vector<at::Tensor> resumed = Copies(plain);
  absl::StatusOr<std::unique_ptr<ZeroOptimizer>> restored =
      ZeroOptimizer::Create(*spec, resumed, group.comm);
  Check(restored.ok(), restored.status().ToString());
  absl::Status loaded = (*restored)->LoadStateDict(*want);
  Check(loaded.ok(), loaded.ToString());
  StepBoth(**restored, resumed, **reference, plain, 50, 55, kind + " restored");

  // The same from a stored version, each rank reading only its byte ranges of the state tensors
  // (parameter 0's state spans two 4 MiB chunks, cut between the ranks). Processes cannot share
  // one RocksDB, so each rank stores the same version in a store of its own.
  StoreOptions store_options;
  store_options.db_path = absl::StrCat(std::getenv("TEST_TMPDIR"), "/", kind, "_", group.world_size,
                                       "_ranks_rank", group.rank);
  absl::StatusOr<std::unique_ptr<RocksDbCheckpointStore>> store =
      RocksDbCheckpointStore::Open(store_options);
  Check(store.ok(), store.status().ToString());
  CheckpointContents contents;
  for (size_t i = 0; i < plain.size(); ++i) {
    contents.model.InsertOrAssign(absl::StrCat("p", i), plain[i].detach());
  }
  absl::StatusOr<Value> current = OptimizerStateDict(**reference);
  Check(current.ok(), current.status().ToString());
  contents.optimizer = *current;
  absl::StatusOr<CommitResult> committed = CommitCheckpoint(**store, "zero", contents);
  Check(committed.ok(), committed.status().ToString());
  absl::StatusOr<std::unique_ptr<VersionReader>> reader =
      (*store)->OpenVersion(*ParseVersionRef("zero"));
  Check(reader.ok(), reader.status().ToString());
  std::vector<at::Tensor> reread = Copies(plain);
  absl::StatusOr<std::unique_ptr<ZeroOptimizer>> from_store =
      ZeroOptimizer::Create(*spec, reread, group.comm);
  Check(from_store.ok(), from_store.status().ToString());
  loaded = (*from_store)->LoadStateFrom(**reader);
  Check(loaded.ok(), loaded.ToString());
  StepBoth(**from_store, reread, **reference, plain, 55, 58, kind + " resumed from the store");
}

int RunWorker() {
  try {
    std::optional<ddp::RendezvousOptions> rendezvous = ddp::RendezvousOptionsFromEnvironment();
    if (!rendezvous) throw std::runtime_error("worker started without RANK/WORLD_SIZE");
    rendezvous->timeout = std::chrono::seconds(60);
    const ddp::ProcessGroupHandle group = ddp::InitProcessGroup(*rendezvous);
    for (const char* kind : {"adamw", "adam", "sgd"}) RunKind(group, kind);
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "zero optimizer worker failed: " << e.what() << "\n";
    return 1;
  }
}

TEST(ZeroOptimizerTest, ShardedStepsMatchThePlainOptimizerBitForBitOnTwoAndThreeRanks) {
  for (int ranks : {2, 3}) {
    const std::vector<int> exits =
        ddp::RunLocalRanks({}, ranks, ddp::PickFreeLoopbackPort(), {{kWorkerVariable, "1"}},
                           std::chrono::seconds(120));
    EXPECT_THAT(exits, Each(Eq(0))) << ranks << " ranks: see the workers' stderr above";
  }
}

TEST(ZeroOptimizerTest, OneRankHoldsEverything) {
  ddp::RendezvousOptions rendezvous;
  rendezvous.master_port = 0;
  const ddp::ProcessGroupHandle group = ddp::InitProcessGroup(rendezvous);
  absl::StatusOr<OptimizerSpec> spec = ParseOptimizerKind("adamw");
  ASSERT_TRUE(spec.ok());
  absl::StatusOr<std::unique_ptr<ZeroOptimizer>> zero =
      ZeroOptimizer::Create(*spec, MakeParameters(), group.comm);
  ASSERT_TRUE(zero.ok()) << zero.status();
  ASSERT_EQ((*zero)->partition().size(), 4u);
  for (const ZeroOptimizer::Slice& slice : (*zero)->partition()) EXPECT_EQ(slice.owner, 0);
}

TEST(ZeroOptimizerTest, NonContiguousParametersAreRefused) {
  ddp::RendezvousOptions rendezvous;
  rendezvous.master_port = 0;
  const ddp::ProcessGroupHandle group = ddp::InitProcessGroup(rendezvous);
  absl::StatusOr<OptimizerSpec> spec = ParseOptimizerKind("sgd");
  ASSERT_TRUE(spec.ok());
  absl::StatusOr<std::unique_ptr<ZeroOptimizer>> zero =
      ZeroOptimizer::Create(*spec, {at::randn({8, 4}).t()}, group.comm);
  EXPECT_EQ(zero.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(zero.status().message()), ::testing::HasSubstr("not contiguous"));
}

}  // namespace
}  // namespace ckpt::train

// The test binary doubles as the worker: RunLocalRanks starts /proc/self/exe with
// kWorkerVariable set, and those copies run one rank instead of the tests.
int main(int argc, char** argv) {
  if (std::getenv(ckpt::train::kWorkerVariable) != nullptr) return ckpt::train::RunWorker();
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}

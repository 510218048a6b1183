#include "libs/ddp/distributed_data_parallel.h"

#include <sys/stat.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <iterator>
#include <memory>
#include <string>
#include <vector>

#include "ATen/CPUGeneratorImpl.h"
#include "ATen/Context.h"
#include "ATen/core/Tensor.h"
#include "ATen/core/grad_mode.h"
#include "ATen/ops/allclose.h"
#include "ATen/ops/cat.h"
#include "ATen/ops/empty.h"
#include "ATen/ops/equal.h"
#include "ATen/ops/full.h"
#include "ATen/ops/mse_loss.h"
#include "ATen/ops/randn.h"
#include "ATen/ops/tanh.h"
#include "ATen/ops/zeros.h"
#include "c10/util/Exception.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "libs/ddp/local_launcher.h"
#include "libs/ddp/process_group.h"
#include "libs/ddp/testing/device_checking_process_group.h"
#include "torch/csrc/jit/api/module.h"
#include "torch/nn/module.h"
#include "torch/nn/modules/batchnorm.h"
#include "torch/nn/modules/linear.h"

namespace ckpt::ddp {
namespace {

using ::testing::ElementsAre;

constexpr char kScenarioVariable[] = "CKPT_DDP_TEST_SCENARIO";
constexpr char kOutputVariable[] = "CKPT_DDP_TEST_OUTPUT";
constexpr int64_t kRankBatch = 6;  // rows per rank per step (or per micro-batch)
constexpr int kSteps = 5;
constexpr double kLearningRate = 0.1;

// 8 -> 16 -> 16 -> 4. With a 1 KiB bucket cap its six parameters fall into three buckets.
struct Mlp : torch::nn::Module {
  Mlp() {
    fc1 = register_module("fc1", torch::nn::Linear(8, 16));
    fc2 = register_module("fc2", torch::nn::Linear(16, 16));
    fc3 = register_module("fc3", torch::nn::Linear(16, 4));
  }
  at::Tensor forward(const at::Tensor& x) {
    return fc3->forward(at::tanh(fc2->forward(at::tanh(fc1->forward(x)))));
  }
  torch::nn::Linear fc1{nullptr}, fc2{nullptr}, fc3{nullptr};
};

struct BatchNormNet : torch::nn::Module {
  BatchNormNet() {
    fc = register_module("fc", torch::nn::Linear(4, 4));
    bn = register_module("bn", torch::nn::BatchNorm1d(4));
  }
  at::Tensor forward(const at::Tensor& x) { return bn->forward(fc->forward(x)); }
  torch::nn::Linear fc{nullptr};
  torch::nn::BatchNorm1d bn{nullptr};
};

// Different seeds per rank on purpose: DistributedDataParallel must make rank 0's init everyone's.
std::shared_ptr<Mlp> MakeMlp(uint64_t seed) {
  at::manual_seed(seed);
  return std::make_shared<Mlp>();
}

// Rows of the deterministic global batch number `batch`: inputs [rows, 8], targets [rows, 4].
std::pair<at::Tensor, at::Tensor> GlobalBatch(uint64_t batch, int64_t rows) {
  at::Generator generator = at::make_generator<at::CPUGeneratorImpl>(1000 + batch);
  at::Tensor inputs = at::randn({rows, 8}, generator, at::TensorOptions().dtype(at::kFloat));
  at::Tensor targets = at::randn({rows, 4}, generator, at::TensorOptions().dtype(at::kFloat));
  return {inputs, targets};
}

at::Tensor Flat(const std::vector<at::Tensor>& tensors) {
  std::vector<at::Tensor> pieces;
  for (const at::Tensor& t : tensors) pieces.push_back(t.detach().reshape({-1}));
  return at::cat(pieces).contiguous();
}

std::vector<at::Tensor> Grads(torch::nn::Module& module) {
  std::vector<at::Tensor> grads;
  for (const at::Tensor& p : module.parameters()) grads.push_back(p.grad());
  return grads;
}

void SgdStep(torch::nn::Module& module) {
  at::NoGradGuard no_grad;
  for (at::Tensor& p : module.parameters()) {
    p.sub_(p.grad() * kLearningRate);
    p.mutable_grad().zero_();
  }
}

void WriteTensor(const std::string& path, const at::Tensor& tensor) {
  const at::Tensor t = tensor.contiguous();
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(static_cast<const char*>(t.data_ptr()), static_cast<std::streamsize>(t.nbytes()));
  TORCH_CHECK(out.good(), "writing ", path, " failed");
}

at::Tensor ReadTensor(const std::string& path, at::ScalarType dtype) {
  std::ifstream in(path, std::ios::binary);
  TORCH_CHECK(in.good(), "cannot open ", path);
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const int64_t element = static_cast<int64_t>(c10::elementSize(dtype));
  at::Tensor t =
      at::empty({static_cast<int64_t>(bytes.size()) / element}, at::TensorOptions().dtype(dtype));
  std::memcpy(t.data_ptr(), bytes.data(), bytes.size());
  return t;
}

std::string File(const std::string& dir, const std::string& name, int rank, int step = -1) {
  return dir + "/" + name + "_rank" + std::to_string(rank) +
         (step >= 0 ? "_step" + std::to_string(step) : std::string()) + ".bin";
}

// Every test runs its group as if rank r's collectives were on cuda:r, so a tensor handed to a
// collective without going through the Communicator fails here as it would under NCCL
// (libs/ddp/testing/device_checking_process_group.h). Models stay on the CPU.
ProcessGroupHandle OnDeclaredDevice(ProcessGroupHandle pg) {
  const c10::Device device(c10::kCUDA, static_cast<c10::DeviceIndex>(pg.rank));
  return testing::WithDeclaredDevice(std::move(pg), device);
}

// ---- Worker side: one rank, in a child process started by RunLocalRanks. ----

void TrainWorker(const ProcessGroupHandle& pg, const std::string& dir) {
  const int rank = pg.rank;
  std::shared_ptr<Mlp> model = MakeMlp(1234 + rank);
  DataParallelOptions options;
  options.bucket_cap_bytes = 1024;
  DistributedDataParallel ddp(model, pg.comm, options);
  const std::vector<std::vector<int64_t>> expected_buckets = {{5, 4, 3}, {2}, {1, 0}};
  TORCH_CHECK(ddp.bucket_parameter_indices() == expected_buckets, "unexpected buckets, ",
              ddp.num_buckets(), " of them");
  WriteTensor(File(dir, "params", rank, 0), Flat(model->parameters()));
  for (int step = 1; step <= kSteps; ++step) {
    auto [inputs, targets] = GlobalBatch(step, 2 * kRankBatch);
    ddp.PrepareForward();
    at::Tensor loss = at::mse_loss(model->forward(inputs.narrow(0, rank * kRankBatch, kRankBatch)),
                                   targets.narrow(0, rank * kRankBatch, kRankBatch));
    loss.backward();
    ddp.FinishGradientSync();
    const double global_loss = pg.comm.AllReduceMean(loss.item<double>());
    SgdStep(*model);
    WriteTensor(File(dir, "params", rank, step), Flat(model->parameters()));
    WriteTensor(File(dir, "loss", rank, step), at::full({1}, global_loss, at::kDouble));
  }
  const int64_t parameter_bytes = Flat(model->parameters()).nbytes();
  TORCH_CHECK(ddp.bytes_all_reduced() == kSteps * parameter_bytes, "bytes_all_reduced ",
              ddp.bytes_all_reduced(), ", expected ", kSteps * parameter_bytes);
}

// The Mlp as a TorchScript module (what torch.jit.script of it gives, written out): the same
// parameters in the same order, a buffer, and forward through the interpreter.
torch::jit::Module ScriptedMlp(const Mlp& source, float scale) {
  torch::jit::Module module("ScriptedMlp");
  for (const auto& item : source.named_parameters()) {
    std::string name = item.key();
    std::replace(name.begin(), name.end(), '.', '_');
    module.register_parameter(name, item.value().detach().clone().requires_grad_(true),
                              /*is_buffer=*/false);
  }
  module.register_buffer("scale", at::full({1}, scale));
  module.define(R"(
    def forward(self, x):
        h = torch.tanh(torch.linear(x, self.fc1_weight, self.fc1_bias))
        h = torch.tanh(torch.linear(h, self.fc2_weight, self.fc2_bias))
        return torch.linear(h, self.fc3_weight, self.fc3_bias) * self.scale
  )");
  return module;
}

// As TrainWorker, on the scripted Mlp: DDP over a torch::jit::Module's parameters and buffers.
void ScriptedWorker(const ProcessGroupHandle& pg, const std::string& dir) {
  const int rank = pg.rank;
  // Rank-specific parameters and buffer: DDP must make rank 0's everyone's.
  torch::jit::Module model = ScriptedMlp(*MakeMlp(1234 + rank), rank == 0 ? 1.0f : 3.0f);
  DataParallelOptions options;
  options.bucket_cap_bytes = 1024;
  DistributedDataParallel ddp(model, pg.comm, options);
  const std::vector<std::vector<int64_t>> expected_buckets = {{5, 4, 3}, {2}, {1, 0}};
  TORCH_CHECK(ddp.bucket_parameter_indices() == expected_buckets, "unexpected buckets");
  std::vector<at::Tensor> parameters;
  for (const at::Tensor& parameter : model.parameters()) parameters.push_back(parameter);
  WriteTensor(File(dir, "params", rank, 0), Flat(parameters));
  for (int step = 1; step <= kSteps; ++step) {
    auto [inputs, targets] = GlobalBatch(step, 2 * kRankBatch);
    ddp.PrepareForward();
    at::Tensor outputs =
        model.forward({inputs.narrow(0, rank * kRankBatch, kRankBatch)}).toTensor();
    at::mse_loss(outputs, targets.narrow(0, rank * kRankBatch, kRankBatch)).backward();
    ddp.FinishGradientSync();
    at::NoGradGuard no_grad;
    for (at::Tensor& parameter : parameters) {
      parameter.sub_(parameter.grad() * kLearningRate);
      parameter.mutable_grad().zero_();
    }
    WriteTensor(File(dir, "params", rank, step), Flat(parameters));
  }
}

void NoSyncWorker(const ProcessGroupHandle& pg, const std::string& dir) {
  const int rank = pg.rank;
  std::shared_ptr<Mlp> model = MakeMlp(77 + rank);
  DataParallelOptions options;
  options.bucket_cap_bytes = 1024;
  DistributedDataParallel ddp(model, pg.comm, options);
  // Rank r's micro-batches are rows [2r * B, (2r + 1) * B) and [(2r + 1) * B, (2r + 2) * B).
  auto [inputs, targets] = GlobalBatch(100, 4 * kRankBatch);
  auto micro_loss = [&](int micro) {
    const int64_t start = (2 * rank + micro) * kRankBatch;
    return at::mse_loss(model->forward(inputs.narrow(0, start, kRankBatch)),
                        targets.narrow(0, start, kRankBatch)) *
           0.5;
  };
  {
    DistributedDataParallel::NoSyncGuard guard = ddp.NoSync();
    DistributedDataParallel::NoSyncGuard moved = std::move(guard);  // still in force
    micro_loss(0).backward();
    ddp.FinishGradientSync();  // a no-op inside NoSync
  }
  TORCH_CHECK(ddp.bytes_all_reduced() == 0, "NoSync backward communicated ",
              ddp.bytes_all_reduced(), " bytes");
  micro_loss(1).backward();
  ddp.FinishGradientSync();
  const int64_t parameter_bytes = static_cast<int64_t>(Flat(model->parameters()).nbytes());
  TORCH_CHECK(ddp.bytes_all_reduced() == parameter_bytes, "the synchronized backward all-reduced ",
              ddp.bytes_all_reduced(), " bytes");
  WriteTensor(File(dir, "grads", rank), Flat(Grads(*model)));
}

void BuffersWorker(const ProcessGroupHandle& pg, const std::string& dir) {
  const int rank = pg.rank;
  at::manual_seed(5);
  auto model = std::make_shared<BatchNormNet>();
  DistributedDataParallel ddp(model, pg.comm);
  // Rank-specific data moves each rank's running statistics differently.
  at::Generator generator = at::make_generator<at::CPUGeneratorImpl>(500 + rank);
  at::Tensor inputs = at::randn({8, 4}, generator, at::TensorOptions()) * (rank + 1) + rank;
  {
    at::NoGradGuard no_grad;
    model->forward(inputs);
  }
  WriteTensor(File(dir, "running_mean_before", rank), model->bn->running_mean.clone());
  ddp.PrepareForward();
  WriteTensor(File(dir, "running_mean_after", rank), model->bn->running_mean.clone());
}

int RunWorker(const std::string& scenario) {
  try {
    const char* dir = std::getenv(kOutputVariable);
    TORCH_CHECK(dir != nullptr, kOutputVariable, " is not set");
    std::optional<RendezvousOptions> options = RendezvousOptionsFromEnvironment();
    TORCH_CHECK(options.has_value(), "worker started without RANK/WORLD_SIZE");
    options->timeout = std::chrono::seconds(20);
    const ProcessGroupHandle pg = OnDeclaredDevice(InitProcessGroup(*options));
    if (scenario == "train") {
      TrainWorker(pg, dir);
    } else if (scenario == "scripted") {
      ScriptedWorker(pg, dir);
    } else if (scenario == "nosync") {
      NoSyncWorker(pg, dir);
    } else if (scenario == "buffers") {
      BuffersWorker(pg, dir);
    } else {
      TORCH_CHECK(false, "unknown scenario ", scenario);
    }
    pg.comm.Barrier();  // nobody tears down Gloo while a peer still needs it
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "worker " << scenario << " failed: " << e.what() << "\n";
    return 1;
  }
}

// ---- Test side. ----

std::string RunScenario(const std::string& scenario, const std::string& run = "") {
  const std::string dir = std::string(std::getenv("TEST_TMPDIR")) + "/" + scenario + run;
  ::mkdir(dir.c_str(), 0755);
  const std::vector<int> exits = RunLocalRanks(
      {}, 2, PickFreeLoopbackPort(), {{kScenarioVariable, scenario}, {kOutputVariable, dir}},
      std::chrono::seconds(60));
  EXPECT_THAT(exits, ElementsAre(0, 0)) << "see the workers' stderr above";
  return dir;
}

TEST(DistributedDataParallelTest, TwoRanksStayIdenticalAndMatchSingleProcessTraining) {
  const std::string dir = RunScenario("train");
  if (HasFailure()) return;

  // The single-process run over the same global batches, from rank 0's initialization.
  std::shared_ptr<Mlp> reference = MakeMlp(1234);
  for (int step = 0; step <= kSteps; ++step) {
    double reference_loss = 0;
    if (step > 0) {
      auto [inputs, targets] = GlobalBatch(step, 2 * kRankBatch);
      at::Tensor loss = at::mse_loss(reference->forward(inputs), targets);
      reference_loss = loss.item<double>();
      loss.backward();
      SgdStep(*reference);
    }
    const at::Tensor rank0 = ReadTensor(File(dir, "params", 0, step), at::kFloat);
    const at::Tensor rank1 = ReadTensor(File(dir, "params", 1, step), at::kFloat);
    EXPECT_TRUE(at::equal(rank0, rank1)) << "ranks differ after step " << step << " by up to "
                                         << (rank0 - rank1).abs().max().item<float>();
    const at::Tensor expected = Flat(reference->parameters());
    ASSERT_EQ(rank0.numel(), expected.numel());
    EXPECT_TRUE(at::allclose(rank0, expected, /*rtol=*/0, /*atol=*/1e-6))
        << "step " << step << ": max difference from single-process training "
        << (rank0 - expected).abs().max().item<float>();
    if (step > 0) {
      for (int rank = 0; rank < 2; ++rank) {
        EXPECT_NEAR(ReadTensor(File(dir, "loss", rank, step), at::kDouble).item<double>(),
                    reference_loss, 1e-6)
            << "step " << step << " rank " << rank;
      }
    }
  }
}

TEST(DistributedDataParallelTest, AScriptedModuleTrainsLikeTheSameLibTorchModule) {
  const std::string scripted = RunScenario("scripted");
  const std::string plain = RunScenario("train", "_for_scripted");
  if (HasFailure()) return;
  for (int step = 0; step <= kSteps; ++step) {
    const at::Tensor rank0 = ReadTensor(File(scripted, "params", 0, step), at::kFloat);
    const at::Tensor rank1 = ReadTensor(File(scripted, "params", 1, step), at::kFloat);
    EXPECT_TRUE(at::equal(rank0, rank1)) << "ranks differ after step " << step;
    // Not bit-equal: the interpreter differentiates with its own formulas (TorchScript's
    // autodiff of tanh, for one), a float32 ulp or so per step away from LibTorch's kernels.
    const at::Tensor expected = ReadTensor(File(plain, "params", 0, step), at::kFloat);
    EXPECT_TRUE(at::allclose(rank0, expected, /*rtol=*/1e-6, /*atol=*/1e-7))
        << "step " << step << ": the scripted module differs by up to "
        << (rank0 - expected).abs().max().item<float>();
  }
}

TEST(DistributedDataParallelTest, TrainingRunsAreBitIdentical) {
  const std::string first = RunScenario("train", "_first");
  const std::string second = RunScenario("train", "_second");
  if (HasFailure()) return;
  for (int rank = 0; rank < 2; ++rank) {
    EXPECT_TRUE(at::equal(ReadTensor(File(first, "params", rank, kSteps), at::kFloat),
                          ReadTensor(File(second, "params", rank, kSteps), at::kFloat)))
        << "rank " << rank;
  }
}

TEST(DistributedDataParallelTest, NoSyncAccumulationEqualsOneStepOverTheConcatenatedBatch) {
  const std::string dir = RunScenario("nosync");
  if (HasFailure()) return;
  std::shared_ptr<Mlp> reference = MakeMlp(77);
  auto [inputs, targets] = GlobalBatch(100, 4 * kRankBatch);
  at::mse_loss(reference->forward(inputs), targets).backward();
  const at::Tensor expected = Flat(Grads(*reference));
  const at::Tensor rank0 = ReadTensor(File(dir, "grads", 0), at::kFloat);
  const at::Tensor rank1 = ReadTensor(File(dir, "grads", 1), at::kFloat);
  EXPECT_TRUE(at::equal(rank0, rank1));
  ASSERT_EQ(rank0.numel(), expected.numel());
  EXPECT_TRUE(at::allclose(rank0, expected, /*rtol=*/0, /*atol=*/1e-6))
      << "max difference " << (rank0 - expected).abs().max().item<float>();
}

TEST(DistributedDataParallelTest, PrepareForwardGivesEveryRankRankZerosBuffers) {
  const std::string dir = RunScenario("buffers");
  if (HasFailure()) return;
  const at::Tensor before0 = ReadTensor(File(dir, "running_mean_before", 0), at::kFloat);
  const at::Tensor before1 = ReadTensor(File(dir, "running_mean_before", 1), at::kFloat);
  const at::Tensor after0 = ReadTensor(File(dir, "running_mean_after", 0), at::kFloat);
  const at::Tensor after1 = ReadTensor(File(dir, "running_mean_after", 1), at::kFloat);
  ASSERT_FALSE(at::equal(before0, before1)) << "the ranks' statistics did not diverge";
  EXPECT_TRUE(at::equal(after0, before0));
  EXPECT_TRUE(at::equal(after1, before0)) << "rank 1 " << after1 << " rank 0 " << before0;
}

// World size 1 runs the same code path in-process; the average of one rank is its gradient.
TEST(DistributedDataParallelTest, SingleRankGradientsEqualPlainBackward) {
  RendezvousOptions options;
  options.master_port = 0;
  const ProcessGroupHandle pg = OnDeclaredDevice(InitProcessGroup(options));
  std::shared_ptr<Mlp> model = MakeMlp(9);
  std::shared_ptr<Mlp> plain = MakeMlp(9);
  auto [inputs, targets] = GlobalBatch(7, kRankBatch);
  at::mse_loss(plain->forward(inputs), targets).backward();
  {
    DistributedDataParallel ddp(model, pg.comm);
    EXPECT_EQ(ddp.num_buckets(), 1);
    EXPECT_THAT(ddp.bucket_parameter_indices(), ElementsAre(ElementsAre(5, 4, 3, 2, 1, 0)));
    at::mse_loss(model->forward(inputs), targets).backward();
    ddp.FinishGradientSync();
    EXPECT_TRUE(at::equal(Flat(Grads(*model)), Flat(Grads(*plain))));
  }
  // The hooks are gone with the DistributedDataParallel: backward works and accumulates.
  at::mse_loss(model->forward(inputs), targets).backward();
  EXPECT_TRUE(at::allclose(Flat(Grads(*model)), Flat(Grads(*plain)) * 2));
}

// Communication overlaps backward: when fc1's gradients (the last bucket) start arriving, the
// buckets holding fc3 and fc2 are already on the wire.
TEST(DistributedDataParallelTest, EarlierBucketsLaunchWhileBackwardIsStillRunning) {
  RendezvousOptions options;
  options.master_port = 0;
  const ProcessGroupHandle pg = OnDeclaredDevice(InitProcessGroup(options));
  std::shared_ptr<Mlp> model = MakeMlp(4);
  DistributedDataParallel* ddp_pointer = nullptr;
  int64_t launched_when_fc1_grad_arrived = -1;
  // Registered before DistributedDataParallel's hooks, so these run before the last bucket fills.
  for (at::Tensor* fc1 : {&model->fc1->weight, &model->fc1->bias}) {
    fc1->register_hook([&](const at::Tensor&) {
      if (launched_when_fc1_grad_arrived < 0) {
        launched_when_fc1_grad_arrived = ddp_pointer->bytes_all_reduced();
      }
    });
  }
  DataParallelOptions ddp_options;
  ddp_options.bucket_cap_bytes = 1024;
  DistributedDataParallel ddp(model, pg.comm, ddp_options);
  ddp_pointer = &ddp;
  auto [inputs, targets] = GlobalBatch(3, kRankBatch);
  at::mse_loss(model->forward(inputs), targets).backward();
  // Bucket 0: fc3.bias, fc3.weight, fc2.bias (16 + 256 + 64 bytes); bucket 1: fc2.weight (1024).
  EXPECT_EQ(launched_when_fc1_grad_arrived, 336 + 1024);
  ddp.FinishGradientSync();
  EXPECT_EQ(ddp.bytes_all_reduced(), 336 + 1024 + 576);
}

TEST(DistributedDataParallelTest, ParametersWithoutGradientGetZerosAndUndefinedGradsAreDefined) {
  RendezvousOptions options;
  options.master_port = 0;
  const ProcessGroupHandle pg = OnDeclaredDevice(InitProcessGroup(options));
  std::shared_ptr<Mlp> model = MakeMlp(3);
  DataParallelOptions ddp_options;
  ddp_options.bucket_cap_bytes = 1024;
  DistributedDataParallel ddp(model, pg.comm, ddp_options);
  // Only fc3 takes part; fc1 and fc2 get no gradient in this backward.
  at::Tensor hidden = at::randn({3, 16});
  at::mse_loss(model->fc3->forward(hidden), at::zeros({3, 4})).backward();
  ddp.FinishGradientSync();
  ASSERT_TRUE(model->fc1->weight.grad().defined());
  EXPECT_TRUE(at::equal(model->fc1->weight.grad(), at::zeros({16, 8})));
  EXPECT_TRUE(at::equal(model->fc2->bias.grad(), at::zeros({16})));
  EXPECT_GT(model->fc3->weight.grad().abs().sum().item<float>(), 0);
  EXPECT_EQ(ddp.bytes_all_reduced(), Flat(model->parameters()).nbytes());
}

// 0-dim parameters (a learned temperature, as CLIP's logit_scale), one used and one not.
struct ScalarNet : torch::nn::Module {
  ScalarNet() {
    scale = register_parameter("scale", at::full({}, 2.0f));
    unused = register_parameter("unused", at::full({}, 5.0f));
    half_unused = register_parameter("half_unused", at::full({}, 1.0f, at::kHalf));
  }
  at::Tensor scale, unused, half_unused;
};

TEST(DistributedDataParallelTest, ZeroDimParametersKeepTheirGradientDtype) {
  RendezvousOptions options;
  options.master_port = 0;
  const ProcessGroupHandle pg = OnDeclaredDevice(InitProcessGroup(options));
  auto model = std::make_shared<ScalarNet>();
  DistributedDataParallel ddp(model, pg.comm, DataParallelOptions());
  for (int step = 0; step < 2; ++step) {  // the second step finds .grad defined.
    (model->scale * at::full({3}, 1.5f)).sum().backward();
    ddp.FinishGradientSync();
    SCOPED_TRACE(step);
    EXPECT_EQ(model->scale.grad().scalar_type(), at::kFloat);
    EXPECT_EQ(model->scale.grad().dim(), 0);
    EXPECT_FLOAT_EQ(model->scale.grad().item<float>(), 4.5f * (step + 1));  // accumulates.
    ASSERT_TRUE(model->unused.grad().defined());
    EXPECT_EQ(model->unused.grad().scalar_type(), at::kFloat);
    EXPECT_EQ(model->unused.grad().item<float>(), 0.0f);
    ASSERT_TRUE(model->half_unused.grad().defined());
    EXPECT_EQ(model->half_unused.grad().scalar_type(), at::kHalf);
  }
}

}  // namespace
}  // namespace ckpt::ddp

// The test binary doubles as the worker: RunLocalRanks starts /proc/self/exe with the scenario
// variable set, and those copies run one rank instead of the tests.
int main(int argc, char** argv) {
  if (const char* scenario = std::getenv(ckpt::ddp::kScenarioVariable); scenario != nullptr) {
    return ckpt::ddp::RunWorker(scenario);
  }
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}

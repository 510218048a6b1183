// Smoke test of libs/ddp on a real machine: trains a small MLP with DistributedDataParallel on
// WORLD ranks (processes this program starts itself, torchrun-style) and checks that every rank
// ends with bit-identical parameters.
//
// Usage: ddp_smoke_main [BACKEND [DEVICE [WORLD]]]
//   BACKEND gloo (default) | nccl;  DEVICE cpu (default) | cuda;  WORLD ranks, default 2.
// Prints each step's mean loss and, on success, "ddp smoke: OK" (exit 0).
// tools/gpu_check.sh builds this with CMake against a pip PyTorch and runs it with nccl/cuda.

#include <chrono>
#include <cstdlib>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "ATen/CPUGeneratorImpl.h"
#include "ATen/Context.h"
#include "ATen/core/Tensor.h"
#include "ATen/core/grad_mode.h"
#include "ATen/ops/cat.h"
#include "ATen/ops/equal.h"
#include "ATen/ops/mse_loss.h"
#include "ATen/ops/randn.h"
#include "ATen/ops/relu.h"
#include "libs/ddp/distributed_data_parallel.h"
#include "libs/ddp/local_launcher.h"
#include "libs/ddp/process_group.h"
#include "torch/nn/module.h"
#include "torch/nn/modules/linear.h"

namespace {

constexpr char kWorkerVariable[] = "CKPT_DDP_SMOKE_WORKER";
constexpr int kSteps = 10;
constexpr int64_t kRankBatch = 32;

struct Mlp : torch::nn::Module {
  Mlp() {
    fc1 = register_module("fc1", torch::nn::Linear(32, 256));
    fc2 = register_module("fc2", torch::nn::Linear(256, 256));
    fc3 = register_module("fc3", torch::nn::Linear(256, 8));
  }
  at::Tensor forward(const at::Tensor& x) {
    return fc3->forward(at::relu(fc2->forward(at::relu(fc1->forward(x)))));
  }
  torch::nn::Linear fc1{nullptr}, fc2{nullptr}, fc3{nullptr};
};

int RunRank(const std::string& backend, const std::string& device_name) {
  std::optional<ckpt::ddp::RendezvousOptions> options =
      ckpt::ddp::RendezvousOptionsFromEnvironment();
  TORCH_CHECK(options.has_value(), "worker started without RANK/WORLD_SIZE");
  options->backend = backend;
  options->timeout = std::chrono::seconds(60);
  TORCH_CHECK(device_name == "cpu" || device_name == "cuda", "unknown device \"", device_name,
              "\"; expected cpu or cuda");
  options->device_type = device_name == "cuda" ? at::kCUDA : at::kCPU;
  // With cuda, rank r computes on cuda:<local rank r>, which InitProcessGroup makes current.
  const ckpt::ddp::ProcessGroupHandle pg = ckpt::ddp::InitProcessGroup(*options);
  const ckpt::ddp::Communicator& comm = pg.comm;
  const at::Device device = comm.device();
  const int rank = pg.rank;

  at::manual_seed(42 + rank);  // rank 0's init must win
  auto model = std::make_shared<Mlp>();
  model->to(device);
  ckpt::ddp::DataParallelOptions ddp_options;
  ddp_options.bucket_cap_bytes = 64 * 1024;  // several buckets even for this small model
  ckpt::ddp::DistributedDataParallel ddp(model, comm, ddp_options);
  if (rank == 0) {
    std::cout << "ddp smoke: backend " << backend << ", device " << device << " (rank 0), world "
              << pg.world_size << ", " << ddp.num_buckets() << " buckets" << std::endl;
  }
  for (int step = 0; step < kSteps; ++step) {
    at::Generator generator = at::make_generator<at::CPUGeneratorImpl>(1000 + step);
    const int64_t rows = kRankBatch * pg.world_size;
    at::Tensor inputs = at::randn({rows, 32}, generator, at::TensorOptions());
    at::Tensor targets = inputs.narrow(1, 0, 8).sin();  // something learnable
    inputs = inputs.narrow(0, rank * kRankBatch, kRankBatch).to(device);
    targets = targets.narrow(0, rank * kRankBatch, kRankBatch).to(device);
    ddp.PrepareForward();
    at::Tensor loss = at::mse_loss(model->forward(inputs), targets);
    loss.backward();
    ddp.FinishGradientSync();
    {
      at::NoGradGuard no_grad;
      for (at::Tensor& p : model->parameters()) {
        p.sub_(p.grad() * 0.05);
        p.mutable_grad().zero_();
      }
    }
    const double mean_loss = comm.AllReduceMean(loss.item<double>());
    if (rank == 0) std::cout << "step " << step << " loss " << mean_loss << std::endl;
  }

  // Compare every rank's parameters with rank 0's, bit for bit.
  std::vector<at::Tensor> pieces;
  for (const at::Tensor& p : model->parameters()) pieces.push_back(p.detach().reshape({-1}));
  const at::Tensor mine = at::cat(pieces);
  at::Tensor root = comm.Place(mine.clone());
  comm.Broadcast(root, /*root=*/0);
  const bool same = at::equal(mine, root);
  const double agreeing = comm.AllReduceMean(same ? 1.0 : 0.0);
  comm.Barrier();
  if (agreeing != 1.0) {
    std::cerr << "rank " << rank << ": parameters " << (same ? "match" : "DIFFER from")
              << " rank 0's; fraction of ranks agreeing " << agreeing << std::endl;
    return 1;
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string backend = argc > 1 ? argv[1] : "gloo";
  const std::string device = argc > 2 ? argv[2] : "cpu";
  const int world = argc > 3 ? std::atoi(argv[3]) : 2;
  try {
    if (std::getenv(kWorkerVariable) != nullptr) return RunRank(backend, device);
    if (world < 1) {
      std::cerr << "WORLD must be >= 1, got \"" << (argc > 3 ? argv[3] : "") << "\"\n";
      return 2;
    }
    const std::vector<int> exits = ckpt::ddp::RunLocalRanks(
        {backend, device, std::to_string(world)}, world, ckpt::ddp::PickFreeLoopbackPort(),
        {{kWorkerVariable, "1"}}, std::chrono::minutes(5));
    for (size_t rank = 0; rank < exits.size(); ++rank) {
      if (exits[rank] != 0) {
        std::cerr << "ddp smoke: FAILED (rank " << rank << " exit status " << exits[rank] << ")\n";
        return 1;
      }
    }
    std::cout << "ddp smoke: OK" << std::endl;
    return 0;
  } catch (const c10::Error& e) {
    std::cerr << "ddp smoke: FAILED: " << e.what_without_backtrace() << "\n";
    return 1;
  } catch (const std::exception& e) {
    std::cerr << "ddp smoke: FAILED: " << e.what() << "\n";
    return 1;
  }
}

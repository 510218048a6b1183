// load_from_loader: how a team that is not ckpt gets a stored checkpoint into its own LibTorch
// module through the loader service. Copy this file; everything it does is a few calls.
//
//   bazel run //tools/examples:load_from_loader -- --loader=127.0.0.1:50052 --ref=mlp@best
//       [--device=cuda:0] [--ddp] [--auth_token=TOKEN]      (one command line)
//
// The module here is the fixtures' MLP (Linear 4->8, BatchNorm1d, ReLU, Linear 8->3); replace it
// with yours.

#include <iostream>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "libs/client/remote_loader.h"
#include "libs/loader/load_target.h"
#include "libs/loader/loader.h"
#include "libs/status/status_macros.h"
#include "libs/store/version_ref.h"
#include "libs/tensor/device.h"
#include "libs/tensor/dtype.h"
#include "libs/tensor/state_dict.h"
#include "torch/csrc/autograd/grad_mode.h"
#include "torch/nn/modules/activation.h"
#include "torch/nn/modules/batchnorm.h"
#include "torch/nn/modules/container/sequential.h"
#include "torch/nn/modules/linear.h"

ABSL_FLAG(std::string, loader, "127.0.0.1:50052", "HOST:PORT of the loader service.");
ABSL_FLAG(std::string, auth_token, "", "Bearer token, if the loader was started with one.");
ABSL_FLAG(std::string, ref, "mlp", "Version to load: MODEL, MODEL@7 or MODEL@alias.");
ABSL_FLAG(std::string, device, "cpu", "Where the module lives: cpu, cuda, cuda:1, ...");
ABSL_FLAG(bool, ddp, false, "Wrap the module the way DDP does (keys under \"module.\").");

namespace {

// Your model. Its parameter and buffer names are what the checkpoint must provide.
torch::nn::Sequential MakeModel() {
  return torch::nn::Sequential(torch::nn::Linear(4, 8), torch::nn::BatchNorm1d(8),
                               torch::nn::ReLU(), torch::nn::Linear(8, 3));
}

// A DDP-style consumer: the same model one level down, as "module.".
struct Wrapped : torch::nn::Module {
  Wrapped() { module = register_module("module", MakeModel().ptr()); }
  std::shared_ptr<torch::nn::SequentialImpl> module;
};

absl::Status Run() {
  // 1. Connect. Calls retry on UNAVAILABLE with backoff and carry deadlines (see the options).
  ckpt::RemoteLoaderOptions options;
  options.address = absl::GetFlag(FLAGS_loader);
  options.auth_token = absl::GetFlag(FLAGS_auth_token);
  ASSIGN_OR_RETURN(std::unique_ptr<ckpt::RemoteLoader> loader,
                   ckpt::RemoteLoader::Connect(options));
  ASSIGN_OR_RETURN(ckpt::v1::VersionRef ref, ckpt::ParseVersionRef(absl::GetFlag(FLAGS_ref)));

  // 2. Build the module where it will run.
  std::shared_ptr<torch::nn::Module> module;
  if (absl::GetFlag(FLAGS_ddp)) {
    module = std::make_shared<Wrapped>();
  } else {
    module = MakeModel().ptr();
  }
  ckpt::LoadTarget target;
  ASSIGN_OR_RETURN(target.device, ckpt::ParseDevice(absl::GetFlag(FLAGS_device)));
  ASSIGN_OR_RETURN(c10::Device device, ckpt::ResolveTorchDevice(target.device));
  module->to(device);

  // 3. Preflight: does the checkpoint fit, and under which key layout? No tensor bytes move.
  ASSIGN_OR_RETURN(ckpt::PreflightReport preflight,
                   loader->Preflight(ref, ckpt::ExpectedTensorsOf(*module), target));
  if (!preflight.report.compatible() && preflight.suggested_keys.has_value()) {
    // E.g. a DDP consumer of a checkpoint stored under canonical keys: ask for "module." keys.
    target.keys = *preflight.suggested_keys;
    ASSIGN_OR_RETURN(preflight, loader->Preflight(ref, ckpt::ExpectedTensorsOf(*module), target));
  }
  std::cout << preflight.summary << "\n";
  if (!preflight.report.compatible()) {
    return absl::FailedPreconditionError("the checkpoint does not fit this module");
  }

  // 4. Load: the service selects, renames and casts; the client puts each tensor on the device.
  ASSIGN_OR_RETURN(ckpt::LoadedState state, loader->Load(ref, target));
  // Where the tensors arrived, before anything copies them (tools/gpu_check.sh reads this line):
  // "arrived: 8 float32 on cuda:1, 1 int64 on cuda:1".
  std::map<std::string, int> arrived;
  for (const ckpt::StateDict::Entry& entry : state.model) {
    const absl::StatusOr<ckpt::DType> dtype = ckpt::FromScalarType(entry.tensor.scalar_type());
    ++arrived[absl::StrCat(dtype.ok() ? std::string(ckpt::DTypeName(*dtype))
                                      : std::string(c10::toString(entry.tensor.scalar_type())),
                           " on ", entry.tensor.device().str())];
  }
  std::vector<std::string> arrivals;
  for (const auto& [what, count] : arrived) arrivals.push_back(absl::StrCat(count, " ", what));
  std::cout << "arrived: " << absl::StrJoin(arrivals, ", ") << "\n";

  // 5. Copy into the module (what load_state_dict does), without recording autograd history.
  torch::NoGradGuard no_grad;
  int copied = 0;
  for (auto& item : module->named_parameters()) {
    if (const at::Tensor* source = state.model.Find(item.key())) {
      item.value().copy_(*source);
      ++copied;
    }
  }
  for (auto& item : module->named_buffers()) {
    if (const at::Tensor* source = state.model.Find(item.key())) {
      item.value().copy_(*source);
      ++copied;
    }
  }
  std::cout << "loaded " << ckpt::FormatVersionRef(state.manifest.model(), state.manifest.version())
            << ": " << copied << " tensors onto " << target.device.ToString() << "\n";
  return absl::OkStatus();
}

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  absl::Status status = Run();
  if (!status.ok()) {
    std::cerr << "load_from_loader: " << status << "\n";
    return 1;
  }
  return 0;
}

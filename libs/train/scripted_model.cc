#include "libs/train/scripted_model.h"

#include <sys/stat.h>

#include <iostream>
#include <optional>
#include <set>
#include <utility>
#include <vector>

#include "ATen/core/Tensor.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "libs/status/status_macros.h"
#include "torch/csrc/jit/serialization/import.h"

namespace ckpt::train {
namespace {

constexpr char kStateDictKeysFile[] = "state_dict_keys.txt";

class ScriptedModel final : public TrainableModel {
 public:
  ScriptedModel(torch::jit::Module module, std::string path, std::optional<LossKind> loss_kind,
                std::optional<std::set<std::string>> persistent_buffers)
      : module_(std::move(module)),
        path_(std::move(path)),
        loss_kind_(loss_kind),
        persistent_buffers_(std::move(persistent_buffers)) {
    loss_method_ = module_.find_method("loss");
  }

  std::vector<at::Tensor> parameters() const override {
    std::vector<at::Tensor> parameters;
    for (const at::Tensor& parameter : module_.parameters()) parameters.push_back(parameter);
    return parameters;
  }

  ddp::ReplicaTensors Replica() const override { return ddp::TensorsOf(module_); }

  StateDict Weights() const override {
    StateDict out;
    Append(module_, "", out);
    return out;
  }

  std::map<int64_t, std::string> OptimizerParamNames() const override {
    std::map<int64_t, std::string> names;
    int64_t id = 0;
    for (const auto& item : module_.named_parameters(/*recurse=*/true)) names[id++] = item.name;
    return names;
  }

  void SetTraining(bool training) override { module_.train(training); }
  void To(at::Device device) override { module_.to(device); }

  LossResult Loss(const at::Tensor& inputs, const at::Tensor& targets) override {
    LossResult result;
    if (loss_method_) {
      const c10::IValue loss = (*loss_method_)({inputs, targets});
      TORCH_CHECK(loss.isTensor(), class_name(), ".loss() returned a ", loss.tagKind(),
                  ", not a Tensor");
      result.loss = loss.toTensor();
      return result;
    }
    const c10::IValue outputs = module_.forward({inputs});
    TORCH_CHECK(outputs.isTensor(), class_name(), ".forward() returned a ", outputs.tagKind(),
                "; the trainer's --loss needs one Tensor: give the module a "
                "@torch.jit.export def loss(self, inputs, targets) -> Tensor");
    result.outputs = outputs.toTensor();
    result.loss = ComputeLoss(*loss_kind_, result.outputs, targets);
    return result;
  }

  ModelIdentity Identity() const override {
    return {"torchscript_class", class_name(),
            absl::StrCat("TorchScript module: ", class_name(), " from ", path_, "; its loss: ",
                         loss_method_ ? "the module's loss()" : LossKindName(*loss_kind_))};
  }

 private:
  std::string class_name() const { return module_.type()->name()->qualifiedName(); }

  // Python's Module._save_to_state_dict order: own parameters, own buffers, then each child.
  void Append(const torch::jit::Module& module, const std::string& prefix, StateDict& out) const {
    for (const auto& item : module.named_parameters(/*recurse=*/false)) {
      out.InsertOrAssign(prefix + item.name, item.value.detach());
    }
    for (const auto& item : module.named_buffers(/*recurse=*/false)) {
      const std::string key = prefix + item.name;
      if (persistent_buffers_ && persistent_buffers_->count(key) == 0) continue;
      out.InsertOrAssign(key, item.value.detach());
    }
    for (const auto& child : module.named_children()) {
      Append(child.value, prefix + child.name + ".", out);
    }
  }

  mutable torch::jit::Module module_;  // a handle: const methods read through it.
  std::string path_;
  std::optional<LossKind> loss_kind_;  // used without a loss method
  std::optional<std::set<std::string>> persistent_buffers_;
  c10::optional<torch::jit::Method> loss_method_;
};

}  // namespace

std::string TorchScriptErrorCause(const std::string& message) {
  std::vector<absl::string_view> lines =
      absl::StrSplit(message, '\n', absl::SkipWhitespace());
  if (lines.size() <= 1 || message.find("Traceback of TorchScript") == std::string::npos) {
    return std::string(lines.empty() ? absl::string_view(message) : lines.front());
  }
  return std::string(absl::StripAsciiWhitespace(lines.back()));
}

absl::StatusOr<std::unique_ptr<TrainableModel>> LoadScriptedModel(
    const ScriptedModelOptions& options) {
  struct stat info = {};
  if (::stat(options.path.c_str(), &info) != 0 || !S_ISREG(info.st_mode)) {
    return absl::NotFoundError(absl::StrCat("no TorchScript module at ", options.path));
  }
  torch::jit::ExtraFilesMap extra_files = {{kStateDictKeysFile, ""}};
  torch::jit::Module module;
  try {
    module = torch::jit::load(options.path, at::Device(at::kCPU), extra_files);
  } catch (const std::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(
        options.path, " is not a TorchScript module (torch::jit::load: ",
        TorchScriptErrorCause(e.what()),
        "). Save one from Python with torch.jit.script(model).save(PATH); a torch.save "
        "checkpoint holds weights without the model's code (import it with ckpt import instead)"));
  }
  const std::string class_name = module.type()->name()->qualifiedName();

  bool trainable = false;
  for (const at::Tensor& parameter : module.parameters()) {
    if (parameter.requires_grad()) trainable = true;
  }
  if (!trainable) {
    return absl::InvalidArgumentError(absl::StrCat(
        options.path, " (", class_name,
        ") has no parameters that require grad: there is nothing to train"));
  }

  const c10::optional<torch::jit::Method> loss_method = module.find_method("loss");
  if (loss_method) {
    // self, inputs, targets.
    const size_t arguments = loss_method->function().getSchema().arguments().size();
    if (arguments != 3) {
      return absl::InvalidArgumentError(absl::StrCat(
          class_name, ".loss() takes ", arguments - 1,
          " argument(s); the trainer calls loss(inputs, targets) and needs a scalar Tensor"));
    }
  }
  std::optional<LossKind> loss_kind;
  if (!options.loss.empty()) {
    ASSIGN_OR_RETURN(loss_kind, ParseLossKind(options.loss));
    if (loss_method) {
      std::cerr << "trainer: " << class_name << " defines loss(); it is used, not --loss="
                << options.loss << "\n";
    }
  } else if (!loss_method) {
    loss_kind = LossKind::kCrossEntropy;
  }

  std::optional<std::set<std::string>> persistent_buffers;
  if (const std::string& listed = extra_files[kStateDictKeysFile]; !listed.empty()) {
    std::set<std::string> keys;
    for (absl::string_view line : absl::StrSplit(listed, '\n', absl::SkipWhitespace())) {
      keys.emplace(absl::StripAsciiWhitespace(line));
    }
    std::set<std::string> known;
    for (const auto& item : module.named_parameters(/*recurse=*/true)) known.insert(item.name);
    for (const auto& item : module.named_buffers(/*recurse=*/true)) known.insert(item.name);
    std::vector<std::string> unknown;
    for (const std::string& key : keys) {
      if (known.count(key) == 0) unknown.push_back(key);
    }
    if (!unknown.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          options.path, "'s ", kStateDictKeysFile, " lists key(s) the module does not have: ",
          absl::StrJoin(unknown, ", ")));
    }
    persistent_buffers = std::move(keys);
  }
  return std::make_unique<ScriptedModel>(std::move(module), options.path, loss_kind,
                                         std::move(persistent_buffers));
}

}  // namespace ckpt::train

#include "libs/train/trainable_model.h"

#include <utility>

#include "ATen/core/Tensor.h"
#include "ATen/ops/binary_cross_entropy_with_logits.h"
#include "ATen/ops/cross_entropy_loss.h"
#include "ATen/ops/log_softmax.h"
#include "ATen/ops/mse_loss.h"
#include "ATen/ops/nll_loss.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "libs/train/optimizer.h"

namespace ckpt::train {
namespace {

class BuiltInModel final : public TrainableModel {
 public:
  explicit BuiltInModel(std::shared_ptr<Model> model) : model_(std::move(model)) {}

  std::vector<at::Tensor> parameters() const override { return model_->parameters(); }
  ddp::ReplicaTensors Replica() const override { return ddp::TensorsOf(model_); }
  StateDict Weights() const override { return ModelStateDict(*model_); }
  std::map<int64_t, std::string> OptimizerParamNames() const override {
    return train::OptimizerParamNames(*model_);
  }
  void SetTraining(bool training) override { model_->train(training); }
  void To(at::Device device) override { model_->to(device); }
  LossResult Loss(const at::Tensor& inputs, const at::Tensor& targets) override {
    LossResult result;
    result.outputs = model_->forward(inputs);
    // log_softmax + nll_loss, as the built-in models always trained (the same kernels as
    // cross_entropy, so their runs stay bit-identical to earlier ones).
    result.loss = at::nll_loss(at::log_softmax(result.outputs, 1), targets);
    return result;
  }
  ModelIdentity Identity() const override {
    const std::string twin = model_->PythonTwin();
    return {"python_twin", twin,
            absl::StrCat("PyTorch twin: ", twin, " (libs/train/python/twins.py)")};
  }

 private:
  std::shared_ptr<Model> model_;
};

}  // namespace

absl::StatusOr<LossKind> ParseLossKind(absl::string_view name) {
  if (name == "cross_entropy") return LossKind::kCrossEntropy;
  if (name == "mse") return LossKind::kMse;
  if (name == "bce_with_logits") return LossKind::kBceWithLogits;
  return absl::InvalidArgumentError(absl::StrCat(
      "unknown loss '", name, "' (expected cross_entropy, mse or bce_with_logits)"));
}

std::string LossKindName(LossKind kind) {
  switch (kind) {
    case LossKind::kCrossEntropy:
      return "cross_entropy";
    case LossKind::kMse:
      return "mse";
    case LossKind::kBceWithLogits:
      return "bce_with_logits";
  }
  return "?";
}

at::Tensor ComputeLoss(LossKind kind, const at::Tensor& outputs, const at::Tensor& targets) {
  switch (kind) {
    case LossKind::kCrossEntropy:
      return at::cross_entropy_loss(outputs, targets);
    case LossKind::kMse:
      return at::mse_loss(outputs, targets.to(outputs.scalar_type()));
    case LossKind::kBceWithLogits:
      return at::binary_cross_entropy_with_logits(outputs, targets.to(outputs.scalar_type()));
  }
  TORCH_CHECK(false, "unknown loss kind");
}

absl::StatusOr<std::unique_ptr<TrainableModel>> WrapBuiltInModel(
    absl::StatusOr<std::shared_ptr<Model>> model) {
  if (!model.ok()) return model.status();
  if (*model == nullptr) return absl::InvalidArgumentError("no model");
  return std::make_unique<BuiltInModel>(*std::move(model));
}

}  // namespace ckpt::train

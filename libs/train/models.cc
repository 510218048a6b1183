#include "libs/train/models.h"

#include <utility>

#include "ATen/core/Tensor.h"
#include "ATen/ops/max_pool2d.h"
#include "ATen/ops/randn.h"
#include "ATen/ops/relu.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "libs/status/status_macros.h"
#include "libs/status/torch_status.h"
#include "torch/nn/modules/batchnorm.h"
#include "torch/nn/modules/container/modulelist.h"
#include "torch/nn/modules/conv.h"
#include "torch/nn/modules/embedding.h"
#include "torch/nn/modules/linear.h"
#include "torch/nn/modules/transformercoder.h"
#include "torch/nn/modules/transformerlayer.h"

namespace ckpt::train {
namespace {

std::string ShapeString(const std::vector<int64_t>& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ","), "]");
}

// Twin: twins.MLP. ModuleList "hidden" then Linear "head", as in Python.
class MlpModel final : public Model {
 public:
  MlpModel(int64_t in_features, int64_t hidden, int64_t layers, int64_t num_classes)
      : in_features_(in_features), hidden_width_(hidden), num_classes_(num_classes) {
    hidden_ = register_module("hidden", torch::nn::ModuleList());
    int64_t width = in_features;
    for (int64_t i = 0; i < layers; ++i) {
      hidden_->push_back(torch::nn::Linear(width, hidden));
      width = hidden;
    }
    head_ = register_module("head", torch::nn::Linear(width, num_classes));
  }

  at::Tensor forward(const at::Tensor& inputs) override {
    at::Tensor x = inputs.flatten(1);
    for (const auto& layer : *hidden_) x = at::relu(layer->as<torch::nn::Linear>()->forward(x));
    return head_->forward(x);
  }

  std::string PythonTwin() const override {
    return absl::StrCat("MLP(in_features=", in_features_, ", hidden=", hidden_width_,
                        ", layers=", hidden_->size(), ", num_classes=", num_classes_, ")");
  }

 private:
  int64_t in_features_;
  int64_t hidden_width_;
  int64_t num_classes_;
  torch::nn::ModuleList hidden_{nullptr};
  torch::nn::Linear head_{nullptr};
};

// Twin: twins.CNN. Global average pooling makes it independent of the image size (12x12
// synthetic, 28x28 MNIST).
class CnnModel final : public Model {
 public:
  CnnModel(int64_t in_channels, int64_t channels, int64_t num_classes)
      : in_channels_(in_channels), channels_(channels), num_classes_(num_classes) {
    conv1_ = register_module(
        "conv1", torch::nn::Conv2d(torch::nn::Conv2dOptions(in_channels, channels, 3).padding(1)));
    bn1_ = register_module("bn1", torch::nn::BatchNorm2d(channels));
    conv2_ = register_module(
        "conv2", torch::nn::Conv2d(torch::nn::Conv2dOptions(channels, channels, 3).padding(1)));
    bn2_ = register_module("bn2", torch::nn::BatchNorm2d(channels));
    head_ = register_module("head", torch::nn::Linear(channels, num_classes));
  }

  at::Tensor forward(const at::Tensor& inputs) override {
    at::Tensor x = at::relu(bn1_->forward(conv1_->forward(inputs)));
    x = at::max_pool2d(x, {2, 2});
    x = at::relu(bn2_->forward(conv2_->forward(x)));
    x = x.mean({2, 3});
    return head_->forward(x);
  }

  std::string PythonTwin() const override {
    return absl::StrCat("CNN(in_channels=", in_channels_, ", channels=", channels_,
                        ", num_classes=", num_classes_, ")");
  }

 private:
  int64_t in_channels_;
  int64_t channels_;
  int64_t num_classes_;
  torch::nn::Conv2d conv1_{nullptr};
  torch::nn::BatchNorm2d bn1_{nullptr};
  torch::nn::Conv2d conv2_{nullptr};
  torch::nn::BatchNorm2d bn2_{nullptr};
  torch::nn::Linear head_{nullptr};
};

// Twin: twins.Transformer. LibTorch's encoder layer is post-norm, ReLU, LayerNorm eps 1e-5 and
// sequence-first [S,N,E]; the twin sets the same explicitly (Python's defaults could change).
class TransformerModel final : public Model {
 public:
  TransformerModel(int64_t vocab_size, int64_t seq_len, int64_t d_model, int64_t heads,
                   int64_t layers, int64_t num_classes)
      : vocab_size_(vocab_size),
        seq_len_(seq_len),
        d_model_(d_model),
        heads_(heads),
        layers_(layers),
        num_classes_(num_classes) {
    // Registered first so that, as in Python, it leads the state dict (own parameters before
    // children's). Small init like GPT-2's, so positions do not swamp the token embedding.
    pos_ = register_parameter("pos", at::randn({seq_len, d_model}) * 0.02);
    embed_ = register_module("embed", torch::nn::Embedding(vocab_size, d_model));
    torch::nn::TransformerEncoderLayer layer(
        torch::nn::TransformerEncoderLayerOptions(d_model, heads)
            .dim_feedforward(2 * d_model)
            .dropout(0.0)
            .activation(torch::kReLU));
    encoder_ = register_module("encoder", torch::nn::TransformerEncoder(
                                              torch::nn::TransformerEncoderOptions(layer, layers)));
    head_ = register_module("head", torch::nn::Linear(d_model, num_classes));
  }

  at::Tensor forward(const at::Tensor& inputs) override {
    const int64_t seq_len = inputs.size(1);
    at::Tensor x = embed_->forward(inputs) + pos_.slice(0, 0, seq_len);  // [N,S,E]
    x = encoder_->forward(x.transpose(0, 1));                            // [S,N,E]
    return head_->forward(x.mean(0));
  }

  std::string PythonTwin() const override {
    return absl::StrCat("Transformer(vocab_size=", vocab_size_, ", seq_len=", seq_len_,
                        ", d_model=", d_model_, ", heads=", heads_, ", layers=", layers_,
                        ", num_classes=", num_classes_, ")");
  }

 private:
  int64_t vocab_size_;
  int64_t seq_len_;
  int64_t d_model_;
  int64_t heads_;
  int64_t layers_;
  int64_t num_classes_;
  at::Tensor pos_;
  torch::nn::Embedding embed_{nullptr};
  torch::nn::TransformerEncoder encoder_{nullptr};
  torch::nn::Linear head_{nullptr};
};

absl::Status Positive(const char* name, int64_t value, const std::string& kind) {
  if (value > 0) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat(kind, ": ", name, " must be positive, got ", value));
}

absl::StatusOr<std::shared_ptr<Model>> MakeModelOrThrow(const ModelSpec& spec,
                                                        const Dataset& data) {
  const std::string& kind = spec.kind;
  const std::vector<int64_t> shape = data.example_shape();
  const int64_t num_classes = data.num_classes();
  if (num_classes <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        kind, ": the built-in models classify, and the data has no class ids (", data.Describe(),
        "); train a model of your own (--model=torchscript:PATH) "
        "on float targets"));
  }
  const bool tokens = data.input_kind() == InputKind::kTokens;
  if (kind == "mlp") {
    RETURN_IF_ERROR(Positive("hidden", spec.hidden, kind));
    if (spec.layers < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("mlp: layers must be >= 0, got ", spec.layers));
    }
    if (tokens) {
      return absl::InvalidArgumentError(
          absl::StrCat("mlp needs float features but the data holds token ids (", data.Describe(),
                       "); use --model=transformer"));
    }
    int64_t in_features = 1;
    for (int64_t dim : shape) in_features *= dim;
    if (in_features <= 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("mlp: examples of shape ", ShapeString(shape), " have no features"));
    }
    return std::make_shared<MlpModel>(in_features, spec.hidden, spec.layers, num_classes);
  }
  if (kind == "cnn") {
    RETURN_IF_ERROR(Positive("hidden (channels)", spec.hidden, kind));
    if (tokens || shape.size() != 3 || shape[0] <= 0 || shape[1] < 2 || shape[2] < 2) {
      return absl::InvalidArgumentError(absl::StrCat(
          "cnn needs float images [C,H,W] with H, W >= 2, but the data has ",
          tokens ? "token ids " : "examples ", ShapeString(shape), " (", data.Describe(),
          "); use --model=mlp for flat features or --model=transformer for tokens"));
    }
    return std::make_shared<CnnModel>(shape[0], spec.hidden, num_classes);
  }
  if (kind == "transformer") {
    RETURN_IF_ERROR(Positive("hidden (d_model)", spec.hidden, kind));
    RETURN_IF_ERROR(Positive("layers", spec.layers, kind));
    RETURN_IF_ERROR(Positive("heads", spec.heads, kind));
    if (!tokens || shape.size() != 1 || shape[0] <= 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("transformer needs int64 token sequences [S], but the data has ",
                       tokens ? "token ids " : "float features ", ShapeString(shape), " (",
                       data.Describe(), "); use --model=mlp or --model=cnn"));
    }
    if (data.vocab_size() <= 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("transformer: the data reports vocab size ", data.vocab_size()));
    }
    if (spec.hidden % spec.heads != 0) {
      return absl::InvalidArgumentError(absl::StrCat("transformer: heads (", spec.heads,
                                                     ") must divide hidden (", spec.hidden, ")"));
    }
    return std::make_shared<TransformerModel>(data.vocab_size(), shape[0], spec.hidden, spec.heads,
                                              spec.layers, num_classes);
  }
  return absl::InvalidArgumentError(absl::StrCat("unknown model kind '", kind, "' (expected ",
                                                 absl::StrJoin(ModelKinds(), ", "), ")"));
}

void AppendModuleState(const torch::nn::Module& module, const std::string& prefix, StateDict& out) {
  for (const auto& item : module.named_parameters(/*recurse=*/false)) {
    out.InsertOrAssign(prefix + item.key(), item.value().detach());
  }
  for (const auto& item : module.named_buffers(/*recurse=*/false)) {
    out.InsertOrAssign(prefix + item.key(), item.value().detach());
  }
  for (const auto& child : module.named_children()) {
    AppendModuleState(*child.value(), prefix + child.key() + ".", out);
  }
}

}  // namespace

absl::StatusOr<std::shared_ptr<Model>> MakeModel(const ModelSpec& spec, const Dataset& data) {
  try {
    return MakeModelOrThrow(spec, data);
  } catch (...) {
    return StatusFromCurrentException();
  }
}

std::vector<std::string> ModelKinds() { return {"mlp", "cnn", "transformer"}; }

StateDict ModelStateDict(const torch::nn::Module& module) {
  StateDict out;
  AppendModuleState(module, "", out);
  return out;
}

}  // namespace ckpt::train

#include "libs/train/optimizer.h"

#include <cmath>
#include <sstream>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>

#include "ATen/core/Tensor.h"
#include "ATen/ops/scalar_tensor.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "c10/util/C++17.h"
#include "libs/status/status_macros.h"
#include "libs/status/torch_status.h"
#include "torch/optim/adam.h"
#include "torch/optim/adamw.h"
#include "torch/optim/sgd.h"

namespace ckpt::train {
namespace {

using torch::optim::Adam;
using torch::optim::AdamOptions;
using torch::optim::AdamParamState;
using torch::optim::AdamW;
using torch::optim::AdamWOptions;
using torch::optim::AdamWParamState;
using torch::optim::Optimizer;
using torch::optim::OptimizerParamState;
using torch::optim::SGD;
using torch::optim::SGDOptions;
using torch::optim::SGDParamState;

enum class Kind { kSgd, kAdam, kAdamW };

const char* KindName(Kind kind) {
  switch (kind) {
    case Kind::kSgd:
      return "SGD";
    case Kind::kAdam:
      return "Adam";
    case Kind::kAdamW:
      return "AdamW";
  }
  return "?";
}

absl::StatusOr<Kind> KindOf(const Optimizer& optimizer) {
  if (dynamic_cast<const SGD*>(&optimizer) != nullptr) return Kind::kSgd;
  if (dynamic_cast<const Adam*>(&optimizer) != nullptr) return Kind::kAdam;
  if (dynamic_cast<const AdamW*>(&optimizer) != nullptr) return Kind::kAdamW;
  return absl::UnimplementedError(
      "optimizer state dicts are implemented for torch::optim SGD, Adam and AdamW only");
}

// The key LibTorch's optimizers use for a parameter's state (see adam.cpp / sgd.cpp): the
// TensorImpl's address, printed as a string (c10::guts::to_string) up to LibTorch 1.13 and the
// pointer itself from 2.0. The map's own key type says which.
using StateKeyType =
    std::decay_t<decltype(std::declval<torch::optim::Optimizer&>().state())>::key_type;

// A template so that only the branch for this LibTorch's key type is compiled.
template <typename Key>
Key StateKeyOf(const at::Tensor& param) {
  if constexpr (std::is_same_v<Key, std::string>) {
    std::ostringstream address;  // exactly what c10::guts::to_string did
    address << param.unsafeGetTensorImpl();
    return address.str();
  } else {
    return param.unsafeGetTensorImpl();
  }
}

StateKeyType StateKey(const at::Tensor& param) { return StateKeyOf<StateKeyType>(param); }

std::string ShapeString(at::IntArrayRef shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

// A float32 scalar tensor, as Python 1.13's Adam keeps 'step'.
Value StepValue(int64_t step) {
  return Value::Tensor(at::scalar_tensor(static_cast<double>(step), at::kFloat));
}

// Python 1.13's Adam and AdamW put their flags in different orders, and AdamW has no
// 'differentiable' / 'fused'; we mirror each so key lists compare equal to Python's.
void AppendAdamFlags(Value& group) {
  group.Set("maximize", Value::Bool(false));
  group.Set("foreach", Value::None());
  group.Set("capturable", Value::Bool(false));
  group.Set("differentiable", Value::Bool(false));
  group.Set("fused", Value::Bool(false));
}

void AppendAdamWFlags(Value& group) {
  group.Set("foreach", Value::None());
  group.Set("maximize", Value::Bool(false));
  group.Set("capturable", Value::Bool(false));
}

template <typename Options>
Value AdamLikeGroup(const Options& o, Kind kind) {
  Value group = Value::Dict();
  group.Set("lr", Value::Float(o.lr()));
  group.Set("betas", Value::Tuple({Value::Float(std::get<0>(o.betas())),
                                   Value::Float(std::get<1>(o.betas()))}));
  group.Set("eps", Value::Float(o.eps()));
  group.Set("weight_decay", Value::Float(o.weight_decay()));
  group.Set("amsgrad", Value::Bool(o.amsgrad()));
  if (kind == Kind::kAdam) {
    AppendAdamFlags(group);
  } else {
    AppendAdamWFlags(group);
  }
  return group;
}

Value SgdGroup(const SGDOptions& o) {
  Value group = Value::Dict();
  group.Set("lr", Value::Float(o.lr()));
  group.Set("momentum", Value::Float(o.momentum()));
  group.Set("dampening", Value::Float(o.dampening()));
  group.Set("weight_decay", Value::Float(o.weight_decay()));
  group.Set("nesterov", Value::Bool(o.nesterov()));
  group.Set("maximize", Value::Bool(false));
  group.Set("foreach", Value::None());
  group.Set("differentiable", Value::Bool(false));
  return group;
}

template <typename ParamState>
Value AdamLikeState(const ParamState& s) {
  Value state = Value::Dict();
  state.Set("step", StepValue(s.step()));
  state.Set("exp_avg", Value::Tensor(s.exp_avg()));
  state.Set("exp_avg_sq", Value::Tensor(s.exp_avg_sq()));
  if (s.max_exp_avg_sq().defined()) {
    state.Set("max_exp_avg_sq", Value::Tensor(s.max_exp_avg_sq()));
  }
  return state;
}

// ---- Reading a state dict.

absl::StatusOr<double> GetNumber(const Value& dict, const char* key, const std::string& where) {
  const Value* v = dict.Find(key);
  if (v == nullptr) return absl::InvalidArgumentError(absl::StrCat(where, ": no '", key, "'"));
  if (v->is_float()) return v->float_value();
  if (v->is_int()) return static_cast<double>(v->int_value());
  return absl::InvalidArgumentError(
      absl::StrCat(where, ": '", key, "' should be a number, found ", v->DebugString()));
}

// A missing flag takes `fallback` (older PyTorch versions wrote fewer flags).
absl::StatusOr<bool> GetBool(const Value& dict, const char* key, bool fallback,
                             const std::string& where) {
  const Value* v = dict.Find(key);
  if (v == nullptr || v->is_none()) return fallback;
  if (v->is_bool()) return v->bool_value();
  if (v->is_int()) return v->int_value() != 0;
  return absl::InvalidArgumentError(
      absl::StrCat(where, ": '", key, "' should be a bool, found ", v->DebugString()));
}

// 'step' as Python 1.13 (float32 tensor), 1.12 (int) or a float writes it.
absl::StatusOr<int64_t> GetStep(const Value& v, const std::string& where) {
  double step = 0;
  if (v.is_int()) {
    if (v.int_value() < 0) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": negative step ", v.int_value()));
    }
    return v.int_value();
  } else if (v.is_float()) {
    step = v.float_value();
  } else if (v.is_tensor() && v.tensor().defined() && v.tensor().numel() == 1) {
    ASSIGN_OR_RETURN(step, CatchTorchErrors([&] { return v.tensor().item<double>(); },
                                            absl::StatusCode::kInvalidArgument));
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": 'step' should be an int, a float or a one-element tensor, found ",
                     v.DebugString()));
  }
  if (!(step >= 0) || step != std::floor(step) || step > 9.0e15) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": 'step' should be a non-negative whole number, found ", step));
  }
  return static_cast<int64_t>(step);
}

// A state tensor checked against its parameter and copied onto the parameter's device (and its
// dtype when both are floating). Always a copy: the optimizer updates state in place, and it must
// not write into the caller's Value (or the store's buffers).
absl::StatusOr<at::Tensor> PlaceStateTensor(const Value* v, const char* key,
                                            const at::Tensor& param, int64_t param_id) {
  const std::string where = absl::StrCat("optimizer state of parameter ", param_id);
  if (v == nullptr) return absl::InvalidArgumentError(absl::StrCat(where, ": no '", key, "'"));
  if (!v->is_tensor() || !v->tensor().defined()) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": '", key, "' should be a tensor, found ", v->DebugString()));
  }
  const at::Tensor& t = v->tensor();
  if (t.sizes() != param.sizes()) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": '", key, "' has shape ", ShapeString(t.sizes()),
                     " in the state dict, the parameter has shape ", ShapeString(param.sizes())));
  }
  const at::ScalarType dtype =
      (t.is_floating_point() && param.is_floating_point()) ? param.scalar_type() : t.scalar_type();
  return CatchTorchErrors(
      [&] {
        return t.to(param.device(), dtype, /*non_blocking=*/false, /*copy=*/true).contiguous();
      },
      absl::StatusCode::kInvalidArgument);
}

// Which optimizer a state dict came from, judged by its keys.
absl::Status CheckKind(const Value& state_dict, Kind kind) {
  const Value* groups = state_dict.Find("param_groups");
  bool has_momentum = false;
  bool has_betas = false;
  for (const Value& group : groups->items()) {
    if (!group.is_dict()) continue;
    has_momentum |= group.Find("momentum") != nullptr;
    has_betas |= group.Find("betas") != nullptr;
  }
  const Value* state = state_dict.Find("state");
  for (const Value::Entry& entry : state->entries()) {
    if (!entry.second.is_dict()) continue;
    has_momentum |= entry.second.Find("momentum_buffer") != nullptr;
    has_betas |= entry.second.Find("exp_avg") != nullptr;
  }
  const bool want_sgd = kind == Kind::kSgd;
  if ((want_sgd && has_betas) || (!want_sgd && has_momentum) || (!has_betas && !has_momentum)) {
    const char* found = has_betas      ? "Adam/AdamW ('betas', 'exp_avg')"
                        : has_momentum ? "SGD ('momentum', 'momentum_buffer')"
                                       : "an unknown optimizer (neither 'betas' nor 'momentum')";
    return absl::InvalidArgumentError(absl::StrCat("optimizer state dict is from ", found,
                                                   " but the optimizer is ", KindName(kind)));
  }
  return absl::OkStatus();
}

absl::Status CheckUnsupportedFlags(const Value& group, const std::string& where) {
  ASSIGN_OR_RETURN(bool maximize, GetBool(group, "maximize", false, where));
  if (maximize) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": 'maximize': True is not implemented by LibTorch's optimizers"));
  }
  return absl::OkStatus();
}

// Everything LoadOptimizerStateDict will install, built before the optimizer is touched.
struct StagedParam {
  StateKeyType key;
  std::unique_ptr<OptimizerParamState> state;  // nullptr: the parameter has no state.
};

template <typename Options>
absl::StatusOr<std::unique_ptr<Options>> StageAdamGroup(const Options& current, const Value& g,
                                                        const std::string& where) {
  auto options = std::make_unique<Options>(current);
  ASSIGN_OR_RETURN(double lr, GetNumber(g, "lr", where));
  ASSIGN_OR_RETURN(double eps, GetNumber(g, "eps", where));
  ASSIGN_OR_RETURN(double weight_decay, GetNumber(g, "weight_decay", where));
  ASSIGN_OR_RETURN(bool amsgrad, GetBool(g, "amsgrad", false, where));
  const Value* betas = g.Find("betas");
  if (betas == nullptr || !betas->is_sequence() || betas->items().size() != 2 ||
      !(betas->items()[0].is_float() || betas->items()[0].is_int()) ||
      !(betas->items()[1].is_float() || betas->items()[1].is_int())) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": 'betas' should be a pair of numbers, found ",
                     betas == nullptr ? "nothing" : betas->DebugString()));
  }
  auto number = [](const Value& v) {
    return v.is_float() ? v.float_value() : static_cast<double>(v.int_value());
  };
  options->lr(lr).eps(eps).weight_decay(weight_decay).amsgrad(amsgrad);
  options->betas(std::make_tuple(number(betas->items()[0]), number(betas->items()[1])));
  return options;
}

absl::StatusOr<std::unique_ptr<SGDOptions>> StageSgdGroup(const SGDOptions& current, const Value& g,
                                                          const std::string& where) {
  auto options = std::make_unique<SGDOptions>(current);
  ASSIGN_OR_RETURN(double lr, GetNumber(g, "lr", where));
  ASSIGN_OR_RETURN(double momentum, GetNumber(g, "momentum", where));
  ASSIGN_OR_RETURN(double weight_decay, GetNumber(g, "weight_decay", where));
  double dampening = 0;
  if (g.Find("dampening") != nullptr) {
    ASSIGN_OR_RETURN(dampening, GetNumber(g, "dampening", where));
  }
  ASSIGN_OR_RETURN(bool nesterov, GetBool(g, "nesterov", false, where));
  options->lr(lr)
      .momentum(momentum)
      .weight_decay(weight_decay)
      .dampening(dampening)
      .nesterov(nesterov);
  return options;
}

template <typename ParamState>
absl::StatusOr<std::unique_ptr<OptimizerParamState>> StageAdamState(const Value& s,
                                                                    const at::Tensor& param,
                                                                    int64_t id, bool amsgrad) {
  const std::string where = absl::StrCat("optimizer state of parameter ", id);
  for (const Value::Entry& entry : s.entries()) {
    const std::string& k = entry.first.string_key();
    if (entry.first.is_int() ||
        (k != "step" && k != "exp_avg" && k != "exp_avg_sq" && k != "max_exp_avg_sq")) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, ": unexpected key ", entry.first.DebugString(),
          " for Adam/AdamW (expected 'step', 'exp_avg', 'exp_avg_sq', 'max_exp_avg_sq')"));
    }
  }
  auto state = std::make_unique<ParamState>();
  const Value* step = s.Find("step");
  if (step == nullptr) return absl::InvalidArgumentError(absl::StrCat(where, ": no 'step'"));
  ASSIGN_OR_RETURN(int64_t step_count, GetStep(*step, where));
  state->step(step_count);
  ASSIGN_OR_RETURN(at::Tensor exp_avg, PlaceStateTensor(s.Find("exp_avg"), "exp_avg", param, id));
  ASSIGN_OR_RETURN(at::Tensor exp_avg_sq,
                   PlaceStateTensor(s.Find("exp_avg_sq"), "exp_avg_sq", param, id));
  state->exp_avg(std::move(exp_avg));
  state->exp_avg_sq(std::move(exp_avg_sq));
  if (const Value* max_sq = s.Find("max_exp_avg_sq"); max_sq != nullptr && !max_sq->is_none()) {
    ASSIGN_OR_RETURN(at::Tensor t, PlaceStateTensor(max_sq, "max_exp_avg_sq", param, id));
    state->max_exp_avg_sq(std::move(t));
  } else if (amsgrad) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": 'amsgrad' is True but there is no 'max_exp_avg_sq'"));
  }
  return std::unique_ptr<OptimizerParamState>(std::move(state));
}

absl::StatusOr<std::unique_ptr<OptimizerParamState>> StageSgdState(const Value& s,
                                                                   const at::Tensor& param,
                                                                   int64_t id) {
  const std::string where = absl::StrCat("optimizer state of parameter ", id);
  for (const Value::Entry& entry : s.entries()) {
    if (entry.first.is_int() || entry.first.string_key() != "momentum_buffer") {
      return absl::InvalidArgumentError(absl::StrCat(where, ": unexpected key ",
                                                     entry.first.DebugString(),
                                                     " for SGD (expected 'momentum_buffer')"));
    }
  }
  const Value* buffer = s.Find("momentum_buffer");
  // Python keeps {'momentum_buffer': None} for momentum 0; LibTorch keeps no state then.
  if (buffer == nullptr || buffer->is_none()) return std::unique_ptr<OptimizerParamState>();
  ASSIGN_OR_RETURN(at::Tensor t, PlaceStateTensor(buffer, "momentum_buffer", param, id));
  auto state = std::make_unique<SGDParamState>();
  state->momentum_buffer(std::move(t));
  return std::unique_ptr<OptimizerParamState>(std::move(state));
}

}  // namespace

absl::StatusOr<OptimizerSpec> ParseOptimizerKind(absl::string_view kind) {
  std::string lower = absl::AsciiStrToLower(kind);
  if (lower != "sgd" && lower != "adam" && lower != "adamw") {
    return absl::InvalidArgumentError(
        absl::StrCat("unknown optimizer kind '", kind, "': expected one of sgd, adam, adamw"));
  }
  OptimizerSpec spec;
  spec.kind = std::move(lower);
  return spec;
}

absl::StatusOr<std::unique_ptr<Optimizer>> MakeOptimizer(const OptimizerSpec& spec,
                                                         std::vector<at::Tensor> parameters) {
  ASSIGN_OR_RETURN(OptimizerSpec parsed, ParseOptimizerKind(spec.kind));
  // LibTorch validates hyper-parameters with TORCH_CHECK in the constructors.
  return CatchTorchErrors(
      [&]() -> std::unique_ptr<Optimizer> {
        if (parsed.kind == "sgd") {
          return std::make_unique<SGD>(
              std::move(parameters),
              SGDOptions(spec.lr).momentum(spec.momentum).weight_decay(spec.weight_decay));
        }
        if (parsed.kind == "adam") {
          return std::make_unique<Adam>(std::move(parameters),
                                        AdamOptions(spec.lr)
                                            .betas(std::make_tuple(spec.beta1, spec.beta2))
                                            .eps(spec.eps)
                                            .weight_decay(spec.weight_decay));
        }
        return std::make_unique<AdamW>(std::move(parameters),
                                       AdamWOptions(spec.lr)
                                           .betas(std::make_tuple(spec.beta1, spec.beta2))
                                           .eps(spec.eps)
                                           .weight_decay(spec.weight_decay));
      },
      absl::StatusCode::kInvalidArgument);
}

absl::StatusOr<Value> OptimizerStateDict(const Optimizer& optimizer) {
  ASSIGN_OR_RETURN(Kind kind, KindOf(optimizer));
  Value state = Value::Dict();
  Value groups = Value::List();
  int64_t id = 0;
  for (const torch::optim::OptimizerParamGroup& group : optimizer.param_groups()) {
    Value g;
    switch (kind) {
      case Kind::kSgd:
        g = SgdGroup(static_cast<const SGDOptions&>(group.options()));
        break;
      case Kind::kAdam:
        g = AdamLikeGroup(static_cast<const AdamOptions&>(group.options()), kind);
        break;
      case Kind::kAdamW:
        g = AdamLikeGroup(static_cast<const AdamWOptions&>(group.options()), kind);
        break;
    }
    Value ids = Value::List();
    for (const at::Tensor& param : group.params()) {
      auto it = optimizer.state().find(StateKey(param));
      if (it != optimizer.state().end()) {
        switch (kind) {
          case Kind::kSgd: {
            const auto& s = static_cast<const SGDParamState&>(*it->second);
            if (s.momentum_buffer().defined()) {
              state.Set(id, Value::Dict({{"momentum_buffer", Value::Tensor(s.momentum_buffer())}}));
            }
            break;
          }
          case Kind::kAdam:
            state.Set(id, AdamLikeState(static_cast<const AdamParamState&>(*it->second)));
            break;
          case Kind::kAdamW:
            state.Set(id, AdamLikeState(static_cast<const AdamWParamState&>(*it->second)));
            break;
        }
      }
      ids.mutable_items().push_back(Value::Int(id));
      ++id;
    }
    g.Set("params", std::move(ids));
    groups.mutable_items().push_back(std::move(g));
  }
  return Value::Dict({{"state", std::move(state)}, {"param_groups", std::move(groups)}});
}

absl::Status LoadOptimizerStateDict(Optimizer& optimizer, const Value& state_dict) {
  ASSIGN_OR_RETURN(Kind kind, KindOf(optimizer));
  if (!state_dict.is_dict()) {
    return absl::InvalidArgumentError(
        absl::StrCat("optimizer state dict should be a dict, found ", state_dict.DebugString()));
  }
  const Value* state = state_dict.Find("state");
  const Value* groups = state_dict.Find("param_groups");
  if (state == nullptr || !state->is_dict() || groups == nullptr || !groups->is_sequence()) {
    return absl::InvalidArgumentError(
        "optimizer state dict should have a dict 'state' and a list 'param_groups'");
  }
  RETURN_IF_ERROR(CheckKind(state_dict, kind));
  std::vector<torch::optim::OptimizerParamGroup>& current = optimizer.param_groups();
  if (groups->items().size() != current.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("optimizer state dict has ", groups->items().size(),
                     " param groups, the optimizer has ", current.size()));
  }

  // Saved id -> the parameter at the same position, as Python's load_state_dict maps them.
  struct Target {
    const at::Tensor* param;
    int64_t index;  // position over all groups.
    size_t group;
  };
  std::map<int64_t, Target> params_by_id;
  std::vector<std::unique_ptr<torch::optim::OptimizerOptions>> new_options;
  int64_t position = 0;
  for (size_t g = 0; g < current.size(); ++g) {
    const Value& group = groups->items()[g];
    const std::string where = absl::StrCat("optimizer param group ", g);
    if (!group.is_dict()) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, " should be a dict, found ", group.DebugString()));
    }
    const Value* ids = group.Find("params");
    if (ids == nullptr || !ids->is_sequence()) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": no 'params' list"));
    }
    const std::vector<at::Tensor>& params = current[g].params();
    if (ids->items().size() != params.size()) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, " has ", ids->items().size(),
                       " parameters in the state dict, the optimizer's has ", params.size()));
    }
    for (size_t i = 0; i < params.size(); ++i) {
      const Value& id = ids->items()[i];
      if (!id.is_int() ||
          !params_by_id.emplace(id.int_value(), Target{&params[i], position, g}).second) {
        return absl::InvalidArgumentError(absl::StrCat(
            where, ": 'params' should hold distinct ints, found ", ids->DebugString()));
      }
      ++position;
    }
    RETURN_IF_ERROR(CheckUnsupportedFlags(group, where));
    switch (kind) {
      case Kind::kSgd: {
        ASSIGN_OR_RETURN(auto o, StageSgdGroup(static_cast<const SGDOptions&>(current[g].options()),
                                               group, where));
        new_options.push_back(std::move(o));
        break;
      }
      case Kind::kAdam: {
        ASSIGN_OR_RETURN(
            auto o,
            StageAdamGroup(static_cast<const AdamOptions&>(current[g].options()), group, where));
        new_options.push_back(std::move(o));
        break;
      }
      case Kind::kAdamW: {
        ASSIGN_OR_RETURN(
            auto o,
            StageAdamGroup(static_cast<const AdamWOptions&>(current[g].options()), group, where));
        new_options.push_back(std::move(o));
        break;
      }
    }
  }

  std::vector<StagedParam> staged;
  for (const Value::Entry& entry : state->entries()) {
    if (!entry.first.is_int()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "optimizer state is keyed by parameter id, found key ", entry.first.DebugString()));
    }
    auto it = params_by_id.find(entry.first.int_key());
    if (it == params_by_id.end()) {
      return absl::InvalidArgumentError(absl::StrCat("optimizer state for parameter id ",
                                                     entry.first.int_key(),
                                                     ", which no param group lists"));
    }
    if (!entry.second.is_dict()) {
      return absl::InvalidArgumentError(absl::StrCat("optimizer state of parameter ",
                                                     it->second.index, " should be a dict, found ",
                                                     entry.second.DebugString()));
    }
    const at::Tensor& param = *it->second.param;
    const int64_t index = it->second.index;
    const torch::optim::OptimizerOptions& group_options = *new_options[it->second.group];
    StagedParam p;
    p.key = StateKey(param);
    switch (kind) {
      case Kind::kSgd: {
        ASSIGN_OR_RETURN(p.state, StageSgdState(entry.second, param, index));
        break;
      }
      case Kind::kAdam: {
        const bool amsgrad = static_cast<const AdamOptions&>(group_options).amsgrad();
        ASSIGN_OR_RETURN(p.state,
                         StageAdamState<AdamParamState>(entry.second, param, index, amsgrad));
        break;
      }
      case Kind::kAdamW: {
        const bool amsgrad = static_cast<const AdamWOptions&>(group_options).amsgrad();
        ASSIGN_OR_RETURN(p.state,
                         StageAdamState<AdamWParamState>(entry.second, param, index, amsgrad));
        break;
      }
    }
    staged.push_back(std::move(p));
  }

  // Everything validated: install. State of parameters the dict does not mention is dropped, as
  // Python's load_state_dict replaces the whole state.
  for (size_t g = 0; g < current.size(); ++g) current[g].set_options(std::move(new_options[g]));
  optimizer.state().clear();
  for (StagedParam& p : staged) {
    if (p.state != nullptr) optimizer.state()[p.key] = std::move(p.state);
  }
  return absl::OkStatus();
}

std::map<int64_t, std::string> OptimizerParamNames(const torch::nn::Module& module) {
  std::map<int64_t, std::string> names;
  int64_t id = 0;
  for (const auto& item : module.named_parameters(/*recurse=*/true)) names[id++] = item.key();
  return names;
}

double CurrentLearningRate(const Optimizer& optimizer) {
  if (optimizer.param_groups().empty()) return 0;
  return optimizer.param_groups()[0].options().get_lr();
}

}  // namespace ckpt::train

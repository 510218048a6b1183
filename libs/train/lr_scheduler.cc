#include "libs/train/lr_scheduler.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "libs/status/status_macros.h"

namespace ckpt::train {
namespace {

constexpr double kPi = 3.14159265358979323846;

absl::StatusOr<double> GetNumber(const Value& dict, const char* key) {
  const Value* v = dict.Find(key);
  if (v != nullptr && v->is_float()) return v->float_value();
  if (v != nullptr && v->is_int()) return static_cast<double>(v->int_value());
  return absl::InvalidArgumentError(absl::StrCat("scheduler state dict: '", key,
                                                 "' should be a number, found ",
                                                 v == nullptr ? "nothing" : v->DebugString()));
}

absl::StatusOr<int64_t> GetInt(const Value& dict, const char* key) {
  const Value* v = dict.Find(key);
  if (v != nullptr && v->is_int()) return v->int_value();
  return absl::InvalidArgumentError(absl::StrCat("scheduler state dict: '", key,
                                                 "' should be an int, found ",
                                                 v == nullptr ? "nothing" : v->DebugString()));
}

absl::StatusOr<std::vector<double>> GetNumbers(const Value& dict, const char* key,
                                               size_t expected) {
  const Value* v = dict.Find(key);
  if (v == nullptr || !v->is_sequence()) {
    return absl::InvalidArgumentError(absl::StrCat("scheduler state dict: '", key,
                                                   "' should be a list of numbers, found ",
                                                   v == nullptr ? "nothing" : v->DebugString()));
  }
  if (v->items().size() != expected) {
    return absl::InvalidArgumentError(
        absl::StrCat("scheduler state dict: '", key, "' has ", v->items().size(),
                     " entries, the optimizer has ", expected, " param groups"));
  }
  std::vector<double> out;
  for (const Value& item : v->items()) {
    if (item.is_float()) {
      out.push_back(item.float_value());
    } else if (item.is_int()) {
      out.push_back(static_cast<double>(item.int_value()));
    } else {
      return absl::InvalidArgumentError(absl::StrCat(
          "scheduler state dict: '", key, "' should hold numbers, found ", v->DebugString()));
    }
  }
  return out;
}

Value FloatList(const std::vector<double>& values) {
  Value list = Value::List();
  for (double v : values) list.mutable_items().push_back(Value::Float(v));
  return list;
}

// What kind of scheduler a state dict came from, by its keys.
std::string DescribeKind(const Value& state) {
  if (state.Find("step_size") != nullptr) return "step";
  if (state.Find("warmup_steps") != nullptr) return "cosine";
  if (state.Find("lr_lambdas") != nullptr) return "a LambdaLR that is not ckpt's cosine";
  return "none";
}

absl::Status ValidateSpec(const SchedulerSpec& spec) {
  if (spec.kind == "step" && spec.step_size <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("step scheduler: step_size must be > 0, got ", spec.step_size));
  }
  if (spec.kind == "cosine") {
    if (spec.total_steps <= 0 || spec.warmup_steps < 0 || spec.warmup_steps > spec.total_steps) {
      return absl::InvalidArgumentError(absl::StrCat(
          "cosine scheduler: need total_steps > 0 and 0 <= warmup_steps <= total_steps, got "
          "warmup_steps ",
          spec.warmup_steps, ", total_steps ", spec.total_steps));
    }
    if (!(spec.min_lr_ratio >= 0 && spec.min_lr_ratio <= 1)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "cosine scheduler: min_lr_ratio must be in [0, 1], got ", spec.min_lr_ratio));
    }
  }
  return absl::OkStatus();
}

// PyTorch's _LRScheduler: base_lrs, last_epoch, _step_count, _last_lr, and the initial step.
// Subclasses compute the next lrs (get_lr) and add their keys to the state dict.
class SchedulerBase : public LrScheduler {
 public:
  SchedulerBase(SchedulerSpec spec, torch::optim::Optimizer& optimizer)
      : spec_(std::move(spec)), optimizer_(optimizer) {
    for (const auto& group : optimizer_.param_groups()) {
      base_lrs_.push_back(group.options().get_lr());
    }
  }

  // The constructor's step (Python's _initial_step); virtual calls are not made from
  // constructors, so MakeScheduler calls this.
  void InitialStep() { Step(); }

  void Step() override {
    ++step_count_;
    ++last_epoch_;
    std::vector<double> lrs = ComputeLrs();
    auto& groups = optimizer_.param_groups();
    for (size_t i = 0; i < groups.size() && i < lrs.size(); ++i) groups[i].options().set_lr(lrs[i]);
    last_lr_ = std::move(lrs);
  }

  std::vector<double> last_lr() const override { return last_lr_; }
  int64_t last_epoch() const override { return last_epoch_; }

  Value StateDict() const override {
    Value state = Value::Dict();
    AddLeadingKeys(state);
    state.Set("base_lrs", FloatList(base_lrs_));
    state.Set("last_epoch", Value::Int(last_epoch_));
    state.Set("verbose", Value::Bool(false));
    state.Set("_step_count", Value::Int(step_count_));
    state.Set("_get_lr_called_within_step", Value::Bool(false));
    state.Set("_last_lr", FloatList(last_lr_));
    AddTrailingKeys(state);
    return state;
  }

  absl::Status LoadStateDict(const Value& state) override {
    if (!state.is_dict()) {
      return absl::InvalidArgumentError(
          absl::StrCat("scheduler state dict should be a dict, found ", state.DebugString()));
    }
    const std::string found = DescribeKind(state);
    if (found != spec_.kind) {
      return absl::InvalidArgumentError(absl::StrCat("scheduler state dict is for a '", found,
                                                     "' scheduler, this scheduler is '", spec_.kind,
                                                     "'"));
    }
    const size_t groups = optimizer_.param_groups().size();
    ASSIGN_OR_RETURN(std::vector<double> base_lrs, GetNumbers(state, "base_lrs", groups));
    ASSIGN_OR_RETURN(std::vector<double> last_lr, GetNumbers(state, "_last_lr", groups));
    ASSIGN_OR_RETURN(int64_t last_epoch, GetInt(state, "last_epoch"));
    ASSIGN_OR_RETURN(int64_t step_count, GetInt(state, "_step_count"));
    SchedulerSpec spec = spec_;
    RETURN_IF_ERROR(ReadOwnKeys(state, spec));
    RETURN_IF_ERROR(ValidateSpec(spec));
    spec_ = spec;
    base_lrs_ = std::move(base_lrs);
    last_lr_ = std::move(last_lr);
    last_epoch_ = last_epoch;
    step_count_ = step_count;
    auto& optimizer_groups = optimizer_.param_groups();
    for (size_t i = 0; i < groups; ++i) optimizer_groups[i].options().set_lr(last_lr_[i]);
    return absl::OkStatus();
  }

 protected:
  virtual std::vector<double> ComputeLrs() const = 0;
  virtual void AddLeadingKeys(Value& state) const {}
  virtual void AddTrailingKeys(Value& state) const {}
  // Reads the kind's own keys into `spec` (validated afterwards).
  virtual absl::Status ReadOwnKeys(const Value& state, SchedulerSpec& spec) const {
    return absl::OkStatus();
  }

  std::vector<double> CurrentLrs() const {
    std::vector<double> lrs;
    for (const auto& group : optimizer_.param_groups()) lrs.push_back(group.options().get_lr());
    return lrs;
  }

  SchedulerSpec spec_;
  torch::optim::Optimizer& optimizer_;
  std::vector<double> base_lrs_;
  int64_t last_epoch_ = -1;
  int64_t step_count_ = 0;
  std::vector<double> last_lr_;
};

class ConstantScheduler final : public SchedulerBase {
 public:
  using SchedulerBase::SchedulerBase;

 protected:
  std::vector<double> ComputeLrs() const override { return CurrentLrs(); }
};

class StepScheduler final : public SchedulerBase {
 public:
  using SchedulerBase::SchedulerBase;

 protected:
  // Python's StepLR.get_lr, the recursive form, so rounding matches Python's exactly.
  std::vector<double> ComputeLrs() const override {
    std::vector<double> lrs = CurrentLrs();
    if (last_epoch_ == 0 || last_epoch_ % spec_.step_size != 0) return lrs;
    for (double& lr : lrs) lr = lr * spec_.gamma;
    return lrs;
  }

  void AddLeadingKeys(Value& state) const override {
    state.Set("step_size", Value::Int(spec_.step_size));
    state.Set("gamma", Value::Float(spec_.gamma));
  }

  absl::Status ReadOwnKeys(const Value& state, SchedulerSpec& spec) const override {
    ASSIGN_OR_RETURN(spec.step_size, GetInt(state, "step_size"));
    ASSIGN_OR_RETURN(spec.gamma, GetNumber(state, "gamma"));
    return absl::OkStatus();
  }
};

class CosineScheduler final : public SchedulerBase {
 public:
  using SchedulerBase::SchedulerBase;

 protected:
  // LambdaLR.get_lr: base_lr * lambda(last_epoch).
  std::vector<double> ComputeLrs() const override {
    const double factor = CosineWarmupFactor(spec_, last_epoch_);
    std::vector<double> lrs;
    for (double base : base_lrs_) lrs.push_back(base * factor);
    return lrs;
  }

  void AddTrailingKeys(Value& state) const override {
    // LambdaLR stores None for a lambda that is not a callable object; Python rebuilds it.
    Value lambdas = Value::List();
    for (size_t i = 0; i < base_lrs_.size(); ++i) lambdas.mutable_items().push_back(Value::None());
    state.Set("lr_lambdas", std::move(lambdas));
    state.Set("warmup_steps", Value::Int(spec_.warmup_steps));
    state.Set("total_steps", Value::Int(spec_.total_steps));
    state.Set("min_lr_ratio", Value::Float(spec_.min_lr_ratio));
  }

  absl::Status ReadOwnKeys(const Value& state, SchedulerSpec& spec) const override {
    ASSIGN_OR_RETURN(spec.warmup_steps, GetInt(state, "warmup_steps"));
    ASSIGN_OR_RETURN(spec.total_steps, GetInt(state, "total_steps"));
    ASSIGN_OR_RETURN(spec.min_lr_ratio, GetNumber(state, "min_lr_ratio"));
    return absl::OkStatus();
  }
};

}  // namespace

double CosineWarmupFactor(const SchedulerSpec& spec, int64_t epoch) {
  if (epoch < spec.warmup_steps) {
    return static_cast<double>(epoch) / static_cast<double>(spec.warmup_steps);
  }
  const double span =
      static_cast<double>(std::max<int64_t>(1, spec.total_steps - spec.warmup_steps));
  const double progress = std::min(1.0, static_cast<double>(epoch - spec.warmup_steps) / span);
  return spec.min_lr_ratio + (1.0 - spec.min_lr_ratio) * 0.5 * (1.0 + std::cos(kPi * progress));
}

absl::StatusOr<std::unique_ptr<LrScheduler>> MakeScheduler(const SchedulerSpec& spec,
                                                           torch::optim::Optimizer& optimizer) {
  SchedulerSpec normalized = spec;
  normalized.kind = absl::AsciiStrToLower(spec.kind);
  RETURN_IF_ERROR(ValidateSpec(normalized));
  std::unique_ptr<SchedulerBase> scheduler;
  if (normalized.kind == "none") {
    scheduler = std::make_unique<ConstantScheduler>(normalized, optimizer);
  } else if (normalized.kind == "step") {
    scheduler = std::make_unique<StepScheduler>(normalized, optimizer);
  } else if (normalized.kind == "cosine") {
    scheduler = std::make_unique<CosineScheduler>(normalized, optimizer);
  } else {
    return absl::InvalidArgumentError(absl::StrCat("unknown scheduler kind '", spec.kind,
                                                   "': expected one of none, step, cosine"));
  }
  scheduler->InitialStep();
  return std::unique_ptr<LrScheduler>(std::move(scheduler));
}

}  // namespace ckpt::train

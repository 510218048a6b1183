#include "libs/train/trainer_state.h"

#include "absl/strings/str_cat.h"

namespace ckpt::train {
namespace {

int64_t IntField(const Value& dict, const char* key, int64_t fallback) {
  const Value* value = dict.Find(key);
  return value != nullptr && value->is_int() ? value->int_value() : fallback;
}

double FloatField(const Value& dict, const char* key, double fallback) {
  const Value* value = dict.Find(key);
  if (value == nullptr) return fallback;
  if (value->is_float()) return value->float_value();
  return value->is_int() ? static_cast<double>(value->int_value()) : fallback;
}

std::string StringField(const Value& dict, const char* key) {
  const Value* value = dict.Find(key);
  return value != nullptr && value->is_string() ? value->string_value() : std::string();
}

}  // namespace

Value EncodeTrainerState(const TrainerState& state) {
  Value trainer = Value::Dict({
      {"epoch", Value::Int(state.epoch)},
      {"sampler_position", Value::Int(state.sampler_position)},
      {"global_step", Value::Int(state.global_step)},
      {"target_step", Value::Int(state.target_step)},
      {"world_size", Value::Int(state.world_size)},
      {"backend", Value::String(state.backend)},
      {"seed", Value::Int(static_cast<int64_t>(state.seed))},
      {"batch_size", Value::Int(state.batch_size)},
      {"accumulation_steps", Value::Int(state.accumulation_steps)},
      {"model", Value::Dict({{"kind", Value::String(state.model.kind)},
                             {"hidden", Value::Int(state.model.hidden)},
                             {"layers", Value::Int(state.model.layers)},
                             {"heads", Value::Int(state.model.heads)},
                             {"path", Value::String(state.model.path)},
                             {"loss", Value::String(state.model.loss)}})},
      {"data", Value::String(state.data)},
      {"eval_fraction", Value::Float(state.eval_fraction)},
  });
  if (state.rng_cpu.defined()) trainer.Set("rng_cpu", Value::Tensor(state.rng_cpu));
  if (state.rng_device.defined()) trainer.Set("rng_device", Value::Tensor(state.rng_device));
  return Value::Dict({{kTrainerStateKey, std::move(trainer)}});
}

absl::StatusOr<TrainerState> DecodeTrainerState(const Value& extra, absl::string_view version) {
  const Value* trainer = extra.is_dict() ? extra.Find(kTrainerStateKey) : nullptr;
  if (trainer == nullptr || !trainer->is_dict()) {
    return absl::FailedPreconditionError(
        absl::StrCat(version, " was not written by the trainer (its extra state has no '",
                     kTrainerStateKey, "' dict)"));
  }
  TrainerState state;
  state.epoch = IntField(*trainer, "epoch", 0);
  state.sampler_position = IntField(*trainer, "sampler_position", 0);
  state.global_step = IntField(*trainer, "global_step", 0);
  state.target_step = IntField(*trainer, "target_step", state.global_step);
  state.world_size = static_cast<int>(IntField(*trainer, "world_size", 0));
  state.backend = StringField(*trainer, "backend");
  state.seed = static_cast<uint64_t>(IntField(*trainer, "seed", 0));
  state.batch_size = IntField(*trainer, "batch_size", 0);
  state.accumulation_steps = IntField(*trainer, "accumulation_steps", 1);
  if (const Value* model = trainer->Find("model"); model != nullptr && model->is_dict()) {
    state.model.kind = StringField(*model, "kind");
    state.model.hidden = IntField(*model, "hidden", state.model.hidden);
    state.model.layers = IntField(*model, "layers", state.model.layers);
    state.model.heads = IntField(*model, "heads", state.model.heads);
    state.model.path = StringField(*model, "path");
    state.model.loss = StringField(*model, "loss");
  }
  state.data = StringField(*trainer, "data");
  state.eval_fraction = FloatField(*trainer, "eval_fraction", 0);
  if (const Value* rng = trainer->Find("rng_cpu"); rng != nullptr && rng->is_tensor()) {
    state.rng_cpu = rng->tensor();
  }
  if (const Value* rng = trainer->Find("rng_device"); rng != nullptr && rng->is_tensor()) {
    state.rng_device = rng->tensor();
  }
  return state;
}

}  // namespace ckpt::train

#include "libs/train/zero_optimizer.h"

#include <cstring>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "ATen/core/Tensor.h"
#include "ATen/core/grad_mode.h"
#include "ATen/ops/empty.h"
#include "ATen/ops/zeros.h"
#include "absl/container/flat_hash_map.h"
#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "libs/status/status_macros.h"
#include "libs/status/torch_status.h"
#include "libs/store/checkpoint_contents.h"
#include "libs/store/checkpoint_store.h"
#include "libs/store/upload_split.h"
#include "libs/store/version_ref.h"
#include "libs/tensor/dtype.h"
#include "libs/tensor/value_proto.h"

namespace ckpt::train {
namespace {

// State entries that hold one value per parameter element; every other entry ('step') is one
// value per parameter.
bool IsPerElement(const std::string& key, const Value& value) {
  return value.is_tensor() && key != "step";
}

// A per-parameter state value as text, exactly (ints, doubles by their bits, scalar tensors by
// their dtype and bytes), so that ranks can exchange them over BroadcastString.
absl::StatusOr<std::string> EncodeScalar(const Value& value) {
  if (value.is_int()) return absl::StrCat("i", value.int_value());
  if (value.is_float()) {
    const double number = value.float_value();
    uint64_t bits;
    std::memcpy(&bits, &number, sizeof(bits));
    return absl::StrCat("f", bits);
  }
  if (value.is_tensor() && value.tensor().numel() == 1) {
    const at::Tensor cpu = value.tensor().detach().cpu().contiguous();
    return absl::StrCat("t", static_cast<int>(cpu.scalar_type()), ":",
                        absl::BytesToHexString(absl::string_view(
                            static_cast<const char*>(cpu.data_ptr()), cpu.nbytes())));
  }
  return absl::InvalidArgumentError(
      "an optimizer state entry that is neither a number, a scalar "
      "tensor nor one value per parameter element");
}

absl::StatusOr<Value> DecodeScalar(absl::string_view text) {
  if (text.empty()) return absl::InternalError("empty scalar");
  const char kind = text[0];
  text.remove_prefix(1);
  if (kind == 'i') {
    int64_t number;
    if (absl::SimpleAtoi(text, &number)) return Value::Int(number);
  } else if (kind == 'f') {
    uint64_t bits;
    if (absl::SimpleAtoi(text, &bits)) {
      double number;
      std::memcpy(&number, &bits, sizeof(number));
      return Value::Float(number);
    }
  } else if (kind == 't') {
    const std::vector<absl::string_view> parts = absl::StrSplit(text, absl::MaxSplits(':', 1));
    int dtype;
    if (parts.size() == 2 && absl::SimpleAtoi(parts[0], &dtype)) {
      const std::string bytes = absl::HexStringToBytes(parts[1]);
      return CatchTorchErrors([&] {
        at::Tensor tensor =
            at::empty({}, at::TensorOptions().dtype(static_cast<at::ScalarType>(dtype)));
        TORCH_CHECK(static_cast<size_t>(tensor.nbytes()) == bytes.size(), "scalar of ",
                    bytes.size(), " bytes");
        std::memcpy(tensor.data_ptr(), bytes.data(), bytes.size());
        return Value::Tensor(tensor);
      });
    }
  }
  return absl::InternalError(
      absl::StrCat("malformed scalar from another rank: ", std::string(1, kind), text));
}

// The param group of a state dict with its "params" replaced by 0..count-1 (same position).
absl::StatusOr<Value> GroupOver(const Value& state_dict, int64_t count) {
  const Value* groups = state_dict.Find("param_groups");
  if (groups == nullptr || !groups->is_sequence() || groups->items().size() != 1 ||
      !groups->items()[0].is_dict()) {
    return absl::InvalidArgumentError(
        "the optimizer state dict must have exactly one param group for ZeRO-1 (the trainer's "
        "optimizers have one)");
  }
  std::vector<Value::Entry> entries;
  for (const Value::Entry& entry : groups->items()[0].entries()) {
    if (entry.first == DictKey("params")) {
      std::vector<Value> ids;
      for (int64_t id = 0; id < count; ++id) ids.push_back(Value::Int(id));
      entries.emplace_back("params", Value::List(std::move(ids)));
    } else {
      entries.push_back(entry);
    }
  }
  return Value::List({Value::Dict(std::move(entries))});
}

}  // namespace

at::Tensor ZeroOptimizer::FlatSlice(const at::Tensor& tensor, const Slice& slice) {
  return tensor.detach().reshape({-1}).slice(0, slice.begin, slice.end);
}

absl::StatusOr<std::unique_ptr<ZeroOptimizer>> ZeroOptimizer::Create(
    const OptimizerSpec& spec, std::vector<at::Tensor> parameters, const ddp::Communicator& comm) {
  CheckpointContents described;
  for (size_t index = 0; index < parameters.size(); ++index) {
    if (!parameters[index].is_contiguous()) {
      return absl::InvalidArgumentError(
          absl::StrCat("parameter ", index,
                       " is not contiguous: ZeRO-1 updates its slices in "
                       "place through a flat view"));
    }
    described.model.InsertOrAssign(absl::StrCat("p", index), parameters[index].detach());
  }
  CommitOptions options;
  options.normalize_keys = false;
  ASSIGN_OR_RETURN(const PreparedUpload prepared, PrepareUpload(described, options));
  std::unique_ptr<ZeroOptimizer> zero(new ZeroOptimizer(comm, std::move(parameters)));
  const std::vector<std::vector<UploadRange>> split = SplitUpload(prepared.header, comm.size());
  for (int owner = 0; owner < static_cast<int>(split.size()); ++owner) {
    for (const UploadRange& range : split[owner]) {
      const int64_t element = zero->parameters_[range.tensor_index].element_size();
      zero->partition_.push_back(
          {owner, range.tensor_index, range.begin / element, range.end / element});
    }
  }
  for (const Slice& slice : zero->partition_) {
    if (slice.owner == comm.rank()) zero->own_.push_back(slice);
  }
  ASSIGN_OR_RETURN(
      zero->shards_, CatchTorchErrors([&] {
        std::vector<at::Tensor> shards;
        for (const Slice& slice : zero->own_) {
          shards.push_back(FlatSlice(zero->parameters_[slice.parameter], slice).clone());
        }
        // A rank without a slice (fewer chunks than ranks) steps an empty optimizer.
        if (shards.empty()) shards.push_back(at::zeros({0}));
        return shards;
      }));
  ASSIGN_OR_RETURN(zero->optimizer_, MakeOptimizer(spec, zero->shards_));
  return zero;
}

int64_t ZeroOptimizer::shard_state_bytes() const {
  absl::StatusOr<Value> state = OptimizerStateDict(*optimizer_);
  int64_t bytes = 0;
  if (state.ok()) {
    state->ForEachTensor(
        [&](const std::string&, const at::Tensor& tensor) { bytes += tensor.nbytes(); });
  }
  return bytes;
}

void ZeroOptimizer::ZeroGrad() {
  // What Optimizer::zero_grad does in LibTorch 1.13, over every parameter, so that a ZeRO run
  // and a plain one accumulate into the same (zeroed, not unset) gradients.
  for (at::Tensor& parameter : parameters_) {
    if (parameter.mutable_grad().defined()) {
      parameter.mutable_grad().detach_();
      parameter.mutable_grad().zero_();
    }
  }
}

void ZeroOptimizer::Step() {
  {
    at::NoGradGuard no_grad;
    for (size_t k = 0; k < own_.size(); ++k) {
      const at::Tensor& parameter = parameters_[own_[k].parameter];
      shards_[k].copy_(FlatSlice(parameter, own_[k]));
      const at::Tensor& grad = parameter.grad();
      shards_[k].mutable_grad() = grad.defined() ? FlatSlice(grad, own_[k]) : at::Tensor();
    }
  }
  optimizer_->step();
  at::NoGradGuard no_grad;
  for (size_t k = 0; k < own_.size(); ++k) {
    FlatSlice(parameters_[own_[k].parameter], own_[k]).copy_(shards_[k]);
  }
  // Every rank's updated slices to every rank: an all-gather, as one broadcast per slice.
  for (const Slice& slice : partition_) {
    at::Tensor view = FlatSlice(parameters_[slice.parameter], slice);
    comm_.Broadcast(view, slice.owner);
  }
}

absl::StatusOr<ZeroOptimizer::LogicalState> ZeroOptimizer::DescribeLogicalState(
    const TensorMaker& make_tensor) const {
  LogicalState logical;
  ASSIGN_OR_RETURN(logical.shard_dict, OptimizerStateDict(*optimizer_));
  const Value* shard_states = logical.shard_dict.Find("state");
  // What this rank holds for each of its slices, one line each: "k<TAB>key=e<dtype>" for a
  // per-element tensor, "key=s<scalar>" for a per-parameter value, in the state's own order.
  std::vector<std::string> lines;
  for (size_t k = 0; k < own_.size(); ++k) {
    const Value* state =
        shard_states != nullptr ? shard_states->Find(static_cast<int64_t>(k)) : nullptr;
    if (state == nullptr || !state->is_dict()) continue;
    std::vector<std::string> fields = {absl::StrCat(k)};
    for (const Value::Entry& entry : state->entries()) {
      const std::string& key = entry.first.string_key();
      if (IsPerElement(key, entry.second)) {
        fields.push_back(
            absl::StrCat(key, "=e", static_cast<int>(entry.second.tensor().scalar_type())));
      } else {
        ASSIGN_OR_RETURN(const std::string scalar, EncodeScalar(entry.second));
        fields.push_back(absl::StrCat(key, "=s", scalar));
      }
    }
    lines.push_back(absl::StrJoin(fields, "\t"));
  }
  const std::string mine = absl::StrJoin(lines, "\n");

  // Every rank's lines, then the slices of the partition they describe.
  using Fields = std::vector<std::pair<std::string, std::string>>;  // key, "e<dtype>"/"s<scalar>"
  std::vector<std::optional<Fields>> states(partition_.size());
  for (int owner = 0; owner < comm_.size(); ++owner) {
    ASSIGN_OR_RETURN(const std::string text,
                     CatchTorchErrors([&] { return comm_.BroadcastString(mine, owner); }));
    std::vector<size_t> owned;
    for (size_t s = 0; s < partition_.size(); ++s) {
      if (partition_[s].owner == owner) owned.push_back(s);
    }
    for (absl::string_view line : absl::StrSplit(text, '\n', absl::SkipEmpty())) {
      const std::vector<absl::string_view> fields = absl::StrSplit(line, '\t');
      size_t k;
      if (!absl::SimpleAtoi(fields[0], &k) || k >= owned.size()) {
        return absl::InternalError(absl::StrCat("rank ", owner, " described a slice it lacks"));
      }
      Fields state;
      for (size_t f = 1; f < fields.size(); ++f) {
        const std::vector<absl::string_view> pair =
            absl::StrSplit(fields[f], absl::MaxSplits('=', 1));
        if (pair.size() != 2 || pair[1].empty()) {
          return absl::InternalError(absl::StrCat("rank ", owner, " sent ", fields[f]));
        }
        state.emplace_back(std::string(pair[0]), std::string(pair[1]));
      }
      states[owned[k]] = std::move(state);
    }
  }

  // Per parameter, the entries its first slice's owner described: per-element tensors made by
  // `make_tensor`, per-parameter values as they are.
  std::vector<Value::Entry> logical_states;
  logical.per_element.resize(parameters_.size());
  logical.described.resize(partition_.size());
  for (size_t s = 0; s < partition_.size(); ++s) {
    const Slice& slice = partition_[s];
    logical.described[s] = states[s].has_value();
    if (slice.begin != 0 || !states[s]) continue;
    const at::Tensor& parameter = parameters_[slice.parameter];
    std::vector<Value::Entry> entries;
    for (const auto& [key, field] : *states[s]) {
      if (field[0] == 'e') {
        int dtype;
        if (!absl::SimpleAtoi(absl::string_view(field).substr(1), &dtype)) {
          return absl::InternalError(absl::StrCat("bad dtype ", field));
        }
        ASSIGN_OR_RETURN(at::Tensor tensor,
                         make_tensor(parameter, static_cast<at::ScalarType>(dtype)));
        logical.per_element[slice.parameter].emplace_back(key, tensor);
        entries.emplace_back(key, Value::Tensor(tensor, parameter.device().str()));
      } else {
        ASSIGN_OR_RETURN(Value scalar, DecodeScalar(absl::string_view(field).substr(1)));
        entries.emplace_back(key, std::move(scalar));
      }
    }
    logical_states.emplace_back(static_cast<int64_t>(slice.parameter),
                                Value::Dict(std::move(entries)));
  }
  ASSIGN_OR_RETURN(Value groups,
                   GroupOver(logical.shard_dict, static_cast<int64_t>(parameters_.size())));
  logical.state_dict = Value::Dict(
      {{"state", Value::Dict(std::move(logical_states))}, {"param_groups", std::move(groups)}});
  return logical;
}

absl::StatusOr<Value> ZeroOptimizer::GatherStateDict() const {
  ASSIGN_OR_RETURN(LogicalState logical,
                   DescribeLogicalState([](const at::Tensor& parameter, at::ScalarType dtype) {
                     return CatchTorchErrors([&] {
                       return at::empty(parameter.sizes(), parameter.options().dtype(dtype));
                     });
                   }));
  const Value* shard_states = logical.shard_dict.Find("state");
  // Each slice's part of the full tensors, broadcast by its owner.
  RETURN_IF_ERROR(CatchTorchErrors([&] {
    at::NoGradGuard no_grad;
    size_t k = 0;
    for (size_t s = 0; s < partition_.size(); ++s) {
      const Slice& slice = partition_[s];
      const bool mine_slice = slice.owner == comm_.rank();
      const Value* shard_state = mine_slice && shard_states != nullptr
                                     ? shard_states->Find(static_cast<int64_t>(k))
                                     : nullptr;
      if (mine_slice) ++k;
      if (!logical.described[s]) continue;
      for (auto& [key, tensor] : logical.per_element[slice.parameter]) {
        at::Tensor view = FlatSlice(tensor, slice);
        if (shard_state != nullptr) {
          const Value* own = shard_state->Find(key);
          TORCH_CHECK(own != nullptr && own->is_tensor(), "shard state lacks ", key);
          view.copy_(own->tensor().reshape({-1}));
        }
        comm_.Broadcast(view, slice.owner);
      }
    }
  }));
  return std::move(logical.state_dict);
}

absl::StatusOr<ZeroOptimizer::ShardedState> ZeroOptimizer::ShardedStateDict() const {
  ASSIGN_OR_RETURN(LogicalState logical,
                   DescribeLogicalState([](const at::Tensor& parameter, at::ScalarType dtype) {
                     return CatchTorchErrors([&] {
                       return at::empty(parameter.sizes(),
                                        at::TensorOptions().dtype(dtype).device(at::kMeta));
                     });
                   }));
  const Value* shard_states = logical.shard_dict.Find("state");
  ShardedState sharded;
  std::vector<bool> partitioned(parameters_.size(), false);
  for (const Slice& slice : partition_) partitioned[slice.parameter] = true;
  for (size_t p = 0; p < parameters_.size(); ++p) {
    if (!partitioned[p]) continue;
    sharded.partitioned.push_back(parameters_[p]);
    for (const auto& [key, placeholder] : logical.per_element[p]) {
      sharded.partitioned.push_back(placeholder);
    }
  }
  RETURN_IF_ERROR(CatchTorchErrors([&] {
    for (size_t k = 0; k < own_.size(); ++k) {
      const Slice& slice = own_[k];
      const at::Tensor& parameter = parameters_[slice.parameter];
      const int64_t element = static_cast<int64_t>(parameter.element_size());
      sharded.owned.push_back(
          {parameter, slice.begin * element, slice.end * element, FlatSlice(parameter, slice)});
      const Value* shard_state =
          shard_states != nullptr ? shard_states->Find(static_cast<int64_t>(k)) : nullptr;
      for (const auto& [key, placeholder] : logical.per_element[slice.parameter]) {
        const Value* own = shard_state != nullptr ? shard_state->Find(key) : nullptr;
        TORCH_CHECK(own != nullptr && own->is_tensor(), "this rank's slice ", k,
                    " has no optimizer state '", key, "' while its parameter's first slice has");
        const int64_t state_element = static_cast<int64_t>(placeholder.element_size());
        sharded.owned.push_back({placeholder, slice.begin * state_element,
                                 slice.end * state_element, own->tensor().detach()});
      }
    }
  }));
  sharded.state_dict = std::move(logical.state_dict);
  return sharded;
}

absl::Status ZeroOptimizer::LoadStateDict(const Value& state_dict) {
  return LoadSlices(state_dict, [](const at::Tensor& full, const Slice& slice) {
    return CatchTorchErrors([&] { return FlatSlice(full, slice).clone(); });
  });
}

absl::Status ZeroOptimizer::LoadStateFrom(const VersionReader& reader) {
  const v1::Manifest& manifest = reader.manifest();
  if (!manifest.has_optimizer_state()) {
    return absl::FailedPreconditionError(absl::StrCat(
        FormatVersionRef(manifest.model(), manifest.version()), " holds no optimizer state"));
  }
  absl::flat_hash_map<std::string, const v1::TensorMeta*> state_tensors;
  for (const v1::TensorMeta& meta : manifest.state_tensors())
    state_tensors.emplace(meta.key(), &meta);
  // Per-element tensors stand in as shape-only (meta device) placeholders, each read by range
  // below; a tensor of one element (a 'step', or the state of a one-element parameter) is read.
  absl::flat_hash_map<const void*, const v1::TensorMeta*> placeholders;
  const TensorResolver resolve = [&](absl::string_view key) -> absl::StatusOr<at::Tensor> {
    auto it = state_tensors.find(key);
    if (it == state_tensors.end()) {
      return absl::DataLossError(absl::StrCat("the optimizer state references tensor '", key,
                                              "', which the manifest lacks"));
    }
    const v1::TensorMeta& meta = *it->second;
    int64_t numel = 1;
    for (int64_t size : meta.shape()) numel *= size;
    if (numel <= 1) return ReadTensor(reader, meta);
    ASSIGN_OR_RETURN(const DType stored, DTypeFromProto(meta.dtype()));
    ASSIGN_OR_RETURN(const c10::ScalarType dtype, ToScalarType(stored));
    ASSIGN_OR_RETURN(at::Tensor placeholder, CatchTorchErrors([&] {
                       return at::empty(
                           std::vector<int64_t>(meta.shape().begin(), meta.shape().end()),
                           at::TensorOptions().dtype(dtype).device(at::kMeta));
                     }));
    placeholders.emplace(placeholder.unsafeGetTensorImpl(), &meta);
    return placeholder;
  };
  ASSIGN_OR_RETURN(const Value skeleton, ValueFromProto(manifest.optimizer_state(), resolve));
  return LoadSlices(
      skeleton, [&](const at::Tensor& full, const Slice& slice) -> absl::StatusOr<at::Tensor> {
        auto it = placeholders.find(full.unsafeGetTensorImpl());
        if (it == placeholders.end()) {
          return CatchTorchErrors([&] { return FlatSlice(full, slice).clone(); });
        }
        const int64_t element = full.element_size();
        ASSIGN_OR_RETURN(at::Tensor part, CatchTorchErrors([&] {
                           return at::empty({slice.end - slice.begin},
                                            at::TensorOptions().dtype(full.scalar_type()));
                         }));
        RETURN_IF_ERROR(reader.ReadTensorRange(*it->second, slice.begin * element,
                                               slice.end * element,
                                               static_cast<char*>(part.data_ptr())));
        return part;
      });
}

absl::Status ZeroOptimizer::LoadSlices(const Value& state_dict, const SliceReader& slice_of) {
  const Value* states = state_dict.Find("state");
  if (states != nullptr && !states->is_dict()) {
    return absl::InvalidArgumentError("the optimizer state dict's 'state' is not a dict");
  }
  std::vector<Value::Entry> shard_states;
  for (size_t k = 0; k < own_.size(); ++k) {
    const Slice& slice = own_[k];
    const Value* state =
        states != nullptr ? states->Find(static_cast<int64_t>(slice.parameter)) : nullptr;
    if (state == nullptr) continue;
    if (!state->is_dict()) {
      return absl::InvalidArgumentError(
          absl::StrCat("the state of parameter ", slice.parameter, " is not a dict"));
    }
    std::vector<Value::Entry> entries;
    for (const Value::Entry& entry : state->entries()) {
      const std::string& key = entry.first.string_key();
      if (!IsPerElement(key, entry.second)) {
        entries.push_back(entry);
        continue;
      }
      const at::Tensor& tensor = entry.second.tensor();
      if (tensor.numel() != parameters_[slice.parameter].numel()) {
        return absl::InvalidArgumentError(absl::StrCat(
            "optimizer state '", key, "' of parameter ", slice.parameter, " has ", tensor.numel(),
            " elements, the parameter ", parameters_[slice.parameter].numel()));
      }
      ASSIGN_OR_RETURN(at::Tensor part, slice_of(tensor, slice));
      entries.emplace_back(key, Value::Tensor(std::move(part)));
    }
    shard_states.emplace_back(static_cast<int64_t>(k), Value::Dict(std::move(entries)));
  }
  ASSIGN_OR_RETURN(Value groups, GroupOver(state_dict, static_cast<int64_t>(shards_.size())));
  return LoadOptimizerStateDict(*optimizer_,
                                Value::Dict({{"state", Value::Dict(std::move(shard_states))},
                                             {"param_groups", std::move(groups)}}));
}

}  // namespace ckpt::train

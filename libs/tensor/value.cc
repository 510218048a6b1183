#include "libs/tensor/value.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>

#include "ATen/core/Tensor.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "c10/util/Exception.h"
#include "libs/tensor/sparse_layout.h"

namespace ckpt {
namespace {

// Accessor misuse is a bug in the caller, never bad input: fail loudly.
void CheckKind(bool ok, const char* accessor) {
  TORCH_CHECK(ok, "ckpt::Value::", accessor, " called on a value of another kind");
}

bool TensorsEqual(const at::Tensor& a, const at::Tensor& b) {
  if (a.defined() != b.defined()) return false;
  if (!a.defined()) return true;
  if (a.scalar_type() != b.scalar_type() || a.sizes() != b.sizes()) return false;
  if (a.layout() != b.layout()) return false;
  if (IsSparseTensor(a)) {  // equal parts (indices and values), not merely equal dense forms.
    absl::StatusOr<SparseParts> parts_a = SparsePartsOf(a);
    absl::StatusOr<SparseParts> parts_b = SparsePartsOf(b);
    if (!parts_a.ok() || !parts_b.ok()) return false;
    for (size_t i = 0; i < parts_a->parts.size(); ++i) {
      if (!TensorsEqual(parts_a->parts[i], parts_b->parts[i])) return false;
    }
    return true;
  }
  if (a.numel() == 0) return true;
  // Bitwise comparison: NaN == NaN and -0.0 != 0.0, which is what a byte-exact round trip needs.
  const at::Tensor ca = a.contiguous().cpu();
  const at::Tensor cb = b.contiguous().cpu();
  return std::memcmp(ca.data_ptr(), cb.data_ptr(), ca.nbytes()) == 0;
}

std::string TensorSummary(const at::Tensor& tensor) {
  if (!tensor.defined()) return "tensor(undefined)";
  return absl::StrCat("tensor(", c10::toString(tensor.scalar_type()), "[",
                      absl::StrJoin(tensor.sizes(), ", "), "])");
}

void WalkTensors(const Value& value, std::string& path,
                 const std::function<void(const std::string&, const at::Tensor&)>& fn) {
  auto descend = [&](const std::string& part, const Value& child) {
    const size_t old_size = path.size();
    if (!path.empty()) path += '/';
    path += part;
    WalkTensors(child, path, fn);
    path.resize(old_size);
  };
  switch (value.kind()) {
    case Value::Kind::kTensor:
      fn(path, value.tensor());
      break;
    case Value::Kind::kList:
    case Value::Kind::kTuple:
      for (size_t i = 0; i < value.items().size(); ++i) {
        descend(std::to_string(i), value.items()[i]);
      }
      break;
    case Value::Kind::kDict:
      for (const auto& [key, child] : value.entries()) {
        descend(key.is_int() ? std::to_string(key.int_key()) : key.string_key(), child);
      }
      break;
    case Value::Kind::kOpaque:
      descend("args", value.opaque_args());
      descend("state", value.opaque_state());
      break;
    default:
      break;
  }
}

}  // namespace

std::string DictKey::DebugString() const {
  if (is_int_) return std::to_string(int_key_);
  return absl::StrCat("'", absl::CEscape(string_key_), "'");
}

Value Value::Bool(bool value) {
  Value v;
  v.kind_ = Kind::kBool;
  v.bool_ = value;
  return v;
}

Value Value::Int(int64_t value) {
  Value v;
  v.kind_ = Kind::kInt;
  v.int_ = value;
  return v;
}

Value Value::Float(double value) {
  Value v;
  v.kind_ = Kind::kFloat;
  v.float_ = value;
  return v;
}

Value Value::String(std::string value) {
  Value v;
  v.kind_ = Kind::kString;
  v.string_ = std::move(value);
  return v;
}

Value Value::Bytes(std::string value) {
  Value v;
  v.kind_ = Kind::kBytes;
  v.string_ = std::move(value);
  return v;
}

Value Value::List(std::vector<Value> items) {
  Value v;
  v.kind_ = Kind::kList;
  v.items_ = std::move(items);
  return v;
}

Value Value::Tuple(std::vector<Value> items) {
  Value v;
  v.kind_ = Kind::kTuple;
  v.items_ = std::move(items);
  return v;
}

Value Value::Dict(std::vector<Entry> entries) {
  Value v;
  v.kind_ = Kind::kDict;
  v.entries_ = std::move(entries);
  return v;
}

Value Value::OrderedDict(std::vector<Entry> entries) {
  Value v = Dict(std::move(entries));
  v.ordered_dict_ = true;
  return v;
}

Value Value::Tensor(at::Tensor tensor, std::string original_device) {
  Value v;
  v.kind_ = Kind::kTensor;
  v.tensor_ = std::move(tensor);
  v.string_ = std::move(original_device);
  return v;
}

Value Value::Opaque(std::string class_name, Value args, Value state) {
  Value v;
  v.kind_ = Kind::kOpaque;
  v.string_ = std::move(class_name);
  v.items_.push_back(std::move(args));
  v.items_.push_back(std::move(state));
  return v;
}

bool Value::bool_value() const {
  CheckKind(is_bool(), "bool_value");
  return bool_;
}

int64_t Value::int_value() const {
  CheckKind(is_int(), "int_value");
  return int_;
}

double Value::float_value() const {
  CheckKind(is_float(), "float_value");
  return float_;
}

const std::string& Value::string_value() const {
  CheckKind(is_string() || is_bytes(), "string_value");
  return string_;
}

const std::vector<Value>& Value::items() const {
  CheckKind(is_sequence(), "items");
  return items_;
}

std::vector<Value>& Value::mutable_items() {
  CheckKind(is_sequence(), "mutable_items");
  return items_;
}

const std::vector<Value::Entry>& Value::entries() const {
  CheckKind(is_dict(), "entries");
  return entries_;
}

std::vector<Value::Entry>& Value::mutable_entries() {
  CheckKind(is_dict(), "mutable_entries");
  return entries_;
}

const at::Tensor& Value::tensor() const {
  CheckKind(is_tensor(), "tensor");
  return tensor_;
}

at::Tensor& Value::mutable_tensor() {
  CheckKind(is_tensor(), "mutable_tensor");
  return tensor_;
}

const std::string& Value::tensor_original_device() const {
  CheckKind(is_tensor(), "tensor_original_device");
  return string_;
}

const std::string& Value::opaque_class_name() const {
  CheckKind(is_opaque(), "opaque_class_name");
  return string_;
}

const Value& Value::opaque_args() const {
  CheckKind(is_opaque(), "opaque_args");
  return items_[0];
}

const Value& Value::opaque_state() const {
  CheckKind(is_opaque(), "opaque_state");
  return items_[1];
}

const Value* Value::Find(const DictKey& key) const {
  CheckKind(is_dict(), "Find");
  for (const Entry& entry : entries_) {
    if (entry.first == key) return &entry.second;
  }
  return nullptr;
}

Value* Value::FindMutable(const DictKey& key) {
  CheckKind(is_dict(), "FindMutable");
  for (Entry& entry : entries_) {
    if (entry.first == key) return &entry.second;
  }
  return nullptr;
}

void Value::Set(DictKey key, Value value) {
  CheckKind(is_dict(), "Set");
  if (Value* existing = FindMutable(key)) {
    *existing = std::move(value);
    return;
  }
  entries_.emplace_back(std::move(key), std::move(value));
}

void Value::ForEachTensor(
    const std::function<void(const std::string& path, const at::Tensor&)>& fn) const {
  std::string path;
  WalkTensors(*this, path, fn);
}

int64_t Value::TensorCount() const {
  int64_t count = 0;
  ForEachTensor([&](const std::string&, const at::Tensor&) { ++count; });
  return count;
}

bool operator==(const Value& a, const Value& b) {
  if (a.kind_ != b.kind_) return false;
  switch (a.kind_) {
    case Value::Kind::kNone:
      return true;
    case Value::Kind::kBool:
      return a.bool_ == b.bool_;
    case Value::Kind::kInt:
      return a.int_ == b.int_;
    case Value::Kind::kFloat:
      return a.float_ == b.float_ || (std::isnan(a.float_) && std::isnan(b.float_));
    case Value::Kind::kString:
    case Value::Kind::kBytes:
      return a.string_ == b.string_;
    case Value::Kind::kList:
    case Value::Kind::kTuple:
      return a.items_ == b.items_;
    case Value::Kind::kDict:
      return a.entries_ == b.entries_;
    case Value::Kind::kTensor:
      return TensorsEqual(a.tensor_, b.tensor_);
    case Value::Kind::kOpaque:
      return a.string_ == b.string_ && a.items_ == b.items_;
  }
  return false;
}

std::string Value::DebugString() const {
  switch (kind_) {
    case Kind::kNone:
      return "None";
    case Kind::kBool:
      return bool_ ? "True" : "False";
    case Kind::kInt:
      return std::to_string(int_);
    case Kind::kFloat:
      return absl::StrCat(float_);
    case Kind::kString:
      return absl::StrCat("'", absl::CEscape(string_), "'");
    case Kind::kBytes:
      return absl::StrCat("b'", absl::CHexEscape(string_), "'");
    case Kind::kList:
    case Kind::kTuple: {
      std::string out = kind_ == Kind::kList ? "[" : "(";
      for (size_t i = 0; i < items_.size(); ++i) {
        if (i > 0) out += ", ";
        out += items_[i].DebugString();
      }
      if (kind_ == Kind::kTuple && items_.size() == 1) out += ",";
      out += kind_ == Kind::kList ? "]" : ")";
      return out;
    }
    case Kind::kDict: {
      std::string out = "{";
      for (size_t i = 0; i < entries_.size(); ++i) {
        if (i > 0) out += ", ";
        absl::StrAppend(&out, entries_[i].first.DebugString(), ": ",
                        entries_[i].second.DebugString());
      }
      return out + "}";
    }
    case Kind::kTensor:
      return TensorSummary(tensor_);
    case Kind::kOpaque:
      return absl::StrCat("<opaque ", string_, " args=", items_[0].DebugString(),
                          " state=", items_[1].DebugString(), ">");
  }
  return "?";
}

PlainObject PlainObjectKind(const Value& value) {
  if (!value.is_opaque() || !value.opaque_state().is_none()) return PlainObject::kNone;
  const std::string& name = value.opaque_class_name();
  const Value& args = value.opaque_args();
  const auto number = [](const Value& v) { return v.is_float() || v.is_int(); };
  if (name == "builtins.complex") {
    return args.is_tuple() && args.items().size() == 2 && number(args.items()[0]) &&
                   number(args.items()[1])
               ? PlainObject::kComplex
               : PlainObject::kNone;
  }
  if (name == "torch.device") {
    const std::vector<Value>* items = args.is_tuple() ? &args.items() : nullptr;
    const bool fits = items != nullptr && !items->empty() && items->size() <= 2 &&
                      (*items)[0].is_string() && (items->size() == 1 || (*items)[1].is_int());
    return fits ? PlainObject::kDevice : PlainObject::kNone;
  }
  static constexpr const char* kDtypes[] = {
      "torch.float16", "torch.float32", "torch.float64", "torch.bfloat16", "torch.half",
      "torch.float", "torch.double", "torch.int8", "torch.int16", "torch.int32", "torch.int64",
      "torch.short", "torch.int", "torch.long", "torch.uint8", "torch.bool", "torch.complex32",
      "torch.complex64", "torch.complex128", "torch.cfloat", "torch.cdouble", "torch.chalf",
      "torch.qint8", "torch.quint8", "torch.qint32", "torch.quint4x2", "torch.quint2x4"};
  if (args.is_none() && std::find(std::begin(kDtypes), std::end(kDtypes), name) !=
                            std::end(kDtypes)) {
    return PlainObject::kDtype;
  }
  return PlainObject::kNone;
}

}  // namespace ckpt

#ifndef CKPT_LIBS_TENSOR_VALUE_H_
#define CKPT_LIBS_TENSOR_VALUE_H_

// Value: the in-memory tree for everything in a checkpoint that is not the model's state dict:
// optimizer and scheduler state dicts, epoch / step, RNG states, user entries of a bundle. It
// mirrors Python's values (None, bool, int, float, str, bytes, list, tuple, dict with str or int
// keys, tensor) plus OpaqueObject for a Python object that ckpt never executes (a user class,
// a scheduler's lambda): it keeps the class name and its pickled arguments / state as data.
//
// Values are plain copyable data; tensors inside are at::Tensor handles (copying a Value shares
// their storage, as copying a Python dict does). Not thread-safe for concurrent mutation.
//
// Example:
//   Value group = Value::Dict();
//   group.Set("lr", Value::Float(0.1));
//   group.Set("params", Value::List({Value::Int(0), Value::Int(1)}));
//   const Value* lr = group.Find("lr");  // lr->float_value() == 0.1

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "ATen/core/Tensor.h"
#include "absl/strings/string_view.h"

namespace ckpt {

class Value;

// A dict key: Python str or int (optimizer "state" is keyed by parameter index).
class DictKey {
 public:
  DictKey(std::string key) : is_int_(false), string_key_(std::move(key)) {}  // NOLINT
  DictKey(const char* key) : is_int_(false), string_key_(key) {}             // NOLINT
  DictKey(int64_t key) : is_int_(true), int_key_(key) {}                     // NOLINT
  DictKey(int key) : is_int_(true), int_key_(key) {}                         // NOLINT

  bool is_int() const { return is_int_; }
  int64_t int_key() const { return int_key_; }
  const std::string& string_key() const { return string_key_; }
  // Python repr: 'lr' or 3.
  std::string DebugString() const;

  friend bool operator==(const DictKey& a, const DictKey& b) {
    return a.is_int_ == b.is_int_ && a.int_key_ == b.int_key_ && a.string_key_ == b.string_key_;
  }
  friend bool operator!=(const DictKey& a, const DictKey& b) { return !(a == b); }

 private:
  bool is_int_;
  int64_t int_key_ = 0;
  std::string string_key_;
};

class Value {
 public:
  enum class Kind {
    kNone,
    kBool,
    kInt,
    kFloat,
    kString,
    kBytes,
    kList,
    kTuple,
    kDict,
    kTensor,
    kOpaque,
  };
  using Entry = std::pair<DictKey, Value>;

  Value() = default;  // None.

  static Value None() { return Value(); }
  static Value Bool(bool value);
  static Value Int(int64_t value);
  static Value Float(double value);
  static Value String(std::string value);
  static Value Bytes(std::string value);
  static Value List(std::vector<Value> items = {});
  static Value Tuple(std::vector<Value> items = {});
  static Value Dict(std::vector<Entry> entries = {});
  // A collections.OrderedDict (what Module.state_dict() returns): a dict in every respect here,
  // but written back as an OrderedDict, so a round trip keeps the producer's Python type.
  static Value OrderedDict(std::vector<Entry> entries = {});
  // `original_device` is where the producer had the tensor ("cuda:1"); empty if unknown.
  static Value Tensor(at::Tensor tensor, std::string original_device = {});
  // A Python object ckpt does not execute: `class_name` is "module.QualName" as pickled,
  // `args` what its constructor was given (a tuple; None if nothing), `state` its __setstate__
  // argument or __dict__ (None if none).
  static Value Opaque(std::string class_name, Value args, Value state);

  Kind kind() const { return kind_; }
  bool is_none() const { return kind_ == Kind::kNone; }
  bool is_bool() const { return kind_ == Kind::kBool; }
  bool is_int() const { return kind_ == Kind::kInt; }
  bool is_float() const { return kind_ == Kind::kFloat; }
  bool is_string() const { return kind_ == Kind::kString; }
  bool is_bytes() const { return kind_ == Kind::kBytes; }
  bool is_list() const { return kind_ == Kind::kList; }
  bool is_tuple() const { return kind_ == Kind::kTuple; }
  bool is_dict() const { return kind_ == Kind::kDict; }
  bool is_tensor() const { return kind_ == Kind::kTensor; }
  bool is_opaque() const { return kind_ == Kind::kOpaque; }
  // A list or a tuple.
  bool is_sequence() const { return kind_ == Kind::kList || kind_ == Kind::kTuple; }
  // A dict made by OrderedDict().
  bool is_ordered_dict() const { return kind_ == Kind::kDict && ordered_dict_; }

  // Accessors: calling one that does not match kind() is a programmer error (checked).
  bool bool_value() const;
  int64_t int_value() const;
  double float_value() const;
  const std::string& string_value() const;  // kString or kBytes.
  const std::vector<Value>& items() const;  // kList or kTuple.
  std::vector<Value>& mutable_items();
  const std::vector<Entry>& entries() const;  // kDict, in insertion order.
  std::vector<Entry>& mutable_entries();
  const at::Tensor& tensor() const;
  at::Tensor& mutable_tensor();
  const std::string& tensor_original_device() const;
  const std::string& opaque_class_name() const;
  const Value& opaque_args() const;
  const Value& opaque_state() const;

  // Dict helpers (kDict only). Find returns nullptr when the key is absent.
  const Value* Find(const DictKey& key) const;
  Value* FindMutable(const DictKey& key);
  // Inserts or replaces; keeps the position of a replaced key, as Python does.
  void Set(DictKey key, Value value);

  // Calls `fn(path, tensor)` for every tensor in the tree, depth first, in order. `path` joins
  // dict keys and sequence indices with '/', e.g. "state/0/exp_avg".
  void ForEachTensor(
      const std::function<void(const std::string& path, const at::Tensor&)>& fn) const;
  int64_t TensorCount() const;

  // Deep equality. Tensors are equal when dtype, shape and every element are equal (NaNs in the
  // same places count as equal, so a round trip of a tensor holding NaN compares equal). A dict
  // and an OrderedDict with the same entries in the same order are equal, as in Python.
  friend bool operator==(const Value& a, const Value& b);
  friend bool operator!=(const Value& a, const Value& b) { return !(a == b); }

  // Python-like repr, tensors abbreviated: {'lr': 0.1, 'state': {0: {'exp_avg': tensor(float32[3,
  // 4])}}}
  std::string DebugString() const;

 private:
  Kind kind_ = Kind::kNone;
  bool bool_ = false;
  bool ordered_dict_ = false;  // kDict only.
  int64_t int_ = 0;
  double float_ = 0;
  std::string string_;  // kString, kBytes, the class name of kOpaque, a tensor's original device.
  std::vector<Value> items_;  // kList, kTuple; kOpaque holds {args, state}.
  std::vector<Entry> entries_;
  at::Tensor tensor_;
};

// The kinds of opaque value that are data, not code: what torch's weights-only loader rebuilds
// (2.x) and ckpt's torch writer writes back as the objects they were, where any other opaque
// object is left out or written as a description.
enum class PlainObject {
  kNone,     // not one of them.
  kComplex,  // a Python complex: builtins.complex(real, imag), two numbers.
  kDevice,   // a torch.device("cuda", 1) / ("cpu",) / ("cuda:1",).
  kDtype,    // a torch dtype named by its global: torch.float16, torch.int64, ...
};
PlainObject PlainObjectKind(const Value& value);

}  // namespace ckpt

#endif  // CKPT_LIBS_TENSOR_VALUE_H_

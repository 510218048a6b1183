#include "libs/tensor/value_proto.h"

#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "libs/status/status_macros.h"

namespace ckpt {
namespace {

// Keep the enums in lock step: the proto is the wire and storage format.
static_assert(static_cast<int>(DType::kBFloat16) == v1::DTYPE_BFLOAT16);
static_assert(static_cast<int>(DType::kComplex128) == v1::DTYPE_COMPLEX128);
static_assert(static_cast<int>(DType::kUInt64) == v1::DTYPE_UINT64);
static_assert(kMaxDTypeValue == v1::DType_MAX);

absl::Status ToProto(const Value& value, std::string& path, const TensorRegistrar& register_tensor,
                     v1::Value& out);

absl::Status ChildToProto(const Value& child, absl::string_view part, std::string& path,
                          const TensorRegistrar& register_tensor, v1::Value& out) {
  const size_t old_size = path.size();
  if (!path.empty()) path += '/';
  absl::StrAppend(&path, part);
  absl::Status status = ToProto(child, path, register_tensor, out);
  path.resize(old_size);
  return status;
}

absl::Status ToProto(const Value& value, std::string& path, const TensorRegistrar& register_tensor,
                     v1::Value& out) {
  switch (value.kind()) {
    case Value::Kind::kNone:
      out.mutable_none_value();
      return absl::OkStatus();
    case Value::Kind::kBool:
      out.set_bool_value(value.bool_value());
      return absl::OkStatus();
    case Value::Kind::kInt:
      out.set_int_value(value.int_value());
      return absl::OkStatus();
    case Value::Kind::kFloat:
      out.set_float_value(value.float_value());
      return absl::OkStatus();
    case Value::Kind::kString:
      out.set_string_value(value.string_value());
      return absl::OkStatus();
    case Value::Kind::kBytes:
      out.set_bytes_value(value.string_value());
      return absl::OkStatus();
    case Value::Kind::kList:
    case Value::Kind::kTuple: {
      v1::ValueList* list = value.is_list() ? out.mutable_list_value() : out.mutable_tuple_value();
      for (size_t i = 0; i < value.items().size(); ++i) {
        RETURN_IF_ERROR(ChildToProto(value.items()[i], std::to_string(i), path, register_tensor,
                                     *list->add_items()));
      }
      return absl::OkStatus();
    }
    case Value::Kind::kDict: {
      v1::ValueDict* dict = out.mutable_dict_value();
      dict->set_ordered(value.is_ordered_dict());
      for (const auto& [key, child] : value.entries()) {
        v1::DictEntry* entry = dict->add_entries();
        if (key.is_int()) {
          entry->set_int_key(key.int_key());
        } else {
          entry->set_string_key(key.string_key());
        }
        RETURN_IF_ERROR(
            ChildToProto(child, key.is_int() ? std::to_string(key.int_key()) : key.string_key(),
                         path, register_tensor, *entry->mutable_value()));
      }
      return absl::OkStatus();
    }
    case Value::Kind::kTensor: {
      ASSIGN_OR_RETURN(std::string key, register_tensor(path, value.tensor()));
      out.mutable_tensor_value()->set_key(std::move(key));
      return absl::OkStatus();
    }
    case Value::Kind::kOpaque: {
      v1::OpaqueObject* opaque = out.mutable_opaque_value();
      opaque->set_class_name(value.opaque_class_name());
      RETURN_IF_ERROR(ChildToProto(value.opaque_args(), "args", path, register_tensor,
                                   *opaque->mutable_args()));
      return ChildToProto(value.opaque_state(), "state", path, register_tensor,
                          *opaque->mutable_state());
    }
  }
  return absl::InternalError("unhandled Value kind");
}

absl::StatusOr<Value> FromProto(const v1::Value& proto, const TensorResolver& resolve_tensor,
                                int depth) {
  if (depth > kMaxValueDepth) {
    return absl::InvalidArgumentError(
        absl::StrCat("value tree nests deeper than ", kMaxValueDepth, " levels"));
  }
  switch (proto.kind_case()) {
    case v1::Value::kNoneValue:
      return Value::None();
    case v1::Value::kBoolValue:
      return Value::Bool(proto.bool_value());
    case v1::Value::kIntValue:
      return Value::Int(proto.int_value());
    case v1::Value::kFloatValue:
      return Value::Float(proto.float_value());
    case v1::Value::kStringValue:
      return Value::String(proto.string_value());
    case v1::Value::kBytesValue:
      return Value::Bytes(proto.bytes_value());
    case v1::Value::kListValue:
    case v1::Value::kTupleValue: {
      const v1::ValueList& list = proto.has_list_value() ? proto.list_value() : proto.tuple_value();
      std::vector<Value> items;
      items.reserve(list.items_size());
      for (const v1::Value& item : list.items()) {
        ASSIGN_OR_RETURN(Value child, FromProto(item, resolve_tensor, depth + 1));
        items.push_back(std::move(child));
      }
      return proto.has_list_value() ? Value::List(std::move(items))
                                    : Value::Tuple(std::move(items));
    }
    case v1::Value::kDictValue: {
      std::vector<Value::Entry> entries;
      entries.reserve(proto.dict_value().entries_size());
      for (const v1::DictEntry& entry : proto.dict_value().entries()) {
        ASSIGN_OR_RETURN(Value child, FromProto(entry.value(), resolve_tensor, depth + 1));
        switch (entry.key_case()) {
          case v1::DictEntry::kStringKey:
            entries.emplace_back(DictKey(entry.string_key()), std::move(child));
            break;
          case v1::DictEntry::kIntKey:
            entries.emplace_back(DictKey(entry.int_key()), std::move(child));
            break;
          default:
            return absl::InvalidArgumentError("dict entry without a key in value tree");
        }
      }
      return proto.dict_value().ordered() ? Value::OrderedDict(std::move(entries))
                                          : Value::Dict(std::move(entries));
    }
    case v1::Value::kTensorValue: {
      ASSIGN_OR_RETURN(at::Tensor tensor, resolve_tensor(proto.tensor_value().key()));
      return Value::Tensor(std::move(tensor));
    }
    case v1::Value::kOpaqueValue: {
      const v1::OpaqueObject& opaque = proto.opaque_value();
      Value args, state;
      if (opaque.has_args()) {
        ASSIGN_OR_RETURN(args, FromProto(opaque.args(), resolve_tensor, depth + 1));
      }
      if (opaque.has_state()) {
        ASSIGN_OR_RETURN(state, FromProto(opaque.state(), resolve_tensor, depth + 1));
      }
      return Value::Opaque(opaque.class_name(), std::move(args), std::move(state));
    }
    case v1::Value::KIND_NOT_SET:
      break;
  }
  return absl::InvalidArgumentError("value in value tree has no kind set");
}

}  // namespace

absl::StatusOr<v1::Value> ValueToProto(const Value& value, const TensorRegistrar& register_tensor) {
  v1::Value out;
  std::string path;
  RETURN_IF_ERROR(ToProto(value, path, register_tensor, out));
  return out;
}

absl::StatusOr<Value> ValueFromProto(const v1::Value& proto, const TensorResolver& resolve_tensor) {
  return FromProto(proto, resolve_tensor, 0);
}

absl::StatusOr<DType> DTypeFromProto(v1::DType dtype) {
  const int value = static_cast<int>(dtype);
  if (value <= 0 || value > kMaxDTypeValue) {
    return absl::InvalidArgumentError(
        absl::StrCat("unknown dtype value ", value, " (this build knows 1..", kMaxDTypeValue, ")"));
  }
  return static_cast<DType>(value);
}

}  // namespace ckpt

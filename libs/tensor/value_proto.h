#ifndef CKPT_LIBS_TENSOR_VALUE_PROTO_H_
#define CKPT_LIBS_TENSOR_VALUE_PROTO_H_

// Value <-> ckpt.v1.Value. Tensors are not inlined in the proto: each becomes a TensorRef whose
// key the caller chooses (and under which it stores the bytes), and is resolved the same way back.
//
// Example (what a store does with an optimizer state dict):
//   ASSIGN_OR_RETURN(v1::Value proto, ValueToProto(optimizer_state,
//       [&](const std::string& path, const at::Tensor& t) -> absl::StatusOr<std::string> {
//         std::string key = "optimizer/" + path;   // "optimizer/state/0/exp_avg"
//         RETURN_IF_ERROR(table.Add(key, t));
//         return key;
//       }));

#include <functional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "libs/tensor/dtype.h"
#include "libs/tensor/value.h"
#include "proto/ckpt/v1/types.pb.h"

namespace ckpt {

// Records `tensor` (found at `path`, see Value::ForEachTensor) and returns the key to reference.
using TensorRegistrar =
    std::function<absl::StatusOr<std::string>(const std::string& path, const at::Tensor& tensor)>;

// Returns the tensor stored under `key`; NOT_FOUND (or any error) aborts the conversion.
using TensorResolver = std::function<absl::StatusOr<at::Tensor>(absl::string_view key)>;

// Errors from `register_tensor` are returned as they are.
absl::StatusOr<v1::Value> ValueToProto(const Value& value, const TensorRegistrar& register_tensor);

// INVALID_ARGUMENT for a Value with no kind set, a dict entry without a key, or nesting deeper
// than kMaxValueDepth; errors from `resolve_tensor` as they are.
absl::StatusOr<Value> ValueFromProto(const v1::Value& proto, const TensorResolver& resolve_tensor);

// Deeper trees are rejected rather than recursed into (optimizer states nest about 5 deep).
inline constexpr int kMaxValueDepth = 100;

inline v1::DType DTypeToProto(DType dtype) { return static_cast<v1::DType>(dtype); }

// INVALID_ARGUMENT for values this build does not know (a newer writer's dtype).
absl::StatusOr<DType> DTypeFromProto(v1::DType dtype);

}  // namespace ckpt

#endif  // CKPT_LIBS_TENSOR_VALUE_PROTO_H_

#ifndef CKPT_LIBS_STATUS_STATUS_MACROS_H_
#define CKPT_LIBS_STATUS_STATUS_MACROS_H_

// Early-return helpers for absl::Status / absl::StatusOr<T>, the error model at every library
// boundary in ckpt.
//
// Example:
//   absl::StatusOr<Manifest> ReadManifest(const VersionRef& ref) {
//     RETURN_IF_ERROR(CheckRef(ref));
//     ASSIGN_OR_RETURN(std::string bytes, ReadValue(ManifestKey(ref)));
//     ...
//   }

#include <utility>

#include "absl/base/optimization.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace ckpt::status_internal {

inline absl::Status AsStatus(absl::Status status) { return status; }

template <typename T>
absl::Status AsStatus(const absl::StatusOr<T>& status_or) {
  return status_or.status();
}

}  // namespace ckpt::status_internal

#define CKPT_STATUS_CONCAT_INNER_(a, b) a##b
#define CKPT_STATUS_CONCAT_(a, b) CKPT_STATUS_CONCAT_INNER_(a, b)

// Evaluates `expr` (an absl::Status or absl::StatusOr<T>) once and returns its status from the
// enclosing function if it is not OK.
#define RETURN_IF_ERROR(expr)                                              \
  do {                                                                     \
    absl::Status ckpt_status_ = ::ckpt::status_internal::AsStatus((expr)); \
    if (ABSL_PREDICT_FALSE(!ckpt_status_.ok())) return ckpt_status_;       \
  } while (false)

// Evaluates `rexpr` (an absl::StatusOr<T>); on error returns its status from the enclosing
// function, else move-assigns the value to `lhs`, which may be a declaration:
//   ASSIGN_OR_RETURN(auto tensor, ReadTensor(key));
//   ASSIGN_OR_RETURN(existing_variable, ReadTensor(key));
// `lhs` must not contain an unparenthesized comma.
#define ASSIGN_OR_RETURN(lhs, rexpr) \
  CKPT_ASSIGN_OR_RETURN_IMPL_(CKPT_STATUS_CONCAT_(ckpt_status_or_, __LINE__), lhs, rexpr)

#define CKPT_ASSIGN_OR_RETURN_IMPL_(status_or, lhs, rexpr) \
  auto status_or = (rexpr);                                \
  if (ABSL_PREDICT_FALSE(!status_or.ok())) {               \
    return std::move(status_or).status();                  \
  }                                                        \
  lhs = std::move(status_or).value()

#endif  // CKPT_LIBS_STATUS_STATUS_MACROS_H_

#ifndef CKPT_LIBS_STATUS_TORCH_STATUS_H_
#define CKPT_LIBS_STATUS_TORCH_STATUS_H_

// LibTorch reports errors by throwing c10::Error (and its subclasses). ckpt's libraries return
// absl::Status at their boundaries, so calls into LibTorch that can throw go through
// CatchTorchErrors. (libs/ddp is the exception by design: it follows c10d and throws, and the
// trainer catches it where it calls it; docs/ARCHITECTURE.md, "Errors".)
//
// Example:
//   absl::StatusOr<at::Tensor> Reshaped(const at::Tensor& t, at::IntArrayRef shape) {
//     return CatchTorchErrors([&] { return t.reshape(shape); });
//   }

#include <exception>
#include <type_traits>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "c10/util/Exception.h"

namespace ckpt {

// c10::IndexError is OUT_OF_RANGE, ValueError / TypeError / LinAlgError INVALID_ARGUMENT,
// NotImplementedError UNIMPLEMENTED, OutOfMemoryError RESOURCE_EXHAUSTED; any other c10::Error
// (a failed TORCH_CHECK, Python's RuntimeError) gets `default_code`. The message is LibTorch's,
// without its C++ backtrace.
absl::Status FromC10Error(const c10::Error& error,
                          absl::StatusCode default_code = absl::StatusCode::kInternal);

// Translates the exception being handled (call only inside a catch block): c10 errors as above,
// std::bad_alloc as RESOURCE_EXHAUSTED, any other std::exception (Debian's LibTorch throws some
// checks as std::runtime_error) with `default_code`, anything else as INTERNAL.
absl::Status StatusFromCurrentException(
    absl::StatusCode default_code = absl::StatusCode::kInternal);

// Throws `status` as a c10::Error, for code that runs inside LibTorch (autograd hooks, c10d
// callbacks) where throwing is the error model. `status` must not be OK.
[[noreturn]] void ThrowAsC10Error(const absl::Status& status);

// Runs `fn()` and returns its result as absl::Status (if it returns void) or absl::StatusOr<T>,
// with anything it throws translated by StatusFromCurrentException(default_code).
template <typename Fn>
auto CatchTorchErrors(Fn&& fn, absl::StatusCode default_code = absl::StatusCode::kInternal) {
  using Result = std::invoke_result_t<Fn>;
  if constexpr (std::is_void_v<Result>) {
    try {
      std::forward<Fn>(fn)();
      return absl::OkStatus();
    } catch (...) {
      return StatusFromCurrentException(default_code);
    }
  } else {
    try {
      return absl::StatusOr<Result>(std::forward<Fn>(fn)());
    } catch (...) {
      return absl::StatusOr<Result>(StatusFromCurrentException(default_code));
    }
  }
}

}  // namespace ckpt

#endif  // CKPT_LIBS_STATUS_TORCH_STATUS_H_

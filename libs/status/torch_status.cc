#include "libs/status/torch_status.h"

#include <new>
#include <string>

#include "absl/strings/str_cat.h"

namespace ckpt {

absl::Status FromC10Error(const c10::Error& error, absl::StatusCode default_code) {
  absl::StatusCode code = default_code;
  if (dynamic_cast<const c10::IndexError*>(&error) != nullptr) {
    code = absl::StatusCode::kOutOfRange;
  } else if (dynamic_cast<const c10::ValueError*>(&error) != nullptr ||
             dynamic_cast<const c10::TypeError*>(&error) != nullptr ||
             dynamic_cast<const c10::LinAlgError*>(&error) != nullptr) {
    code = absl::StatusCode::kInvalidArgument;
  } else if (dynamic_cast<const c10::NotImplementedError*>(&error) != nullptr) {
    code = absl::StatusCode::kUnimplemented;
  } else if (dynamic_cast<const c10::OutOfMemoryError*>(&error) != nullptr) {
    code = absl::StatusCode::kResourceExhausted;
  }
  return absl::Status(code, absl::StrCat("LibTorch: ", error.msg()));
}

absl::Status StatusFromCurrentException(absl::StatusCode default_code) {
  try {
    throw;
  } catch (const c10::Error& error) {
    return FromC10Error(error, default_code);
  } catch (const std::bad_alloc&) {
    return absl::ResourceExhaustedError("out of memory (std::bad_alloc)");
  } catch (const std::exception& error) {
    // Debian's LibTorch throws some of its checks (e.g. Tensor::view's shape check) as a plain
    // std::runtime_error rather than c10::Error, so they take the same default code.
    return absl::Status(default_code, absl::StrCat("LibTorch: ", error.what()));
  } catch (...) {
    return absl::InternalError("unexpected exception of unknown type");
  }
}

void ThrowAsC10Error(const absl::Status& status) {
  const std::string message = status.ToString();
  switch (status.code()) {
    case absl::StatusCode::kOutOfRange:
      throw c10::IndexError({__func__, __FILE__, static_cast<uint32_t>(__LINE__)}, message);
    case absl::StatusCode::kInvalidArgument:
      throw c10::ValueError({__func__, __FILE__, static_cast<uint32_t>(__LINE__)}, message);
    case absl::StatusCode::kUnimplemented:
      throw c10::NotImplementedError({__func__, __FILE__, static_cast<uint32_t>(__LINE__)},
                                     message);
    default:
      throw c10::Error({__func__, __FILE__, static_cast<uint32_t>(__LINE__)}, message);
  }
}

}  // namespace ckpt

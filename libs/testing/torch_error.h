#ifndef CKPT_LIBS_TESTING_TORCH_ERROR_H_
#define CKPT_LIBS_TESTING_TORCH_ERROR_H_

// For tests of code that reports errors as c10::Error (libs/ddp, LibTorch itself).
//
// Example:
//   EXPECT_THAT(TorchErrorOf([&] { comm.Broadcast(tensor, 5); }), HasSubstr("root must be"));

#include <string>
#include <utility>

#include "c10/util/Exception.h"

namespace ckpt::testing {

// The message of the c10::Error that `function` throws, without LibTorch's backtrace; "(no
// error)" when it returns normally. Other exceptions propagate.
template <typename Function>
std::string TorchErrorOf(Function&& function) {
  try {
    std::forward<Function>(function)();
  } catch (const c10::Error& e) {
    return e.what_without_backtrace();
  }
  return "(no error)";
}

}  // namespace ckpt::testing

#endif  // CKPT_LIBS_TESTING_TORCH_ERROR_H_

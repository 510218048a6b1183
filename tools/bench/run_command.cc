#include "tools/bench/run_command.h"

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace ckpt::bench {

absl::StatusOr<std::string> RunCommand(const std::string& command) {
  FILE* pipe = ::popen(command.c_str(), "r");
  if (pipe == nullptr) {
    return absl::InternalError(absl::StrCat("popen ", command, ": ", std::strerror(errno)));
  }
  std::string output;
  char buffer[4096];
  size_t n;
  while ((n = std::fread(buffer, 1, sizeof(buffer), pipe)) > 0) output.append(buffer, n);
  const int status = ::pclose(pipe);
  if (status != 0) {
    return absl::InternalError(
        absl::StrCat("`", command, "` exited with status ", status, "; output: ", output));
  }
  return output;
}

}  // namespace ckpt::bench

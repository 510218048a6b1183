#include "libs/testing/python_runner.h"

#include <sys/wait.h>

#include <cstdio>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace ckpt::testing {

absl::StatusOr<std::string> RunPython(const std::string& script, const std::string& args) {
  const std::string command = absl::StrCat("/usr/bin/python3 ", script, " ", args, " 2>&1");
  FILE* pipe = popen(command.c_str(), "r");
  if (pipe == nullptr) return absl::InternalError(absl::StrCat("cannot run ", command));
  std::string output;
  char buffer[4096];
  while (size_t n = fread(buffer, 1, sizeof(buffer), pipe)) output.append(buffer, n);
  const int status = pclose(pipe);
  if (status != 0) {
    return absl::InternalError(absl::StrCat(command, " exited with status ",
                                            WIFEXITED(status) ? WEXITSTATUS(status) : status, ":\n",
                                            output));
  }
  return output;
}

std::string RunPythonOrAddFailure(const std::string& script, const std::string& args) {
  absl::StatusOr<std::string> output = RunPython(script, args);
  if (!output.ok()) {
    ADD_FAILURE() << output.status().message();
    return std::string(output.status().message());
  }
  return *output;
}

}  // namespace ckpt::testing

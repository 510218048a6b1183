#ifndef CKPT_LIBS_TESTING_PYTHON_RUNNER_H_
#define CKPT_LIBS_TESTING_PYTHON_RUNNER_H_

// Runs real PyTorch (Debian's /usr/bin/python3 with torch 1.13) from tests: the peer that writes
// the files ckpt reads and reads the files ckpt writes. testonly.

#include <string>

#include "absl/status/statusor.h"

namespace ckpt::testing {

// Runs `/usr/bin/python3 SCRIPT ARGS` (SCRIPT relative to the test's runfiles root, e.g.
// "libs/format/testdata/checkpoint_fixtures.py"; ARGS passed through the shell) and returns
// what it printed (stdout and stderr). INTERNAL with the output when it exits non-zero.
absl::StatusOr<std::string> RunPython(const std::string& script, const std::string& args);

// RunPython that records a test failure (with the script's output) instead of returning an
// error; returns the output either way.
std::string RunPythonOrAddFailure(const std::string& script, const std::string& args);

}  // namespace ckpt::testing

#endif  // CKPT_LIBS_TESTING_PYTHON_RUNNER_H_

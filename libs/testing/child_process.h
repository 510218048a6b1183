#ifndef CKPT_LIBS_TESTING_CHILD_PROCESS_H_
#define CKPT_LIBS_TESTING_CHILD_PROCESS_H_

// A program under test (a server binary, the trainer) run as a child process with its stdout and
// stderr captured in files, for tests of real binaries: flags, port files, signals, exit codes.
// testonly.
//
// Example:
//   ChildProcess server(RunfilesPath("services/loader/loader"), dir);
//   ASSERT_TRUE(server.Start({"--port_file=" + port_file}));
//   const int port = server.WaitForPort(port_file, absl::Seconds(30));
//   server.Signal(SIGTERM);
//   std::optional<int> status = server.WaitForExit(absl::Seconds(30));

#include <sys/types.h>

#include <optional>
#include <string>
#include <vector>

#include "absl/time/time.h"

namespace ckpt::testing {

// `relative` (e.g. "services/loader/loader") inside the test's runfiles.
std::string RunfilesPath(const std::string& relative);

// The contents of `path` ("" if it cannot be read).
std::string ReadFileOrEmpty(const std::string& path);

// How a command line ended and what it printed (stdout and stderr together); exit_code is -1
// when a signal ended it.
struct ShellResult {
  int exit_code = -1;
  std::string output;
};

// Runs `command_line` with /bin/sh from the current directory (the runfiles root in a test) and
// waits for it.
ShellResult RunShell(const std::string& command_line);

// Writes `contents` to `path` (replacing it).
void WriteTextFile(const std::string& path, const std::string& contents);

// $TEST_TMPDIR/<name of the running test>: a directory path private to the test case (not
// created).
std::string TestCaseDir();

class ChildProcess {
 public:
  // Output goes to `dir`/stdout and `dir`/stderr (`dir` must exist).
  ChildProcess(std::string binary, std::string dir);
  // SIGKILLs and reaps the child if the test did not wait for it.
  ~ChildProcess();
  ChildProcess(const ChildProcess&) = delete;
  ChildProcess& operator=(const ChildProcess&) = delete;

  // Starts `binary flags...` with this process's environment. False if it could not be spawned.
  bool Start(const std::vector<std::string>& flags);
  // The wait status once the child exits; nullopt if it is still running after `timeout`.
  std::optional<int> WaitForExit(absl::Duration timeout);
  // Polls `port_file` (which the child writes once it serves) for a port; 0 if the child exits
  // first or nothing appears within `timeout`.
  int WaitForPort(const std::string& port_file, absl::Duration timeout);
  void Signal(int signal_number);
  pid_t pid() const { return pid_; }
  std::string stdout_text() const { return ReadFileOrEmpty(dir_ + "/stdout"); }
  std::string stderr_text() const { return ReadFileOrEmpty(dir_ + "/stderr"); }

 private:
  const std::string binary_;
  const std::string dir_;
  pid_t pid_ = -1;
};

}  // namespace ckpt::testing

#endif  // CKPT_LIBS_TESTING_CHILD_PROCESS_H_

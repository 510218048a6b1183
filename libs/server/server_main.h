#ifndef CKPT_LIBS_SERVER_SERVER_MAIN_H_
#define CKPT_LIBS_SERVER_SERVER_MAIN_H_

// What every ckpt binary's main() does the same way: --help that lists the binary's own flags,
// and a graceful stop on SIGINT / SIGTERM.
//
// Example (a server's main):
//   SetHelpFlagsFile("services/loader/main.cc");
//   absl::ParseCommandLine(argc, argv);
//   const sigset_t stop_signals = BlockStopSignals();   // before any thread starts
//   ...start the server...
//   WaitForStopSignal(stop_signals, "loader", grace);   // then shut down

#include <signal.h>

#include <functional>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "libs/rpc/grpc_server.h"

namespace ckpt {

// --help / --helpshort list the flags defined in the file whose path ends with `main_file`
// (Abseil's default looks for a file named after the binary, which ours are not).
void SetHelpFlagsFile(absl::string_view main_file);

// Blocks SIGINT and SIGTERM in this thread and returns the set. Call it before any thread exists
// (RocksDB and gRPC start theirs) so that every thread inherits the mask and the signals wait
// for WaitForStopSignal instead of killing the process.
sigset_t BlockStopSignals();

// Writes `port` (decimal, one line) to `port_file` atomically, for scripts that start a server on
// port 0 and wait for the file.
absl::Status WritePortFile(const std::string& port_file, int port);

// What every server binary does once its GrpcServer is up: prints "<serving_line> on ADDRESS" to
// stdout, then writes --port_file (when set; last, so its waiters can read that line), waits for SIGINT / SIGTERM, runs `before_shutdown` (e.g.
// ending watches or a side server), then shuts the server down giving in-flight calls `grace`.
// Returns the exit status: 0, or 1 when the port file cannot be written (nothing is served).
struct ServeOptions {
  std::string program;        // "loader", for log lines.
  std::string serving_line;   // "loader serving DIR"
  std::string after_address;  // printed after the address, e.g. " and SOCKET".
  std::string port_file;
  absl::Duration grace = absl::Seconds(10);
  std::function<void()> before_shutdown;
};
int ServeUntilStopped(GrpcServer& server, const sigset_t& stop_signals,
                      const ServeOptions& options);

// Waits for one of `signals` and logs "<program>: <signal>; shutting down (grace <grace>)".
void WaitForStopSignal(const sigset_t& signals, absl::string_view program, absl::Duration grace);

}  // namespace ckpt

#endif  // CKPT_LIBS_SERVER_SERVER_MAIN_H_

#include "libs/server/server_main.h"

#include <pthread.h>

#include <cstring>
#include <iostream>
#include <string>

#include "absl/flags/usage_config.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "libs/io/atomic_file.h"

namespace ckpt {

void SetHelpFlagsFile(absl::string_view main_file) {
  static std::string* const file = new std::string(main_file);
  absl::FlagsUsageConfig usage_config;
  usage_config.contains_help_flags = [](absl::string_view path) {
    return absl::EndsWith(path, *file);
  };
  usage_config.contains_helpshort_flags = usage_config.contains_help_flags;
  absl::SetFlagsUsageConfig(usage_config);
}

sigset_t BlockStopSignals() {
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  return signals;
}

absl::Status WritePortFile(const std::string& port_file, int port) {
  return WriteFileAtomically(port_file, absl::StrCat(port, "\n"));
}

int ServeUntilStopped(GrpcServer& server, const sigset_t& stop_signals,
                      const ServeOptions& options) {
  std::cout << options.serving_line << " on " << server.address() << options.after_address
            << std::endl;
  // The port file comes last, so whoever waits for it may also read the serving line.
  if (!options.port_file.empty()) {
    if (absl::Status written = WritePortFile(options.port_file, server.port()); !written.ok()) {
      std::cerr << options.program << ": writing --port_file: " << written << "\n";
      server.Shutdown(absl::ZeroDuration());
      server.Wait();
      return 1;
    }
  }
  WaitForStopSignal(stop_signals, options.program, options.grace);
  if (options.before_shutdown) options.before_shutdown();
  server.Shutdown(options.grace);
  server.Wait();
  return 0;
}

void WaitForStopSignal(const sigset_t& signals, absl::string_view program, absl::Duration grace) {
  int signal_number = 0;
  if (sigwait(&signals, &signal_number) != 0) {
    std::cerr << program << ": sigwait failed; shutting down\n";
  } else {
    std::cerr << program << ": " << strsignal(signal_number) << "; shutting down (grace "
              << absl::FormatDuration(grace) << ")" << std::endl;
  }
}

}  // namespace ckpt

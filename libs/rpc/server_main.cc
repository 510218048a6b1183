#include "libs/rpc/server_main.h"

#include <pthread.h>

#include <cstring>
#include <iostream>
#include <string>

#include "absl/flags/usage_config.h"
#include "absl/strings/match.h"

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

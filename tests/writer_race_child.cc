// One writer of writer_race_test: a client process that makes alias changes through the real
// client (RemoteCheckpointStore, and libs/registry's Promote / Rollback), each held at a barrier
// just before it sends SetAlias so that two such processes race at the store.
//
//   writer_race_child STORE_ADDRESS TOKEN_FILE
//
// reads one operation a line from stdin, space-separated:
//   promote MODEL VERSION ALIAS REASON
//   rollback MODEL ALIAS REASON
//   set MODEL ALIAS VERSION EXPECTED REASON
// (`set` is SetAlias compare-and-set with expected_current_version EXPECTED; -1: the alias must
// not exist). For each it prints "ready\n" once the call is about to send SetAlias (its reads and
// checks done), waits for one byte on stdin, sends it, and prints "won PREVIOUS\n" or
// "lost CODE: MESSAGE\n" (also when it failed before reaching SetAlias). Exits 0 at the end of
// stdin; 2 for a bad command line, operation or no connection.

#include <unistd.h>

#include <cstdint>
#include <fstream>
#include <iostream>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/time.h"
#include "libs/client/remote_checkpoint_store.h"
#include "libs/registry/promotion.h"
#include "libs/status/status_macros.h"
#include "libs/store/testing/instrumented_store.h"

namespace ckpt {
namespace {

int Usage(const std::string& problem) {
  std::cerr << "writer_race_child: " << problem
            << "\nusage: writer_race_child STORE_ADDRESS TOKEN_FILE, then on stdin one a line: "
               "promote MODEL VERSION ALIAS REASON | rollback MODEL ALIAS REASON | "
               "set MODEL ALIAS VERSION EXPECTED REASON\n";
  return 2;
}

// The next line of stdin, read a byte at a time (the barrier reads single bytes too); nullopt at
// its end.
std::optional<std::string> ReadCommand() {
  std::string line;
  char byte = 0;
  while (read(STDIN_FILENO, &byte, 1) == 1) {
    if (byte == '\n') return line;
    line.push_back(byte);
  }
  return std::nullopt;
}

// Runs one operation; how it ended, or INVALID_ARGUMENT for one it cannot parse.
absl::StatusOr<int64_t> RunOperation(CheckpointStore& store, const std::vector<std::string>& op) {
  int64_t version = 0;
  int64_t expected = 0;
  if (op.size() == 5 && op[0] == "promote" && absl::SimpleAtoi(op[2], &version)) {
    ASSIGN_OR_RETURN(PromotionResult promoted,
                     Promote(store, op[1], version, op[3], PromotionRules{}, op[4]));
    return promoted.previous_version;
  }
  if (op.size() == 4 && op[0] == "rollback") {
    ASSIGN_OR_RETURN(AliasMove moved, Rollback(store, op[1], op[2], op[3]));
    return moved.from_version;
  }
  if (op.size() == 6 && op[0] == "set" && absl::SimpleAtoi(op[3], &version) &&
      absl::SimpleAtoi(op[4], &expected)) {
    return store.SetAlias(op[1], op[2], version, expected, {"", op[5]});
  }
  return absl::InvalidArgumentError(
      absl::StrCat("cannot parse the operation '", absl::StrJoin(op, " "), "'"));
}

int Main(const std::vector<std::string>& args) {
  if (args.size() != 2) return Usage("expected STORE_ADDRESS TOKEN_FILE");
  std::ifstream token_file(args[1]);
  std::stringstream token;
  token << token_file.rdbuf();
  RemoteStoreOptions options;
  options.address = args[0];
  options.auth_token = std::string(absl::StripAsciiWhitespace(token.str()));
  options.deadline = absl::Seconds(60);
  absl::StatusOr<std::unique_ptr<RemoteCheckpointStore>> remote =
      RemoteCheckpointStore::Connect(options);
  if (!remote.ok()) return Usage(remote.status().ToString());

  InstrumentedStore store(remote->get());
  store.set_hook([](absl::string_view method) {
    if (method != "SetAlias") return;
    std::cout << "ready\n" << std::flush;
    char go = 0;
    if (read(STDIN_FILENO, &go, 1) != 1) {
      std::cerr << "writer_race_child: stdin closed before the go\n";
      _exit(3);
    }
  });
  while (std::optional<std::string> command = ReadCommand()) {
    const std::vector<std::string> op = absl::StrSplit(*command, ' ', absl::SkipEmpty());
    const absl::StatusOr<int64_t> previous = RunOperation(store, op);
    if (absl::IsInvalidArgument(previous.status())) return Usage(previous.status().ToString());
    if (previous.ok()) {
      std::cout << "won " << *previous << "\n" << std::flush;
    } else {
      std::cout << "lost " << absl::StatusCodeToString(previous.status().code()) << ": "
                << previous.status().message() << "\n"
                << std::flush;
    }
  }
  return 0;
}

}  // namespace
}  // namespace ckpt

int main(int argc, char** argv) {
  return ckpt::Main(std::vector<std::string>(argv + 1, argv + argc));
}

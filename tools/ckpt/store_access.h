#ifndef CKPT_TOOLS_CKPT_STORE_ACCESS_H_
#define CKPT_TOOLS_CKPT_STORE_ACCESS_H_

// How `ckpt` commands reach the store and the loader from their global options (--store_dir,
// --store with --store_auth_token_file and --store_tls_*, --loader with --loader_auth_token_file
// and --loader_tls_*; the deprecated --auth_token_file and --tls_* until the next release), and
// option parsing every store command shares.

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "libs/client/remote_loader.h"
#include "libs/loader/loader_interface.h"
#include "libs/rpc/client_channel.h"
#include "libs/store/checkpoint_store.h"
#include "proto/ckpt/v1/types.pb.h"
#include "tools/ckpt/command_line.h"

namespace ckpt {

// The store the command works on: a service (--store) or a database opened in-process
// (--store_dir, created when `create`).
absl::StatusOr<std::unique_ptr<CheckpointStore>> OpenStore(const cli::ParsedCommandLine& line,
                                                           bool create);

// A client of the loader service --loader names (with --loader_auth_token_file's token and
// --loader_tls_*).
absl::StatusOr<std::unique_ptr<RemoteLoader>> ConnectLoader(const cli::ParsedCommandLine& line);

// The Loader a command uses: a loader service (--loader), or this process over the store
// (--store / --store_dir), which must outlive it.
struct LoaderHandle {
  std::unique_ptr<CheckpointStore> store;
  std::unique_ptr<Loader> loader;
};
absl::StatusOr<LoaderHandle> OpenLoader(const cli::ParsedCommandLine& line);

// How to reach the service the command names: --loader's when given, else --store's, with their
// tokens and TLS. INVALID_ARGUMENT when there is neither (an embedded --store_dir has no
// service, and no identities).
struct ServiceClient {
  ClientOptions options;
  std::string noun;  // "loader" or "checkpoint store"
};
absl::StatusOr<ServiceClient> ServiceClientFor(const cli::ParsedCommandLine& line);

// `text` parsed as MODEL@VERSION with a version number; INVALID_ARGUMENT otherwise.
absl::StatusOr<v1::VersionRef> RefWithVersion(const std::string& text);

// A duration back from now ("30m", "24h", "7d") or an RFC 3339 time; INVALID_ARGUMENT naming
// `option` otherwise.
absl::StatusOr<absl::Time> ParseTimeOption(const std::string& option, const std::string& text);

// RFC 3339 in UTC with a "Z" and all six digits of microseconds, so lines align and sort.
std::string UtcTimeText(int64_t unix_micros);

}  // namespace ckpt

#endif  // CKPT_TOOLS_CKPT_STORE_ACCESS_H_

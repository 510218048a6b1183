#ifndef CKPT_LIBS_CLIENT_SHM_LOADER_H_
#define CKPT_LIBS_CLIENT_SHM_LOADER_H_

// SharedMemoryLoader: the Loader (libs/loader/loader_interface.h) for a consumer on the loader's
// host. Load asks the loader's shared-memory socket (libs/loader/shm_server.h) and gets the
// adapted manifest, where each tensor's bytes lie and read-only descriptors of the files that
// hold them (the store's pack files, or a sealed memfd of cast and copied bytes); it maps each
// file once and builds the tensors on the mapped bytes: no tensor byte passes through TCP,
// protobuf or a copy. Preflight and Export move no tensor bytes through the consumer (or write
// a file) and go to the gRPC loader given at Connect.
//
// Integrity as over gRPC: every chunk is hashed (XXH3-64) against the manifest's chunk refs, a
// cast tensor against the digest the loader took of the bytes it wrote; DATA_LOSS names the
// tensor and the chunk, as RemoteLoader's does (libs/loader/stream_digest.h).
//
// Tensors are writable, as LocalLoader's mapped ones are: the mappings are private
// (MAP_PRIVATE, PROT_READ | PROT_WRITE), so the first write to a page copies it into this
// process and neither the store's files nor other consumers ever see it; a tensor never shares
// bytes with another one of the same load. The mappings and descriptors go away with the last
// tensor that uses them (descriptors are closed once mapped).
//
// Where the socket is missing or refuses (another host, a loader without --shm_socket, a loader
// restarted without it), is busy or slow, or the request is over kMaxShmRequestBytes (a target
// with very long key lists), a Load goes to the gRPC loader instead and says so once
// (options.log).
// OpenLoaderClient picks the transport once at start the same way.
//
// Thread-safety: every method may be called concurrently (one connection per Load).
//
// Example:
//   LoaderClientOptions options;
//   options.address = "127.0.0.1:50052";
//   options.shm_socket = "/data/ckpt/loader.sock";  // --shm_socket of the loader
//   ASSIGN_OR_RETURN(std::unique_ptr<Loader> loader, OpenLoaderClient(options));
//   ASSIGN_OR_RETURN(LoadedState state, loader->Load(ref, target));

#include <sys/types.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "libs/client/remote_loader.h"
#include "libs/loader/loader_interface.h"
#include "libs/loader/shm_protocol.pb.h"
#include "libs/loader/shm_wire.h"

namespace ckpt {

struct LoaderClientOptions;

struct SharedMemoryLoaderOptions {
  // The loader's --shm_socket.
  std::string socket_path;
  // Bounds each send and receive on the socket (the loader copies cast tensors before it
  // answers, so this is per Load, not per byte).
  absl::Duration timeout = absl::Minutes(10);
  // Where "using the gRPC loader instead" goes (once per loader). Default: a line on stderr.
  std::function<void(absl::string_view)> log;
  // Uids trusted to serve the socket, besides this process's own uid and root. Every check the
  // client makes compares bytes with digests from the same answer, so they catch damage, not a
  // fake loader: whoever holds the socket path decides what is served. The server's uid
  // (SO_PEERCRED) is checked on every connection; another is PERMISSION_DENIED, with no fallback.
  std::vector<uid_t> trusted_server_uids;
};

// What a SharedMemoryLoader has done, for logs and tests.
struct SharedMemoryLoaderCounters {
  int64_t shm_loads = 0;       // Loads answered over the socket.
  int64_t fallback_loads = 0;  // Loads that went to the gRPC loader instead.
  int64_t mapped_bytes = 0;    // tensor bytes mapped from passed descriptors.
};

class SharedMemoryLoader final : public Loader {
 public:
  // Says hello on the socket first: UNAVAILABLE when nothing listens there (no such file,
  // refused), PERMISSION_DENIED when the loader does not admit this process's uid.
  // `grpc_loader` (not null) serves Preflight and Export, and Loads when the socket goes away.
  static absl::StatusOr<std::unique_ptr<SharedMemoryLoader>> Connect(
      SharedMemoryLoaderOptions options, std::unique_ptr<Loader> grpc_loader);

  // The hello alone, errors as Connect: whether a Connect would succeed now.
  static absl::Status Probe(const SharedMemoryLoaderOptions& options);

  // As RemoteLoader::Load (LoadedState.manifest is the adapted manifest the loader sent).
  // FAILED_PRECONDITION (before the socket is touched) when target.device is unusable here;
  // DATA_LOSS for a chunk or tensor that fails its checksum, or an answer inconsistent with its
  // manifest; PERMISSION_DENIED and other loader errors as they are.
  absl::StatusOr<LoadedState> Load(const v1::VersionRef& ref,
                                   const LoadTarget& target) const override;
  absl::StatusOr<PreflightReport> Preflight(const v1::VersionRef& ref,
                                            const std::vector<ExpectedTensor>& expected,
                                            const LoadTarget& target) const override;
  absl::StatusOr<ExportResult> Export(const v1::VersionRef& ref, const ExportOptions& options,
                                      const std::string& path) const override;

  const std::string& socket_path() const { return options_.socket_path; }
  SharedMemoryLoaderCounters counters() const;

 private:
  friend absl::StatusOr<std::unique_ptr<Loader>> OpenLoaderClient(
      const LoaderClientOptions& options);

  SharedMemoryLoader(SharedMemoryLoaderOptions options, std::unique_ptr<Loader> grpc_loader);

  absl::StatusOr<LoadedState> Assemble(const v1::ShmAnswer& answer, std::vector<UniqueFd>& fds,
                                       const LoadTarget& target) const;

  const SharedMemoryLoaderOptions options_;
  const std::unique_ptr<Loader> grpc_loader_;
  mutable std::atomic<bool> fallback_logged_{false};
  mutable std::atomic<int64_t> shm_loads_{0};
  mutable std::atomic<int64_t> fallback_loads_{0};
  mutable std::atomic<int64_t> mapped_bytes_{0};
};

struct LoaderClientOptions : RemoteLoaderOptions {
  // The loader's --shm_socket; empty: gRPC only.
  std::string shm_socket;
  // As SharedMemoryLoaderOptions.
  absl::Duration shm_timeout = absl::Minutes(10);
  std::function<void(absl::string_view)> log;
};

// The loader a consumer should hold: a SharedMemoryLoader when options.shm_socket names a socket
// that admits this process, else the RemoteLoader at options.address, after saying once why
// (options.log). Errors as RemoteLoader::Connect (the gRPC loader is needed either way).
absl::StatusOr<std::unique_ptr<Loader>> OpenLoaderClient(const LoaderClientOptions& options);

}  // namespace ckpt

#endif  // CKPT_LIBS_CLIENT_SHM_LOADER_H_

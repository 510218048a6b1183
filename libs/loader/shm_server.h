#ifndef CKPT_LIBS_LOADER_SHM_SERVER_H_
#define CKPT_LIBS_LOADER_SHM_SERVER_H_

// ShmLoaderServer: the loader's shared-memory path for consumers on its own host, the way
// Triton's system shared memory and Plasma serve co-located clients. It listens on a Unix-domain
// socket beside the gRPC loader; a consumer (SharedMemoryLoader, libs/client/shm_loader.h) sends
// a LoadRequest and gets back the adapted manifest (as the gRPC Load's first message), where
// each tensor's bytes lie, and read-only file descriptors (SCM_RIGHTS) to map them from, so no
// tensor byte passes through a socket, protobuf or copy on the consumer's side:
//
//  - A tensor sent as stored whose chunks lie back to back in one pack file of the store
//    (VersionReader::LocateTensorBytes) is served from the pack itself, opened O_RDONLY: the
//    consumer maps the page cache the store's own reads use. Only a peer of this process's uid
//    gets pack descriptors, because a pack may hold other models' chunks and that uid can read
//    the store's files anyway; another admitted uid gets copies (below) of exactly its tensors.
//  - Every other tensor (a cast one, one whose chunks are scattered or deduplicated with another
//    tensor of the load, one from a store without files) is written once into a memfd shared by
//    the whole answer, sealed (F_SEAL_WRITE | F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) before it
//    is passed, read-only.
//
// Integrity: the server checks nothing it passes in place (the consumer hashes every chunk of
// it against the manifest's chunk refs, the store's XXH3-64, as a gRPC consumer does); bytes it
// copies are checked by the store's read, and a cast tensor's answer carries the XXH3-64 of the
// bytes written (TensorDigest), which the consumer checks too.
//
// Access: the socket file is created with `socket_mode` (0600 by default), and every
// connection's peer uid (SO_PEERCRED, from the kernel) must be this process's own uid (unless
// admit_own_uid is false) or one of allowed_uids; others get PERMISSION_DENIED naming their uid
// as soon as they are accepted, before a byte of their request is read and without taking a
// connection slot.
// An admitted uid is a reader of every model on this socket: the operator who lists a uid grants
// it that, as an identities file grants a token a role. The gRPC side's bearer tokens are not
// asked for here (a process that can connect has no channel to present one on that the kernel
// vouches for; its uid is what it is).
//
// Threads: one accepting thread, and one thread per connection while its answer is built and
// sent; at most max_connections at once (more are answered RESOURCE_EXHAUSTED). A consumer that
// goes away mid-answer costs that connection only. An admitted peer has io_timeout for its whole
// request (at most kMaxShmRequestBytes), however it trickles it, and io_timeout again to take its
// answer: one that dawdles holds its slot that long at most.
//
// Example:
//   ShmServerOptions options;
//   options.socket_path = "/run/ckpt/loader.sock";
//   ASSIGN_OR_RETURN(std::unique_ptr<ShmLoaderServer> shm, ShmLoaderServer::Start(store, options));
//   ...
//   shm->Shutdown();  // or let it go out of scope

#include <sys/types.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "libs/loader/chunk_cache.h"
#include "libs/loader/shm_protocol.pb.h"
#include "libs/store/checkpoint_store.h"
#include "proto/ckpt/v1/loader.pb.h"

namespace ckpt {

struct ShmServerOptions {
  // Where to listen; at most 107 bytes (sun_path). A stale socket file there (nothing listening)
  // is replaced; one a live server listens on is ALREADY_EXISTS.
  std::string socket_path;
  // The socket file's mode: 0600 (this uid only), 0660 to let a group connect (its uids must
  // still be in allowed_uids).
  mode_t socket_mode = 0600;
  // Peer uids admitted besides this process's own.
  std::vector<uid_t> allowed_uids;
  // Whether this process's own uid is admitted (tests turn it off to play a stranger).
  bool admit_own_uid = true;
  // Connections served at once.
  int max_connections = 64;
  // How long a connection may take to send its whole request, and again to take its whole
  // answer (deadlines, not per read or write).
  absl::Duration io_timeout = absl::Seconds(30);
  // The chunk cache the copied tensors are read through: the loader's, shared with its gRPC
  // service (not owned; it must outlive the server). Null: read straight from the store.
  ChunkCache* cache = nullptr;
};

// What the server has done, for logs and tests.
struct ShmServerCounters {
  int64_t answers = 0;         // answers sent whole (errors included).
  int64_t broken = 0;          // connections that went away before their answer was sent.
  int64_t refused = 0;         // PERMISSION_DENIED for the peer's uid (not in `answers`).
  int64_t in_place_bytes = 0;  // tensor bytes passed as pack files.
  int64_t copied_bytes = 0;    // tensor bytes written into memfds.
};

class ShmLoaderServer {
 public:
  // Binds and listens, then serves `store` (not owned; it must outlive the server) on a thread
  // of its own. INVALID_ARGUMENT for bad options (an empty or too long path); ALREADY_EXISTS
  // when a server listens there already; errors from socket calls as INTERNAL naming the path.
  static absl::StatusOr<std::unique_ptr<ShmLoaderServer>> Start(CheckpointStore* store,
                                                                ShmServerOptions options);
  // Shutdown.
  ~ShmLoaderServer();
  ShmLoaderServer(const ShmLoaderServer&) = delete;
  ShmLoaderServer& operator=(const ShmLoaderServer&) = delete;

  // Stops accepting, breaks open connections, waits for their threads and removes the socket
  // file. Idempotent.
  void Shutdown();

  const std::string& socket_path() const { return options_.socket_path; }
  ShmServerCounters counters() const;
  // Connections being served now (for tests that wait for the server to be idle).
  int active_connections() const;

 private:
  ShmLoaderServer(CheckpointStore* store, ShmServerOptions options, int listen_fd, int wake_fd);

  void AcceptLoop();
  // Serves an admitted peer's connection; closes `fd`.
  void Serve(int fd, uid_t uid);
  // Answers a connection the accepting thread does not serve (a refused uid, the connection
  // limit) with `status`, without reading from it, and closes `fd`.
  void TurnAway(int fd, const absl::Status& status);
  // The answer to `request` from a peer of `uid`, with the descriptors to pass (owned by the
  // caller once returned).
  absl::Status BuildLoadAnswer(const v1::LoadRequest& request, bool same_uid, v1::ShmAnswer& answer,
                               std::vector<int>& fds);
  absl::Status Admit(uid_t uid) const;

  CheckpointStore& store_;
  const ShmServerOptions options_;
  const uid_t own_uid_;
  const int listen_fd_;
  const int wake_fd_;  // an eventfd that wakes the accepting thread for Shutdown.
  std::thread accept_thread_;

  mutable absl::Mutex mu_;
  bool shut_down_ ABSL_GUARDED_BY(mu_) = false;
  absl::flat_hash_set<int> open_connections_ ABSL_GUARDED_BY(mu_);
  int serving_ ABSL_GUARDED_BY(mu_) = 0;  // connection threads still running.

  std::atomic<int64_t> answers_{0};
  std::atomic<int64_t> broken_{0};
  std::atomic<int64_t> refused_{0};
  std::atomic<int64_t> in_place_bytes_{0};
  std::atomic<int64_t> copied_bytes_{0};
};

}  // namespace ckpt

#endif  // CKPT_LIBS_LOADER_SHM_SERVER_H_

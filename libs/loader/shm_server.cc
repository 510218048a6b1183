#include "libs/loader/shm_server.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstring>
#include <iostream>
#include <optional>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "libs/io/disjoint_ranges.h"
#include "libs/io/prefault.h"
#include "libs/loader/served_load.h"
#include "libs/loader/shm_wire.h"
#include "libs/status/status_macros.h"
#include "libs/store/version_ref.h"

namespace ckpt {
namespace {

// Where tensors start in a memfd: element alignment for every dtype, as the store's packs.
constexpr int64_t kMemfdAlignment = 64;

absl::Status ErrnoError(absl::string_view what, int error) {
  return absl::InternalError(absl::StrCat(what, ": ", strerror(error)));
}

absl::StatusOr<sockaddr_un> SocketAddress(const std::string& path) {
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  if (path.empty()) return absl::InvalidArgumentError("the shared-memory socket path is empty");
  if (path.size() >= sizeof(address.sun_path)) {
    return absl::InvalidArgumentError(absl::StrCat("the shared-memory socket path '", path,
                                                   "' is longer than ",
                                                   sizeof(address.sun_path) - 1, " bytes"));
  }
  std::memcpy(address.sun_path, path.data(), path.size());
  return address;
}

// A shared, writable mapping of a memfd while it is filled; unmapped on destruction, before the
// seals (F_SEAL_WRITE refuses while a shared writable mapping exists).
class FillMapping {
 public:
  FillMapping(void* base, size_t length) : base_(base), length_(length) {}
  ~FillMapping() { munmap(base_, length_); }
  char* data() const { return static_cast<char*>(base_); }

 private:
  void* const base_;
  const size_t length_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<ShmLoaderServer>> ShmLoaderServer::Start(CheckpointStore* store,
                                                                        ShmServerOptions options) {
  if (store == nullptr) return absl::InvalidArgumentError("ShmLoaderServer needs a store");
  if (options.max_connections < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_connections must be at least 1, got ", options.max_connections));
  }
  ASSIGN_OR_RETURN(const sockaddr_un address, SocketAddress(options.socket_path));
  const std::string& path = options.socket_path;
  UniqueFd listener(socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!listener.valid()) return ErrnoError("socket(AF_UNIX)", errno);
  struct stat existing;
  if (lstat(path.c_str(), &existing) == 0) {
    if (!S_ISSOCK(existing.st_mode)) {
      return absl::AlreadyExistsError(
          absl::StrCat("'", path, "' exists and is not a socket: not replacing it"));
    }
    // A socket file: live (another loader) or stale (one that died without removing it).
    UniqueFd probe(socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
    if (probe.valid() &&
        connect(probe.get(), reinterpret_cast<const sockaddr*>(&address), sizeof(address)) == 0) {
      return absl::AlreadyExistsError(
          absl::StrCat("a server already listens on the shared-memory socket '", path, "'"));
    }
    if (unlink(path.c_str()) != 0 && errno != ENOENT) {
      return ErrnoError(absl::StrCat("removing the stale socket '", path, "'"), errno);
    }
  }
  if (bind(listener.get(), reinterpret_cast<const sockaddr*>(&address), sizeof(address)) != 0) {
    return ErrnoError(absl::StrCat("bind('", path, "')"), errno);
  }
  // Before listen: no connection is accepted while the file has the umask's mode. (Peers are
  // checked by uid regardless.)
  if (chmod(path.c_str(), options.socket_mode) != 0) {
    const int error = errno;
    unlink(path.c_str());
    return ErrnoError(absl::StrCat("chmod('", path, "')"), error);
  }
  if (listen(listener.get(), 128) != 0) {
    const int error = errno;
    unlink(path.c_str());
    return ErrnoError(absl::StrCat("listen('", path, "')"), error);
  }
  UniqueFd wake(eventfd(0, EFD_CLOEXEC));
  if (!wake.valid()) {
    const int error = errno;
    unlink(path.c_str());
    return ErrnoError("eventfd", error);
  }
  std::unique_ptr<ShmLoaderServer> server(
      new ShmLoaderServer(store, std::move(options), listener.Release(), wake.Release()));
  server->accept_thread_ = std::thread([raw = server.get()] { raw->AcceptLoop(); });
  return server;
}

ShmLoaderServer::ShmLoaderServer(CheckpointStore* store, ShmServerOptions options, int listen_fd,
                                 int wake_fd)
    : store_(*store),
      options_(std::move(options)),
      own_uid_(geteuid()),
      listen_fd_(listen_fd),
      wake_fd_(wake_fd) {}

ShmLoaderServer::~ShmLoaderServer() {
  Shutdown();
  close(listen_fd_);
  close(wake_fd_);
}

void ShmLoaderServer::Shutdown() {
  {
    absl::MutexLock lock(&mu_);
    if (shut_down_) return;
    shut_down_ = true;
    // Connections blocked in a read or a write return at once.
    for (int fd : open_connections_) shutdown(fd, SHUT_RDWR);
  }
  const uint64_t one = 1;
  if (write(wake_fd_, &one, sizeof(one)) < 0) {
    std::cerr << "shared-memory loader: waking the accepting thread: " << strerror(errno) << "\n";
  }
  if (accept_thread_.joinable()) accept_thread_.join();
  absl::MutexLock lock(&mu_);
  mu_.Await(absl::Condition(
      +[](int* serving) { return *serving == 0; }, &serving_));
  unlink(options_.socket_path.c_str());
}

ShmServerCounters ShmLoaderServer::counters() const {
  ShmServerCounters counters;
  counters.answers = answers_.load();
  counters.broken = broken_.load();
  counters.refused = refused_.load();
  counters.in_place_bytes = in_place_bytes_.load();
  counters.copied_bytes = copied_bytes_.load();
  return counters;
}

int ShmLoaderServer::active_connections() const {
  absl::MutexLock lock(&mu_);
  return serving_;
}

void ShmLoaderServer::AcceptLoop() {
  while (true) {
    pollfd polled[2] = {{listen_fd_, POLLIN, 0}, {wake_fd_, POLLIN, 0}};
    if (poll(polled, 2, -1) < 0) {
      if (errno == EINTR) continue;
      std::cerr << "shared-memory loader: poll: " << strerror(errno) << "\n";
      return;
    }
    if (polled[1].revents != 0) return;
    const int fd = accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno != EINTR && errno != EAGAIN && errno != ECONNABORTED) {
        std::cerr << "shared-memory loader: accept: " << strerror(errno) << "\n";
      }
      continue;
    }
    // The uid first, from the kernel, before a byte is read: a stranger gets no thread, no slot
    // and no buffer for whatever it would send, and learns nothing about versions.
    ucred peer{};
    socklen_t length = sizeof(peer);
    if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &peer, &length) != 0) {
      std::cerr << "shared-memory loader: getsockopt(SO_PEERCRED): " << strerror(errno) << "\n";
      close(fd);
      continue;
    }
    if (absl::Status admitted = Admit(peer.uid); !admitted.ok()) {
      refused_.fetch_add(1);
      TurnAway(fd, admitted);
      continue;
    }
    bool busy;
    {
      absl::MutexLock lock(&mu_);
      if (shut_down_) {
        close(fd);
        return;
      }
      busy = serving_ >= options_.max_connections;
      if (!busy) {
        ++serving_;
        open_connections_.insert(fd);
      }
    }
    if (busy) {
      TurnAway(fd, absl::ResourceExhaustedError(
                       absl::StrCat("the shared-memory loader is serving its limit of ",
                                    options_.max_connections, " connections; retry later")));
      continue;
    }
    std::thread([this, fd, uid = peer.uid] { Serve(fd, uid); }).detach();
  }
}

void ShmLoaderServer::TurnAway(int fd, const absl::Status& status) {
  // A small answer into a fresh socket's buffer: does not block the accepting thread. Whatever
  // the peer sent stays unread (closing then resets its end; the answer is read first).
  v1::ShmAnswer answer;
  answer.set_code(static_cast<int>(status.code()));
  answer.set_message(std::string(status.message()));
  (void)SendFrame(fd, answer.SerializeAsString(), {}, absl::Now() + absl::Seconds(1));
  close(fd);
}

absl::Status ShmLoaderServer::Admit(uid_t uid) const {
  if (options_.admit_own_uid && uid == own_uid_) return absl::OkStatus();
  for (uid_t allowed : options_.allowed_uids) {
    if (uid == allowed) return absl::OkStatus();
  }
  return absl::PermissionDeniedError(absl::StrCat(
      "uid ", uid, " may not load through the shared-memory socket '", options_.socket_path,
      "' (admitted: ", options_.admit_own_uid ? absl::StrCat("this loader's uid ", own_uid_) : "",
      options_.allowed_uids.empty() ? ""
                                    : absl::StrCat(options_.admit_own_uid ? " and " : "", "uids ",
                                                   absl::StrJoin(options_.allowed_uids, ",")),
      "); load over gRPC with a token instead"));
}

void ShmLoaderServer::Serve(int fd, uid_t uid) {
  v1::ShmAnswer answer;
  std::vector<int> fds;   // to pass; closed here once sent.
  bool received = false;  // a whole request frame arrived.
  const absl::Status outcome = [&]() -> absl::Status {
    std::string bytes;
    std::vector<UniqueFd> unexpected;  // a client passes none; closed on return.
    // One deadline for the whole request: a peer that trickles it cannot hold the slot longer.
    RETURN_IF_ERROR(ReceiveFrame(fd, kMaxShmRequestBytes, bytes, unexpected,
                                 absl::Now() + options_.io_timeout));
    received = true;
    v1::ShmRequest request;
    if (!request.ParseFromString(bytes)) {
      return absl::InvalidArgumentError("the request is not a ShmRequest");
    }
    switch (request.kind_case()) {
      case v1::ShmRequest::kHello:
        return absl::OkStatus();
      case v1::ShmRequest::kLoad:
        return BuildLoadAnswer(request.load(), uid == own_uid_, answer, fds);
      default:
        return absl::InvalidArgumentError("a ShmRequest naming neither hello nor load");
    }
  }();
  if (!outcome.ok()) {
    for (int passed : fds) close(passed);
    fds.clear();
    answer.Clear();
    answer.set_code(static_cast<int>(outcome.code()));
    answer.set_message(std::string(outcome.message()));
  }
  answer.set_fd_count(static_cast<int>(fds.size()));
  // A peer that is already gone (or never sent a request) gets nothing and costs nothing more.
  const bool peer_gone =
      !received && (absl::IsUnavailable(outcome) || absl::IsDeadlineExceeded(outcome));
  if (!peer_gone) {
    if (absl::Status sent =
            SendFrame(fd, answer.SerializeAsString(), fds, absl::Now() + options_.io_timeout);
        sent.ok()) {
      answers_.fetch_add(1);
    } else {
      broken_.fetch_add(1);  // the consumer went away: its loss, not the server's.
    }
  } else {
    broken_.fetch_add(1);
  }
  for (int passed : fds) close(passed);
  absl::MutexLock lock(&mu_);
  open_connections_.erase(fd);
  close(fd);
  --serving_;
}

namespace {

// A shared-memory answer's end of ServedLoad::Send: tensors passed in place in a pack file are
// skipped, the others written into the memfd at their layout's offset, digests into the layout.
class ShmLoadSink final : public ServedLoadSink {
 public:
  ShmLoadSink(v1::ShmAnswer& answer, const std::vector<bool>& in_place, char* memfd)
      : answer_(answer), in_place_(in_place), memfd_(memfd) {}

  Placement Place(const ServedTensor& tensor) override {
    return in_place_[static_cast<size_t>(tensor.index)] ? Placement::kSkip : Placement::kInto;
  }
  char* Destination(const ServedTensor& tensor) override {
    return memfd_ == nullptr ? nullptr : memfd_ + answer_.tensors(tensor.index).offset();
  }
  absl::Status Digest(const v1::TensorDigest& digest) override {
    *answer_.mutable_tensors(digest.tensor_index())->mutable_digest() = digest;
    return absl::OkStatus();
  }

 private:
  v1::ShmAnswer& answer_;
  const std::vector<bool>& in_place_;
  char* const memfd_;
};

}  // namespace

absl::Status ShmLoaderServer::BuildLoadAnswer(const v1::LoadRequest& request, bool same_uid,
                                              v1::ShmAnswer& answer, std::vector<int>& fds) {
  if (request.has_only_tensors()) {
    return absl::InvalidArgumentError(
        "LoadRequest.only_tensors is for resuming gRPC streams; the shared-memory path answers "
        "whole loads");
  }
  ASSIGN_OR_RETURN(const std::unique_ptr<VersionReader> reader, store_.OpenVersion(request.ref()));
  ASSIGN_OR_RETURN(const ServedLoad load, ServedLoad::Plan(reader->manifest(), request));
  *answer.mutable_manifest() = load.manifest();

  // Where each tensor goes: a pack file passed as it is, else the memfd.
  std::vector<bool> in_place(load.tensors().size(), false);
  int copies = 0;
  int64_t memfd_bytes = 0;
  absl::flat_hash_map<std::string, int> pack_fd;  // path -> index in fds
  // Bytes of each pack handed out by this answer: two tensors never share bytes (a
  // deduplicated twin is copied), or a write to one would show in the other.
  absl::flat_hash_map<std::string, DisjointRanges> claimed;
  for (const ServedTensor& tensor : load.tensors()) {
    const v1::TensorMeta& stored = *tensor.stored;
    const v1::TensorMeta& out = *tensor.sent;
    v1::ShmTensorLayout& layout = *answer.add_tensors();
    layout.set_length(out.byte_length());
    if (out.byte_length() == 0) {
      layout.set_fd(-1);
      continue;
    }
    if (!tensor.cast && same_uid) {
      ASSIGN_OR_RETURN(std::optional<VersionReader::FileRegion> region,
                       reader->LocateTensorBytes(stored));
      if (region.has_value() && region->offset % kMemfdAlignment == 0 &&
          claimed[region->path].Claim(region->offset, region->offset + stored.byte_length())) {
        auto it = pack_fd.find(region->path);
        if (it == pack_fd.end() && static_cast<int>(fds.size()) < kMaxShmFds - 1) {
          // Unlinked since the reader's snapshot (garbage collection): copied instead.
          const int opened = open(region->path.c_str(), O_RDONLY | O_CLOEXEC);
          if (opened >= 0) {
            fds.push_back(opened);
            it = pack_fd.emplace(region->path, static_cast<int>(fds.size()) - 1).first;
          }
        }
        if (it != pack_fd.end()) {
          layout.set_fd(it->second);
          layout.set_offset(region->offset);
          in_place[static_cast<size_t>(tensor.index)] = true;
          in_place_bytes_.fetch_add(stored.byte_length());
          continue;
        }
      }
    }
    const int64_t offset = (memfd_bytes + kMemfdAlignment - 1) / kMemfdAlignment * kMemfdAlignment;
    layout.set_offset(offset);
    memfd_bytes = offset + out.byte_length();
    ++copies;
  }
  if (copies == 0) {
    // Nothing to copy: the digests of zero-byte tensors are all Send has to give.
    ShmLoadSink sink(answer, in_place, nullptr);
    return load.Send(*reader, options_.cache, /*digests=*/true, sink);
  }

  UniqueFd memfd(memfd_create("ckpt-shm-load", MFD_CLOEXEC | MFD_ALLOW_SEALING));
  if (!memfd.valid()) return ErrnoError("memfd_create", errno);
  if (ftruncate(memfd.get(), memfd_bytes) != 0) {
    return absl::ResourceExhaustedError(
        absl::StrCat("sizing a memfd of ", memfd_bytes, " bytes: ", strerror(errno)));
  }
  {
    void* base = mmap(nullptr, static_cast<size_t>(memfd_bytes), PROT_READ | PROT_WRITE, MAP_SHARED,
                      memfd.get(), 0);
    if (base == MAP_FAILED) return ErrnoError("mapping a memfd", errno);
    FillMapping fill(base, static_cast<size_t>(memfd_bytes));
    // Fresh shared memory: its pages allocated in one call, not a fault per 4 KiB of the copies.
    PrefaultForWrite(fill.data(), static_cast<size_t>(memfd_bytes));
    // The store checks every chunk as it reads it; the consumer checks the digests of the rest.
    ShmLoadSink sink(answer, in_place, fill.data());
    RETURN_IF_ERROR(load.Send(*reader, options_.cache, /*digests=*/true, sink));
  }
  if (fcntl(memfd.get(), F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_WRITE | F_SEAL_SEAL) !=
      0) {
    return ErrnoError("sealing a memfd", errno);
  }
  // The consumer gets a read-only descriptor (the seals already forbid writes; this says so to
  // anything that looks at its flags). Without /proc the sealed one goes.
  const int read_only =
      open(absl::StrCat("/proc/self/fd/", memfd.get()).c_str(), O_RDONLY | O_CLOEXEC);
  const int memfd_index = static_cast<int>(fds.size());
  fds.push_back(read_only >= 0 ? read_only : memfd.Release());
  for (const ServedTensor& tensor : load.tensors()) {
    if (tensor.sent->byte_length() > 0 && !in_place[static_cast<size_t>(tensor.index)]) {
      answer.mutable_tensors(tensor.index)->set_fd(memfd_index);
    }
  }
  copied_bytes_.fetch_add(memfd_bytes);
  return absl::OkStatus();
}

}  // namespace ckpt

#ifndef CKPT_LIBS_LOADER_SHM_WIRE_H_
#define CKPT_LIBS_LOADER_SHM_WIRE_H_

// Framing of the loader's shared-memory protocol (libs/loader/shm_protocol.proto) on a
// Unix-domain stream socket, for both ends (shm_server.h, libs/client/shm_loader.h): a frame is
// a 4-byte little-endian length and that many bytes; file descriptors travel in one SCM_RIGHTS
// control message with the frame's first bytes.
//
// Example:
//   RETURN_IF_ERROR(SendFrame(socket, answer.SerializeAsString(), fds));
//   std::string bytes; std::vector<UniqueFd> received;
//   RETURN_IF_ERROR(ReceiveFrame(socket, kMaxShmFrameBytes, bytes, received));

#include <cstddef>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "absl/types/span.h"

namespace ckpt {

// The most descriptors one answer passes (the kernel's SCM_MAX_FD is 253).
inline constexpr int kMaxShmFds = 250;
// The largest frame either end accepts (a manifest of very many tensors fits).
inline constexpr size_t kMaxShmFrameBytes = size_t{256} << 20;
// The largest request the server reads: a LoadRequest is a ref and a target, whose key lists are
// what can grow (1 MiB is some 10,000 keys of 100 bytes). Bounded apart from answers because
// the server allocates a request's bytes for a peer it has not heard from yet; a client with a
// larger request loads over gRPC instead.
inline constexpr size_t kMaxShmRequestBytes = size_t{1} << 20;

// A file descriptor, closed on destruction. Movable.
class UniqueFd {
 public:
  UniqueFd() = default;
  explicit UniqueFd(int fd) : fd_(fd) {}
  ~UniqueFd() { Reset(); }
  UniqueFd(UniqueFd&& other) noexcept : fd_(other.Release()) {}
  UniqueFd& operator=(UniqueFd&& other) noexcept;
  UniqueFd(const UniqueFd&) = delete;
  UniqueFd& operator=(const UniqueFd&) = delete;

  int get() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  int Release() {
    const int fd = fd_;
    fd_ = -1;
    return fd;
  }
  void Reset(int fd = -1);

 private:
  int fd_ = -1;
};

// Bounds every later send and receive on `socket` (SO_SNDTIMEO / SO_RCVTIMEO).
absl::Status SetSocketTimeouts(int socket, absl::Duration timeout);

// Sends `message` as one frame, with `fds` (at most kMaxShmFds, not taken) attached. UNAVAILABLE
// when the peer is gone; DEADLINE_EXCEEDED past the send timeout, or past `deadline` for the
// whole frame (a finite deadline replaces the socket's send timeout: a peer that takes a byte
// at a time cannot stretch it).
absl::Status SendFrame(int socket, absl::string_view message, absl::Span<const int> fds,
                       absl::Time deadline = absl::InfiniteFuture());

// Receives one frame into `message`, appending the descriptors that came with it (close-on-exec)
// to `fds`, which owns them whatever is returned. UNAVAILABLE when the peer closed the socket
// (before or during the frame); DEADLINE_EXCEEDED past the receive timeout, or past `deadline`
// for the whole frame (as SendFrame's); DATA_LOSS for a frame over `max_bytes` (its length is
// checked before any of its bytes are read) or descriptors the kernel had to drop.
absl::Status ReceiveFrame(int socket, size_t max_bytes, std::string& message,
                          std::vector<UniqueFd>& fds, absl::Time deadline = absl::InfiniteFuture());

}  // namespace ckpt

#endif  // CKPT_LIBS_LOADER_SHM_WIRE_H_

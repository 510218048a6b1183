#include "libs/loader/shm_wire.h"

#include <errno.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace ckpt {
namespace {

absl::Status SocketError(int error, absl::string_view what) {
  if (error == EAGAIN || error == EWOULDBLOCK) {
    return absl::DeadlineExceededError(absl::StrCat(what, ": timed out"));
  }
  if (error == EPIPE || error == ECONNRESET || error == ENOTCONN) {
    return absl::UnavailableError(
        absl::StrCat(what, ": the peer went away (", strerror(error), ")"));
  }
  return absl::InternalError(absl::StrCat(what, ": ", strerror(error)));
}

// Before each send or receive of a frame with a finite `deadline`: the socket's timeout becomes
// what is left of it, so the frame as a whole cannot outlast it.
absl::Status ArmDeadline(int socket, absl::Time deadline, int option) {
  if (deadline == absl::InfiniteFuture()) return absl::OkStatus();
  const absl::Duration left = deadline - absl::Now();
  if (left <= absl::ZeroDuration()) {
    return absl::DeadlineExceededError(option == SO_RCVTIMEO
                                           ? "receiving a frame: past its deadline"
                                           : "sending a frame: past its deadline");
  }
  // A zero timeval would mean no timeout at all.
  const timeval tv = absl::ToTimeval(std::max(left, absl::Milliseconds(1)));
  if (setsockopt(socket, SOL_SOCKET, option, &tv, sizeof(tv)) != 0) {
    return absl::InternalError(absl::StrCat("setting a socket timeout: ", strerror(errno)));
  }
  return absl::OkStatus();
}

void EncodeLength(uint32_t length, char* out) {
  for (int i = 0; i < 4; ++i) out[i] = static_cast<char>((length >> (8 * i)) & 0xff);
}

// Sends all of [data, data + size) with plain send calls.
absl::Status SendAll(int socket, const char* data, size_t size, absl::Time deadline) {
  while (size > 0) {
    if (absl::Status armed = ArmDeadline(socket, deadline, SO_SNDTIMEO); !armed.ok()) return armed;
    const ssize_t sent = send(socket, data, size, MSG_NOSIGNAL);
    if (sent < 0) {
      if (errno == EINTR) continue;
      return SocketError(errno, "sending a frame");
    }
    data += sent;
    size -= static_cast<size_t>(sent);
  }
  return absl::OkStatus();
}

// Receives exactly `size` bytes; UNAVAILABLE on an orderly close.
absl::Status ReceiveAll(int socket, char* data, size_t size, absl::Time deadline) {
  while (size > 0) {
    if (absl::Status armed = ArmDeadline(socket, deadline, SO_RCVTIMEO); !armed.ok()) return armed;
    const ssize_t got = recv(socket, data, size, 0);
    if (got < 0) {
      if (errno == EINTR) continue;
      return SocketError(errno, "receiving a frame");
    }
    if (got == 0) return absl::UnavailableError("the peer closed the socket mid-frame");
    data += got;
    size -= static_cast<size_t>(got);
  }
  return absl::OkStatus();
}

}  // namespace

UniqueFd& UniqueFd::operator=(UniqueFd&& other) noexcept {
  if (this != &other) Reset(other.Release());
  return *this;
}

void UniqueFd::Reset(int fd) {
  if (fd_ >= 0) close(fd_);
  fd_ = fd;
}

absl::Status SetSocketTimeouts(int socket, absl::Duration timeout) {
  timeval tv = absl::ToTimeval(timeout);
  if (setsockopt(socket, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv)) != 0 ||
      setsockopt(socket, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv)) != 0) {
    return absl::InternalError(absl::StrCat("setting socket timeouts: ", strerror(errno)));
  }
  return absl::OkStatus();
}

absl::Status SendFrame(int socket, absl::string_view message, absl::Span<const int> fds,
                       absl::Time deadline) {
  if (message.size() > kMaxShmFrameBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("a frame of ", message.size(), " bytes is over ", kMaxShmFrameBytes));
  }
  if (fds.size() > static_cast<size_t>(kMaxShmFds)) {
    return absl::InvalidArgumentError(
        absl::StrCat(fds.size(), " descriptors in one frame, at most ", kMaxShmFds));
  }
  char header[4];
  EncodeLength(static_cast<uint32_t>(message.size()), header);
  // The header goes with the descriptors in one sendmsg: they arrive with the frame's first byte.
  iovec iov{header, sizeof(header)};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  std::vector<char> control;
  if (!fds.empty()) {
    control.assign(CMSG_SPACE(sizeof(int) * fds.size()), 0);
    msg.msg_control = control.data();
    msg.msg_controllen = control.size();
    cmsghdr* cmsg = CMSG_FIRSTHDR(&msg);
    cmsg->cmsg_level = SOL_SOCKET;
    cmsg->cmsg_type = SCM_RIGHTS;
    cmsg->cmsg_len = CMSG_LEN(sizeof(int) * fds.size());
    std::memcpy(CMSG_DATA(cmsg), fds.data(), sizeof(int) * fds.size());
  }
  ssize_t sent;
  do {  // re-armed after a signal, so signals cannot stretch the deadline.
    if (absl::Status armed = ArmDeadline(socket, deadline, SO_SNDTIMEO); !armed.ok()) return armed;
    sent = sendmsg(socket, &msg, MSG_NOSIGNAL);
  } while (sent < 0 && errno == EINTR);
  if (sent < 0) return SocketError(errno, "sending a frame");
  // A short write still carried the descriptors; the rest of the header is plain bytes.
  if (static_cast<size_t>(sent) < sizeof(header)) {
    if (absl::Status rest = SendAll(socket, header + sent, sizeof(header) - sent, deadline);
        !rest.ok()) {
      return rest;
    }
  }
  return SendAll(socket, message.data(), message.size(), deadline);
}

absl::Status ReceiveFrame(int socket, size_t max_bytes, std::string& message,
                          std::vector<UniqueFd>& fds, absl::Time deadline) {
  char header[4];
  iovec iov{header, sizeof(header)};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * 253)];
  msg.msg_control = control;
  msg.msg_controllen = sizeof(control);
  ssize_t got;
  do {  // re-armed after a signal, so signals cannot stretch the deadline.
    if (absl::Status armed = ArmDeadline(socket, deadline, SO_RCVTIMEO); !armed.ok()) return armed;
    got = recvmsg(socket, &msg, MSG_CMSG_CLOEXEC);
  } while (got < 0 && errno == EINTR);
  if (got < 0) return SocketError(errno, "receiving a frame");
  for (cmsghdr* cmsg = CMSG_FIRSTHDR(&msg); cmsg != nullptr; cmsg = CMSG_NXTHDR(&msg, cmsg)) {
    if (cmsg->cmsg_level != SOL_SOCKET || cmsg->cmsg_type != SCM_RIGHTS) continue;
    const size_t count = (cmsg->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    for (size_t i = 0; i < count; ++i) {
      int fd;
      std::memcpy(&fd, CMSG_DATA(cmsg) + i * sizeof(int), sizeof(int));
      fds.emplace_back(fd);
    }
  }
  if (got == 0) return absl::UnavailableError("the peer closed the socket");
  if ((msg.msg_flags & MSG_CTRUNC) != 0) {
    return absl::DataLossError("descriptors passed with a frame were dropped (MSG_CTRUNC)");
  }
  if (static_cast<size_t>(got) < sizeof(header)) {
    if (absl::Status rest = ReceiveAll(socket, header + got, sizeof(header) - got, deadline);
        !rest.ok()) {
      return rest;
    }
  }
  uint32_t length = 0;
  for (int i = 0; i < 4; ++i) length |= uint32_t{static_cast<unsigned char>(header[i])} << (8 * i);
  if (length > max_bytes) {
    // RESOURCE_EXHAUSTED, not DATA_LOSS: a request over the server's cap (a client built with
    // another cap) is answered with it, and clients fall back to gRPC on it.
    return absl::ResourceExhaustedError(
        absl::StrCat("a frame of ", length, " bytes, at most ", max_bytes));
  }
  message.resize(length);
  return ReceiveAll(socket, message.data(), length, deadline);
}

}  // namespace ckpt

#include "libs/io/read_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace ckpt {

absl::StatusOr<std::string> ReadSmallFile(const std::string& path, absl::string_view what,
                                          uint64_t max_bytes) {
  const auto where = [&] { return absl::StrCat(what, "=", path); };
  if (path.empty()) return absl::InvalidArgumentError(absl::StrCat(what, " is empty"));
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    const int error = errno;
    const std::string message = absl::StrCat("cannot open ", where(), ": ", std::strerror(error));
    if (error == ENOENT) return absl::NotFoundError(message);
    if (error == EACCES || error == EPERM) return absl::PermissionDeniedError(message);
    return absl::InvalidArgumentError(message);
  }
  struct stat info;
  std::string bytes;
  absl::Status status;
  if (::fstat(fd, &info) != 0 || !S_ISREG(info.st_mode)) {
    status = absl::InvalidArgumentError(absl::StrCat(where(), " is not a regular file"));
  } else if (static_cast<uint64_t>(info.st_size) > max_bytes) {
    status = absl::InvalidArgumentError(absl::StrCat(where(), " is ", info.st_size,
                                                     " bytes; more than the ", max_bytes,
                                                     " such a file may hold"));
  } else {
    bytes.resize(static_cast<size_t>(info.st_size));
    size_t done = 0;
    while (done < bytes.size()) {
      const ssize_t n = ::read(fd, bytes.data() + done, bytes.size() - done);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) {
        status = absl::DataLossError(
            absl::StrCat("error reading ", where(), ": ", std::strerror(errno)));
        break;
      }
      if (n == 0) {
        bytes.resize(done);  // Shrunk while we read: what is there now.
        break;
      }
      done += static_cast<size_t>(n);
    }
  }
  ::close(fd);
  if (!status.ok()) return status;
  return bytes;
}

}  // namespace ckpt

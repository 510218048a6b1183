#include "libs/io/private_directory.h"

#include <fcntl.h>
#include <stdlib.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <vector>

#include "absl/strings/str_cat.h"

namespace ckpt {

absl::StatusOr<PrivateDirectory> PrivateDirectory::Create(absl::string_view prefix) {
  const char* tmpdir = std::getenv("TMPDIR");
  std::string pattern =
      absl::StrCat(tmpdir != nullptr && *tmpdir != '\0' ? tmpdir : "/tmp", "/", prefix, ".XXXXXX");
  std::vector<char> buffer(pattern.begin(), pattern.end());
  buffer.push_back('\0');
  if (mkdtemp(buffer.data()) == nullptr) {  // mkdtemp creates it 0700.
    return absl::InternalError(
        absl::StrCat("cannot create a private directory ", pattern, ": ", std::strerror(errno)));
  }
  return PrivateDirectory(std::string(buffer.data()));
}

PrivateDirectory::PrivateDirectory(PrivateDirectory&& other) noexcept
    : path_(std::move(other.path_)) {
  other.path_.clear();
}

PrivateDirectory& PrivateDirectory::operator=(PrivateDirectory&& other) noexcept {
  if (this != &other) {
    Remove();
    path_ = std::move(other.path_);
    other.path_.clear();
  }
  return *this;
}

PrivateDirectory::~PrivateDirectory() { Remove(); }

void PrivateDirectory::Remove() {
  if (path_.empty()) return;
  std::error_code ignored;
  std::filesystem::remove_all(path_, ignored);
  path_.clear();
}

absl::StatusOr<std::string> PrivateDirectory::Write(absl::string_view name,
                                                    absl::string_view contents) const {
  const std::string path = absl::StrCat(path_, "/", name);
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) {
    return absl::InternalError(absl::StrCat("cannot create ", path, ": ", std::strerror(errno)));
  }
  size_t done = 0;
  while (done < contents.size()) {
    const ssize_t n = ::write(fd, contents.data() + done, contents.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int error = errno;
      ::close(fd);
      return absl::InternalError(absl::StrCat("cannot write ", path, ": ", std::strerror(error)));
    }
    done += static_cast<size_t>(n);
  }
  if (::close(fd) != 0) {
    return absl::InternalError(absl::StrCat("cannot write ", path, ": ", std::strerror(errno)));
  }
  return path;
}

}  // namespace ckpt

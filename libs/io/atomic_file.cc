#include "libs/io/atomic_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"

namespace ckpt {
namespace {

std::string DirectoryOf(const std::string& path) {
  const size_t slash = path.rfind('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

}  // namespace

absl::Status ErrnoToStatus(int error_number, absl::string_view operation, absl::string_view path) {
  const std::string message = absl::StrCat(operation, " ", path, ": ", std::strerror(error_number));
  switch (error_number) {
    case ENOENT:
    case ENOTDIR:
      return absl::NotFoundError(message);
    case EACCES:
    case EPERM:
    case EROFS:
      return absl::PermissionDeniedError(message);
    case ENOSPC:
    case EDQUOT:
    case EFBIG:
      return absl::ResourceExhaustedError(message);
    case EISDIR:
      return absl::InvalidArgumentError(message);
    default:
      return absl::UnavailableError(message);
  }
}

absl::StatusOr<AtomicFileWriter> AtomicFileWriter::Create(std::string path) {
  if (path.empty() || path.back() == '/') {
    return absl::InvalidArgumentError(absl::StrCat("'", path, "' is not a file path"));
  }
  struct stat info;
  if (::stat(path.c_str(), &info) == 0 && S_ISDIR(info.st_mode)) {
    return absl::InvalidArgumentError(absl::StrCat(path, " is a directory"));
  }
  // mkstemp picks a unique name, so concurrent writers of one target never share a temp file.
  std::string temp_path = absl::StrCat(path, ".tmp-XXXXXX");
  const int fd = ::mkstemp(temp_path.data());
  if (fd < 0) return ErrnoToStatus(errno, "creating a temporary file for", path);
  ::fchmod(fd, 0644);
  return AtomicFileWriter(std::move(path), std::move(temp_path), fd);
}

AtomicFileWriter::AtomicFileWriter(std::string path, std::string temp_path, int fd)
    : path_(std::move(path)), temp_path_(std::move(temp_path)), fd_(fd) {}

AtomicFileWriter::AtomicFileWriter(AtomicFileWriter&& other) noexcept
    : path_(std::move(other.path_)),
      temp_path_(std::move(other.temp_path_)),
      fd_(std::exchange(other.fd_, -1)),
      bytes_written_(other.bytes_written_) {}

AtomicFileWriter& AtomicFileWriter::operator=(AtomicFileWriter&& other) noexcept {
  if (this != &other) {
    Abandon();
    path_ = std::move(other.path_);
    temp_path_ = std::move(other.temp_path_);
    fd_ = std::exchange(other.fd_, -1);
    bytes_written_ = other.bytes_written_;
  }
  return *this;
}

AtomicFileWriter::~AtomicFileWriter() { Abandon(); }

void AtomicFileWriter::Abandon() {
  if (fd_ < 0) return;
  ::close(fd_);
  fd_ = -1;
  ::unlink(temp_path_.c_str());
}

absl::Status AtomicFileWriter::Append(absl::string_view bytes) {
  if (fd_ < 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("writing ", path_, ": the writer was committed or abandoned"));
  }
  while (!bytes.empty()) {
    const ssize_t written = ::write(fd_, bytes.data(), bytes.size());
    if (written < 0) {
      if (errno == EINTR) continue;
      const absl::Status status = ErrnoToStatus(errno, "writing", path_);
      Abandon();
      return status;
    }
    bytes.remove_prefix(written);
    bytes_written_ += written;
  }
  return absl::OkStatus();
}

absl::Status AtomicFileWriter::Commit() {
  if (fd_ < 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("committing ", path_, ": the writer was committed or abandoned"));
  }
  if (::fsync(fd_) != 0) {
    const absl::Status status = ErrnoToStatus(errno, "syncing", path_);
    Abandon();
    return status;
  }
  if (::close(fd_) != 0) {
    fd_ = -1;
    ::unlink(temp_path_.c_str());
    return ErrnoToStatus(errno, "closing", path_);
  }
  fd_ = -1;
  if (::rename(temp_path_.c_str(), path_.c_str()) != 0) {
    const absl::Status status = ErrnoToStatus(errno, "renaming into place", path_);
    ::unlink(temp_path_.c_str());
    return status;
  }
  // The rename is durable only once the directory entry is.
  return SyncDirectory(DirectoryOf(path_));
}

absl::Status SyncDirectory(const std::string& directory) {
  const int dir_fd = ::open(directory.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir_fd < 0) return ErrnoToStatus(errno, "opening directory", directory);
  const int synced = ::fsync(dir_fd);
  const int sync_errno = errno;
  ::close(dir_fd);
  if (synced != 0) return ErrnoToStatus(sync_errno, "syncing directory", directory);
  return absl::OkStatus();
}

absl::Status WriteFileAtomically(const std::string& path, absl::string_view contents) {
  absl::StatusOr<AtomicFileWriter> writer = AtomicFileWriter::Create(path);
  if (!writer.ok()) return writer.status();
  if (absl::Status appended = writer->Append(contents); !appended.ok()) return appended;
  return writer->Commit();
}

}  // namespace ckpt

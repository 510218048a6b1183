#include "libs/format/byte_source.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"

namespace ckpt {
namespace {

absl::Status RangeError(const std::string& name, uint64_t offset, uint64_t length, uint64_t size) {
  return absl::DataLossError(absl::StrCat(name, ": needs bytes [", offset, ", ", offset + length,
                                          ") but the file has ", size, " bytes (truncated?)"));
}

bool RangeFits(uint64_t offset, uint64_t length, uint64_t size) {
  return offset <= size && length <= size - offset;
}

class FileSource : public ByteSource {
 public:
  FileSource(int fd, uint64_t size, std::string path)
      : fd_(fd), size_(size), path_(std::move(path)) {}
  ~FileSource() override { ::close(fd_); }
  FileSource(const FileSource&) = delete;
  FileSource& operator=(const FileSource&) = delete;

  uint64_t size() const override { return size_; }
  const std::string& name() const override { return path_; }

  absl::Status ReadAt(uint64_t offset, absl::Span<char> dst) const override {
    if (!RangeFits(offset, dst.size(), size_)) {
      return RangeError(path_, offset, dst.size(), size_);
    }
    size_t done = 0;
    while (done < dst.size()) {
      // Linux caps one read at about 2 GiB; loop for larger tensors and short reads.
      const size_t want = std::min<size_t>(dst.size() - done, size_t{1} << 30);
      const ssize_t got = ::pread(fd_, dst.data() + done, want, static_cast<off_t>(offset + done));
      if (got < 0) {
        if (errno == EINTR) continue;
        return absl::UnavailableError(
            absl::StrCat(path_, ": read at offset ", offset + done, ": ", std::strerror(errno)));
      }
      if (got == 0) {
        // The file shrank after we sized it.
        return RangeError(path_, offset, dst.size(), offset + done);
      }
      done += static_cast<size_t>(got);
    }
    return absl::OkStatus();
  }

 private:
  int fd_;
  uint64_t size_;
  std::string path_;
};

class MemoryByteSource : public ByteSource {
 public:
  MemoryByteSource(absl::string_view bytes, std::string name)
      : bytes_(bytes), name_(std::move(name)) {}

  uint64_t size() const override { return bytes_.size(); }
  const std::string& name() const override { return name_; }

  absl::Status ReadAt(uint64_t offset, absl::Span<char> dst) const override {
    if (!RangeFits(offset, dst.size(), bytes_.size())) {
      return RangeError(name_, offset, dst.size(), bytes_.size());
    }
    if (!dst.empty()) std::memcpy(dst.data(), bytes_.data() + offset, dst.size());
    return absl::OkStatus();
  }

 private:
  absl::string_view bytes_;
  std::string name_;
};

}  // namespace

absl::StatusOr<std::string> ByteSource::ReadString(uint64_t offset, uint64_t length) const {
  if (!RangeFits(offset, length, size())) return RangeError(name(), offset, length, size());
  std::string out(length, '\0');
  absl::Status status = ReadAt(offset, absl::MakeSpan(out));
  if (!status.ok()) return status;
  return out;
}

absl::StatusOr<std::unique_ptr<ByteSource>> OpenFileSource(const std::string& path) {
  int fd;
  do {
    fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  } while (fd < 0 && errno == EINTR);
  if (fd < 0) {
    const int error = errno;
    const std::string message = absl::StrCat("opening ", path, ": ", std::strerror(error));
    if (error == ENOENT || error == ENOTDIR) return absl::NotFoundError(message);
    if (error == EACCES || error == EPERM) return absl::PermissionDeniedError(message);
    return absl::UnavailableError(message);
  }
  struct stat info;
  if (::fstat(fd, &info) != 0) {
    const int error = errno;
    ::close(fd);
    return absl::UnavailableError(absl::StrCat("stat ", path, ": ", std::strerror(error)));
  }
  if (!S_ISREG(info.st_mode)) {
    ::close(fd);
    return absl::InvalidArgumentError(absl::StrCat(path, " is not a regular file"));
  }
  return std::unique_ptr<ByteSource>(new FileSource(fd, static_cast<uint64_t>(info.st_size), path));
}

std::unique_ptr<ByteSource> MemorySource(absl::string_view bytes, std::string name) {
  return std::make_unique<MemoryByteSource>(bytes, std::move(name));
}

}  // namespace ckpt

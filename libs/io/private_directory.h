#ifndef CKPT_LIBS_IO_PRIVATE_DIRECTORY_H_
#define CKPT_LIBS_IO_PRIVATE_DIRECTORY_H_

// A temporary directory only this user can read (0700), removed with everything in it when the
// object is destroyed: for secrets a library must hand to another by path, such as a run's TLS key.

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace ckpt {

class PrivateDirectory {
 public:
  PrivateDirectory() = default;  // Empty: owns nothing.
  // A new directory $TMPDIR/<prefix>.XXXXXX (else /tmp). Errors from mkdtemp, naming the path.
  static absl::StatusOr<PrivateDirectory> Create(absl::string_view prefix);

  PrivateDirectory(PrivateDirectory&& other) noexcept;
  PrivateDirectory& operator=(PrivateDirectory&& other) noexcept;
  PrivateDirectory(const PrivateDirectory&) = delete;
  PrivateDirectory& operator=(const PrivateDirectory&) = delete;
  ~PrivateDirectory();

  const std::string& path() const { return path_; }

  // Writes `contents` to path()/name with mode 0600 and returns that path.
  absl::StatusOr<std::string> Write(absl::string_view name, absl::string_view contents) const;

 private:
  explicit PrivateDirectory(std::string path) : path_(std::move(path)) {}
  void Remove();

  std::string path_;
};

}  // namespace ckpt

#endif  // CKPT_LIBS_IO_PRIVATE_DIRECTORY_H_

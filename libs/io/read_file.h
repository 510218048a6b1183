#ifndef CKPT_LIBS_IO_READ_FILE_H_
#define CKPT_LIBS_IO_READ_FILE_H_

// Reading a small whole file (a certificate, a key, a token or policy file) with messages that
// say which setting named it.

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace ckpt {

// The bytes of the file at `path`. `what` names the setting that gave the path, for messages
// ("--tls_cert_file"). NOT_FOUND when it does not exist; PERMISSION_DENIED when it cannot be
// opened; INVALID_ARGUMENT when it is a directory or larger than `max_bytes`; DATA_LOSS on a
// read error.
absl::StatusOr<std::string> ReadSmallFile(const std::string& path, absl::string_view what,
                                          uint64_t max_bytes = uint64_t{16} << 20);

}  // namespace ckpt

#endif  // CKPT_LIBS_IO_READ_FILE_H_

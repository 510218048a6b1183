#ifndef CKPT_LIBS_STORE_VERSION_REF_H_
#define CKPT_LIBS_STORE_VERSION_REF_H_

// Names in the store and references to versions: "MODEL", "MODEL@7", "MODEL@latest", "MODEL@best".
//
// Model names and aliases share one syntax, [A-Za-z0-9._-]{1,128}: safe in file names, URLs and
// shell words, and free of '@' (the reference separator) and '\0' (the RocksDB key separator).
// An alias must not be all digits (MODEL@7 means version 7), must not start with '-' or '.'
// ("MODEL@-1" is an error, not an alias), and must not be "latest", which always means the
// newest version.
//
// Example:
//   ASSIGN_OR_RETURN(v1::VersionRef ref, ParseVersionRef("resnet18@best"));
//   FormatVersionRef(ref) == "resnet18@best"

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "proto/ckpt/v1/types.pb.h"

namespace ckpt {

inline constexpr int kMaxNameLength = 128;
inline constexpr absl::string_view kLatestAlias = "latest";

// INVALID_ARGUMENT naming the offending text and character.
absl::Status ValidateModelName(absl::string_view model);
// As ValidateModelName, and also rejects "latest" (reserved), all-digit names and a leading
// '-' or '.'.
absl::Status ValidateAliasName(absl::string_view alias);
// A commit's idempotency key (CommitOptions::idempotency_key): empty (none), or 1 to 128
// printable ASCII characters without spaces. INVALID_ARGUMENT otherwise.
absl::Status ValidateIdempotencyKey(absl::string_view key);

// "MODEL" and "MODEL@latest" give {model, alias "latest"}; "MODEL@7" gives {model, version 7};
// "MODEL@best" gives {model, alias "best"}. INVALID_ARGUMENT for a bad model name, an empty or
// malformed reference, version 0 or a negative / overflowing number.
absl::StatusOr<v1::VersionRef> ParseVersionRef(absl::string_view text);

// "MODEL@7", "MODEL@best"; a ref with neither version nor alias prints as "MODEL@latest".
std::string FormatVersionRef(const v1::VersionRef& ref);
std::string FormatVersionRef(absl::string_view model, int64_t version);

// {model, version}.
v1::VersionRef MakeVersionRef(absl::string_view model, int64_t version);

}  // namespace ckpt

#endif  // CKPT_LIBS_STORE_VERSION_REF_H_

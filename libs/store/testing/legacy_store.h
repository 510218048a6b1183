#ifndef CKPT_LIBS_STORE_TESTING_LEGACY_STORE_H_
#define CKPT_LIBS_STORE_TESTING_LEGACY_STORE_H_

// A store database as an older build wrote it (testonly): the column families up to and
// including `last`, the current schema version, nothing else. Tests open it with this build to
// check that column families added since are created empty and the store works.

#include <string>

#include "absl/status/status.h"
#include "libs/store/rocksdb_schema.h"

namespace ckpt::testing {

absl::Status CreateLegacyStore(const std::string& path, ColumnFamily last);

}  // namespace ckpt::testing

#endif  // CKPT_LIBS_STORE_TESTING_LEGACY_STORE_H_

#ifndef CKPT_LIBS_STATUS_ROCKSDB_STATUS_H_
#define CKPT_LIBS_STATUS_ROCKSDB_STATUS_H_

// rocksdb::Status <-> absl::Status, translated once at the edge of libs/store.

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "rocksdb/status.h"

namespace ckpt {

// Maps a RocksDB status onto the canonical codes: Corruption is DATA_LOSS, a full disk or space
// limit is RESOURCE_EXHAUSTED, a missing path is NOT_FOUND, Busy / lock conflicts are ABORTED
// (retry the transaction), shutdown / TryAgain are UNAVAILABLE, TimedOut is DEADLINE_EXCEEDED,
// other I/O errors are UNAVAILABLE. `context` (e.g. "opening /data/ckpt") prefixes the message.
absl::Status FromRocksDbStatus(const rocksdb::Status& status, absl::string_view context = {});

// The reverse mapping, for code that hands a Status back to RocksDB (custom Env, filters).
rocksdb::Status ToRocksDbStatus(const absl::Status& status);

}  // namespace ckpt

#endif  // CKPT_LIBS_STATUS_ROCKSDB_STATUS_H_

#ifndef CKPT_LIBS_STORE_INTERNAL_ROCKSDB_UPLOAD_SESSION_H_
#define CKPT_LIBS_STORE_INTERNAL_ROCKSDB_UPLOAD_SESSION_H_

// The RocksDB store's UploadSession (private; see internal/rocksdb_store_core.h): chunks are
// hashed and written to the upload's pack file as they fill, on a background pipeline for stable
// data, and Commit makes the version visible in one synced batch.

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "libs/store/internal/rocksdb_store_core.h"

namespace ckpt {

// A session for the upload `upload_id` (already recorded and registered live in `core`, and
// registered joinable as `join_name`), writing pack `pack_id`, for a validated `header`.
std::unique_ptr<UploadSession> NewRocksDbUploadSession(
    std::shared_ptr<RocksDbCheckpointStore::Core> core, std::string upload_id, uint64_t pack_id,
    v1::Manifest header, CommitOptions options, std::vector<std::string> warnings,
    std::string join_name);

// A part of the live upload joinable as `parent_id` (of `parent_header`) writing `ranges` (checked
// by the caller: CheckUploadRanges), as the upload `part_id` (already recorded and registered live)
// writing pack `pack_id`.
std::unique_ptr<UploadPart> NewRocksDbUploadPart(std::shared_ptr<RocksDbCheckpointStore::Core> core,
                                                 std::string part_id, uint64_t pack_id,
                                                 std::string parent_id,
                                                 std::shared_ptr<const v1::Manifest> parent_header,
                                                 std::vector<UploadRange> ranges);

}  // namespace ckpt

#endif  // CKPT_LIBS_STORE_INTERNAL_ROCKSDB_UPLOAD_SESSION_H_

#include "libs/store/testing/legacy_store.h"

#include <memory>
#include <vector>

#include "libs/status/rocksdb_status.h"
#include "libs/status/status_macros.h"
#include "rocksdb/db.h"

namespace ckpt::testing {

absl::Status CreateLegacyStore(const std::string& path, ColumnFamily last) {
  rocksdb::DBOptions db_options = MakeDbOptions(/*create_if_missing=*/true);
  std::vector<rocksdb::ColumnFamilyDescriptor> descriptors;
  for (int i = 0; i <= static_cast<int>(last); ++i) {
    const ColumnFamily cf = static_cast<ColumnFamily>(i);
    descriptors.emplace_back(std::string(ColumnFamilyName(cf)), MakeColumnFamilyOptions(cf));
  }
  std::vector<rocksdb::ColumnFamilyHandle*> handles;
  rocksdb::DB* raw = nullptr;
  RETURN_IF_ERROR(FromRocksDbStatus(
      rocksdb::DB::Open(db_options, path, descriptors, &handles, &raw), "creating a legacy store"));
  std::unique_ptr<rocksdb::DB> db(raw);
  absl::Status written =
      FromRocksDbStatus(db->Put(rocksdb::WriteOptions(), handles[0], std::string(kSchemaVersionKey),
                                std::string(kSchemaVersion)),
                        "writing the schema version");
  for (rocksdb::ColumnFamilyHandle* handle : handles) db->DestroyColumnFamilyHandle(handle);
  return written;
}

}  // namespace ckpt::testing

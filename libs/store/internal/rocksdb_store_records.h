#ifndef CKPT_LIBS_STORE_INTERNAL_ROCKSDB_STORE_RECORDS_H_
#define CKPT_LIBS_STORE_INTERNAL_ROCKSDB_STORE_RECORDS_H_

// Small helpers of the RocksDB store's files (private; see internal/rocksdb_store_core.h):
// slices, record parsing, refcount deltas of manifests, pack locations, snapshots.

#include <algorithm>
#include <atomic>
#include <cstring>
#include <deque>
#include <future>
#include <limits>
#include <map>
#include <optional>
#include <random>
#include <set>
#include <thread>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "libs/io/prefault.h"
#include "libs/status/rocksdb_status.h"
#include "libs/status/status_macros.h"
#include "libs/store/chunk_hasher.h"
#include "libs/store/chunk_pack.h"
#include "libs/store/manifest_validation.h"
#include "libs/store/rocksdb_checkpoint_store.h"
#include "libs/store/rocksdb_schema.h"
#include "libs/store/store_records.pb.h"
#include "libs/store/version_ref.h"
#include "rocksdb/write_batch.h"

namespace ckpt {
namespace rocksdb_store_internal {

using store::ChunkRecord;
using store::ModelRecord;
using store::PackedChunk;
using store::UploadRecord;

inline rocksdb::Slice ToSlice(absl::string_view bytes) {
  return rocksdb::Slice(bytes.data(), bytes.size());
}
inline absl::string_view ToView(const rocksdb::Slice& slice) {
  return absl::string_view(slice.data(), slice.size());
}
inline bool StartsWith(const rocksdb::Slice& key, absl::string_view prefix) {
  return key.size() >= prefix.size() && ToView(key).substr(0, prefix.size()) == prefix;
}

inline int64_t NowMicros() { return absl::ToUnixMicros(absl::Now()); }

// A VERSION_DELETED event of MODEL@version, naming the aliases removed with it.
inline v1::RegistryEvent VersionDeletedEvent(absl::string_view model, int64_t version,
                                             const std::vector<std::string>& aliases) {
  v1::RegistryEvent event;
  event.set_kind(v1::RegistryEvent::VERSION_DELETED);
  event.set_model(std::string(model));
  event.set_version(version);
  event.set_alias(absl::StrJoin(aliases, ","));
  return event;
}

template <typename Proto>
inline absl::Status ParseRecord(absl::string_view bytes, Proto& record, absl::string_view what) {
  if (!record.ParseFromArray(bytes.data(), static_cast<int>(bytes.size()))) {
    return absl::DataLossError(absl::StrCat("unreadable ", what, " record"));
  }
  return absl::OkStatus();
}

inline int64_t LogicalBytes(const v1::Manifest& manifest) {
  int64_t total = 0;
  for (const v1::TensorMeta& meta : manifest.tensors()) total += meta.byte_length();
  for (const v1::TensorMeta& meta : manifest.state_tensors()) total += meta.byte_length();
  return total;
}

inline std::string Hex64(uint64_t value) { return absl::StrFormat("%016x", value); }

// Where a tensor's first chunk starts in its pack: tensors of 1 MiB or more on a page (padding
// costs < 0.4%), smaller ones on 64 bytes (element alignment for every dtype, at most 63 bytes
// of padding each), so readers can hand out tensors that point into a mapping of the pack.
constexpr int64_t kPageAlignFromBytes = int64_t{1} << 20;
inline int64_t TensorAlignment(int64_t byte_length) {
  return byte_length >= kPageAlignFromBytes ? 4096 : 64;
}
// Readers map tensors at least this large and copy smaller ones.
constexpr int64_t kMapInPlaceMinBytes = kPageAlignFromBytes;

// An upload writes the records of the chunks it stored (kUploads) in batches of this many, not
// one RocksDB write each: those writes were ~40% of the writing thread's time for 10,000 small
// tensors (perf, tools/bench). After a crash fewer than this many stored chunks have no record;
// their bytes are in the upload's own pack, which GarbageCollect removes once no location names it,
// so only the abandoned upload's bytes_freed count is short.
constexpr int kUploadRecordBatch = 256;

// A pack whose live chunks fill less than this share of it is rewritten by GarbageCollect.
constexpr double kCompactPackBelowLiveFraction = 0.5;
// ... and only when that frees at least this much (small packs are mostly alignment padding).
constexpr int64_t kCompactPackMinDeadBytes = int64_t{1} << 20;

inline std::string EncodeLocation(const PackLocation& location) {
  PackedChunk record;
  record.set_pack_id(location.pack_id);
  record.set_offset(location.offset);
  record.set_length(location.length);
  return record.SerializeAsString();
}

// Per-chunk refcount changes, summed over everything one batch does.
struct RefDelta {
  int64_t delta = 0;
  int64_t length = 0;
  uint64_t xxh3_64 = 0;
};
using RefDeltas = absl::flat_hash_map<std::string, RefDelta>;

inline void AddTensorRefs(const v1::TensorMeta& meta, int64_t sign, RefDeltas& deltas) {
  for (const v1::ChunkRef& chunk : meta.chunks()) {
    RefDelta& delta = deltas[chunk.sha256()];
    delta.delta += sign;
    delta.length = chunk.length();
    delta.xxh3_64 = chunk.xxh3_64();
  }
}

inline void AddManifestRefs(const v1::Manifest& manifest, int64_t sign, RefDeltas& deltas) {
  for (const v1::TensorMeta& meta : manifest.tensors()) AddTensorRefs(meta, sign, deltas);
  for (const v1::TensorMeta& meta : manifest.state_tensors()) AddTensorRefs(meta, sign, deltas);
}

inline void CollectTensorRefs(const v1::Value& value, absl::flat_hash_set<std::string>& keys) {
  switch (value.kind_case()) {
    case v1::Value::kListValue:
      for (const v1::Value& item : value.list_value().items()) CollectTensorRefs(item, keys);
      break;
    case v1::Value::kTupleValue:
      for (const v1::Value& item : value.tuple_value().items()) CollectTensorRefs(item, keys);
      break;
    case v1::Value::kDictValue:
      for (const v1::DictEntry& entry : value.dict_value().entries()) {
        CollectTensorRefs(entry.value(), keys);
      }
      break;
    case v1::Value::kTensorValue:
      keys.insert(value.tensor_value().key());
      break;
    case v1::Value::kOpaqueValue:
      CollectTensorRefs(value.opaque_value().args(), keys);
      CollectTensorRefs(value.opaque_value().state(), keys);
      break;
    default:
      break;
  }
}

// Removes the optimizer state of `manifest` and the state tensors only it references; returns
// those tensors.
inline std::vector<v1::TensorMeta> DropOptimizerState(v1::Manifest& manifest) {
  absl::flat_hash_set<std::string> optimizer_keys, kept_keys;
  CollectTensorRefs(manifest.optimizer_state(), optimizer_keys);
  CollectTensorRefs(manifest.scheduler_state(), kept_keys);
  CollectTensorRefs(manifest.extra_state(), kept_keys);
  std::vector<v1::TensorMeta> removed;
  google::protobuf::RepeatedPtrField<v1::TensorMeta> kept;
  for (v1::TensorMeta& meta : *manifest.mutable_state_tensors()) {
    if (optimizer_keys.contains(meta.key()) && !kept_keys.contains(meta.key())) {
      removed.push_back(std::move(meta));
    } else {
      *kept.Add() = std::move(meta);
    }
  }
  manifest.mutable_state_tensors()->Swap(&kept);
  manifest.clear_optimizer_state();
  manifest.clear_optimizer_param_names();
  manifest.add_warnings(absl::StrCat("optimizer state dropped by retention at ",
                                     absl::FormatTime(absl::Now(), absl::UTCTimeZone())));
  return removed;
}

// Releases a RocksDB snapshot when it goes out of scope.
class SnapshotHolder {
 public:
  explicit SnapshotHolder(rocksdb::DB* db) : db_(db), snapshot_(db->GetSnapshot()) {}
  ~SnapshotHolder() { db_->ReleaseSnapshot(snapshot_); }
  SnapshotHolder(const SnapshotHolder&) = delete;
  SnapshotHolder& operator=(const SnapshotHolder&) = delete;
  const rocksdb::Snapshot* get() const { return snapshot_; }

 private:
  rocksdb::DB* db_;
  const rocksdb::Snapshot* snapshot_;
};

}  // namespace rocksdb_store_internal
}  // namespace ckpt

#endif  // CKPT_LIBS_STORE_INTERNAL_ROCKSDB_STORE_RECORDS_H_

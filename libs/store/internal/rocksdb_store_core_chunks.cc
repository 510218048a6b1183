// RocksDbCheckpointStore::Core: chunk reads, tensors mapped in place, chunk checks, and the
// pinning and storing of an upload's chunks (see internal/rocksdb_store_core.h for how the
// store's files divide).

#include <cstring>
#include <limits>
#include <utility>

#include "libs/store/chunk_layout.h"
#include "libs/store/internal/rocksdb_store_core.h"

namespace ckpt {

using namespace rocksdb_store_internal;  // NOLINT(build/namespaces): the store's own helpers.
using Core = RocksDbCheckpointStore::Core;

bool PackMappings::Claim(uint64_t pack_id, int64_t start, int64_t end) {
  return handed_out[pack_id].Claim(start, end);
}

absl::Status Core::ReadChunkInto(const v1::ChunkRef& chunk, const rocksdb::Snapshot* snapshot,
                                 char* destination) const {
  std::string location_bytes;
  rocksdb::Status read =
      db_->Get(Read(snapshot), cf(ColumnFamily::kPackedChunks), chunk.sha256(), &location_bytes);
  if (read.ok()) {
    PackedChunk record;
    RETURN_IF_ERROR(ParseRecord(location_bytes, record, "chunk location"));
    if (record.length() != chunk.length()) {
      return absl::DataLossError(
          absl::StrCat("stored ", record.length(), " bytes; the manifest says ", chunk.length()));
    }
    return packs_->Read({record.pack_id(), record.offset(), record.length()}, destination);
  }
  if (!read.IsNotFound()) return FromRocksDbStatus(read, "looking up a chunk location");
  rocksdb::PinnableSlice value;
  read = db_->Get(Read(snapshot), cf(ColumnFamily::kChunks), chunk.sha256(), &value);
  if (read.IsNotFound()) return absl::NotFoundError("missing from the store");
  RETURN_IF_ERROR(FromRocksDbStatus(read, "reading an inline chunk"));
  if (static_cast<int64_t>(value.size()) != chunk.length()) {
    return absl::DataLossError(
        absl::StrCat("stored ", value.size(), " bytes; the manifest says ", chunk.length()));
  }
  std::memcpy(destination, value.data(), value.size());
  return absl::OkStatus();
}

absl::StatusOr<std::optional<PackLocation>> Core::FindPackLocation(
    const v1::ChunkRef& chunk, const rocksdb::Snapshot* snapshot) const {
  std::string location_bytes;
  rocksdb::Status read =
      db_->Get(Read(snapshot), cf(ColumnFamily::kPackedChunks), chunk.sha256(), &location_bytes);
  if (read.IsNotFound()) return std::nullopt;
  RETURN_IF_ERROR(FromRocksDbStatus(read, "looking up a chunk location"));
  PackedChunk record;
  RETURN_IF_ERROR(ParseRecord(location_bytes, record, "chunk location"));
  // ReadChunkInto reports a location that cannot be right (packs_->Read checks the extent).
  if (record.length() != chunk.length() || record.offset() < 0 || record.length() < 0 ||
      record.offset() > std::numeric_limits<int64_t>::max() - record.length()) {
    return std::nullopt;
  }
  return PackLocation{record.pack_id(), record.offset(), record.length()};
}

std::string Core::ChunkName(const v1::TensorMeta& meta, const v1::ChunkRef& chunk, int64_t offset,
                            absl::string_view where) {
  return absl::StrCat("chunk ", HexEncode(chunk.sha256()), " of tensor '", meta.key(), "'",
                      where.empty() ? "" : absl::StrCat(" of ", where), " (bytes ", offset, "..",
                      offset + chunk.length(), ")");
}

absl::Status Core::CheckChunkBytes(const v1::TensorMeta& meta, const v1::ChunkRef& chunk,
                                   int64_t offset, absl::string_view where,
                                   absl::string_view bytes) {
  const uint64_t xxh3 = Xxh3(bytes);
  if (xxh3 != chunk.xxh3_64()) {
    return absl::DataLossError(
        absl::StrCat(ChunkName(meta, chunk, offset, where), " fails its xxh3 checksum (expected ",
                     Hex64(chunk.xxh3_64()), ", computed ", Hex64(xxh3),
                     "): the stored bytes are corrupt and were not returned"));
  }
  return absl::OkStatus();
}

absl::Status Core::ReadTensorInto(const v1::TensorMeta& meta, char* destination,
                                  const rocksdb::Snapshot* snapshot, absl::string_view where,
                                  bool check_xxh3) const {
  RETURN_IF_ERROR(CheckChunkLayout(meta));
  int64_t offset = 0;
  for (const v1::ChunkRef& chunk : meta.chunks()) {
    absl::Status read = ReadChunkInto(chunk, snapshot, destination + offset);
    if (!read.ok()) return ChunkReadError(meta, chunk, offset, where, read);
    if (check_xxh3) {
      RETURN_IF_ERROR(CheckChunkBytes(meta, chunk, offset, where,
                                      absl::string_view(destination + offset, chunk.length())));
    }
    offset += chunk.length();
  }
  return absl::OkStatus();
}

absl::StatusOr<VersionReader::MappedBytes> Core::MapTensor(const v1::TensorMeta& meta,
                                                           const rocksdb::Snapshot* snapshot,
                                                           absl::string_view where,
                                                           PackMappings& mappings) const {
  RETURN_IF_ERROR(CheckChunkLayout(meta));
  VersionReader::MappedBytes mapped;
  // A backend that cannot map (an object store): the caller reads the tensor instead.
  if (meta.chunks_size() == 0 || !packs_->CanMap()) return mapped;
  std::optional<PackLocation> whole;
  for (const v1::ChunkRef& chunk : meta.chunks()) {
    ASSIGN_OR_RETURN(std::optional<PackLocation> location, FindPackLocation(chunk, snapshot));
    if (!location.has_value()) return mapped;
    if (!whole.has_value()) {
      whole = location;
    } else if (location->pack_id != whole->pack_id ||
               location->offset != whole->offset + whole->length) {
      return mapped;
    } else {
      whole->length += location->length;
    }
  }
  if (whole->offset % 64 != 0) return mapped;  // element alignment
  std::shared_ptr<MappedPackRegion> region;
  {
    absl::MutexLock lock(&mappings.mu);
    if (!mappings.Claim(whole->pack_id, whole->offset, whole->offset + whole->length)) {
      return mapped;
    }
    std::shared_ptr<MappedPackRegion>& pack = mappings.packs[whole->pack_id];
    if (pack == nullptr || pack->size() < whole->offset + whole->length) {
      absl::StatusOr<std::shared_ptr<MappedPackRegion>> mapping = packs_->MapWhole(whole->pack_id);
      if (!mapping.ok()) {
        return ChunkReadError(meta, meta.chunks(0), 0, where, mapping.status());
      }
      pack = *std::move(mapping);
    }
    region = pack;
  }
  if (region->size() < whole->offset + whole->length) {
    // Never touched: a mapping past the end of the file is SIGBUS on first access.
    return ChunkReadError(meta, meta.chunks(0), 0, where,
                          absl::DataLossError(absl::StrCat(
                              "pack ", PackFileName(whole->pack_id), " bytes ", whole->offset, "..",
                              whole->offset + whole->length, " lie beyond the end of the ",
                              region->size(), "-byte file")));
  }
  char* data = region->data() + whole->offset;
  // Checking every chunk touches every page: map them in one call, not a fault per page.
  PrefaultForRead(data, static_cast<size_t>(whole->length));
  int64_t offset = 0;
  for (const v1::ChunkRef& chunk : meta.chunks()) {
    RETURN_IF_ERROR(CheckChunkBytes(meta, chunk, offset, where,
                                    absl::string_view(data + offset, chunk.length())));
    offset += chunk.length();
  }
  mapped.data = data;
  mapped.owner = std::move(region);
  return mapped;
}

absl::Status Core::ChunkReadError(const v1::TensorMeta& meta, const v1::ChunkRef& chunk,
                                  int64_t offset, absl::string_view where,
                                  const absl::Status& status) {
  const std::string name = ChunkName(meta, chunk, offset, where);
  if (absl::IsNotFound(status)) {
    return absl::DataLossError(absl::StrCat(name, " is missing from the store"));
  }
  return absl::Status(status.code(), absl::StrCat(name, ": ", status.message()));
}

absl::Status Core::ReadChunks(const v1::TensorMeta& meta, const ChunkCallback& callback,
                              const rocksdb::Snapshot* snapshot, absl::string_view where) const {
  RETURN_IF_ERROR(CheckChunkLayout(meta));
  // One chunk buffer per thread, reused: a fresh 4 MiB per call costs a page fault per 4 KiB.
  // (A callback that reads again on this thread gets a buffer of its own.)
  thread_local std::string reused;
  thread_local bool reused_busy = false;
  std::string own;
  std::string& buffer = reused_busy ? own : reused;
  const bool took_reused = !reused_busy;
  reused_busy = true;
  struct Release {
    bool active;
    ~Release() {
      if (active) reused_busy = false;
    }
  } release{took_reused};
  int64_t offset = 0;
  for (const v1::ChunkRef& chunk : meta.chunks()) {
    if (buffer.size() < static_cast<size_t>(chunk.length())) buffer.resize(chunk.length());
    absl::Status read = ReadChunkInto(chunk, snapshot, buffer.data());
    if (!read.ok()) return ChunkReadError(meta, chunk, offset, where, read);
    const absl::string_view bytes(buffer.data(), chunk.length());
    RETURN_IF_ERROR(CheckChunkBytes(meta, chunk, offset, where, bytes));
    RETURN_IF_ERROR(callback(offset, bytes));
    offset += chunk.length();
  }
  return absl::OkStatus();
}

std::string Core::CheckChunk(const v1::ChunkRef& chunk, const rocksdb::Snapshot* snapshot) const {
  if (chunk.length() < 0 || chunk.length() > kChunkBytes) {
    return absl::StrCat("the manifest gives the chunk ", chunk.length(), " bytes");
  }
  std::string buffer(chunk.length(), '\0');
  absl::Status read = ReadChunkInto(chunk, snapshot, buffer.data());
  if (absl::IsNotFound(read)) return "chunk is missing from the store";
  if (!read.ok()) return absl::StrCat("chunk unreadable: ", read.message());
  const uint64_t xxh3 = Xxh3(buffer);
  if (xxh3 != chunk.xxh3_64()) {
    return absl::StrCat("xxh3 mismatch: expected ", Hex64(chunk.xxh3_64()), ", computed ",
                        Hex64(xxh3));
  }
  const std::string sha256 = Sha256(buffer);
  if (sha256 != chunk.sha256()) {
    return absl::StrCat("SHA-256 mismatch: the stored bytes hash to ", HexEncode(sha256));
  }
  return "";
}

absl::Status Core::PinAndStoreChunk(absl::string_view upload_id, const ChunkDigest& digest,
                                    absl::string_view bytes, int64_t alignment, ChunkWriter& pack,
                                    absl::flat_hash_set<std::string>& pinned,
                                    absl::flat_hash_map<std::string, PackLocation>& written,
                                    rocksdb::WriteBatch& records) {
  if (pinned.insert(digest.sha256).second) {
    absl::MutexLock lock(&mu_);
    ++pinned_chunks_[digest.sha256];
  }
  if (written.contains(digest.sha256)) return absl::OkStatus();
  // Pinned first, then checked: GC either ran before the pin (and its deletion is visible now)
  // or runs after it and skips this chunk.
  std::string record;
  rocksdb::Status read = db_->Get(Read(), cf(ColumnFamily::kRefs), digest.sha256, &record);
  if (read.ok()) return absl::OkStatus();
  if (!read.IsNotFound()) return FromRocksDbStatus(read, "looking up a chunk");
  ASSIGN_OR_RETURN(const int64_t offset, pack.Append(bytes, alignment));
  const PackLocation location{pack.pack_id(), offset, digest.length};
  // The location is recorded by Commit, after the pack is synced: `packed_chunks` only ever
  // names durable bytes. Until then the upload record (written in batches, see
  // kUploadRecordBatch) accounts for the chunk in GarbageCollect.
  records.Put(cf(ColumnFamily::kUploads), UploadChunkKey(upload_id, digest.sha256),
              EncodeBigEndian64(static_cast<uint64_t>(digest.length)));
  written.emplace(digest.sha256, location);
  return absl::OkStatus();
}

absl::StatusOr<ChunkDigest> Core::PinStoredChunk(absl::string_view sha256,
                                                 absl::flat_hash_set<std::string>& pinned) {
  if (pinned.insert(std::string(sha256)).second) {
    absl::MutexLock lock(&mu_);
    ++pinned_chunks_[std::string(sha256)];
  }
  std::string bytes;
  rocksdb::Status read = db_->Get(Read(), cf(ColumnFamily::kRefs),
                                  rocksdb::Slice(sha256.data(), sha256.size()), &bytes);
  if (read.IsNotFound()) {
    return absl::NotFoundError(
        absl::StrCat("the store holds no committed chunk ", HexEncode(sha256), ": send its bytes"));
  }
  RETURN_IF_ERROR(FromRocksDbStatus(read, "looking up a chunk"));
  ChunkRecord record;
  RETURN_IF_ERROR(
      ParseRecord(bytes, record, absl::StrCat("refcount of chunk ", HexEncode(sha256))));
  ChunkDigest digest;
  digest.sha256 = std::string(sha256);
  digest.length = record.length();
  digest.xxh3_64 = record.xxh3_64();
  return digest;
}

}  // namespace ckpt

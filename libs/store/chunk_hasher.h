#ifndef CKPT_LIBS_STORE_CHUNK_HASHER_H_
#define CKPT_LIBS_STORE_CHUNK_HASHER_H_

// Content addresses and checksums of the store's chunks.
//
// A chunk's address is its SHA-256 (OpenSSL EVP, which uses the CPU's SHA extensions where
// present): several teams share one store, so addresses must resist deliberately built collisions,
// which a fast non-cryptographic hash does not. Every read additionally checks xxh3-64, which runs
// at memory speed, so a flipped bit on disk is caught on the hot path without paying SHA-256 there.
//
// Example:
//   ChunkDigest digest = HashChunk(bytes);        // sha256 (32 raw bytes), xxh3_64, length
//   ContentHasher whole;                           // a tensor's content hash, from its chunks
//   whole.AddChunk(digest);
//   std::string content_hash = whole.Finish();

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "libs/io/xxh3.h"  // Xxh3(bytes): the chunk checksum, used with HashChunk's.

namespace ckpt {

// Tensor bytes are cut into chunks of this size (the last chunk of a tensor may be shorter; chunks
// never span tensors, so a tensor that did not change dedups whole). 4 MiB because:
//  - each chunk is appended to a pack file (chunk_pack.h) and costs a ~100-byte RocksDB index
//    entry and refcount record: at 4 MiB that overhead is < 0.01%;
//  - a changed region of a large tensor re-stores at most a few 4 MiB pieces, not the tensor;
//  - readers and writers hold one chunk per tensor in flight, so memory stays bounded (4 MiB, not
//    the tensor) and a chunk fits the gRPC default message limit when split in 1 MiB messages.
// Readers check a manifest's chunk refs against this layout with CheckChunkLayout
// (chunk_layout.h).
inline constexpr int64_t kChunkBytes = int64_t{4} << 20;

inline constexpr int kSha256Bytes = 32;

struct ChunkDigest {
  std::string sha256;  // 32 raw bytes.
  uint64_t xxh3_64 = 0;
  int64_t length = 0;
};

// SHA-256 and xxh3-64 of `bytes`.
ChunkDigest HashChunk(absl::string_view bytes);

// SHA-256 of `bytes` (32 raw bytes).
std::string Sha256(absl::string_view bytes);

// Incremental SHA-256, for a tensor's content hash across its chunks. Not thread-safe; movable.
class Sha256Hasher {
 public:
  Sha256Hasher();
  ~Sha256Hasher();
  Sha256Hasher(Sha256Hasher&&) noexcept;
  Sha256Hasher& operator=(Sha256Hasher&&) noexcept;

  void Update(absl::string_view bytes);
  // The 32-byte digest; the hasher is reset and may be reused.
  std::string Finish();

 private:
  struct Context;
  std::unique_ptr<Context> context_;
};

// A tensor's content hash (TensorMeta.content_hash): SHA-256 over its chunks' SHA-256s, each
// followed by the chunk's length as 8 little-endian bytes, in order. It names the bytes as
// securely as a SHA-256 of them (chunking is deterministic: 4 MiB pieces from offset 0), yet costs
// 40 bytes of hashing per chunk instead of a second pass over every byte. (Stores written before
// this scheme hold SHA-256 of the bytes; version_diff compares chunk lists, which both agree on.)
class ContentHasher {
 public:
  void AddChunk(const ChunkDigest& chunk);
  // The 32-byte hash; the hasher is reset and may be reused.
  std::string Finish();

 private:
  Sha256Hasher hasher_;
};

// ContentHasher over the chunking of `bytes` (what the store computes for a tensor of them).
std::string ContentHashOfBytes(absl::string_view bytes);

// Lowercase hex of raw bytes: "9f86d081...".
std::string HexEncode(absl::string_view bytes);

// Raw bytes of lowercase or uppercase hex; INVALID_ARGUMENT for odd length or a non-hex digit.
absl::StatusOr<std::string> HexDecode(absl::string_view hex);

// The first 12 hex digits of a SHA-256, enough to name a chunk in a message ("chunk 9f86d081884c").
std::string ShortHex(absl::string_view sha256);

}  // namespace ckpt

#endif  // CKPT_LIBS_STORE_CHUNK_HASHER_H_

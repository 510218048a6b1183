#ifndef CKPT_LIBS_STORE_S3_CHUNK_BACKEND_H_
#define CKPT_LIBS_STORE_S3_CHUNK_BACKEND_H_

// S3ChunkBackend: the RocksDB store's packs as objects in an S3-compatible bucket (issue #21),
// RocksDB staying the index (chunk_backend.h says why the pack, not the chunk, is the object).
//
// - Pack `id` is the object `<prefix>packs/<16 hex digits>.pack`.
// - A writer buffers appended bytes and uploads a multipart part each time its buffer reaches
//   `part_size` (doubling every 1,000 parts, so one pack can pass S3's 10,000-part limit at a
//   fixed size: 8 MiB parts reach about 8 TiB), in the background while the next part fills, so
//   at most about two parts are in memory at once. Sync() completes the multipart upload (with
//   If-None-Match where the server honours it), or, for a pack smaller than one part, stores it
//   with one PutObjectIfAbsent. After Sync the object is immutable: a further Append is
//   FAILED_PRECONDITION (the store syncs each pack once, just before the commit that names it).
//   Until Sync nothing is visible to readers or to List; a store killed before it leaves a
//   multipart upload that ListPending reports and GC aborts after its grace period.
// - NewPack asks HEAD first: a pack id is never reused, so an existing object means another
//   writer, and the pack is refused (ALREADY_EXISTS) rather than overwritten.
// - Reads are ranged GETs written straight into the destination. A missing object or a short
//   one is DATA_LOSS; the store checks every chunk's xxh3 (and verify its SHA-256) after.
// - Remove hides the pack from List at once but deletes the object only at ReleaseRemoved, once
//   no reader on an older snapshot can still name it (what an open descriptor does for a pack
//   file). A deletion a crash or an S3 error leaves undone is redone by a later GC, which finds
//   the object unnamed.
// - MapWhole is UNIMPLEMENTED (CanMap() is false): loads copy into fresh tensors.
//
// One bucket prefix serves one store: GC deletes objects under it that the store's index does not
// name. Thread-safe; each writer is used by one thread at a time.
//
// Example:
//   ASSIGN_OR_RETURN(std::unique_ptr<s3::S3Client> client, s3::S3Client::Create(s3_options));
//   S3ChunkBackendOptions options;
//   options.prefix = "team-a/";
//   ASSIGN_OR_RETURN(std::shared_ptr<S3ChunkBackend> backend,
//                    S3ChunkBackend::Create(std::move(client), options));
//   StoreOptions store_options;
//   store_options.db_path = "/data/ckpt-index";
//   store_options.chunk_backend = backend;

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "libs/s3/s3_client.h"
#include "libs/store/chunk_backend.h"

namespace ckpt {

struct S3ChunkBackendOptions {
  // Prepended to every object key: "" or a path ending in '/' (e.g. "team-a/ckpt/"). Default "".
  std::string prefix;
  // Bytes per multipart part (>= kMinS3PackPartSize): a writer holds up to about twice this in
  // memory. Larger parts mean fewer requests per pack. Default 8 MiB.
  uint64_t part_size = uint64_t{8} << 20;
  // Check at Create that the bucket can be listed, so that a wrong endpoint, bucket or key fails
  // when the store opens rather than at its first commit. Default true.
  bool check_access = true;
};

// The smallest part size S3ChunkBackendOptions accepts (S3's own minimum is 5 MiB).
inline constexpr uint64_t kMinS3PackPartSize = uint64_t{8} << 20;

class S3ChunkBackend final : public ChunkBackend {
 public:
  // INVALID_ARGUMENT for a prefix that is neither empty nor ends in '/', or a part size below
  // kMinS3PackPartSize; with check_access, the S3 error of listing the prefix.
  static absl::StatusOr<std::unique_ptr<S3ChunkBackend>> Create(
      std::shared_ptr<s3::S3Client> client, S3ChunkBackendOptions options);

  // The key of pack `pack_id`'s object.
  std::string ObjectKey(uint64_t pack_id) const;

  std::string Describe() const override;
  absl::StatusOr<std::unique_ptr<ChunkWriter>> NewPack(uint64_t pack_id) override;
  absl::Status Read(const PackLocation& location, char* destination) const override;
  bool CanMap() const override { return false; }
  absl::StatusOr<std::shared_ptr<MappedPackRegion>> MapWhole(uint64_t pack_id) const override;
  // The pack objects with their sizes and LastModified times.
  absl::StatusOr<std::vector<PackInfo>> List() const override;
  // Hides the pack; its object goes at ReleaseRemoved(g >= generation).
  absl::Status Remove(uint64_t pack_id, uint64_t generation) override;
  // Deletes the objects of packs removed at generations <= `up_to`; one whose delete fails is
  // logged and stays for the next call, and the rest go on. Returns how many failed.
  int ReleaseRemoved(uint64_t up_to) override;
  // The multipart uploads of pack objects in progress, with their Initiated times.
  absl::StatusOr<std::vector<PendingPack>> ListPending() const override;
  // An S3ChangeLog under the same prefix: `<prefix>changes/`.
  absl::StatusOr<std::unique_ptr<ChangeLog>> OpenChangeLog() override;
  absl::Status AbortPending(const PendingPack& pending) override;

 private:
  S3ChunkBackend(std::shared_ptr<s3::S3Client> client, S3ChunkBackendOptions options);
  std::string PacksPrefix() const;
  std::string ObjectUrl(uint64_t pack_id) const;

  const std::shared_ptr<s3::S3Client> client_;
  const S3ChunkBackendOptions options_;
  mutable absl::Mutex mu_;
  // Removed packs whose objects are still there, with their generations.
  std::vector<std::pair<uint64_t, uint64_t>> removed_ ABSL_GUARDED_BY(mu_);
};

// What the store's binaries take as --chunks_s3_* flags (services/checkpoint_store, tools/ckpt),
// in one place so the two cannot drift apart.
struct S3ChunkStorageConfig {
  // "http://HOST:PORT" or "https://HOST[:PORT]". Empty: no object storage (pack files).
  std::string endpoint;
  std::string bucket;
  std::string prefix;                // S3ChunkBackendOptions::prefix.
  std::string region = "us-east-1";  // the SigV4 scope's region.
  std::string ca_file;               // https: PEM CA bundle instead of the system's.
  std::string access_key;            // LoadS3Credentials fills these two.
  std::string secret_key;
};

// Fills config.access_key and secret_key from `credentials_file` when it is not empty -- AWS's
// shared credentials format: `aws_access_key_id = ...` and `aws_secret_access_key = ...` lines
// (the first of each; [profile] headers and # comments ignored) -- or else from the environment's
// AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, as AWS's own tools do. Never from a flag value,
// which `ps` shows to every user. INVALID_ARGUMENT naming what is missing; the file's read error.
absl::Status LoadS3Credentials(const std::string& credentials_file, S3ChunkStorageConfig& config);

// The --chunks_s3_* flags as given (libs/server/service_flags.h, and ckpt's options of the same
// names); empty strings are flags not given.
struct S3ChunkFlags {
  std::string endpoint;
  std::string bucket;
  std::string prefix;
  std::string region;
  std::string credentials_file;
  std::string ca_file;

  // No --chunks_s3_* flag was given.
  bool empty() const {
    return endpoint.empty() && bucket.empty() && prefix.empty() && region.empty() &&
           credentials_file.empty() && ca_file.empty();
  }
};

// The storage `flags` describe, credentials loaded (LoadS3Credentials); endpoint empty when no
// flag was given (pack files). INVALID_ARGUMENT for any --chunks_s3_* flag without
// --chunks_s3_endpoint (none is silently ignored), or an endpoint without a bucket.
absl::StatusOr<S3ChunkStorageConfig> S3ChunkStorageFromFlags(const S3ChunkFlags& flags);

// The S3ChunkBackend `config` describes (Create checks that the bucket can be listed), for
// StoreOptions::chunk_backend; null when config.endpoint is empty. INVALID_ARGUMENT for a bucket
// or credentials missing; S3's error when the bucket cannot be listed.
absl::StatusOr<std::shared_ptr<ChunkBackend>> OpenS3ChunkStorage(
    const S3ChunkStorageConfig& config);

}  // namespace ckpt

#endif  // CKPT_LIBS_STORE_S3_CHUNK_BACKEND_H_

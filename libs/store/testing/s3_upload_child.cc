// A store on S3 packs that dies in the middle of an upload, for s3_chunk_backend_ceph_test: the
// test runs it as a child process and checks what the bucket and the index hold afterwards.
// Built with the failpoint store (internal/failpoint.h), so CKPT_FAILPOINT in the environment can
// kill it at a chosen point of Commit. testonly.
//
// Usage: s3_upload_child MODE DB_PATH BUCKET PREFIX, with S3_ENDPOINT, S3_ACCESS_KEY,
// S3_SECRET_KEY and S3_REGION in the environment (tools/ceph/single_node.sh's env file).
//   parts   streams 20 MiB of a 40 MiB tensor (two 8 MiB parts go up: a multipart upload in
//           progress), prints "ready" and waits to be killed.
//   commit  uploads a 1 MiB tensor and commits; run with CKPT_FAILPOINT=commit.after_pack_sync
//           it dies with its pack object complete and no version committed.

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <string>

#include "libs/s3/s3_client.h"
#include "libs/store/rocksdb_checkpoint_store.h"
#include "libs/store/s3_chunk_backend.h"

namespace ckpt {
namespace {

int Die(const std::string& what, const absl::Status& status) {
  std::fprintf(stderr, "s3_upload_child: %s: %s\n", what.c_str(), status.ToString().c_str());
  return 2;
}

std::string Env(const char* name) {
  const char* value = std::getenv(name);
  return value == nullptr ? "" : value;
}

int Run(const std::string& mode, const std::string& db_path, const std::string& bucket,
        const std::string& prefix) {
  s3::S3ClientOptions s3_options;
  s3_options.endpoint = Env("S3_ENDPOINT");
  s3_options.access_key = Env("S3_ACCESS_KEY");
  s3_options.secret_key = Env("S3_SECRET_KEY");
  s3_options.region = Env("S3_REGION");
  s3_options.bucket = bucket;
  absl::StatusOr<std::unique_ptr<s3::S3Client>> client = s3::S3Client::Create(s3_options);
  if (!client.ok()) return Die("S3 client", client.status());
  S3ChunkBackendOptions backend_options;
  backend_options.prefix = prefix;
  absl::StatusOr<std::unique_ptr<S3ChunkBackend>> backend =
      S3ChunkBackend::Create(*std::move(client), backend_options);
  if (!backend.ok()) return Die("S3 backend", backend.status());
  StoreOptions options;
  options.db_path = db_path;
  options.chunk_backend = *std::move(backend);
  absl::StatusOr<std::unique_ptr<RocksDbCheckpointStore>> store =
      RocksDbCheckpointStore::Open(options);
  if (!store.ok()) return Die("opening the store", store.status());

  const int64_t bytes = mode == "parts" ? int64_t{40} << 20 : int64_t{1} << 20;
  v1::Manifest header;
  v1::TensorMeta* meta = header.add_tensors();
  meta->set_key("weights");
  meta->set_dtype(v1::DTYPE_UINT8);
  meta->add_shape(bytes);
  meta->set_byte_length(bytes);
  absl::StatusOr<std::unique_ptr<UploadSession>> session =
      (*store)->BeginUpload("victim", header, CommitOptions());
  if (!session.ok()) return Die("BeginUpload", session.status());
  // Pseudo-random, so no two chunks are equal (equal chunks would be stored once).
  std::string data(static_cast<size_t>(bytes), '\0');
  std::mt19937_64 random(bytes);
  for (size_t i = 0; i + 8 <= data.size(); i += 8) {
    const uint64_t word = random();
    std::memcpy(&data[i], &word, 8);
  }

  if (mode == "parts") {
    const int64_t sent = int64_t{20} << 20;
    absl::Status added = (*session)->AddTensorData(0, 0, absl::string_view(data).substr(0, sent));
    if (!added.ok()) return Die("AddTensorData", added);
    std::printf("ready\n");
    std::fflush(stdout);
    while (true) ::pause();  // until SIGKILL.
  }
  absl::Status added = (*session)->AddTensorData(0, 0, data);
  if (!added.ok()) return Die("AddTensorData", added);
  absl::StatusOr<CommitResult> committed = (*session)->Commit();
  if (!committed.ok()) return Die("Commit", committed.status());
  std::printf("committed (no failpoint armed?)\n");
  return 0;
}

}  // namespace
}  // namespace ckpt

int main(int argc, char** argv) {
  if (argc != 5) {
    std::fprintf(stderr, "usage: s3_upload_child parts|commit DB_PATH BUCKET PREFIX\n");
    return 2;
  }
  return ckpt::Run(argv[1], argv[2], argv[3], argv[4]);
}

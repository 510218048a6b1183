// s3_bench: a checkpoint saved to and loaded from the store with its chunks in S3 (issue #21,
// S3ChunkBackend) against the same bytes PUT and GET as one object with the curl CLI, in the same
// run and against the same server; the store on local pack files for reference.
//
//   bazel run //tools/ceph:single_node -- start /tmp/ceph && source /tmp/ceph/env
//   bazel run //tools/bench:s3_bench -- [--mib=256] [--tensor_mib=4] [--runs=3]
//   bazel run //tools/ceph:single_node -- stop /tmp/ceph
//
// The server comes from S3_ENDPOINT, S3_ACCESS_KEY, S3_SECRET_KEY and S3_REGION in the
// environment (what single_node.sh writes to DIR/env). Each run uses fresh keys and a fresh store,
// so nothing is deduplicated against an earlier run; the tensors are random (incompressible,
// unique). curl signs with --aws-sigv4 and sends the payload's SHA-256 computed beforehand (not
// timed), while the store hashes as it uploads (SHA-256 for content addresses and again for the
// SigV4 payload signature): the ratio shows what the store's work and its multipart parts cost.

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "ATen/Context.h"
#include "ATen/core/Tensor.h"
#include "ATen/ops/rand.h"
#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "libs/s3/s3_client.h"
#include "libs/s3/sigv4.h"
#include "libs/store/checkpoint_contents.h"
#include "libs/store/checkpoint_store.h"
#include "libs/store/rocksdb_checkpoint_store.h"
#include "libs/store/s3_chunk_backend.h"
#include "libs/tensor/state_dict.h"
#include "tools/bench/stats.h"

ABSL_FLAG(int, mib, 256, "Checkpoint size in MiB. Default 256.");
ABSL_FLAG(int, tensor_mib, 4,
          "Size of each tensor in MiB (the checkpoint is mib/tensor_mib "
          "float32 tensors). Default 4.");
ABSL_FLAG(int, runs, 3, "Runs of each measurement; the table shows medians. Default 3.");
ABSL_FLAG(std::string, bucket, "ckpt-s3-bench", "Bucket to use (created if missing).");
ABSL_FLAG(std::string, work_dir, "/tmp/ckpt-s3-bench",
          "Scratch directory for the curl file and the stores' RocksDB indexes (removed after).");

namespace ckpt {
namespace {

std::string Env(const char* name) {
  const char* value = std::getenv(name);
  return value == nullptr ? "" : value;
}

int Fail(const std::string& what) {
  std::cerr << "s3_bench: " << what << "\n";
  return 1;
}

double MiBPerSecond(int64_t bytes, absl::Duration took) {
  return static_cast<double>(bytes) / (1 << 20) / absl::ToDoubleSeconds(took);
}

// Runs `command` with /bin/sh; its wall time, or nullopt when it failed.
std::optional<absl::Duration> TimeCommand(const std::string& command) {
  const absl::Time start = absl::Now();
  const int status = std::system(command.c_str());
  if (status != 0) return std::nullopt;
  return absl::Now() - start;
}

// Deletes every object under `prefix`.
absl::Status RemoveObjects(s3::S3Client& client, const std::string& prefix) {
  absl::StatusOr<std::vector<s3::ListedObject>> objects = client.ListAllObjects(prefix);
  if (!objects.ok()) return objects.status();
  for (const s3::ListedObject& object : *objects) {
    if (absl::Status deleted = client.DeleteObject(object.key); !deleted.ok()) return deleted;
  }
  return absl::OkStatus();
}

std::string Quote(const std::string& text) { return absl::StrCat("'", text, "'"); }

int Run() {
  const int64_t bytes = int64_t{absl::GetFlag(FLAGS_mib)} << 20;
  const int64_t tensor_bytes = int64_t{absl::GetFlag(FLAGS_tensor_mib)} << 20;
  const int runs = absl::GetFlag(FLAGS_runs);
  if (bytes <= 0 || tensor_bytes <= 0 || bytes % tensor_bytes != 0 || runs < 1) {
    return Fail("--mib must be a positive multiple of --tensor_mib, --runs >= 1");
  }
  S3ChunkStorageConfig config;
  config.endpoint = Env("S3_ENDPOINT");
  config.access_key = Env("S3_ACCESS_KEY");
  config.secret_key = Env("S3_SECRET_KEY");
  config.region = Env("S3_REGION").empty() ? "us-east-1" : Env("S3_REGION");
  config.bucket = absl::GetFlag(FLAGS_bucket);
  if (config.endpoint.empty() || config.access_key.empty() || config.secret_key.empty()) {
    return Fail(
        "set S3_ENDPOINT, S3_ACCESS_KEY, S3_SECRET_KEY (and S3_REGION): start a server with "
        "`bazel run //tools/ceph:single_node -- start /tmp/ceph` and `source /tmp/ceph/env`");
  }
  s3::S3ClientOptions client_options;
  client_options.endpoint = config.endpoint;
  client_options.access_key = config.access_key;
  client_options.secret_key = config.secret_key;
  client_options.region = config.region;
  client_options.bucket = config.bucket;
  absl::StatusOr<std::unique_ptr<s3::S3Client>> client = s3::S3Client::Create(client_options);
  if (!client.ok()) return Fail(client.status().ToString());
  absl::Status created = (*client)->CreateBucket();
  if (!created.ok() && !absl::IsAlreadyExists(created)) return Fail(created.ToString());

  const std::string work = absl::GetFlag(FLAGS_work_dir);
  if (!TimeCommand(absl::StrCat("rm -rf ", Quote(work))) || ::mkdir(work.c_str(), 0755) != 0) {
    return Fail("cannot create " + work);
  }

  // The checkpoint, and the same bytes in one file for curl.
  at::manual_seed(7);
  StateDict model;
  std::string all_bytes;
  all_bytes.reserve(static_cast<size_t>(bytes));
  for (int64_t i = 0; i < bytes / tensor_bytes; ++i) {
    at::Tensor tensor = at::rand({tensor_bytes / 4}, at::kFloat);
    all_bytes.append(static_cast<const char*>(tensor.data_ptr()), tensor_bytes);
    model.InsertOrAssign(absl::StrCat("layer", i, ".weight"), tensor);
  }
  const std::string file = work + "/blob";
  std::ofstream(file, std::ios::binary).write(all_bytes.data(), all_bytes.size());
  const std::string payload_sha = s3::Sha256Hex(all_bytes);
  std::string().swap(all_bytes);

  const std::string curl =
      absl::StrCat("curl -sf --max-time 600 -o /dev/null --aws-sigv4 ",
                   Quote(absl::StrCat("aws:amz:", config.region, ":s3")), " --user ",
                   Quote(absl::StrCat(config.access_key, ":", config.secret_key)));
  std::vector<double> curl_put, curl_get, s3_save, s3_load, pack_save, pack_load;
  auto store_config_prefix = [](int run) {
    return absl::StrCat("bench-", getpid(), "-run", run, "/");
  };
  for (int run = 0; run < runs; ++run) {
    const std::string url =
        absl::StrCat(config.endpoint, "/", config.bucket, "/curl/run", run, "-", getpid());
    std::optional<absl::Duration> put =
        TimeCommand(absl::StrCat(curl, " -H ", Quote("x-amz-content-sha256: " + payload_sha),
                                 " -T ", Quote(file), " ", Quote(url)));
    std::optional<absl::Duration> get = TimeCommand(absl::StrCat(
        curl, " -H ", Quote(absl::StrCat("x-amz-content-sha256: ", s3::kEmptyPayloadSha256)), " ",
        Quote(url)));
    if (!put || !get) return Fail("curl PUT/GET failed (curl >= 7.75 with --aws-sigv4 needed)");
    curl_put.push_back(MiBPerSecond(bytes, *put));
    curl_get.push_back(MiBPerSecond(bytes, *get));

    for (const bool on_s3 : {true, false}) {
      StoreOptions options;
      options.db_path = absl::StrCat(work, "/store-", on_s3 ? "s3" : "packs", run);
      if (on_s3) {
        S3ChunkStorageConfig store_config = config;
        store_config.prefix = store_config_prefix(run);
        absl::StatusOr<std::shared_ptr<ChunkBackend>> backend = OpenS3ChunkStorage(store_config);
        if (!backend.ok()) return Fail(backend.status().ToString());
        options.chunk_backend = *std::move(backend);
      }
      absl::StatusOr<std::unique_ptr<RocksDbCheckpointStore>> store =
          RocksDbCheckpointStore::Open(options);
      if (!store.ok()) return Fail(store.status().ToString());
      CheckpointContents contents;
      contents.model = model;
      absl::Time start = absl::Now();
      absl::StatusOr<CommitResult> committed =
          CommitCheckpoint(**store, "bench", contents, CommitOptions());
      const absl::Duration save = absl::Now() - start;
      if (!committed.ok()) return Fail(committed.status().ToString());
      start = absl::Now();
      absl::StatusOr<LoadedCheckpoint> loaded = LoadCheckpoint(**store, committed->version);
      const absl::Duration load = absl::Now() - start;
      if (!loaded.ok()) return Fail(loaded.status().ToString());
      const at::Tensor* first = loaded->contents.model.Find("layer0.weight");
      if (loaded->contents.model.size() != model.size() || first == nullptr ||
          !first->equal(model.entry(0).tensor)) {
        return Fail("the loaded checkpoint differs from the saved one");
      }
      (on_s3 ? s3_save : pack_save).push_back(MiBPerSecond(bytes, save));
      (on_s3 ? s3_load : pack_load).push_back(MiBPerSecond(bytes, load));
      if (on_s3) {
        // Each run's objects go, so a cluster sized for one run holds any number of them (a full
        // memstore OSD makes writes hang rather than fail).
        absl::Status removed = RemoveObjects(**client, store_config_prefix(run));
        if (!removed.ok()) return Fail(removed.ToString());
      }
    }
    absl::Status removed = (*client)->DeleteObject(absl::StrCat("curl/run", run, "-", getpid()));
    if (!removed.ok()) return Fail(removed.ToString());
  }
  if (!TimeCommand(absl::StrCat("rm -rf ", Quote(work)))) std::cerr << "could not remove " << work;

  const double curl_put_median = bench::Summarize(curl_put).median;
  const double curl_get_median = bench::Summarize(curl_get).median;
  auto row = [&](const std::string& name, const std::vector<double>& values, double baseline) {
    const bench::Summary summary = bench::Summarize(values);
    std::cout << absl::StrFormat(
        "| %-34s | %9.0f | %9.0f | %9.0f | %s |\n", name, summary.median, summary.min, summary.max,
        baseline > 0 ? absl::StrFormat("%.2f", summary.median / baseline) : std::string("-"));
  };
  std::cout << absl::StrFormat(
      "\nS3 chunk backend: %d MiB (%d tensors of %d MiB), %d runs, server %s\n\n",
      absl::GetFlag(FLAGS_mib), static_cast<int>(bytes / tensor_bytes),
      absl::GetFlag(FLAGS_tensor_mib), runs, config.endpoint);
  std::cout << "| what                               | MiB/s med |       min |       max | "
               "/ curl |\n";
  std::cout << "|------------------------------------|-----------|-----------|-----------|"
               "--------|\n";
  row("curl PUT, one object", curl_put, 0);
  row("store save, chunks in S3", s3_save, curl_put_median);
  row("store save, pack files (local)", pack_save, 0);
  row("curl GET, one object", curl_get, 0);
  row("store load, chunks in S3", s3_load, curl_get_median);
  row("store load, pack files (local)", pack_load, 0);
  return 0;
}

}  // namespace
}  // namespace ckpt

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "Save and load through the store's S3 chunk backend against curl PUT/GET of the same bytes.\n"
      "  source /tmp/ceph/env && s3_bench [--mib=256] [--tensor_mib=4] [--runs=3]");
  absl::ParseCommandLine(argc, argv);
  return ckpt::Run();
}

// change_log_bench: what the store's change log costs and how fast a store comes back from it
// (issue #53). Every figure has its baseline in the same run, against the same disk or bucket.
//
//   bazel run //tools/bench:change_log_bench -- [--commits=20] [--mib=16] [--aliases=200]
//       [--rebuild_versions=2000] [--runs=3]
//   # against a real radosgw as well (S3_ENDPOINT ... as tools/ceph/single_node.sh writes them):
//   bazel run //tools/ceph:single_node -- start /tmp/ceph && source /tmp/ceph/env && bazel run ...
//
// F3  commit latency (a checkpoint of --mib MiB in 4 MiB tensors, random bytes) and alias moves
//     (a registry change alone) with StoreOptions::keep_change_log against without, runs
//     interleaved; the table shows medians over --runs of the per-operation mean.
// F2  rebuild: --rebuild_versions small versions (one 4 KiB tensor each) committed, the index
//     deleted, then the time to open again: versions per second, and the store's time-to-serving
//     after a lost disk; once replaying every record, once from a snapshot of the index taken
//     near the end (StoreOptions::change_log_snapshot_every) and the records after it.
// F4  follower lag (S3 only): under D1's workload, how long after the writer acknowledged each
//     commit a follower on the same bucket, applying the log every 100 ms, could read it.

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "ATen/Context.h"
#include "ATen/core/Tensor.h"
#include "ATen/ops/full.h"
#include "ATen/ops/randn.h"
#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "libs/s3/s3_client.h"
#include "libs/store/checkpoint_contents.h"
#include "libs/store/checkpoint_store.h"
#include "libs/store/rocksdb_checkpoint_store.h"
#include "libs/store/s3_chunk_backend.h"
#include "libs/store/version_ref.h"
#include "libs/tensor/state_dict.h"
#include "tools/bench/stats.h"
#include "tools/bench/workloads.h"

ABSL_FLAG(int, commits, 20, "Commits per run for F3. Default 20.");
ABSL_FLAG(int, mib, 16, "Checkpoint size of each F3 commit in MiB (4 MiB tensors). Default 16.");
ABSL_FLAG(int, aliases, 200, "Alias moves per run for F3. Default 200.");
ABSL_FLAG(int, rebuild_versions, 2000, "Versions committed before the F2 rebuild. Default 2000.");
ABSL_FLAG(int, runs, 3, "Runs of each F3 measurement (medians shown). Default 3.");
ABSL_FLAG(bool, follower_lag, true,
          "With S3: F4, a follower's lag under D1's ten 256 MiB fine-tunes (about 300 MiB of "
          "packs). Default true.");
ABSL_FLAG(std::string, work_dir, "/tmp/ckpt-change-log-bench",
          "Scratch directory for the stores (removed after).");

namespace ckpt {
namespace {

namespace fs = std::filesystem;

std::string Env(const char* name) {
  const char* value = std::getenv(name);
  return value == nullptr ? "" : value;
}

// Where a store's chunks (and so its change log) go.
struct Backend {
  std::string name;
  bool s3 = false;
};

std::shared_ptr<ChunkBackend> MakeChunks(const Backend& backend, const std::string& prefix) {
  if (!backend.s3) return nullptr;
  s3::S3ClientOptions options;
  options.endpoint = Env("S3_ENDPOINT");
  options.access_key = Env("S3_ACCESS_KEY");
  options.secret_key = Env("S3_SECRET_KEY");
  if (!Env("S3_REGION").empty()) options.region = Env("S3_REGION");
  options.bucket = "ckpt-change-log-bench";
  absl::StatusOr<std::unique_ptr<s3::S3Client>> client = s3::S3Client::Create(options);
  if (!client.ok()) {
    std::fprintf(stderr, "S3 client: %s\n", client.status().ToString().c_str());
    std::exit(1);
  }
  (*client)->CreateBucket().IgnoreError();
  S3ChunkBackendOptions backend_options;
  backend_options.prefix = prefix;
  absl::StatusOr<std::unique_ptr<S3ChunkBackend>> chunks =
      S3ChunkBackend::Create(std::shared_ptr<s3::S3Client>(*std::move(client)), backend_options);
  if (!chunks.ok()) {
    std::fprintf(stderr, "S3 backend: %s\n", chunks.status().ToString().c_str());
    std::exit(1);
  }
  return *std::move(chunks);
}

std::unique_ptr<RocksDbCheckpointStore> OpenStore(const std::string& dir,
                                                  std::shared_ptr<ChunkBackend> chunks,
                                                  bool keep_change_log,
                                                  int64_t snapshot_every = 0) {
  StoreOptions options;
  options.db_path = dir;
  options.chunk_backend = std::move(chunks);
  options.keep_change_log = keep_change_log;
  options.change_log_snapshot_every = snapshot_every;
  absl::StatusOr<std::unique_ptr<RocksDbCheckpointStore>> store =
      RocksDbCheckpointStore::Open(options);
  if (!store.ok()) {
    std::fprintf(stderr, "opening %s: %s\n", dir.c_str(), store.status().ToString().c_str());
    std::exit(1);
  }
  return *std::move(store);
}

void Check(const absl::Status& status, const char* what) {
  if (!status.ok()) {
    std::fprintf(stderr, "%s: %s\n", what, status.ToString().c_str());
    std::exit(1);
  }
}

CheckpointContents RandomCheckpoint(int mib, int64_t seed) {
  at::manual_seed(seed);
  CheckpointContents contents;
  for (int i = 0; i < std::max(1, mib / 4); ++i) {
    Check(contents.model.Insert(absl::StrCat("layer", i, ".weight"),
                                at::randn({std::min(mib, 4) * 256 * 1024})),
          "building a checkpoint");
  }
  return contents;
}

struct Costs {
  double commit_ms = 0;
  double alias_ms = 0;
};

// One F3 run: --commits commits and --aliases alias moves into a fresh store.
Costs MeasureOnce(const Backend& backend, bool keep_change_log, int run) {
  const std::string dir = absl::StrCat(absl::GetFlag(FLAGS_work_dir), "/f3-", backend.name, "-",
                                       keep_change_log, "-", run);
  fs::remove_all(dir);
  std::unique_ptr<RocksDbCheckpointStore> store = OpenStore(
      dir, MakeChunks(backend, absl::StrCat("f3-", keep_change_log, "-", run, "-", absl::ToUnixMicros(absl::Now()), "/")),
      keep_change_log);
  const int commits = absl::GetFlag(FLAGS_commits);
  std::vector<CheckpointContents> checkpoints;
  for (int i = 0; i < commits; ++i) {
    checkpoints.push_back(RandomCheckpoint(absl::GetFlag(FLAGS_mib), run * 1000 + i));
  }
  Costs costs;
  absl::Time start = absl::Now();
  for (int i = 0; i < commits; ++i) {
    Check(CommitCheckpoint(*store, "m", checkpoints[i]).status(), "committing");
  }
  costs.commit_ms = absl::ToDoubleMilliseconds(absl::Now() - start) / commits;
  const int aliases = absl::GetFlag(FLAGS_aliases);
  start = absl::Now();
  for (int i = 0; i < aliases; ++i) {
    Check(store->SetAlias("m", "production", 1 + i % commits).status(), "moving an alias");
  }
  costs.alias_ms = absl::ToDoubleMilliseconds(absl::Now() - start) / aliases;
  store.reset();
  fs::remove_all(dir);
  return costs;
}

void F3(const Backend& backend) {
  std::vector<double> commit_without, commit_with, alias_without, alias_with;
  for (int run = 0; run < absl::GetFlag(FLAGS_runs); ++run) {
    // Interleaved, so a drift of the disk or the server hits both sides alike.
    const Costs without = MeasureOnce(backend, false, run);
    const Costs with = MeasureOnce(backend, true, run);
    commit_without.push_back(without.commit_ms);
    commit_with.push_back(with.commit_ms);
    alias_without.push_back(without.alias_ms);
    alias_with.push_back(with.alias_ms);
  }
  const bench::Summary cw = bench::Summarize(commit_without), cl = bench::Summarize(commit_with);
  const bench::Summary aw = bench::Summarize(alias_without), al = bench::Summarize(alias_with);
  const int mib = absl::GetFlag(FLAGS_mib);
  std::printf("| F3 %-12s | commit of %3d MiB | %9.2f ms | %9.2f ms | %5.3f | %7.1f MiB/s |\n",
              backend.name.c_str(), mib, cw.median, cl.median, cl.median / cw.median,
              mib / (cl.median / 1000));
  std::printf("| F3 %-12s | alias move        | %9.3f ms | %9.3f ms | %5.3f |               |\n",
              backend.name.c_str(), aw.median, al.median, al.median / aw.median);
}

// One F2 row: the store built with a snapshot of its index every `snapshot_every` changes (0:
// none, so the rebuild replays every record), its index deleted, then opened again.
void F2(const Backend& backend, int64_t snapshot_every) {
  const std::string dir = absl::StrCat(absl::GetFlag(FLAGS_work_dir), "/f2-", backend.name);
  fs::remove_all(dir);
  const std::string prefix = absl::StrCat("f2-", absl::ToUnixMicros(absl::Now()), "/");
  const int versions = absl::GetFlag(FLAGS_rebuild_versions);
  {
    std::unique_ptr<RocksDbCheckpointStore> store =
        OpenStore(dir, MakeChunks(backend, prefix), true, snapshot_every);
    for (int i = 0; i < versions; ++i) {
      CheckpointContents contents;
      Check(contents.model.Insert("w", at::full({1024}, static_cast<float>(i))), "building");
      Check(CommitCheckpoint(*store, absl::StrCat("model-", i % 10), contents).status(),
            "committing");
    }
  }  // closing waits for a snapshot being written.
  for (const fs::directory_entry& entry : fs::directory_iterator(dir)) {
    if (entry.is_regular_file()) fs::remove(entry.path());  // the index, not packs/ or changes/.
  }
  const absl::Time start = absl::Now();
  std::unique_ptr<RocksDbCheckpointStore> store = OpenStore(dir, MakeChunks(backend, prefix), true);
  const double seconds = absl::ToDoubleSeconds(absl::Now() - start);
  absl::StatusOr<std::vector<v1::ModelInfo>> models = store->ListModels();
  Check(models.status(), "listing");
  int64_t listed = 0;
  for (const v1::ModelInfo& model : *models) listed += model.version_count();
  if (listed != versions) {
    std::fprintf(stderr, "rebuilt %lld versions of %d\n", static_cast<long long>(listed), versions);
    std::exit(1);
  }
  std::printf("| F2 %-12s | rebuild of %d versions (%lld changes), %s | %.2f s to serving | %.0f "
              "versions/s |\n",
              backend.name.c_str(), versions, static_cast<long long>(store->last_change()),
              snapshot_every > 0 ? "from a snapshot near the end" : "every record replayed",
              seconds, versions / seconds);
  store.reset();
  fs::remove_all(dir);
}

// F4: how far a follower trails its writer under D1's workload (ten fine-tunes of one 256 MiB
// backbone, each with its own 4 MiB head): the writer commits them back to back; a follower on
// the same bucket applies what the writer appended every 100 ms (checkpoint_store's
// --follow_interval) and notes when each version becomes readable there. S3 only: followers
// share the writer's bucket.
void F4(const Backend& backend) {
  const std::string dir = absl::StrCat(absl::GetFlag(FLAGS_work_dir), "/f4-", backend.name);
  fs::remove_all(dir);
  fs::create_directories(dir);
  const std::string prefix = absl::StrCat("f4-", absl::ToUnixMicros(absl::Now()), "/");
  constexpr int kVersions = 10;
  absl::StatusOr<bench::FineTuneSeries> series =
      bench::MakeFineTuneSeries(int64_t{256} << 20, int64_t{4} << 20, kVersions);
  Check(series.status(), "making D1's fine-tune series");
  std::unique_ptr<RocksDbCheckpointStore> writer =
      OpenStore(dir + "/writer", MakeChunks(backend, prefix), true);
  StoreOptions follower_options;
  follower_options.db_path = dir + "/follower";
  follower_options.chunk_backend = MakeChunks(backend, prefix);
  follower_options.start_as_follower = true;
  absl::StatusOr<std::unique_ptr<RocksDbCheckpointStore>> opened =
      RocksDbCheckpointStore::Open(follower_options);
  Check(opened.status(), "opening the follower");
  std::unique_ptr<RocksDbCheckpointStore> follower = *std::move(opened);

  std::vector<absl::Time> acknowledged(kVersions + 1), visible(kVersions + 1);
  std::atomic<bool> done{false};
  std::thread follow([&] {
    int64_t next = 1;
    while (next <= kVersions && !done.load()) {
      Check(follower->FollowChangeLog().status(), "following");
      while (next <= kVersions && follower->GetManifest(MakeVersionRef("d1", next)).ok()) {
        visible[next++] = absl::Now();
      }
      absl::SleepFor(absl::Milliseconds(100));
    }
  });
  for (int i = 0; i < kVersions; ++i) {
    Check(CommitCheckpoint(*writer, "d1", series->versions[i]).status(), "committing");
    acknowledged[i + 1] = absl::Now();
  }
  const absl::Time give_up = absl::Now() + absl::Seconds(60);
  while (absl::Now() < give_up && visible[kVersions] == absl::Time()) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  done = true;
  follow.join();
  std::vector<double> lag_ms;
  for (int v = 1; v <= kVersions; ++v) {
    if (visible[v] == absl::Time()) {
      std::fprintf(stderr, "d1@%d never became readable on the follower\n", v);
      std::exit(1);
    }
    // A version can show up between its commit and the writer's clock reading after it: 0.
    lag_ms.push_back(std::max(0.0, absl::ToDoubleMilliseconds(visible[v] - acknowledged[v])));
  }
  std::sort(lag_ms.begin(), lag_ms.end());
  std::printf("| F4 %-12s | follower lag, D1 (10 commits of 256 MiB + 4 MiB) | p50 %.0f ms | "
              "max %.0f ms (= p99 of 10) | follow interval 100 ms |\n",
              backend.name.c_str(), lag_ms[lag_ms.size() / 2], lag_ms.back());
  follower.reset();
  writer.reset();
  fs::remove_all(dir);
}

}  // namespace
}  // namespace ckpt

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "What the store's change log costs (F3) and how fast a lost index comes back (F2).\n"
      "  change_log_bench [--commits=20] [--mib=16] [--aliases=200] [--rebuild_versions=2000]\n"
      "                   [--runs=3]   (S3_ENDPOINT etc. in the environment: radosgw too)");
  absl::ParseCommandLine(argc, argv);
  std::filesystem::create_directories(absl::GetFlag(FLAGS_work_dir));
  std::vector<ckpt::Backend> backends = {{"pack-files", false}};
  if (!ckpt::Env("S3_ENDPOINT").empty()) backends.push_back({"S3", true});
  std::printf("| figure          | operation         | without log | with log  | ratio | throughput    |\n");
  std::printf("|-----------------|-------------------|-------------|-----------|-------|---------------|\n");
  std::setvbuf(stdout, nullptr, _IOLBF, 0);  // each row as it is measured.
  for (const ckpt::Backend& backend : backends) ckpt::F3(backend);
  // Each commit here is one change (no audit), so a snapshot every 95% of them lands near the
  // end and leaves a 5% tail to replay.
  const int64_t near_the_end = std::max(1, absl::GetFlag(FLAGS_rebuild_versions) * 19 / 20);
  for (const ckpt::Backend& backend : backends) {
    ckpt::F2(backend, /*snapshot_every=*/0);
    ckpt::F2(backend, near_the_end);
  }
  for (const ckpt::Backend& backend : backends) {
    if (backend.s3 && absl::GetFlag(FLAGS_follower_lag)) ckpt::F4(backend);
  }
  std::filesystem::remove_all(absl::GetFlag(FLAGS_work_dir));
  return 0;
}

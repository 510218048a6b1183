// The --chunks_s3_* flags end to end through the binaries users run: the checkpoint_store server
// with its packs in libs/s3's fake S3 server (testdata/fake_s3_server.py, SigV4 checked), a
// checkpoint committed and loaded back over gRPC bit for bit, the pack objects found in the
// bucket and no pack file on local disk; then the `ckpt` CLI on the same index and bucket.

#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include "ATen/Context.h"
#include "ATen/core/Tensor.h"
#include "ATen/ops/arange.h"
#include "ATen/ops/equal.h"
#include "ATen/ops/randn.h"

#include <cstdlib>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "libs/client/remote_checkpoint_store.h"
#include "libs/s3/s3_client.h"
#include "libs/store/checkpoint_contents.h"
#include "libs/store/checkpoint_store.h"
#include "libs/testing/child_process.h"

namespace ckpt {
namespace {

using ::testing::HasSubstr;

constexpr char kAccessKey[] = "AKIDE2E";
constexpr char kSecretKey[] = "e2e/secret+key";
constexpr char kBucket[] = "e2e-bucket";
constexpr char kPrefix[] = "team-a/";

v1::VersionRef Ref(const std::string& model, int64_t version) {
  v1::VersionRef ref;
  ref.set_model(model);
  ref.set_version(version);
  return ref;
}

// Every *.pack file under `dir`.
std::vector<std::string> PackFilesUnder(const std::string& dir) {
  std::vector<std::string> packs;
  for (const auto& entry : std::filesystem::recursive_directory_iterator(dir)) {
    if (entry.path().extension() == ".pack") packs.push_back(entry.path().string());
  }
  return packs;
}

TEST(S3ChunksBinariesTest, ServerAndCliKeepPacksInTheBucketAndLoadThemBackBitExact) {
  const std::string dir = testing::TestCaseDir();
  ASSERT_EQ(mkdir(dir.c_str(), 0755), 0);
  for (const char* sub : {"/s3", "/server", "/db"}) {
    ASSERT_EQ(mkdir((dir + sub).c_str(), 0755), 0) << sub;
  }

  testing::ChildProcess s3("/usr/bin/python3", dir + "/s3");
  ASSERT_TRUE(s3.Start({testing::RunfilesPath("libs/s3/testdata/fake_s3_server.py"),
                        "--port_file=" + dir + "/s3/port", "--bucket=" + std::string(kBucket),
                        "--access_key=" + std::string(kAccessKey),
                        "--secret_key=" + std::string(kSecretKey)}));
  const int s3_port = s3.WaitForPort(dir + "/s3/port", absl::Seconds(30));
  ASSERT_GT(s3_port, 0) << s3.stderr_text();
  const std::string endpoint = absl::StrCat("http://127.0.0.1:", s3_port);
  // Credentials from a file, as the flags' help recommends (never a flag value).
  const std::string credentials = dir + "/credentials";
  testing::WriteTextFile(credentials, absl::StrCat("[default]\naws_access_key_id = ", kAccessKey,
                                                   "\naws_secret_access_key = ", kSecretKey, "\n"));
  const std::vector<std::string> s3_flags = {
      "--chunks_s3_endpoint=" + endpoint, "--chunks_s3_bucket=" + std::string(kBucket),
      "--chunks_s3_prefix=" + std::string(kPrefix), "--chunks_s3_credentials_file=" + credentials};

  // Two tensors, one above the 8 MiB part size (a multipart upload), one small.
  at::manual_seed(7);
  const at::Tensor big = at::randn({3 * 1024 * 1024 + 17});  // 12 MiB of float32
  const at::Tensor small = at::arange(1000, at::kLong);
  CheckpointContents contents;
  ASSERT_TRUE(contents.model.Insert("layer.weight", big).ok());
  ASSERT_TRUE(contents.model.Insert("layer.bias", small).ok());

  const std::string db = dir + "/db/index";
  testing::ChildProcess server(testing::RunfilesPath("services/checkpoint_store/checkpoint_store"),
                               dir + "/server");
  std::vector<std::string> server_flags = {"--store_dir=" + db, "--listen=127.0.0.1:0",
                                           "--port_file=" + dir + "/server/port"};
  server_flags.insert(server_flags.end(), s3_flags.begin(), s3_flags.end());
  ASSERT_TRUE(server.Start(server_flags));
  const int port = server.WaitForPort(dir + "/server/port", absl::Seconds(30));
  ASSERT_GT(port, 0) << server.stderr_text();
  {
    RemoteStoreOptions options;
    options.address = absl::StrCat("127.0.0.1:", port);
    absl::StatusOr<std::unique_ptr<RemoteCheckpointStore>> store =
        RemoteCheckpointStore::Connect(options);
    ASSERT_TRUE(store.ok()) << store.status();
    absl::StatusOr<CommitResult> committed =
        CommitCheckpoint(**store, "e2e", contents, CommitOptions());
    ASSERT_TRUE(committed.ok()) << committed.status() << "\n" << server.stderr_text();
    EXPECT_EQ(committed->version.version(), 1);
    absl::StatusOr<LoadedCheckpoint> loaded = LoadCheckpoint(**store, Ref("e2e", 1));
    ASSERT_TRUE(loaded.ok()) << loaded.status();
    for (const auto& [key, expected] : {std::pair{"layer.weight", big}, {"layer.bias", small}}) {
      const at::Tensor* got = loaded->contents.model.Find(key);
      ASSERT_NE(got, nullptr) << key;
      EXPECT_EQ(got->dtype(), expected.dtype()) << key;
      EXPECT_EQ(got->sizes(), expected.sizes()) << key;
      EXPECT_TRUE(at::equal(*got, expected)) << key << " differs after the round trip";
    }
  }
  server.Signal(SIGTERM);
  std::optional<int> status = server.WaitForExit(absl::Seconds(30));
  ASSERT_TRUE(status.has_value()) << "still running after SIGTERM";
  EXPECT_TRUE(WIFEXITED(*status) && WEXITSTATUS(*status) == 0) << server.stderr_text();

  // The packs are objects under the prefix, holding at least the tensors' bytes; no pack file.
  s3::S3ClientOptions client_options;
  client_options.endpoint = endpoint;
  client_options.access_key = kAccessKey;
  client_options.secret_key = kSecretKey;
  client_options.bucket = kBucket;
  absl::StatusOr<std::unique_ptr<s3::S3Client>> client = s3::S3Client::Create(client_options);
  ASSERT_TRUE(client.ok()) << client.status();
  absl::StatusOr<std::vector<s3::ListedObject>> objects =
      (*client)->ListAllObjects(absl::StrCat(kPrefix, "packs/"));
  ASSERT_TRUE(objects.ok()) << objects.status();
  ASSERT_GE(objects->size(), 1u);
  uint64_t object_bytes = 0;
  for (const s3::ListedObject& object : *objects) {
    EXPECT_THAT(object.key, ::testing::EndsWith(".pack"));
    object_bytes += object.size;
  }
  EXPECT_GE(object_bytes, static_cast<uint64_t>(big.nbytes() + small.nbytes()));
  EXPECT_THAT(PackFilesUnder(dir + "/db"), ::testing::IsEmpty());

  // The CLI on the same index reads the chunks from the bucket: verify re-hashes every one.
  std::string cli_flags;
  for (const std::string& flag : s3_flags) absl::StrAppend(&cli_flags, " ", flag);
  const testing::ShellResult verified = testing::RunShell(
      absl::StrCat("tools/ckpt/ckpt verify --store_dir=", db, cli_flags, " 2>&1"));
  EXPECT_EQ(verified.exit_code, 0) << verified.output;
  EXPECT_THAT(verified.output, HasSubstr("verified the whole store ("));
  EXPECT_THAT(verified.output, HasSubstr(" 0 problems"));
  // Without the flags the index names packs that are not on this disk: verify says so.
  const testing::ShellResult local =
      testing::RunShell(absl::StrCat("tools/ckpt/ckpt verify --store_dir=", db, " 2>&1"));
  EXPECT_NE(local.exit_code, 0) << local.output;
}

}  // namespace
}  // namespace ckpt

#include "libs/client/open_store.h"

#include <pwd.h>
#include <unistd.h>

#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "ATen/core/Tensor.h"
#include "ATen/ops/arange.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "libs/status/status_matchers.h"
#include "libs/store/checkpoint_contents.h"
#include "libs/store/version_ref.h"

namespace ckpt {
namespace {

using ::ckpt::testing::StatusIs;

std::string TestDir() {
  const char* tmp = std::getenv("TEST_TMPDIR");
  return std::string(tmp != nullptr ? tmp : "/tmp") + "/" +
         ::testing::UnitTest::GetInstance()->current_test_info()->name();
}

std::string ExpectedUser() {
  const struct passwd* entry = getpwuid(geteuid());
  return entry != nullptr ? std::string(entry->pw_name) : absl::StrCat("uid:", geteuid());
}

TEST(OpenCheckpointStoreTest, ChangesToADirectoryAreAuditedAsTheLocalUser) {
  StoreLocation location;
  location.directory = TestDir();
  location.create_if_missing = true;
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<CheckpointStore> store, OpenCheckpointStore(location));
  CheckpointContents contents;
  ASSERT_OK(contents.model.Insert("w", at::arange(4, at::kFloat)));
  contents.metadata.set_producer("ckpt import");
  ASSERT_OK(CommitCheckpoint(*store, "m", contents).status());
  ASSERT_OK(store->SetAlias("m", "best", 1).status());

  const std::string identity = "local:" + ExpectedUser();
  ASSERT_OK_AND_ASSIGN(std::vector<v1::AuditRecord> records, store->ListAudit({}));
  ASSERT_EQ(records.size(), 2u);
  for (const v1::AuditRecord& record : records) {
    EXPECT_EQ(record.identity(), identity);
    EXPECT_EQ(record.peer(), "local");
    EXPECT_EQ(record.outcome(), v1::AuditRecord::OK);
  }
  EXPECT_EQ(records[0].action(), "commit");
  EXPECT_EQ(records[1].action(), "set_alias");
  absl::StatusOr<v1::VersionRef> ref = ParseVersionRef("m@1");
  ASSERT_OK(ref.status());
  ASSERT_OK_AND_ASSIGN(v1::Manifest manifest, store->GetManifest(*ref));
  EXPECT_EQ(manifest.metadata().producer(), identity);
  EXPECT_EQ(manifest.metadata().labels().at("client_producer"), "ckpt import");
}

TEST(OpenCheckpointStoreTest, NeedsExactlyOneOfAddressAndDirectory) {
  EXPECT_THAT(OpenCheckpointStore({}), StatusIs(absl::StatusCode::kInvalidArgument, "exactly one"));
  StoreLocation both;
  both.address = "127.0.0.1:1";
  both.directory = TestDir();
  EXPECT_THAT(OpenCheckpointStore(both), StatusIs(absl::StatusCode::kInvalidArgument));
  StoreLocation token_without_address;
  token_without_address.directory = TestDir();
  token_without_address.auth_token = "t";
  EXPECT_THAT(OpenCheckpointStore(token_without_address),
              StatusIs(absl::StatusCode::kInvalidArgument, "auth token"));
}

// Which store-client flags go together: checked here once for the loader and the trainer.
TEST(StoreLocationFromFlagsTest, OneStoreAndClientSettingsOnlyForAService) {
  StoreClientFlags directory;
  directory.store_dir = "/data/ckpt";
  ASSERT_OK_AND_ASSIGN(StoreLocation location, StoreLocationFromFlags(directory));
  EXPECT_EQ(location.directory, "/data/ckpt");
  EXPECT_TRUE(location.address.empty());

  EXPECT_THAT(StoreLocationFromFlags({}),
              StatusIs(absl::StatusCode::kInvalidArgument, "exactly one of --store"));
  StoreClientFlags both = directory;
  both.store = "127.0.0.1:1";
  EXPECT_THAT(StoreLocationFromFlags(both),
              StatusIs(absl::StatusCode::kInvalidArgument, "exactly one of --store"));
  // A binary's default --store_dir (the trainer's ckpt-data) yields to --store.
  both.store_dir_default = "/data/ckpt";
  ASSERT_OK_AND_ASSIGN(location, StoreLocationFromFlags(both));
  EXPECT_EQ(location.address, "127.0.0.1:1");
  EXPECT_TRUE(location.directory.empty());

  StoreClientFlags token = directory;
  token.auth_token_file = "/tmp/token";
  EXPECT_THAT(StoreLocationFromFlags(token), StatusIs(absl::StatusCode::kInvalidArgument,
                                                      "--store_auth_token_file needs --store"));
  StoreClientFlags tls = directory;
  tls.tls_server_name = "store.example";
  EXPECT_THAT(StoreLocationFromFlags(tls),
              StatusIs(absl::StatusCode::kInvalidArgument, "--store_tls_* flags need --store"));

  StoreClientFlags service;
  service.store = "127.0.0.1:1";
  service.tls_ca_file = "ca.pem";
  service.tls_server_name = "store.example";
  service.auth_token_file = TestDir() + "/no-such-token";
  EXPECT_THAT(StoreLocationFromFlags(service),
              StatusIs(absl::StatusCode::kInvalidArgument, "--store_auth_token_file"));
  service.auth_token_file.clear();
  ASSERT_OK_AND_ASSIGN(location, StoreLocationFromFlags(service));
  EXPECT_EQ(location.tls.ca_file, "ca.pem");
  EXPECT_EQ(location.tls.server_name, "store.example");
}

TEST(OpenCheckpointStoreTest, AMissingDirectoryIsNotFoundWithoutCreate) {
  StoreLocation location;
  location.directory = TestDir();
  EXPECT_THAT(OpenCheckpointStore(location), StatusIs(absl::StatusCode::kNotFound));
}

}  // namespace
}  // namespace ckpt

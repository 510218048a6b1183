// S3ChangeLog against libs/s3's fake server (SigV4 checked, If-None-Match honoured as radosgw
// does on PUT). The store's rebuild from a real radosgw is in s3_chunk_backend_ceph_test.

#include "libs/store/s3_change_log.h"

#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "libs/s3/s3_client.h"
#include "libs/s3/testing/fake_s3_server.h"
#include "libs/status/status_matchers.h"

namespace ckpt {
namespace {

using ::ckpt::testing::StatusIs;

std::shared_ptr<s3::S3Client> Client(const testing::FakeS3Server& server) {
  absl::StatusOr<std::unique_ptr<s3::S3Client>> client = s3::S3Client::Create(server.ClientOptions());
  EXPECT_TRUE(client.ok()) << client.status();
  return client.ok() ? std::shared_ptr<s3::S3Client>(*std::move(client)) : nullptr;
}

std::string Record(int64_t n, absl::string_view writer = "a") {
  return EncodeChangeFrame(absl::StrCat("change ", n, " by ", writer));
}

TEST(S3ChangeLogTest, AppendsAndReadsBackInOrderAcrossPages) {
  testing::FakeS3Server server;
  S3ChangeLog log(Client(server), "team/");
  for (int64_t n = 1; n <= 30; ++n) ASSERT_OK(log.Append(n, Record(n)));
  EXPECT_EQ(log.ObjectKey(3), "team/changes/00000000000000000003");
  int64_t after = 0;
  while (true) {
    ASSERT_OK_AND_ASSIGN(auto page, log.ReadAfter(after, 8));
    if (page.empty()) break;
    for (const LoggedChange& change : page) {
      ASSERT_EQ(change.sequence, after + 1);
      EXPECT_EQ(change.bytes, Record(change.sequence));
      after = change.sequence;
    }
  }
  EXPECT_EQ(after, 30);
}

// Two writers on one bucket: the second create of a number is refused by the server, which is
// what fences a writer that lost its place. A retry of one's own append (its answer lost) is OK.
TEST(S3ChangeLogTest, ASecondWriterOfANumberIsFenced) {
  testing::FakeS3Server server;
  S3ChangeLog first(Client(server), "");
  S3ChangeLog second(Client(server), "");
  ASSERT_OK(first.Append(1, Record(1, "first")));
  EXPECT_OK(first.Append(1, Record(1, "first")));
  EXPECT_THAT(second.Append(1, Record(1, "second")),
              StatusIs(absl::StatusCode::kAlreadyExists, "another writer"));
  ASSERT_OK_AND_ASSIGN(auto read, second.ReadAfter(0, 10));
  ASSERT_EQ(read.size(), 1u);
  EXPECT_EQ(read[0].bytes, Record(1, "first"));
}

TEST(S3ChangeLogTest, SnapshotsAreKeptTwoNewestAndReadBackWhole) {
  testing::FakeS3Server server;
  S3ChangeLog log(Client(server), "team/");
  ASSERT_OK_AND_ASSIGN(int64_t latest, log.LatestSnapshot());
  EXPECT_EQ(latest, 0);
  EXPECT_THAT(log.ReadSnapshot(3), StatusIs(absl::StatusCode::kNotFound));
  for (int64_t n : {3, 9, 27}) ASSERT_OK(log.PutSnapshot(n, Record(n, "snapshot")));
  ASSERT_OK_AND_ASSIGN(latest, log.LatestSnapshot());
  EXPECT_EQ(latest, 27);
  ASSERT_OK_AND_ASSIGN(std::string bytes, log.ReadSnapshot(27));
  EXPECT_EQ(bytes, Record(27, "snapshot"));
  EXPECT_OK(log.ReadSnapshot(9).status());
  EXPECT_THAT(log.ReadSnapshot(3), StatusIs(absl::StatusCode::kNotFound));
  // The records are untouched.
  ASSERT_OK_AND_ASSIGN(auto records, log.ReadAfter(0, 10));
  EXPECT_TRUE(records.empty());
}

TEST(S3ChangeLogTest, AMissingRecordBeforeLaterOnesIsDataLoss) {
  testing::FakeS3Server server;
  std::shared_ptr<s3::S3Client> client = Client(server);
  S3ChangeLog log(client, "");
  for (int64_t n = 1; n <= 3; ++n) ASSERT_OK(log.Append(n, Record(n)));
  ASSERT_OK(client->DeleteObject(log.ObjectKey(2)));
  EXPECT_THAT(log.ReadAfter(0, 10), StatusIs(absl::StatusCode::kDataLoss, "change 2 is missing"));
  ASSERT_OK_AND_ASSIGN(auto after_two, log.ReadAfter(2, 10));
  ASSERT_EQ(after_two.size(), 1u);
  EXPECT_EQ(after_two[0].sequence, 3);
}

TEST(S3ChangeLogTest, ARetriedAppendWhoseFirstAnswerWasLostIsOk) {
  testing::FakeS3Server server;
  S3ChangeLog log(Client(server), "");
  // The server stores the first PUT and its answer is lost: the client retries and sees 412.
  server.Fault({{"method", "PUT"}, {"lose_response", true}, {"count", 1}});
  EXPECT_OK(log.Append(1, Record(1)));
  ASSERT_OK_AND_ASSIGN(auto read, log.ReadAfter(0, 10));
  ASSERT_EQ(read.size(), 1u);
}

}  // namespace
}  // namespace ckpt

// S3Client against a real S3 server: Debian's Ceph (mon, memstore OSD, radosgw) started on
// 127.0.0.1 by tools/ceph/single_node.sh and stopped after. Where Ceph is not installed the tests
// are skipped, and fail in CI (CKPT_REQUIRE, libs/testing/requirements.h); tools/install_deps.sh
// installs it.

#include <stdlib.h>
#include <unistd.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "libs/s3/s3_client.h"
#include "libs/status/status_matchers.h"
#include "libs/testing/child_process.h"
#include "libs/testing/requirements.h"

namespace ckpt::s3 {
namespace {

using ::ckpt::testing::StatusIs;
using ::testing::HasSubstr;
using ::testing::SizeIs;

std::string Bytes(size_t size, int seed) {
  std::string out(size, '\0');
  for (size_t i = 0; i < size; ++i) out[i] = static_cast<char>((i * 131 + seed + i / 997) & 0xff);
  return out;
}

class CephS3Test : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    if (!CephInstalled()) return;  // SetUp skips or fails each test.
    script_ = new std::string(testing::RunfilesPath("tools/ceph/single_node.sh"));
    ASSERT_EQ(access(script_->c_str(), R_OK), 0) << "no tools/ceph/single_node.sh at " << *script_;
    // Short: Ceph's admin sockets live under the directory and unix socket paths are limited to
    // 108 bytes, which TEST_TMPDIR's sandbox path can exceed.
    char dir_template[] = "/tmp/ckpt-s3-ceph-XXXXXX";
    ASSERT_NE(mkdtemp(dir_template), nullptr);
    dir_ = new std::string(dir_template);
    const testing::ShellResult started = testing::RunShell(
        absl::StrCat("/bin/bash ", *script_, " start --memstore-mib 1024 ", *dir_, "/ceph 2>&1"));
    ASSERT_EQ(started.exit_code, 0) << started.output;
    std::map<std::string, std::string> env;
    for (absl::string_view line :
         absl::StrSplit(testing::ReadFileOrEmpty(*dir_ + "/ceph/env"), '\n', absl::SkipEmpty())) {
      std::pair<std::string, std::string> kv = absl::StrSplit(line, absl::MaxSplits('=', 1));
      env[kv.first] = kv.second;
    }
    options_ = new S3ClientOptions();
    options_->endpoint = env["S3_ENDPOINT"];
    options_->access_key = env["S3_ACCESS_KEY"];
    options_->secret_key = env["S3_SECRET_KEY"];
    options_->region = env["S3_REGION"];
    options_->bucket = "ckpt-s3-client-test";
    options_->max_attempts = 3;
    options_->multipart_threshold = 6 << 20;
    options_->part_size = kMinPartSize;
    absl::StatusOr<std::unique_ptr<S3Client>> client = S3Client::Create(*options_);
    ASSERT_TRUE(client.ok()) << client.status();
    ASSERT_OK((*client)->CreateBucket());
  }

  static void TearDownTestSuite() {
    if (dir_ != nullptr) {
      const testing::ShellResult stopped = testing::RunShell(
          absl::StrCat("/bin/bash ", *script_, " stop ", *dir_, "/ceph 2>&1; rmdir ", *dir_));
      EXPECT_EQ(stopped.exit_code, 0) << stopped.output;
    }
  }

  void SetUp() override {
    CKPT_REQUIRE(CephInstalled(), "Ceph (ceph-mon, ceph-osd, radosgw)");
    ASSERT_NE(options_, nullptr) << "Ceph did not start (see the suite's setup failure)";
    absl::StatusOr<std::unique_ptr<S3Client>> client = S3Client::Create(*options_);
    ASSERT_TRUE(client.ok()) << client.status();
    s3_ = *std::move(client);
  }

  static bool CephInstalled() {
    return access("/usr/bin/radosgw", X_OK) == 0 && access("/usr/bin/ceph-mon", X_OK) == 0 &&
           access("/usr/bin/ceph-osd", X_OK) == 0;
  }

  static std::string* dir_;
  static std::string* script_;
  static S3ClientOptions* options_;
  std::unique_ptr<S3Client> s3_;
};

std::string* CephS3Test::dir_ = nullptr;
std::string* CephS3Test::script_ = nullptr;
S3ClientOptions* CephS3Test::options_ = nullptr;

TEST_F(CephS3Test, ObjectsRoundTripWithRangesHeadListAndDelete) {
  const std::string data = Bytes(1 << 20, 1);
  const std::string key = "round trip/a b+c=\xc3\xa9.bin";
  ASSERT_OK(s3_->PutObject(key, data));
  ASSERT_OK_AND_ASSIGN(ObjectInfo info, s3_->HeadObject(key));
  EXPECT_EQ(info.size, data.size());
  ASSERT_OK_AND_ASSIGN(std::string read, s3_->GetObject(key));
  EXPECT_TRUE(read == data);
  ASSERT_OK_AND_ASSIGN(std::string slice, s3_->GetObject(key, ByteRange{12345, 678}));
  EXPECT_EQ(slice, data.substr(12345, 678));
  EXPECT_THAT(s3_->GetObject(key, ByteRange{data.size(), 1}),
              StatusIs(absl::StatusCode::kOutOfRange));

  for (int i = 0; i < 5; ++i) ASSERT_OK(s3_->PutObject(absl::StrCat("list/", i), "x"));
  ASSERT_OK_AND_ASSIGN(ListPage page, s3_->ListObjectsV2("list/", "", 2));
  EXPECT_THAT(page.objects, SizeIs(2));
  EXPECT_FALSE(page.next_continuation_token.empty());
  ASSERT_OK_AND_ASSIGN(ListPage second,
                       s3_->ListObjectsV2("list/", page.next_continuation_token, 2));
  ASSERT_THAT(second.objects, SizeIs(2));
  EXPECT_EQ(second.objects[0].key, "list/2");
  ASSERT_OK_AND_ASSIGN(std::vector<ListedObject> all, s3_->ListAllObjects("list/"));
  EXPECT_THAT(all, SizeIs(5));

  ASSERT_OK(s3_->DeleteObject(key));
  EXPECT_THAT(s3_->GetObject(key), StatusIs(absl::StatusCode::kNotFound, "NoSuchKey"));
  EXPECT_THAT(s3_->HeadObject(key), StatusIs(absl::StatusCode::kNotFound));
}

// rgw honours "If-None-Match: *" on PUT (412), which the default IfAbsentMode relies on.
TEST_F(CephS3Test, IfNoneMatchOnPutRefusesAnExistingObject) {
  ASSERT_OK(s3_->PutObjectIfAbsent("conditional", "first"));
  EXPECT_THAT(s3_->PutObjectIfAbsent("conditional", "second"),
              StatusIs(absl::StatusCode::kAlreadyExists));
  EXPECT_EQ(s3_->GetObject("conditional").value_or("?"), "first");

  S3ClientOptions options = s3_->options();
  options.if_absent_mode = S3ClientOptions::IfAbsentMode::kHeadFirst;
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<S3Client> head_first, S3Client::Create(options));
  EXPECT_THAT(head_first->PutObjectIfAbsent("conditional", "third"),
              StatusIs(absl::StatusCode::kAlreadyExists));
  ASSERT_OK(head_first->PutObjectIfAbsent("conditional-2", "new"));
  EXPECT_EQ(s3_->GetObject("conditional").value_or("?"), "first");
}

TEST_F(CephS3Test, MultipartUploadAssemblesThePartsInOrder) {
  const std::string data = Bytes((12 << 20) + 7, 2);
  ASSERT_OK(s3_->PutObject("multipart", data));
  ASSERT_OK_AND_ASSIGN(ObjectInfo info, s3_->HeadObject("multipart"));
  EXPECT_EQ(info.size, data.size());
  EXPECT_THAT(info.etag, HasSubstr("-3"));
  ASSERT_OK_AND_ASSIGN(std::string read, s3_->GetObject("multipart"));
  EXPECT_TRUE(read == data);
  ASSERT_OK_AND_ASSIGN(std::string across,
                       s3_->GetObject("multipart", ByteRange{kMinPartSize - 3, 6}));
  EXPECT_EQ(across, data.substr(kMinPartSize - 3, 6));

  // Ceph 16.2's rgw ignores If-None-Match on CompleteMultipartUpload (it honours it on PUT, see
  // above) and replaces the object: the reason PutObjectIfAbsent asks HEAD before a multipart
  // upload instead of relying on the header.
  ASSERT_OK_AND_ASSIGN(std::string upload_id, s3_->CreateMultipartUpload("multipart"));
  ASSERT_OK_AND_ASSIGN(std::string etag, s3_->UploadPart("multipart", upload_id, 1, "replacement"));
  EXPECT_OK(
      s3_->CompleteMultipartUpload("multipart", upload_id, {{1, etag}}, /*if_none_match=*/true));
  EXPECT_EQ(s3_->GetObject("multipart").value_or("?"), "replacement");
}

TEST_F(CephS3Test, AWrongSecretIsPermissionDeniedWithS3sCode) {
  S3ClientOptions options = s3_->options();
  options.secret_key = "wrong";
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<S3Client> wrong, S3Client::Create(options));
  EXPECT_THAT(wrong->GetObject("anything"),
              StatusIs(absl::StatusCode::kPermissionDenied, "SignatureDoesNotMatch"));
}

}  // namespace
}  // namespace ckpt::s3

#include "libs/io/read_file.h"

#include <sys/stat.h>

#include <fstream>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "libs/status/status_matchers.h"

namespace ckpt {
namespace {

using ::ckpt::testing::StatusIs;

std::string TempPath(const std::string& name) {
  return std::string(::testing::TempDir()) + "/" + name;
}

TEST(ReadSmallFileTest, ReadsTheWholeFile) {
  const std::string path = TempPath("small.pem");
  std::ofstream(path, std::ios::binary) << std::string("-----BEGIN\0X\n", 13);
  ASSERT_OK_AND_ASSIGN(std::string bytes, ReadSmallFile(path, "--tls_cert_file"));
  EXPECT_EQ(bytes, std::string("-----BEGIN\0X\n", 13));
}

TEST(ReadSmallFileTest, ErrorsNameTheSettingAndThePath) {
  EXPECT_THAT(ReadSmallFile(TempPath("missing"), "--tls_ca_file"),
              StatusIs(absl::StatusCode::kNotFound, "--tls_ca_file="));
  EXPECT_THAT(ReadSmallFile(::testing::TempDir(), "--tokens_file"),
              StatusIs(absl::StatusCode::kInvalidArgument, "not a regular file"));
  EXPECT_THAT(ReadSmallFile("", "--tokens_file"),
              StatusIs(absl::StatusCode::kInvalidArgument, "--tokens_file is empty"));
  const std::string big = TempPath("big");
  std::ofstream(big, std::ios::binary) << std::string(100, 'x');
  EXPECT_THAT(ReadSmallFile(big, "--policy_file", 99),
              StatusIs(absl::StatusCode::kInvalidArgument, "100 bytes"));
}

}  // namespace
}  // namespace ckpt

#include "libs/auth/bearer_auth.h"

#include <cstdlib>
#include <fstream>

#include "gtest/gtest.h"
#include "libs/status/status_matchers.h"

namespace ckpt {
namespace {

using ::ckpt::testing::IsOk;
using ::ckpt::testing::StatusIs;

std::string WriteFile(const std::string& name, const std::string& contents) {
  const std::string path = std::string(std::getenv("TEST_TMPDIR")) + "/" + name;
  std::ofstream(path, std::ios::binary) << contents;
  return path;
}

TEST(ReadAuthTokenFileTest, StripsWhitespace) {
  absl::StatusOr<std::string> token = ReadAuthTokenFile(WriteFile("ok", "  s3cret\n"));
  ASSERT_THAT(token.status(), IsOk());
  EXPECT_EQ(*token, "s3cret");
}

TEST(ReadAuthTokenFileTest, RejectsMissingEmptyAndUnprintableTokens) {
  EXPECT_THAT(ReadAuthTokenFile("/nonexistent/token", "--store_token").status(),
              StatusIs(absl::StatusCode::kInvalidArgument, "cannot read --store_token"));
  EXPECT_THAT(ReadAuthTokenFile(WriteFile("empty", " \n")).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, "is empty"));
  EXPECT_THAT(ReadAuthTokenFile(WriteFile("space", "two words")).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, "printable ASCII"));
}

}  // namespace
}  // namespace ckpt

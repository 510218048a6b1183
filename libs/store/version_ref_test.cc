#include "libs/store/version_ref.h"

#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "libs/status/status_matchers.h"

namespace ckpt {
namespace {

using ::ckpt::testing::StatusIs;

TEST(ParseVersionRefTest, ParsesVersionNumbers) {
  ASSERT_OK_AND_ASSIGN(v1::VersionRef ref, ParseVersionRef("resnet18-imagenet@7"));
  EXPECT_EQ(ref.model(), "resnet18-imagenet");
  EXPECT_EQ(ref.ref_case(), v1::VersionRef::kVersion);
  EXPECT_EQ(ref.version(), 7);
}

TEST(ParseVersionRefTest, BareModelMeansLatest) {
  ASSERT_OK_AND_ASSIGN(v1::VersionRef bare, ParseVersionRef("gpt.tiny_v2"));
  EXPECT_EQ(bare.model(), "gpt.tiny_v2");
  EXPECT_EQ(bare.alias(), "latest");
  ASSERT_OK_AND_ASSIGN(v1::VersionRef latest, ParseVersionRef("gpt.tiny_v2@latest"));
  EXPECT_EQ(latest.alias(), "latest");
}

TEST(ParseVersionRefTest, ParsesAliases) {
  ASSERT_OK_AND_ASSIGN(v1::VersionRef ref, ParseVersionRef("m@best"));
  EXPECT_EQ(ref.model(), "m");
  EXPECT_EQ(ref.alias(), "best");
}

TEST(ParseVersionRefTest, RejectsMalformedReferences) {
  for (const char* text : {"", "@7", "m@", "m@0", "m@-1", "m@99999999999999999999", "m@a@b",
                           "bad model@1", "m@b\xc3\xa9st", "m/1"}) {
    EXPECT_THAT(ParseVersionRef(text), StatusIs(absl::StatusCode::kInvalidArgument))
        << "'" << text << "'";
  }
  EXPECT_THAT(ParseVersionRef(std::string("m\0x@1", 5)),
              StatusIs(absl::StatusCode::kInvalidArgument, "position 1"));
}

TEST(ParseVersionRefTest, FormatsBack) {
  for (const char* text : {"m@7", "m@best", "m@latest"}) {
    ASSERT_OK_AND_ASSIGN(v1::VersionRef ref, ParseVersionRef(text));
    EXPECT_EQ(FormatVersionRef(ref), text);
  }
  ASSERT_OK_AND_ASSIGN(v1::VersionRef bare, ParseVersionRef("m"));
  EXPECT_EQ(FormatVersionRef(bare), "m@latest");
  v1::VersionRef empty;
  empty.set_model("m");
  EXPECT_EQ(FormatVersionRef(empty), "m@latest");
  EXPECT_EQ(FormatVersionRef(MakeVersionRef("m", 3)), "m@3");
}

TEST(NameValidationTest, ModelNamesAllowOnlySafeCharactersUpTo128) {
  EXPECT_OK(ValidateModelName("A-z_0.9"));
  EXPECT_OK(ValidateModelName(std::string(128, 'a')));
  EXPECT_THAT(ValidateModelName(std::string(129, 'a')),
              StatusIs(absl::StatusCode::kInvalidArgument, "at most 128"));
  EXPECT_THAT(ValidateModelName(""), StatusIs(absl::StatusCode::kInvalidArgument, "empty"));
  EXPECT_THAT(ValidateModelName("a@b"), StatusIs(absl::StatusCode::kInvalidArgument, "'@'"));
}

TEST(NameValidationTest, AliasesMustNotBeLatestOrNumbers) {
  EXPECT_OK(ValidateAliasName("best"));
  EXPECT_OK(ValidateAliasName("v2"));
  EXPECT_THAT(ValidateAliasName("latest"),
              StatusIs(absl::StatusCode::kInvalidArgument, "reserved"));
  EXPECT_THAT(ValidateAliasName("42"), StatusIs(absl::StatusCode::kInvalidArgument, "digits"));
  EXPECT_THAT(ValidateAliasName("-x"), StatusIs(absl::StatusCode::kInvalidArgument, "starts with"));
}

}  // namespace
}  // namespace ckpt

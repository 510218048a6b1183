#include "libs/auth/access_policy.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "libs/status/status_matchers.h"

namespace ckpt {
namespace {

using ::ckpt::testing::StatusIs;

// sha256("reader-token") and sha256("writer-token").
constexpr char kReaderHash[] = "0d0e4b2ecb21e8b0b0d7fa1b1e1b1b7d4d2bd3b0bbf1d8bde1b0b4f5a6c7d8e9";
constexpr char kWriterHash[] = "1d0e4b2ecb21e8b0b0d7fa1b1e1b1b7d4d2bd3b0bbf1d8bde1b0b4f5a6c7d8e9";

TEST(RequiredRoleTest, EachMethodNeedsItsRoleAndUnknownMethodsNeedAdmin) {
  EXPECT_EQ(RequiredRole("GetManifest"), Role::kReader);
  EXPECT_EQ(RequiredRole("Export"), Role::kReader);
  EXPECT_EQ(RequiredRole("Upload"), Role::kWriter);
  EXPECT_EQ(RequiredRole("SetAlias"), Role::kWriter);
  EXPECT_EQ(RequiredRole("DeleteVersion"), Role::kAdmin);
  EXPECT_EQ(RequiredRole("GarbageCollect"), Role::kAdmin);
  EXPECT_EQ(RequiredRole("SomethingNew"), Role::kAdmin);
}

TEST(AuthorizeTest, DeniedCallsNameTheIdentityWhatItTriedTheModelAndWhatIsMissing) {
  Caller reader{"serving", Role::kReader, {}, "ipv4:10.0.0.1:1"};
  EXPECT_OK(AccessPolicy::Authorize(reader, "Download", "m"));
  EXPECT_THAT(AccessPolicy::Authorize(reader, "SetAlias", "m"),
              StatusIs(absl::StatusCode::kPermissionDenied,
                       "identity 'serving' (role reader) may not move aliases (SetAlias) on "
                       "model 'm': that needs the writer role"));
  EXPECT_THAT(AccessPolicy::Authorize(reader, "GarbageCollect", ""),
              StatusIs(absl::StatusCode::kPermissionDenied,
                       "identity 'serving' (role reader) may not collect garbage "
                       "(GarbageCollect): that needs the admin role"));
  Caller scoped{"team-a", Role::kWriter, {"team-a/*"}, ""};
  EXPECT_OK(AccessPolicy::Authorize(scoped, "Upload", "team-a/resnet"));
  EXPECT_OK(AccessPolicy::Authorize(scoped, "ListModels", ""));
  EXPECT_THAT(AccessPolicy::Authorize(scoped, "Upload", "team-b/resnet"),
              StatusIs(absl::StatusCode::kPermissionDenied,
                       "identity 'team-a' may not commit versions (Upload) on model "
                       "'team-b/resnet': its writer role covers only"));
  EXPECT_THAT(AccessPolicy::Authorize(scoped, "DeleteVersion", "team-a/resnet"),
              StatusIs(absl::StatusCode::kPermissionDenied, "needs the admin role"));
}

TEST(ParseIdentitiesTest, ReadsTokensCertificatesRolesAndScopes) {
  ASSERT_OK_AND_ASSIGN(
      std::vector<IdentityEntry> entries,
      ParseIdentities(absl::StrCat(R"({"identities": [
        {"name": "serving", "token_sha256": ")",
                                   kReaderHash, R"(", "role": "reader"},
        {"name": "team-a", "token_sha256": ")",
                                   kWriterHash, R"(", "role": "writer", "models": ["team-a/*"]},
        {"name": "ops", "certificate": "ops.example.com", "role": "admin"}]})"),
                      "ids.json"));
  ASSERT_EQ(entries.size(), 3u);
  EXPECT_EQ(entries[0].name, "serving");
  EXPECT_EQ(entries[0].token_sha256.size(), 32u);
  EXPECT_EQ(entries[1].models, std::vector<std::string>{"team-a/*"});
  EXPECT_EQ(entries[2].certificate, "ops.example.com");
  EXPECT_EQ(entries[2].role, Role::kAdmin);
}

TEST(ParseIdentitiesTest, AForwardingFrontEndIsACertificateWithoutARoleOfItsOwn) {
  const auto parse = [](const std::string& json) { return ParseIdentities(json, "ids.json"); };
  ASSERT_OK_AND_ASSIGN(std::vector<IdentityEntry> entries, parse(R"({"identities": [
      {"name": "console", "certificate": "console.example", "forwards_certificates": true}]})"));
  ASSERT_EQ(entries.size(), 1u);
  EXPECT_TRUE(entries[0].forwards_certificates);
  EXPECT_THAT(parse(R"({"identities": [{"name": "console", "certificate": "c", "role": "reader",
                                        "forwards_certificates": true}]})"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "(console) forwards certificates, so it has no role or models of its own"));
  EXPECT_THAT(parse(absl::StrCat(R"({"identities": [{"name": "console", "token_sha256": ")",
                                 kReaderHash, R"(", "forwards_certificates": true}]})")),
              StatusIs(absl::StatusCode::kInvalidArgument, "must be known by its own certificate"));
  EXPECT_THAT(parse(R"({"identities": [{"name": "console", "certificate": "c",
                                        "forwards_certificates": "yes"}]})"),
              StatusIs(absl::StatusCode::kInvalidArgument, "must be true or false"));
}

TEST(ParseIdentitiesTest, BadFilesAreRefusedNamingTheEntry) {
  const auto parse = [](const std::string& json) { return ParseIdentities(json, "ids.json"); };
  EXPECT_THAT(parse("{"), StatusIs(absl::StatusCode::kInvalidArgument, "ids.json: not valid JSON"));
  EXPECT_THAT(parse(R"({"people": []})"), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(parse(R"({"identities": [{"name": "a", "role": "root", "certificate": "x"}]})"),
              StatusIs(absl::StatusCode::kInvalidArgument, "unknown role 'root'"));
  EXPECT_THAT(parse(R"({"identities": [{"name": "a", "role": "reader"}]})"),
              StatusIs(absl::StatusCode::kInvalidArgument, "exactly one of"));
  EXPECT_THAT(parse(R"({"identities": [{"name": "a", "role": "reader", "token_sha256": "abc"}]})"),
              StatusIs(absl::StatusCode::kInvalidArgument, "64 hex digits"));
  EXPECT_THAT(parse(R"({"identities": [{"name": "a", "role": "reader", "certificate": "x",
                                         "colour": "red"}]})"),
              StatusIs(absl::StatusCode::kInvalidArgument, "unknown field 'colour'"));
  EXPECT_THAT(parse(R"({"identities": [{"name": "a", "role": "reader", "certificate": "x"},
                                       {"name": "a", "role": "admin", "certificate": "y"}]})"),
              StatusIs(absl::StatusCode::kInvalidArgument, "two identities are named 'a'"));
  EXPECT_THAT(parse(absl::StrCat(R"({"identities": [
        {"name": "a", "role": "reader", "token_sha256": ")",
                                 kReaderHash, R"("},
        {"name": "b", "role": "admin", "token_sha256": ")",
                                 kReaderHash, R"("}]})")),
              StatusIs(absl::StatusCode::kInvalidArgument, "(b) has the same token"));
}

TEST(AccessPolicyTest, AnIdentitiesFileThatCannotBeReadIsAnError) {
  EXPECT_THAT(AccessPolicy::FromIdentitiesFile("/no/such/identities.json"),
              StatusIs(absl::StatusCode::kNotFound, "--identities_file=/no/such/identities.json"));
}

}  // namespace
}  // namespace ckpt

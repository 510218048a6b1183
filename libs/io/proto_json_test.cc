#include "libs/io/proto_json.h"

#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "libs/status/status_matchers.h"
#include "proto/ckpt/v1/types.pb.h"

namespace ckpt {
namespace {

v1::Lineage SomeLineage() {
  v1::Lineage lineage;
  lineage.set_run_id("run-1");
  lineage.set_parent_relation("fine_tuned_from");
  return lineage;
}

TEST(ProtoToJsonTest, KeepsProtoFieldNamesAndPrintsDefaults) {
  ASSERT_OK_AND_ASSIGN(std::string json, ProtoToJson(SomeLineage()));
  EXPECT_EQ(json,
            R"({"run_id":"run-1","parent":"","parent_relation":"fine_tuned_from",)"
            R"("code_revision":"","dataset":"","producer_info":{}})");
  // A scalar's shape is an empty list, not missing; a zero is a zero; an unset message is absent.
  v1::TensorMeta scalar;
  scalar.set_key("step");
  ASSERT_OK_AND_ASSIGN(json, ProtoToJson(scalar));
  EXPECT_THAT(json, ::testing::HasSubstr(R"("shape":[])"));
  EXPECT_THAT(json, ::testing::HasSubstr(R"("byte_length":"0")"));
  v1::VersionMetadata metadata;
  ASSERT_OK_AND_ASSIGN(json, ProtoToJson(metadata));
  EXPECT_THAT(json, ::testing::HasSubstr(R"("epoch":"0")"));
  EXPECT_THAT(json, ::testing::Not(::testing::HasSubstr("lineage")));
}

TEST(ProtoToJsonTest, IndentedPutsOneFieldOnEachLine) {
  ASSERT_OK_AND_ASSIGN(std::string json, ProtoToJson(SomeLineage(), /*indented=*/true));
  EXPECT_THAT(json, ::testing::HasSubstr("\"run_id\": \"run-1\",\n"));
  EXPECT_THAT(json, ::testing::HasSubstr("\"parent_relation\": \"fine_tuned_from\",\n"));
}

TEST(JsonToProtoTest, ReadsWhatProtoToJsonWritesAndRefusesUnknownFields) {
  ASSERT_OK_AND_ASSIGN(std::string json, ProtoToJson(SomeLineage()));
  v1::Lineage read;
  ASSERT_OK(JsonToProto(json, read));
  EXPECT_EQ(read.run_id(), "run-1");
  EXPECT_EQ(read.parent_relation(), "fine_tuned_from");
  v1::Lineage camel;
  ASSERT_OK(JsonToProto(R"({"runId": "run-2"})", camel));
  EXPECT_EQ(camel.run_id(), "run-2");
  v1::Lineage refused;
  EXPECT_THAT(JsonToProto(R"({"run": "x"})", refused),
              ckpt::testing::StatusIs(absl::StatusCode::kInvalidArgument, "ckpt.v1.Lineage"));
  EXPECT_THAT(JsonToProto("not json", refused),
              ckpt::testing::StatusIs(absl::StatusCode::kInvalidArgument));
}

}  // namespace
}  // namespace ckpt

#include "libs/store/listing_page.h"

#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "libs/status/status_matchers.h"

namespace ckpt {
namespace {

using ::ckpt::testing::StatusIs;

std::vector<v1::ModelInfo> Models(std::vector<std::string> names) {
  std::vector<v1::ModelInfo> models;
  for (const std::string& name : names) models.emplace_back().set_name(name);
  return models;
}

std::vector<std::string> Names(const ListingPage<v1::ModelInfo>& page) {
  std::vector<std::string> names;
  for (const v1::ModelInfo& model : page.entries) names.push_back(model.name());
  return names;
}

TEST(ListingPageTest, ModelsPageByNameAndAModelAddedBetweenPagesShiftsNothing) {
  ASSERT_OK_AND_ASSIGN(ListingPage<v1::ModelInfo> first,
                       PageOfModels(Models({"c", "a", "d", "b"}), "", 2));
  EXPECT_EQ(Names(first), (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(first.next_page_token, "b");
  // "aa" sorts before the token: created between pages, it does not push "c" into page one.
  ASSERT_OK_AND_ASSIGN(ListingPage<v1::ModelInfo> second,
                       PageOfModels(Models({"c", "a", "aa", "d", "b"}), first.next_page_token, 2));
  EXPECT_EQ(Names(second), (std::vector<std::string>{"c", "d"}));
  EXPECT_EQ(second.next_page_token, "");
  EXPECT_THAT(PageOfModels(Models({"a"}), "not a name!", 2),
              StatusIs(absl::StatusCode::kInvalidArgument, "not one that ListModels returned"));
}

TEST(ListingPageTest, VersionsPageByNumber) {
  std::vector<v1::VersionInfo> versions;
  for (int64_t v : {3, 1, 7, 2}) versions.emplace_back().set_version(v);
  ASSERT_OK_AND_ASSIGN(ListingPage<v1::VersionInfo> page, PageOfVersions(versions, "2", 1));
  ASSERT_EQ(page.entries.size(), 1u);
  EXPECT_EQ(page.entries[0].version(), 3);
  EXPECT_EQ(page.next_page_token, "3");
  ASSERT_OK_AND_ASSIGN(page, PageOfVersions(versions, "3", 5));
  ASSERT_EQ(page.entries.size(), 1u);
  EXPECT_EQ(page.entries[0].version(), 7);
  EXPECT_EQ(page.next_page_token, "");
  EXPECT_THAT(PageOfVersions(versions, "0", 1), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(PageOfVersions(versions, "x", 1), StatusIs(absl::StatusCode::kInvalidArgument));
}

}  // namespace
}  // namespace ckpt

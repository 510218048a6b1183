#include "libs/store/listing_page.h"

#include <algorithm>
#include <cstdint>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "libs/store/version_ref.h"

namespace ckpt {

absl::StatusOr<ListingPage<v1::ModelInfo>> PageOfModels(std::vector<v1::ModelInfo> models,
                                                        absl::string_view page_token,
                                                        int page_size) {
  if (!page_token.empty() && !ValidateModelName(page_token).ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("page_token '", page_token, "' is not one that ListModels returned"));
  }
  std::sort(models.begin(), models.end(),
            [](const v1::ModelInfo& a, const v1::ModelInfo& b) { return a.name() < b.name(); });
  auto it = page_token.empty()
                ? models.begin()
                : std::upper_bound(models.begin(), models.end(), page_token,
                                   [](absl::string_view name, const v1::ModelInfo& model) {
                                     return name < model.name();
                                   });
  ListingPage<v1::ModelInfo> page;
  for (; it != models.end() && static_cast<int>(page.entries.size()) < page_size; ++it) {
    page.entries.push_back(std::move(*it));
  }
  if (it != models.end() && !page.entries.empty())
    page.next_page_token = page.entries.back().name();
  return page;
}

absl::StatusOr<ListingPage<v1::VersionInfo>> PageOfVersions(std::vector<v1::VersionInfo> versions,
                                                            absl::string_view page_token,
                                                            int page_size) {
  int64_t after = 0;  // The last version of the previous page.
  if (!page_token.empty() && (!absl::SimpleAtoi(page_token, &after) || after < 1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("page_token '", page_token, "' is not one that ListVersions returned"));
  }
  std::sort(
      versions.begin(), versions.end(),
      [](const v1::VersionInfo& a, const v1::VersionInfo& b) { return a.version() < b.version(); });
  auto it = std::upper_bound(
      versions.begin(), versions.end(), after,
      [](int64_t version, const v1::VersionInfo& info) { return version < info.version(); });
  ListingPage<v1::VersionInfo> page;
  for (; it != versions.end() && static_cast<int>(page.entries.size()) < page_size; ++it) {
    page.entries.push_back(std::move(*it));
  }
  if (it != versions.end() && !page.entries.empty()) {
    page.next_page_token = absl::StrCat(page.entries.back().version());
  }
  return page;
}

}  // namespace ckpt

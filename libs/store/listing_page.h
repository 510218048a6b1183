#ifndef CKPT_LIBS_STORE_LISTING_PAGE_H_
#define CKPT_LIBS_STORE_LISTING_PAGE_H_

// One page of a model or version listing, for any front end that pages (the store service's
// ListModels / ListVersions). Pages are keyed by the last entry of the previous page (a model
// name, a version number), not by an offset, so models or versions created or deleted between
// pages neither repeat nor shift the listing.
//
// Example:
//   ASSIGN_OR_RETURN(ListingPage<v1::ModelInfo> page,
//                    PageOfModels(store.ListModels().value(), request.page_token(), 100));

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "proto/ckpt/v1/checkpoint_store.pb.h"

namespace ckpt {

template <typename Info>
struct ListingPage {
  std::vector<Info> entries;    // in order: by model name, or by version number.
  std::string next_page_token;  // empty on the last page.
};

// The page of `models` after `page_token` ("" for the first), at most `page_size` (>= 1) long.
// INVALID_ARGUMENT for a token that is not a model name.
absl::StatusOr<ListingPage<v1::ModelInfo>> PageOfModels(std::vector<v1::ModelInfo> models,
                                                        absl::string_view page_token,
                                                        int page_size);

// The same for `versions`; the token is a version number (>= 1).
absl::StatusOr<ListingPage<v1::VersionInfo>> PageOfVersions(std::vector<v1::VersionInfo> versions,
                                                            absl::string_view page_token,
                                                            int page_size);

}  // namespace ckpt

#endif  // CKPT_LIBS_STORE_LISTING_PAGE_H_

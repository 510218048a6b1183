#include "libs/testing/requirements.h"

#include <cstdlib>

#include "absl/strings/str_cat.h"

namespace ckpt::testing {

bool MissingRequirementsFail() {
  const char* ci = std::getenv("CKPT_CI");
  return ci != nullptr && absl::string_view(ci) != "" && absl::string_view(ci) != "0";
}

std::string MissingRequirementMessage(absl::string_view requirement) {
  if (MissingRequirementsFail()) {
    return absl::StrCat("this test needs ", requirement,
                        ", which this machine lacks; CKPT_CI is set, so it fails rather than "
                        "skips: CI must not pass a test it did not run");
  }
  return absl::StrCat("this test needs ", requirement,
                      ", which this machine lacks: skipped (with CKPT_CI=1, as in CI, it fails)");
}

}  // namespace ckpt::testing

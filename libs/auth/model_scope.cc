#include "libs/auth/model_scope.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace ckpt {

bool ModelPatternMatches(absl::string_view pattern, absl::string_view name) {
  // Iterative glob with one backtrack point: linear enough for model names.
  size_t p = 0, n = 0, star = absl::string_view::npos, resume = 0;
  while (n < name.size()) {
    if (p < pattern.size() && (pattern[p] == '?' || pattern[p] == name[n])) {
      ++p;
      ++n;
    } else if (p < pattern.size() && pattern[p] == '*') {
      star = p++;
      resume = n;
    } else if (star != absl::string_view::npos) {
      p = star + 1;
      n = ++resume;
    } else {
      return false;
    }
  }
  while (p < pattern.size() && pattern[p] == '*') ++p;
  return p == pattern.size();
}

bool ModelScope::Covers(absl::string_view model) const {
  if (patterns_.empty()) return true;
  for (const std::string& pattern : patterns_) {
    if (ModelPatternMatches(pattern, model)) return true;
  }
  return false;
}

std::string ModelScope::Describe() const {
  if (patterns_.empty()) return "every model";
  return absl::StrCat("models matching ", absl::StrJoin(patterns_, ", "));
}

}  // namespace ckpt

#ifndef CKPT_LIBS_AUTH_MODEL_SCOPE_H_
#define CKPT_LIBS_AUTH_MODEL_SCOPE_H_

// ModelScope: the models a caller may see, as shell-style name patterns ("team-a-*": '*' matches
// any run of characters, '?' one character). An empty pattern list is the whole store. The one
// place that says whether a model is inside a scope: AccessPolicy asks it for calls that name a
// model, ScopedStore for every call, including those that name none.
//
// Example:
//   ModelScope scope({"team-a-*", "shared-embeddings"});
//   scope.Covers("team-a-ranker");  // true
//   scope.Covers("team-b-ranker");  // false
//   ModelScope().Covers("anything");  // true: unrestricted

#include <string>
#include <vector>

#include "absl/strings/string_view.h"

namespace ckpt {

// Shell-style match of `name` against `pattern` ('*' any run, '?' one character).
bool ModelPatternMatches(absl::string_view pattern, absl::string_view name);

class ModelScope {
 public:
  // The whole store.
  ModelScope() = default;
  // Models matching any of `patterns`; empty: the whole store.
  explicit ModelScope(std::vector<std::string> patterns) : patterns_(std::move(patterns)) {}

  // Whether the scope is the whole store.
  bool unrestricted() const { return patterns_.empty(); }
  bool Covers(absl::string_view model) const;
  const std::vector<std::string>& patterns() const { return patterns_; }
  // "models matching team-a-*, shared-embeddings", or "every model": for error messages.
  std::string Describe() const;

 private:
  std::vector<std::string> patterns_;
};

}  // namespace ckpt

#endif  // CKPT_LIBS_AUTH_MODEL_SCOPE_H_

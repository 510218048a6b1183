#include "libs/store/version_ref.h"

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace ckpt {
namespace {

bool IsNameChar(char c) {
  return absl::ascii_isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' || c == '-';
}

absl::Status ValidateName(absl::string_view what, absl::string_view name) {
  if (name.empty()) return absl::InvalidArgumentError(absl::StrCat(what, " name is empty"));
  if (name.size() > kMaxNameLength) {
    return absl::InvalidArgumentError(absl::StrCat(what, " name '", name.substr(0, 32), "...' has ",
                                                   name.size(), " characters; at most ",
                                                   kMaxNameLength));
  }
  for (size_t i = 0; i < name.size(); ++i) {
    if (!IsNameChar(name[i])) {
      return absl::InvalidArgumentError(absl::StrCat(
          what, " name '", absl::CHexEscape(name), "' has '", absl::CHexEscape(name.substr(i, 1)),
          "' at position ", i, "; allowed are letters, digits, '.', '_' and '-'"));
    }
  }
  return absl::OkStatus();
}

bool AllDigits(absl::string_view text) {
  for (char c : text) {
    if (!absl::ascii_isdigit(static_cast<unsigned char>(c))) return false;
  }
  return !text.empty();
}

}  // namespace

absl::Status ValidateModelName(absl::string_view model) { return ValidateName("model", model); }

absl::Status ValidateAliasName(absl::string_view alias) {
  absl::Status status = ValidateName("alias", alias);
  if (!status.ok()) return status;
  if (alias == kLatestAlias) {
    return absl::InvalidArgumentError(
        "alias 'latest' is reserved: it always means the newest version");
  }
  if (alias[0] == '-' || alias[0] == '.') {
    return absl::InvalidArgumentError(absl::StrCat(
        "alias '", alias, "' starts with '", alias.substr(0, 1),
        "'; aliases start with a letter, digit or '_' (so '-1' is never read as an alias)"));
  }
  if (AllDigits(alias)) {
    return absl::InvalidArgumentError(
        absl::StrCat("alias '", alias, "' is all digits, which would read as a version number"));
  }
  return absl::OkStatus();
}

absl::Status ValidateIdempotencyKey(absl::string_view key) {
  constexpr size_t kMaxIdempotencyKeyLength = 128;
  if (key.size() > kMaxIdempotencyKeyLength) {
    return absl::InvalidArgumentError(absl::StrCat("idempotency key of ", key.size(),
                                                   " characters; at most ",
                                                   kMaxIdempotencyKeyLength, " are allowed"));
  }
  for (const char c : key) {
    if (c <= ' ' || c > '~') {
      return absl::InvalidArgumentError(absl::StrCat(
          "idempotency key '", absl::CHexEscape(key),
          "' holds a character that is not printable ASCII (or a space); keys are tokens"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<v1::VersionRef> ParseVersionRef(absl::string_view text) {
  const size_t at = text.find('@');
  const absl::string_view model = text.substr(0, at);
  absl::Status model_ok = ValidateModelName(model);
  if (!model_ok.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("bad version reference '", absl::CHexEscape(text), "': ", model_ok.message(),
                     " (expected MODEL, MODEL@VERSION or MODEL@ALIAS)"));
  }
  v1::VersionRef ref;
  ref.set_model(std::string(model));
  if (at == absl::string_view::npos) {
    ref.set_alias(std::string(kLatestAlias));
    return ref;
  }
  const absl::string_view part = text.substr(at + 1);
  if (AllDigits(part)) {
    int64_t version = 0;
    if (!absl::SimpleAtoi(part, &version) || version < 1) {
      return absl::InvalidArgumentError(absl::StrCat(
          "bad version reference '", text, "': version must be a number from 1 to 2^63-1"));
    }
    ref.set_version(version);
    return ref;
  }
  if (part != kLatestAlias) {
    absl::Status alias_ok = ValidateAliasName(part);
    if (!alias_ok.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "bad version reference '", absl::CHexEscape(text), "': ", alias_ok.message()));
    }
  }
  ref.set_alias(std::string(part));
  return ref;
}

std::string FormatVersionRef(const v1::VersionRef& ref) {
  switch (ref.ref_case()) {
    case v1::VersionRef::kVersion:
      return absl::StrCat(ref.model(), "@", ref.version());
    case v1::VersionRef::kAlias:
      return absl::StrCat(ref.model(), "@", ref.alias().empty() ? kLatestAlias : ref.alias());
    default:
      return absl::StrCat(ref.model(), "@", kLatestAlias);
  }
}

std::string FormatVersionRef(absl::string_view model, int64_t version) {
  return absl::StrCat(model, "@", version);
}

v1::VersionRef MakeVersionRef(absl::string_view model, int64_t version) {
  v1::VersionRef ref;
  ref.set_model(std::string(model));
  ref.set_version(version);
  return ref;
}

}  // namespace ckpt

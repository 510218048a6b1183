#ifndef CKPT_LIBS_STATUS_STATUS_MATCHERS_H_
#define CKPT_LIBS_STATUS_STATUS_MATCHERS_H_

// GoogleTest helpers for absl::Status / absl::StatusOr<T> (testonly).
//
//   ASSERT_OK(store.Put(...));
//   ASSERT_OK_AND_ASSIGN(Manifest manifest, store.GetManifest(ref));
//   EXPECT_THAT(store.GetManifest(missing), StatusIs(absl::StatusCode::kNotFound, "model@9"));
//   EXPECT_THAT(result, StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("shape")));

#include <ostream>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "libs/status/status_macros.h"

namespace ckpt::testing {

namespace internal {

inline const absl::Status& GetStatus(const absl::Status& status) { return status; }

template <typename T>
const absl::Status& GetStatus(const absl::StatusOr<T>& status_or) {
  return status_or.status();
}

template <typename StatusType>
class StatusIsMatcherImpl : public ::testing::MatcherInterface<StatusType> {
 public:
  StatusIsMatcherImpl(absl::StatusCode code, ::testing::Matcher<const std::string&> message)
      : code_(code), message_(std::move(message)) {}

  bool MatchAndExplain(StatusType actual, ::testing::MatchResultListener* listener) const override {
    const absl::Status& status = GetStatus(actual);
    *listener << "whose status is " << status;
    if (status.code() != code_) return false;
    return message_.MatchAndExplain(std::string(status.message()), listener);
  }

  void DescribeTo(std::ostream* os) const override {
    *os << "has status code " << absl::StatusCodeToString(code_) << " and a message that ";
    message_.DescribeTo(os);
  }

  void DescribeNegationTo(std::ostream* os) const override {
    *os << "does not have status code " << absl::StatusCodeToString(code_)
        << " or has a message that ";
    message_.DescribeNegationTo(os);
  }

 private:
  absl::StatusCode code_;
  ::testing::Matcher<const std::string&> message_;
};

class StatusIsMatcher {
 public:
  StatusIsMatcher(absl::StatusCode code, ::testing::Matcher<const std::string&> message)
      : code_(code), message_(std::move(message)) {}

  template <typename StatusType>
  operator ::testing::Matcher<StatusType>() const {  // NOLINT: implicit by design.
    return ::testing::Matcher<StatusType>(
        new StatusIsMatcherImpl<const StatusType&>(code_, message_));
  }

 private:
  absl::StatusCode code_;
  ::testing::Matcher<const std::string&> message_;
};

}  // namespace internal

// Matches an absl::Status or absl::StatusOr<T> with `code` whose message matches `message`
// (a matcher, or a plain string -- char* or std::string -- meaning "contains this substring").
inline internal::StatusIsMatcher StatusIs(absl::StatusCode code,
                                          ::testing::Matcher<const std::string&> message) {
  return internal::StatusIsMatcher(code, std::move(message));
}

inline internal::StatusIsMatcher StatusIs(absl::StatusCode code, const char* substring) {
  return internal::StatusIsMatcher(code, ::testing::HasSubstr(substring));
}

inline internal::StatusIsMatcher StatusIs(absl::StatusCode code, const std::string& substring) {
  return internal::StatusIsMatcher(code, ::testing::HasSubstr(substring));
}

inline internal::StatusIsMatcher StatusIs(absl::StatusCode code) {
  return internal::StatusIsMatcher(code, ::testing::_);
}

// Matches an OK absl::Status or an absl::StatusOr<T> that holds a value.
inline internal::StatusIsMatcher IsOk() { return StatusIs(absl::StatusCode::kOk); }

}  // namespace ckpt::testing

#define EXPECT_OK(expr) EXPECT_THAT((expr), ::ckpt::testing::IsOk())
#define ASSERT_OK(expr) ASSERT_THAT((expr), ::ckpt::testing::IsOk())

// Asserts that `rexpr` (an absl::StatusOr<T>) holds a value and move-assigns it to `lhs`.
#define ASSERT_OK_AND_ASSIGN(lhs, rexpr) \
  CKPT_ASSERT_OK_AND_ASSIGN_IMPL_(CKPT_STATUS_CONCAT_(ckpt_status_or_, __LINE__), lhs, rexpr)

#define CKPT_ASSERT_OK_AND_ASSIGN_IMPL_(status_or, lhs, rexpr) \
  auto status_or = (rexpr);                                    \
  ASSERT_TRUE(status_or.ok()) << status_or.status();           \
  lhs = std::move(status_or).value()

#endif  // CKPT_LIBS_STATUS_STATUS_MATCHERS_H_

#ifndef CKPT_LIBS_TESTING_REQUIREMENTS_H_
#define CKPT_LIBS_TESTING_REQUIREMENTS_H_

// Tests that need something of the machine which a developer's machine may lack (root, a second
// uid, Ceph, a private mount namespace), testonly. Where it is missing, CKPT_REQUIRE skips the
// test through gtest (the test log says "[  SKIPPED ]" with the reason, and test.xml marks it
// skipped), so `bazel test //...` passes on a laptop; but where $CKPT_CI is set to anything other
// than "" or "0" it fails the test instead, so that a CI machine which lost a requirement (Ceph
// not installed, not running as root) cannot pass these tests without running them. CI sets it:
// `bazel test --test_env=CKPT_CI=1` (.ci/run).
//
// Use it in a test body, SetUp(), or a ::testing::Environment's SetUp() (skipping or failing
// every test of the binary); it returns from the enclosing void function when the requirement is
// missing.
//
// Example:
//   TEST(ShmTest, SocketServedByAnotherUidIsRefused) {
//     CKPT_REQUIRE(geteuid() == 0, "root, to serve a socket as another uid");
//     ...
//   }

#include <string>

#include "absl/strings/string_view.h"
#include "gtest/gtest.h"

namespace ckpt::testing {

// Whether a missing requirement fails the test ($CKPT_CI set, not "0") rather than skips it.
bool MissingRequirementsFail();

// What CKPT_REQUIRE says about `requirement` ("root, to ...", "Ceph (radosgw)") being missing.
std::string MissingRequirementMessage(absl::string_view requirement);

}  // namespace ckpt::testing

// Skips the test (locally) or fails it (in CI) when `available` is false; see above.
#define CKPT_REQUIRE(available, requirement)                                     \
  do {                                                                           \
    if (!(available)) {                                                          \
      if (::ckpt::testing::MissingRequirementsFail()) {                          \
        GTEST_FAIL() << ::ckpt::testing::MissingRequirementMessage(requirement); \
      }                                                                          \
      GTEST_SKIP() << ::ckpt::testing::MissingRequirementMessage(requirement);   \
    }                                                                            \
  } while (false)

#endif  // CKPT_LIBS_TESTING_REQUIREMENTS_H_

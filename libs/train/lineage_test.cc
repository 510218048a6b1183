#include "libs/train/lineage.h"

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <regex>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"

namespace ckpt::train {
namespace {

std::string TmpPath(const std::string& name) {
  return absl::StrCat(std::getenv("TEST_TMPDIR"), "/", name);
}

bool HaveGit() { return std::system("git --version >/dev/null 2>&1") == 0; }

// Runs a shell command in `dir`, with a git identity and no user or system configuration.
int Shell(const std::string& dir, const std::string& command) {
  return std::system(absl::StrCat("cd '", dir, "' && export HOME='", dir,
                                  "' GIT_CONFIG_NOSYSTEM=1 GIT_AUTHOR_NAME=t "
                                  "GIT_AUTHOR_EMAIL=t@example.com GIT_COMMITTER_NAME=t "
                                  "GIT_COMMITTER_EMAIL=t@example.com && (",
                                  command, ") >/dev/null 2>&1")
                         .c_str());
}

TEST(LineageTest, RunIdsNameTheModelAndTimeAndDifferPerRun) {
  const absl::Time start = absl::FromUnixSeconds(1714564800);  // 2024-05-01 12:00:00 UTC
  const std::string a = NewRunId("mlp-synthetic", start);
  const std::string b = NewRunId("mlp-synthetic", start);
  EXPECT_TRUE(std::regex_match(a, std::regex("mlp-synthetic-20240501T120000Z-[0-9a-f]{8}"))) << a;
  EXPECT_NE(a, b);
}

TEST(LineageTest, GitRevisionIsTheCheckedOutCommitAndDirtyWhenModified) {
  if (!HaveGit()) {
    // Without git there is no revision, and no error.
    EXPECT_EQ(GitCodeRevision(TmpPath("")), "");
    GTEST_SKIP() << "git is not installed";
  }
  const std::string repo = TmpPath("repo");
  std::filesystem::create_directories(repo);
  ASSERT_EQ(Shell(repo, "git init -q ."), 0);
  EXPECT_EQ(GitCodeRevision(repo), "") << "a checkout without a commit has no revision";
  std::ofstream(repo + "/train.py") << "print('hello')\n";
  ASSERT_EQ(Shell(repo, "git add train.py && git commit -q -m first"), 0);
  ASSERT_EQ(Shell(repo, "git rev-parse HEAD > ../head.txt"), 0);
  std::string head;
  std::ifstream(TmpPath("head.txt")) >> head;
  ASSERT_EQ(head.size(), 40u);

  EXPECT_EQ(GitCodeRevision(repo), head);
  // A subdirectory of the checkout has the checkout's revision.
  std::filesystem::create_directories(repo + "/sub");
  EXPECT_EQ(GitCodeRevision(repo + "/sub"), head);
  std::filesystem::remove(repo + "/sub");

  std::ofstream(repo + "/train.py") << "print('changed')\n";
  EXPECT_EQ(GitCodeRevision(repo), head + "+dirty");
  ASSERT_EQ(Shell(repo, "git checkout -q -- train.py"), 0);
  EXPECT_EQ(GitCodeRevision(repo), head);
  std::ofstream(repo + "/untracked.txt") << "new\n";
  EXPECT_EQ(GitCodeRevision(repo), head + "+dirty");
}

TEST(LineageTest, NoRevisionOutsideACheckout) {
  const std::string plain = TmpPath("plain");
  std::filesystem::create_directories(plain);
  // A ceiling keeps git from finding a checkout above TEST_TMPDIR (it normally sits outside any).
  setenv("GIT_CEILING_DIRECTORIES", std::getenv("TEST_TMPDIR"), 1);
  EXPECT_EQ(GitCodeRevision(plain), "");
  EXPECT_EQ(GitCodeRevision(TmpPath("does-not-exist")), "");
  unsetenv("GIT_CEILING_DIRECTORIES");
}

}  // namespace
}  // namespace ckpt::train

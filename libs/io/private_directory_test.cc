#include "libs/io/private_directory.h"

#include <sys/stat.h>

#include <filesystem>

#include "gtest/gtest.h"
#include "libs/status/status_matchers.h"

namespace ckpt {
namespace {

TEST(PrivateDirectoryTest, FilesAreOwnerOnlyAndGoWithTheDirectory) {
  std::string dir;
  {
    ASSERT_OK_AND_ASSIGN(PrivateDirectory private_dir, PrivateDirectory::Create("ckpt-test"));
    dir = private_dir.path();
    struct stat info;
    ASSERT_EQ(::stat(dir.c_str(), &info), 0);
    EXPECT_EQ(info.st_mode & 0777, 0700);
    ASSERT_OK_AND_ASSIGN(std::string path, private_dir.Write("key.pem", "secret"));
    ASSERT_EQ(::stat(path.c_str(), &info), 0);
    EXPECT_EQ(info.st_mode & 0777, 0600);
    EXPECT_EQ(info.st_size, 6);
    PrivateDirectory moved = std::move(private_dir);
    EXPECT_TRUE(std::filesystem::exists(path));
  }
  EXPECT_FALSE(std::filesystem::exists(dir));
}

}  // namespace
}  // namespace ckpt

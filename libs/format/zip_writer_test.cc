#include "libs/format/zip_writer.h"

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "libs/format/byte_source.h"
#include "libs/format/zip_reader.h"
#include "libs/status/status_matchers.h"

namespace ckpt {
namespace {

using ::ckpt::testing::StatusIs;

// Entries of awkward sizes (empty, one byte, not a multiple of the alignment) and long names, so
// that padding differs from entry to entry.
std::vector<std::pair<std::string, std::string>> Entries() {
  std::vector<std::pair<std::string, std::string>> entries;
  entries.emplace_back("archive/data.pkl", std::string(131, 'p'));
  entries.emplace_back("archive/byteorder", "little");
  entries.emplace_back("archive/data/0", "");
  entries.emplace_back("archive/data/1", std::string(1, '\x7f'));
  entries.emplace_back(absl::StrCat("archive/data/", std::string(300, 'k')),
                       std::string(4099, 'x'));
  entries.emplace_back("archive/version", "3\n");
  return entries;
}

std::string Write(const std::vector<std::pair<std::string, std::string>>& entries,
                  ZipWriterOptions options) {
  std::string file;
  ZipWriter zip(
      [&](absl::string_view bytes) {
        file.append(bytes.data(), bytes.size());
        return absl::OkStatus();
      },
      options);
  for (const auto& [name, data] : entries) EXPECT_OK(zip.AddEntry(name, data));
  EXPECT_OK(zip.Finish());
  EXPECT_EQ(zip.bytes_written(), file.size());
  return file;
}

TEST(ZipWriterTest, PlannedBytesIsTheSizeOfTheWrittenFile) {
  for (const bool zip64 : {false, true}) {
    for (const int alignment : {1, 64}) {
      ZipWriterOptions options;
      options.force_zip64 = zip64;
      options.alignment = alignment;
      const std::string file = Write(Entries(), options);
      std::vector<std::pair<std::string, uint64_t>> sizes;
      for (const auto& [name, data] : Entries()) sizes.emplace_back(name, data.size());
      EXPECT_EQ(ZipWriter::PlannedBytes(sizes, options), file.size())
          << "zip64=" << zip64 << " alignment=" << alignment;

      // What a streamed writer sends is a zip the reader accepts, every record aligned.
      std::unique_ptr<ByteSource> source = MemorySource(file, "streamed.zip");
      ASSERT_OK_AND_ASSIGN(ZipReader reader, ZipReader::Open(source.get()));
      ASSERT_EQ(reader.entries().size(), Entries().size());
      for (const auto& [name, data] : Entries()) {
        const ZipEntry* entry = reader.Find(name);
        ASSERT_NE(entry, nullptr) << name;
        ASSERT_OK_AND_ASSIGN(uint64_t offset, reader.DataOffset(*entry));
        EXPECT_EQ(offset % alignment, 0u) << name;
        ASSERT_OK_AND_ASSIGN(std::string read, reader.ReadToString(*entry, 1 << 20));
        EXPECT_EQ(read, data) << name;
      }
    }
  }
}

TEST(ZipWriterTest, SinkErrorsAndDuplicateNamesFailTheCall) {
  ZipWriter failing([](absl::string_view) { return absl::ResourceExhaustedError("disk full"); });
  EXPECT_THAT(failing.AddEntry("a", "bytes"), StatusIs(absl::StatusCode::kResourceExhausted));

  std::string file;
  ZipWriter zip([&](absl::string_view bytes) {
    file.append(bytes.data(), bytes.size());
    return absl::OkStatus();
  });
  ASSERT_OK(zip.AddEntry("a", "1"));
  EXPECT_THAT(zip.AddEntry("a", "2"), StatusIs(absl::StatusCode::kInvalidArgument, "duplicate"));
  EXPECT_THAT(zip.AddEntry("", "2"), StatusIs(absl::StatusCode::kInvalidArgument, "1..65535"));
  ASSERT_OK(zip.Finish());
  EXPECT_THAT(zip.AddEntry("b", "2"), StatusIs(absl::StatusCode::kFailedPrecondition));
}

}  // namespace
}  // namespace ckpt

#include "libs/format/zip_reader.h"

#include <cstdlib>
#include <fstream>
#include <iterator>
#include <sstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "libs/format/byte_source.h"
#include "libs/format/testing/zip_builder.h"
#include "libs/status/status_matchers.h"

namespace ckpt {
namespace {

using ::ckpt::testing::StatusIs;
using ::ckpt::testing::ZipBuilder;

void Poke32(std::string& bytes, uint64_t offset, uint32_t value) {
  for (int i = 0; i < 4; ++i) bytes[offset + i] = static_cast<char>((value >> (8 * i)) & 0xFF);
}
void Poke16(std::string& bytes, uint64_t offset, uint16_t value) {
  bytes[offset] = static_cast<char>(value & 0xFF);
  bytes[offset + 1] = static_cast<char>(value >> 8);
}

absl::StatusOr<std::string> ReadAll(absl::string_view archive, const std::string& name) {
  std::unique_ptr<ByteSource> source = MemorySource(archive, "test.zip");
  ASSIGN_OR_RETURN(ZipReader zip, ZipReader::Open(source.get()));
  const ZipEntry* entry = zip.Find(name);
  if (entry == nullptr) return absl::NotFoundError(name);
  return zip.ReadToString(*entry, 1 << 20);
}

ZipBuilder TwoEntries() {
  ZipBuilder zip;
  zip.Add("archive/data.pkl", "pickle bytes");
  zip.Add("archive/data/0", std::string(100, '\x7f'));
  return zip;
}

TEST(ZipReaderTest, ListsAndReadsStoredEntries) {
  const std::string archive = TwoEntries().Finish();
  std::unique_ptr<ByteSource> source = MemorySource(archive, "test.zip");
  ASSERT_OK_AND_ASSIGN(ZipReader zip, ZipReader::Open(source.get()));
  ASSERT_EQ(zip.entries().size(), 2u);
  EXPECT_EQ(zip.entries()[0].name, "archive/data.pkl");
  EXPECT_EQ(zip.entries()[1].uncompressed_size, 100u);
  EXPECT_EQ(zip.Find("missing"), nullptr);
  ASSERT_OK_AND_ASSIGN(std::string data, zip.ReadToString(*zip.Find("archive/data/0"), 1000));
  EXPECT_EQ(data, std::string(100, '\x7f'));
  ASSERT_OK_AND_ASSIGN(uint64_t offset, zip.DataOffset(*zip.Find("archive/data/0")));
  EXPECT_EQ(offset % 64, 0u);
  EXPECT_TRUE(ZipReader::HasZipMagic(archive));
  EXPECT_FALSE(ZipReader::HasZipMagic("\x80\x02\x8a\x0a"));
}

TEST(ZipReaderTest, ReadsZip64RecordsAndSizes) {
  ZipBuilder::Options options;
  options.zip64 = true;
  const std::string archive = TwoEntries().Finish(options);
  ASSERT_OK_AND_ASSIGN(std::string pickle, ReadAll(archive, "archive/data.pkl"));
  EXPECT_EQ(pickle, "pickle bytes");
  ASSERT_OK_AND_ASSIGN(std::string data, ReadAll(archive, "archive/data/0"));
  EXPECT_EQ(data.size(), 100u);
}

TEST(ZipReaderTest, FindsTheEndRecordBeforeAComment) {
  ZipBuilder::Options options;
  options.comment = "a comment that mentions PK\x05\x06 itself";
  ASSERT_OK_AND_ASSIGN(std::string pickle,
                       ReadAll(TwoEntries().Finish(options), "archive/data.pkl"));
  EXPECT_EQ(pickle, "pickle bytes");
}

TEST(ZipReaderTest, ReadsAnArchiveWrittenByPythonZipfile) {
  const std::string dir = std::getenv("TEST_TMPDIR") ? std::getenv("TEST_TMPDIR") : "/tmp";
  const std::string path = dir + "/python.zip";
  const std::string python = std::getenv("PYTHON") ? std::getenv("PYTHON") : "/usr/bin/python3";
  const std::string script = absl::StrCat(
      "import zipfile\n"
      "with zipfile.ZipFile('",
      path,
      "', 'w', zipfile.ZIP_STORED) as z:\n"
      "  z.writestr('a/data.pkl', b'abc' * 1000)\n"
      "  with z.open('a/big', 'w', force_zip64=True) as f: f.write(bytes(range(256)))\n");
  const std::string script_path = dir + "/write_zip.py";
  std::ofstream(script_path) << script;
  ASSERT_EQ(std::system((python + " " + script_path).c_str()), 0);
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<ByteSource> source, OpenFileSource(path));
  ASSERT_OK_AND_ASSIGN(ZipReader zip, ZipReader::Open(source.get()));
  ASSERT_OK_AND_ASSIGN(std::string pkl, zip.ReadToString(*zip.Find("a/data.pkl"), 1 << 20));
  EXPECT_EQ(pkl.size(), 3000u);
  ASSERT_OK_AND_ASSIGN(std::string big, zip.ReadToString(*zip.Find("a/big"), 1 << 20));
  ASSERT_EQ(big.size(), 256u);
  EXPECT_EQ(static_cast<unsigned char>(big[255]), 255);
}

TEST(ZipReaderTest, CorruptDataFailsTheCrcCheck) {
  ZipBuilder zip = TwoEntries();
  std::string archive = zip.Finish();
  archive[zip.layout().data_offsets[1] + 50] ^= 1;
  EXPECT_THAT(ReadAll(archive, "archive/data/0"),
              StatusIs(absl::StatusCode::kDataLoss, "'archive/data/0': CRC-32 mismatch"));
  // The other entry is still readable.
  EXPECT_OK(ReadAll(archive, "archive/data.pkl"));
}

TEST(ZipReaderTest, WrongCrcInTheDirectoryFailsTheCheck) {
  ZipBuilder zip;
  zip.AddWithCrc("x", "payload", 0x12345678);
  EXPECT_THAT(ReadAll(zip.Finish(), "x"),
              StatusIs(absl::StatusCode::kDataLoss, "central directory says 12345678"));
}

TEST(ZipReaderTest, EveryTruncationIsAnErrorNotACrash) {
  const std::string archive = TwoEntries().Finish();
  for (size_t size = 0; size < archive.size(); ++size) {
    const std::string cut = archive.substr(0, size);
    absl::StatusOr<std::string> result = ReadAll(cut, "archive/data/0");
    EXPECT_FALSE(result.ok()) << "prefix of " << size << " bytes";
  }
}

TEST(ZipReaderTest, ACutArchiveIsDataLoss) {
  const std::string archive = TwoEntries().Finish();
  EXPECT_THAT(ReadAll(archive.substr(0, archive.size() / 2), "x"),
              StatusIs(absl::StatusCode::kDataLoss, "the file is truncated?"));
}

TEST(ZipReaderTest, NonZipInputIsInvalidArgument) {
  EXPECT_THAT(ReadAll("", "x"), StatusIs(absl::StatusCode::kInvalidArgument, "only 0 bytes"));
  EXPECT_THAT(ReadAll(std::string(1000, 'a'), "x"),
              StatusIs(absl::StatusCode::kInvalidArgument, "no end-of-central-directory record"));
}

TEST(ZipReaderTest, EntryCountBeyondTheDirectoryIsRejected) {
  ZipBuilder zip = TwoEntries();
  std::string archive = zip.Finish();
  Poke16(archive, zip.layout().end_record_offset + 8, 60000);
  Poke16(archive, zip.layout().end_record_offset + 10, 60000);
  EXPECT_THAT(ReadAll(archive, "x"),
              StatusIs(absl::StatusCode::kInvalidArgument, "claims 60000 entries"));
}

TEST(ZipReaderTest, DirectoryOutsideTheFileIsRejected) {
  ZipBuilder zip = TwoEntries();
  std::string archive = zip.Finish();
  Poke32(archive, zip.layout().end_record_offset + 16, 0x7FFFFFF0);
  EXPECT_THAT(ReadAll(archive, "x"),
              StatusIs(absl::StatusCode::kInvalidArgument, "central directory ["));
}

TEST(ZipReaderTest, BadDirectorySignatureIsRejected) {
  ZipBuilder zip = TwoEntries();
  std::string archive = zip.Finish();
  archive[zip.layout().directory_offset] = 'X';
  EXPECT_THAT(ReadAll(archive, "x"),
              StatusIs(absl::StatusCode::kInvalidArgument, "entry 0 at offset"));
}

TEST(ZipReaderTest, LocalHeaderOffsetsAreChecked) {
  ZipBuilder zip = TwoEntries();
  std::string archive = zip.Finish();
  // Entry 0's central record: its local header offset is at +42. Point it at entry 1's data.
  Poke32(archive, zip.layout().directory_offset + 42,
         static_cast<uint32_t>(zip.layout().data_offsets[1]));
  EXPECT_THAT(ReadAll(archive, "archive/data.pkl"),
              StatusIs(absl::StatusCode::kInvalidArgument, "no local header signature"));
  Poke32(archive, zip.layout().directory_offset + 42, 0x7FFFFFF0);
  EXPECT_THAT(ReadAll(archive, "archive/data.pkl"),
              StatusIs(absl::StatusCode::kInvalidArgument, "not before the central directory"));
}

TEST(ZipReaderTest, SizesRunningIntoTheDirectoryAreRejected) {
  ZipBuilder zip = TwoEntries();
  std::string archive = zip.Finish();
  const uint64_t record = zip.layout().directory_offset;
  Poke32(archive, record + 20, 400);
  Poke32(archive, record + 24, 400);
  EXPECT_THAT(ReadAll(archive, "archive/data.pkl"),
              StatusIs(absl::StatusCode::kInvalidArgument, "does not end before the central"));
}

TEST(ZipReaderTest, DuplicateNamesAreRejected) {
  ZipBuilder zip;
  zip.Add("same", "a");
  zip.Add("same", "b");
  EXPECT_THAT(ReadAll(zip.Finish(), "same"),
              StatusIs(absl::StatusCode::kInvalidArgument, "duplicate entry 'same'"));
}

TEST(ZipReaderTest, MethodsOtherThanStoredAndDeflateAreUnimplemented) {
  ZipBuilder zip = TwoEntries();
  std::string archive = zip.Finish();
  Poke16(archive, zip.layout().directory_offset + 10, 12);  // bzip2
  EXPECT_THAT(ReadAll(archive, "archive/data.pkl"),
              StatusIs(absl::StatusCode::kUnimplemented, "compressed with method 12"));
}

// TorchScript archives deflate their code/ entries: a deflated entry written by Python's zipfile
// reads back, and one whose data or sizes are damaged is an error, never a crash or a huge
// allocation.
TEST(ZipReaderTest, ReadsDeflatedEntriesAndRefusesDamagedOnes) {
  const std::string dir = std::getenv("TEST_TMPDIR") ? std::getenv("TEST_TMPDIR") : "/tmp";
  const std::string path = dir + "/deflated.zip";
  const std::string python = std::getenv("PYTHON") ? std::getenv("PYTHON") : "/usr/bin/python3";
  const std::string script_path = dir + "/write_deflated.py";
  std::ofstream(script_path) << absl::StrCat(
      "import zipfile\n"
      "with zipfile.ZipFile('",
      path,
      "', 'w', zipfile.ZIP_DEFLATED) as z:\n"
      "  z.writestr('a/code/__torch__.py', b'class Net(Module):\\n' * 5000)\n");
  ASSERT_EQ(std::system((python + " " + script_path).c_str()), 0);
  std::ifstream in(path, std::ios::binary);
  const std::string archive((std::istreambuf_iterator<char>(in)), {});
  ASSERT_OK_AND_ASSIGN(std::string code, ReadAll(archive, "a/code/__torch__.py"));
  EXPECT_EQ(code.size(), 19u * 5000);
  EXPECT_EQ(code.substr(0, 19), "class Net(Module):\n");

  const size_t directory = archive.find("PK\x01\x02");
  ASSERT_NE(directory, std::string::npos);
  std::string damaged = archive;
  damaged[40] ^= 0x55;  // inside the deflate stream (the local header is 30 + 19 bytes)
  EXPECT_FALSE(ReadAll(damaged, "a/code/__torch__.py").ok());
  // A directory claiming a megabyte from a few hundred bytes: refused before allocating it.
  std::string bomb = archive;
  Poke32(bomb, directory + 24, (1u << 20) - 1);
  EXPECT_THAT(ReadAll(bomb, "a/code/__torch__.py"),
              StatusIs(absl::StatusCode::kInvalidArgument, "more than deflate can expand"));
  // Claiming a little more than the stream holds: the stream ends short.
  std::string longer = archive;
  Poke32(longer, directory + 24, 19u * 5000 + 7);
  EXPECT_THAT(ReadAll(longer, "a/code/__torch__.py"),
              StatusIs(absl::StatusCode::kDataLoss, "inflates to 95000 bytes, not the 95007"));
  std::string shorter = archive;
  Poke32(shorter, directory + 24, 19u * 5000 - 7);
  EXPECT_THAT(ReadAll(shorter, "a/code/__torch__.py"),
              StatusIs(absl::StatusCode::kDataLoss, "inflates to more than the 94993 bytes"));
}

TEST(ZipReaderTest, MissingZip64RecordIsRejected) {
  ZipBuilder zip = TwoEntries();
  std::string archive = zip.Finish();
  Poke32(archive, zip.layout().end_record_offset + 16, 0xFFFFFFFF);
  EXPECT_THAT(ReadAll(archive, "x"),
              StatusIs(absl::StatusCode::kInvalidArgument, "ZIP64 end record that is missing"));
}

TEST(ZipReaderTest, Zip64SentinelsWithoutExtraFieldAreRejected) {
  ZipBuilder zip = TwoEntries();
  std::string archive = zip.Finish();
  Poke32(archive, zip.layout().directory_offset + 24, 0xFFFFFFFF);
  EXPECT_THAT(ReadAll(archive, "x"),
              StatusIs(absl::StatusCode::kInvalidArgument, "no ZIP64 extra field"));
}

}  // namespace
}  // namespace ckpt

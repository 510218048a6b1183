#ifndef CKPT_LIBS_FORMAT_TESTING_ZIP_BUILDER_H_
#define CKPT_LIBS_FORMAT_TESTING_ZIP_BUILDER_H_

// ZipBuilder (testonly): writes small stored zip archives in memory, the way PyTorch's writer
// lays them out (64-byte aligned data, data descriptors), optionally with every size and offset in
// ZIP64 form, so tests can make well-formed archives and then damage exactly one field.
//
// Example:
//   ZipBuilder zip;
//   zip.Add("archive/data.pkl", pickle_bytes);
//   std::string bytes = zip.Finish();

#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"

namespace ckpt::testing {

class ZipBuilder {
 public:
  struct Options {
    // Write 0xFFFFFFFF in every 32-bit size / offset field and the real values in ZIP64 extra
    // fields, plus a ZIP64 end record and locator, as writers do for files over 4 GiB.
    bool zip64 = false;
    // Pad each local header's extra field so entry data starts at a multiple of 64 (PyTorch).
    bool align_data = true;
    // Archive comment after the end record.
    std::string comment;
  };

  // Adds a stored entry; AddWithCrc writes `crc` instead of the real CRC-32.
  void Add(std::string name, std::string data);
  void AddWithCrc(std::string name, std::string data, uint32_t crc);

  std::string Finish() const { return Finish(Options()); }
  std::string Finish(const Options& options) const;

  // Offsets of the last Finish, for tests that damage a specific field.
  struct Layout {
    std::vector<uint64_t> local_header_offsets;
    std::vector<uint64_t> data_offsets;
    uint64_t directory_offset = 0;
    uint64_t end_record_offset = 0;
  };
  const Layout& layout() const { return layout_; }

 private:
  struct Entry {
    std::string name;
    std::string data;
    uint32_t crc;
  };
  std::vector<Entry> entries_;
  mutable Layout layout_;
};

}  // namespace ckpt::testing

#endif  // CKPT_LIBS_FORMAT_TESTING_ZIP_BUILDER_H_

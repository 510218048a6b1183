#include "libs/format/testing/zip_builder.h"

#include <utility>

#include "libs/format/crc32.h"

namespace ckpt::testing {
namespace {

void Put16(std::string& out, uint16_t v) {
  out.push_back(static_cast<char>(v & 0xFF));
  out.push_back(static_cast<char>(v >> 8));
}
void Put32(std::string& out, uint32_t v) {
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xFF));
}
void Put64(std::string& out, uint64_t v) {
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xFF));
}

}  // namespace

void ZipBuilder::Add(std::string name, std::string data) {
  const uint32_t crc = Crc32(0, data);
  entries_.push_back({std::move(name), std::move(data), crc});
}

void ZipBuilder::AddWithCrc(std::string name, std::string data, uint32_t crc) {
  entries_.push_back({std::move(name), std::move(data), crc});
}

std::string ZipBuilder::Finish(const Options& options) const {
  layout_ = Layout();
  std::string out;
  for (const Entry& entry : entries_) {
    layout_.local_header_offsets.push_back(out.size());
    Put32(out, 0x04034b50);
    Put16(out, 20);
    Put16(out, 0x0808);  // Data descriptor + UTF-8 names, like PyTorch's writer.
    Put16(out, 0);       // Stored.
    Put16(out, 0);
    Put16(out, 0x21);
    Put32(out, 0);  // CRC and sizes live in the data descriptor and central directory.
    Put32(out, 0);
    Put32(out, 0);
    Put16(out, static_cast<uint16_t>(entry.name.size()));
    size_t extra = 0;
    if (options.align_data) {
      const size_t data_start = out.size() + 2 + entry.name.size() + 4;
      extra = 4 + (64 - data_start % 64) % 64;
    }
    Put16(out, static_cast<uint16_t>(extra));
    out += entry.name;
    if (extra > 0) {
      Put16(out, 0x4246);  // "FB", PyTorch's padding field.
      Put16(out, static_cast<uint16_t>(extra - 4));
      out.append(extra - 4, 'Z');
    }
    layout_.data_offsets.push_back(out.size());
    out += entry.data;
    Put32(out, 0x08074b50);
    Put32(out, entry.crc);
    if (options.zip64) {
      Put64(out, entry.data.size());
      Put64(out, entry.data.size());
    } else {
      Put32(out, static_cast<uint32_t>(entry.data.size()));
      Put32(out, static_cast<uint32_t>(entry.data.size()));
    }
  }
  layout_.directory_offset = out.size();
  for (size_t i = 0; i < entries_.size(); ++i) {
    const Entry& entry = entries_[i];
    Put32(out, 0x02014b50);
    Put16(out, 45);
    Put16(out, options.zip64 ? 45 : 20);
    Put16(out, 0x0808);
    Put16(out, 0);
    Put16(out, 0);
    Put16(out, 0x21);
    Put32(out, entry.crc);
    const uint32_t size32 = options.zip64 ? 0xFFFFFFFF : static_cast<uint32_t>(entry.data.size());
    Put32(out, size32);
    Put32(out, size32);
    Put16(out, static_cast<uint16_t>(entry.name.size()));
    Put16(out, options.zip64 ? 28 : 0);
    Put16(out, 0);  // Comment.
    Put16(out, 0);  // Disk.
    Put16(out, 0);
    Put32(out, 0);
    Put32(out, options.zip64 ? 0xFFFFFFFF : static_cast<uint32_t>(layout_.local_header_offsets[i]));
    out += entry.name;
    if (options.zip64) {
      Put16(out, 0x0001);
      Put16(out, 24);
      Put64(out, entry.data.size());
      Put64(out, entry.data.size());
      Put64(out, layout_.local_header_offsets[i]);
    }
  }
  const uint64_t directory_size = out.size() - layout_.directory_offset;
  if (options.zip64) {
    const uint64_t record_offset = out.size();
    Put32(out, 0x06064b50);
    Put64(out, 44);
    Put16(out, 45);
    Put16(out, 45);
    Put32(out, 0);
    Put32(out, 0);
    Put64(out, entries_.size());
    Put64(out, entries_.size());
    Put64(out, directory_size);
    Put64(out, layout_.directory_offset);
    Put32(out, 0x07064b50);
    Put32(out, 0);
    Put64(out, record_offset);
    Put32(out, 1);
  }
  layout_.end_record_offset = out.size();
  Put32(out, 0x06054b50);
  Put16(out, 0);
  Put16(out, 0);
  const uint16_t count16 = options.zip64 ? 0xFFFF : static_cast<uint16_t>(entries_.size());
  Put16(out, count16);
  Put16(out, count16);
  Put32(out, options.zip64 ? 0xFFFFFFFF : static_cast<uint32_t>(directory_size));
  Put32(out, options.zip64 ? 0xFFFFFFFF : static_cast<uint32_t>(layout_.directory_offset));
  Put16(out, static_cast<uint16_t>(options.comment.size()));
  out += options.comment;
  return out;
}

}  // namespace ckpt::testing

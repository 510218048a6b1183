#include "libs/store/change_log.h"

#include <cstring>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "libs/io/xxh3.h"

namespace ckpt {

namespace {

constexpr absl::string_view kMagic = "CKCL";
constexpr char kFormat = 1;
constexpr size_t kHeaderBytes = 4 + 1 + 8;
constexpr size_t kNameDigits = 20;

}  // namespace

std::string EncodeChangeFrame(absl::string_view payload) {
  std::string frame;
  frame.reserve(kHeaderBytes + payload.size());
  frame.append(kMagic.data(), kMagic.size());
  frame.push_back(kFormat);
  const uint64_t checksum = Xxh3(payload);
  for (int i = 0; i < 8; ++i) frame.push_back(static_cast<char>((checksum >> (8 * i)) & 0xff));
  frame.append(payload.data(), payload.size());
  return frame;
}

absl::StatusOr<absl::string_view> DecodeChangeFrame(absl::string_view frame,
                                                    absl::string_view where) {
  if (frame.size() < kHeaderBytes || frame.substr(0, kMagic.size()) != kMagic) {
    return absl::DataLossError(absl::StrCat(where, " is not a change record (", frame.size(),
                                            " bytes without the CKCL header)"));
  }
  if (frame[4] != kFormat) {
    return absl::DataLossError(absl::StrCat(where, " has change record format ",
                                            static_cast<int>(frame[4]), "; this build reads ",
                                            static_cast<int>(kFormat)));
  }
  uint64_t checksum = 0;
  for (int i = 0; i < 8; ++i) {
    checksum |= static_cast<uint64_t>(static_cast<unsigned char>(frame[5 + i])) << (8 * i);
  }
  const absl::string_view payload = frame.substr(kHeaderBytes);
  if (Xxh3(payload) != checksum) {
    return absl::DataLossError(absl::StrFormat(
        "%s is damaged: its %d bytes fail their checksum (xxh3 %016x, recorded %016x)", where,
        payload.size(), Xxh3(payload), checksum));
  }
  return payload;
}

std::string ChangeName(int64_t sequence) {
  return absl::StrFormat("%0*d", static_cast<int>(kNameDigits), sequence);
}

int64_t ChangeNumberFromName(absl::string_view name) {
  if (name.size() != kNameDigits) return -1;
  for (char c : name) {
    if (!absl::ascii_isdigit(static_cast<unsigned char>(c))) return -1;
  }
  int64_t number = 0;
  if (!absl::SimpleAtoi(name, &number) || number < 1) return -1;
  return number;
}

}  // namespace ckpt

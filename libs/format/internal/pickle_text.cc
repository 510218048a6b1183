#include "libs/format/internal/pickle_text.h"

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace ckpt::pickle_internal {
namespace {

void AppendUtf8(uint32_t code_point, std::string& out) {
  if (code_point < 0x80) {
    out.push_back(static_cast<char>(code_point));
  } else if (code_point < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (code_point >> 6)));
    out.push_back(static_cast<char>(0x80 | (code_point & 0x3F)));
  } else if (code_point < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (code_point >> 12)));
    out.push_back(static_cast<char>(0x80 | ((code_point >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (code_point & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (code_point >> 18)));
    out.push_back(static_cast<char>(0x80 | ((code_point >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((code_point >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (code_point & 0x3F)));
  }
}

int HexDigit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// Decodes UTF-8 into code points; false on malformed input.
bool DecodeUtf8(absl::string_view text, std::vector<uint32_t>& out) {
  for (size_t i = 0; i < text.size();) {
    const unsigned char c = static_cast<unsigned char>(text[i]);
    int length;
    uint32_t code_point;
    if (c < 0x80) {
      length = 1;
      code_point = c;
    } else if ((c & 0xE0) == 0xC0) {
      length = 2;
      code_point = c & 0x1F;
    } else if ((c & 0xF0) == 0xE0) {
      length = 3;
      code_point = c & 0x0F;
    } else if ((c & 0xF8) == 0xF0) {
      length = 4;
      code_point = c & 0x07;
    } else {
      return false;
    }
    if (i + length > text.size()) return false;
    for (int k = 1; k < length; ++k) {
      const unsigned char next = static_cast<unsigned char>(text[i + k]);
      if ((next & 0xC0) != 0x80) return false;
      code_point = (code_point << 6) | (next & 0x3F);
    }
    out.push_back(code_point);
    i += length;
  }
  return true;
}

}  // namespace

std::string LittleEndianToDecimal(absl::string_view bytes) {
  std::vector<uint8_t> magnitude(bytes.begin(), bytes.end());
  const bool negative = !magnitude.empty() && (magnitude.back() & 0x80);
  if (negative) {
    // Negate: invert and add one.
    int carry = 1;
    for (uint8_t& b : magnitude) {
      const int sum = static_cast<uint8_t>(~b) + carry;
      b = static_cast<uint8_t>(sum & 0xFF);
      carry = sum >> 8;
    }
  }
  // Repeated division by 10^9, most significant byte first.
  std::vector<uint8_t> digits(magnitude.rbegin(), magnitude.rend());
  std::string decimal;
  while (true) {
    size_t first = 0;
    while (first < digits.size() && digits[first] == 0) ++first;
    if (first == digits.size()) break;
    uint64_t remainder = 0;
    for (size_t i = first; i < digits.size(); ++i) {
      const uint64_t current = (remainder << 8) | digits[i];
      digits[i] = static_cast<uint8_t>(current / 1000000000);
      remainder = current % 1000000000;
    }
    std::string chunk = absl::StrFormat("%09d", remainder);
    decimal.insert(0, chunk);
  }
  absl::string_view trimmed = decimal;
  while (trimmed.size() > 1 && trimmed.front() == '0') trimmed.remove_prefix(1);
  if (trimmed.empty()) trimmed = "0";
  return absl::StrCat(negative ? "-" : "", trimmed);
}

absl::StatusOr<std::string> EscapeDecode(absl::string_view in) {
  std::string out;
  for (size_t i = 0; i < in.size(); ++i) {
    if (in[i] != '\\') {
      out.push_back(in[i]);
      continue;
    }
    if (++i == in.size()) return absl::InvalidArgumentError("STRING ends with a lone backslash");
    const char c = in[i];
    switch (c) {
      case '\n':
        break;
      case '\\':
        out.push_back('\\');
        break;
      case '\'':
        out.push_back('\'');
        break;
      case '"':
        out.push_back('"');
        break;
      case 'a':
        out.push_back('\a');
        break;
      case 'b':
        out.push_back('\b');
        break;
      case 'f':
        out.push_back('\f');
        break;
      case 'n':
        out.push_back('\n');
        break;
      case 'r':
        out.push_back('\r');
        break;
      case 't':
        out.push_back('\t');
        break;
      case 'v':
        out.push_back('\v');
        break;
      case 'x': {
        if (i + 2 >= in.size())
          return absl::InvalidArgumentError("STRING has a truncated \\x escape");
        const int high = HexDigit(in[i + 1]);
        const int low = HexDigit(in[i + 2]);
        if (high < 0 || low < 0)
          return absl::InvalidArgumentError("STRING has an invalid \\x escape");
        out.push_back(static_cast<char>(high * 16 + low));
        i += 2;
        break;
      }
      default:
        if (c >= '0' && c <= '7') {
          int value = c - '0';
          for (int k = 0; k < 2 && i + 1 < in.size() && in[i + 1] >= '0' && in[i + 1] <= '7'; ++k) {
            value = value * 8 + (in[++i] - '0');
          }
          out.push_back(static_cast<char>(value & 0xFF));
        } else {
          out.push_back('\\');
          out.push_back(c);
        }
    }
  }
  return out;
}

absl::StatusOr<std::string> RawUnicodeEscapeDecode(absl::string_view in) {
  std::string out;
  for (size_t i = 0; i < in.size(); ++i) {
    const unsigned char c = static_cast<unsigned char>(in[i]);
    if (c == '\\' && i + 1 < in.size() && (in[i + 1] == 'u' || in[i + 1] == 'U')) {
      // An odd run of backslashes escapes; Python counts preceding backslashes the same way.
      size_t backslashes = 0;
      for (size_t k = i; k-- > 0 && in[k] == '\\';) ++backslashes;
      if (backslashes % 2 == 0) {
        const int digits = in[i + 1] == 'u' ? 4 : 8;
        if (i + 2 + digits > in.size())
          return absl::InvalidArgumentError("UNICODE has a truncated \\u escape");
        uint32_t code_point = 0;
        for (int k = 0; k < digits; ++k) {
          const int d = HexDigit(in[i + 2 + k]);
          if (d < 0) return absl::InvalidArgumentError("UNICODE has an invalid \\u escape");
          code_point = code_point * 16 + d;
        }
        if (code_point > 0x10FFFF)
          return absl::InvalidArgumentError("UNICODE escape beyond U+10FFFF");
        AppendUtf8(code_point, out);
        i += 1 + digits;
        continue;
      }
    }
    AppendUtf8(c, out);  // Latin-1.
  }
  return out;
}

absl::StatusOr<std::string> EncodeText(const std::string& text, absl::string_view encoding) {
  const std::string lower = absl::AsciiStrToLower(encoding);
  if (lower == "utf-8" || lower == "utf8") return text;
  if (lower == "latin1" || lower == "latin-1" || lower == "iso-8859-1" || lower == "ascii") {
    std::vector<uint32_t> code_points;
    if (!DecodeUtf8(text, code_points))
      return absl::InvalidArgumentError("_codecs.encode of malformed UTF-8 text");
    std::string out;
    out.reserve(code_points.size());
    for (uint32_t c : code_points) {
      if (c > 0xFF)
        return absl::InvalidArgumentError(
            absl::StrCat("_codecs.encode: U+", absl::Hex(c), " does not fit ", encoding));
      out.push_back(static_cast<char>(c));
    }
    return out;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("_codecs.encode with unsupported encoding '", encoding, "'"));
}

}  // namespace ckpt::pickle_internal

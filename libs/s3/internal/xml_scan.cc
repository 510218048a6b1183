#include "libs/s3/internal/xml_scan.h"

#include <cstdint>
#include <cstdlib>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace ckpt::s3::internal {
namespace {

void AppendUtf8(uint32_t code_point, std::string* out) {
  if (code_point < 0x80) {
    out->push_back(static_cast<char>(code_point));
  } else if (code_point < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (code_point >> 6)));
    out->push_back(static_cast<char>(0x80 | (code_point & 0x3F)));
  } else if (code_point < 0x10000) {
    out->push_back(static_cast<char>(0xE0 | (code_point >> 12)));
    out->push_back(static_cast<char>(0x80 | ((code_point >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (code_point & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xF0 | (code_point >> 18)));
    out->push_back(static_cast<char>(0x80 | ((code_point >> 12) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | ((code_point >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (code_point & 0x3F)));
  }
}

}  // namespace

std::vector<absl::string_view> XmlElements(absl::string_view xml, absl::string_view tag) {
  std::vector<absl::string_view> out;
  const std::string open = absl::StrCat("<", tag);
  const std::string close = absl::StrCat("</", tag, ">");
  size_t at = 0;
  while ((at = xml.find(open, at)) != absl::string_view::npos) {
    const size_t after_name = at + open.size();
    if (after_name >= xml.size()) break;
    const char next = xml[after_name];
    if (next != '>' && next != ' ' && next != '/') {  // <KeyCount> is not <Key>.
      at = after_name;
      continue;
    }
    const size_t open_end = xml.find('>', after_name);
    if (open_end == absl::string_view::npos) break;
    if (xml[open_end - 1] == '/') {
      out.push_back(absl::string_view());
      at = open_end + 1;
      continue;
    }
    const size_t end = xml.find(close, open_end + 1);
    if (end == absl::string_view::npos) break;
    out.push_back(xml.substr(open_end + 1, end - open_end - 1));
    at = end + close.size();
  }
  return out;
}

std::optional<std::string> XmlText(absl::string_view xml, absl::string_view tag) {
  std::vector<absl::string_view> elements = XmlElements(xml, tag);
  if (elements.empty()) return std::nullopt;
  return XmlUnescape(elements.front());
}

std::string XmlUnescape(absl::string_view text) {
  std::string out;
  out.reserve(text.size());
  size_t i = 0;
  while (i < text.size()) {
    if (text[i] != '&') {
      out.push_back(text[i++]);
      continue;
    }
    const size_t semicolon = text.find(';', i);
    if (semicolon == absl::string_view::npos || semicolon - i > 12) {
      out.push_back(text[i++]);
      continue;
    }
    const absl::string_view entity = text.substr(i + 1, semicolon - i - 1);
    bool decoded = true;
    if (entity == "amp") {
      out.push_back('&');
    } else if (entity == "lt") {
      out.push_back('<');
    } else if (entity == "gt") {
      out.push_back('>');
    } else if (entity == "quot") {
      out.push_back('"');
    } else if (entity == "apos") {
      out.push_back('\'');
    } else if (entity.size() > 1 && entity[0] == '#') {
      uint32_t code_point = 0;
      const bool hex = entity[1] == 'x' || entity[1] == 'X';
      const absl::string_view digits = entity.substr(hex ? 2 : 1);
      decoded =
          hex ? absl::SimpleHexAtoi(digits, &code_point) : absl::SimpleAtoi(digits, &code_point);
      decoded = decoded && code_point <= 0x10FFFF;
      if (decoded) AppendUtf8(code_point, &out);
    } else {
      decoded = false;
    }
    if (decoded) {
      i = semicolon + 1;
    } else {
      out.push_back(text[i++]);
    }
  }
  return out;
}

std::string XmlEscape(absl::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (char c : text) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      case '\'':
        out += "&apos;";
        break;
      default:
        out.push_back(c);
    }
  }
  return out;
}

}  // namespace ckpt::s3::internal

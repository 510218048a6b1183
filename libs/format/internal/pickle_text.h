#ifndef CKPT_LIBS_FORMAT_INTERNAL_PICKLE_TEXT_H_
#define CKPT_LIBS_FORMAT_INTERNAL_PICKLE_TEXT_H_

// The pickle machine's text and number decoding (private to :pickle_reader; see
// internal/pickle_machine.h): pure functions of their arguments, so they can be read and tested
// without the machine. Their errors are INVALID_ARGUMENT without a location; the machine prefixes
// the pickle's name and the opcode's offset.

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace ckpt::pickle_internal {

// Two's-complement little-endian bytes (LONG1 / LONG4) to decimal text.
std::string LittleEndianToDecimal(absl::string_view bytes);

// Python's codecs.escape_decode, for protocol 0 STRING (the text between the quotes).
absl::StatusOr<std::string> EscapeDecode(absl::string_view in);

// Python's raw-unicode-escape decoding (protocol 0 UNICODE) to UTF-8.
absl::StatusOr<std::string> RawUnicodeEscapeDecode(absl::string_view in);

// _codecs.encode(text, encoding) for the encodings pickles use (utf-8, latin-1, ascii): `text` is
// UTF-8, the result the encoded bytes.
absl::StatusOr<std::string> EncodeText(const std::string& text, absl::string_view encoding);

}  // namespace ckpt::pickle_internal

#endif  // CKPT_LIBS_FORMAT_INTERNAL_PICKLE_TEXT_H_

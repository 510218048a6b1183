#ifndef CKPT_LIBS_FORMAT_ZIP_FORMAT_H_
#define CKPT_LIBS_FORMAT_ZIP_FORMAT_H_

// Record signatures and fixed sizes of the zip format (PKWARE APPNOTE 6.3, sections 4.3 and
// 4.5), shared by ZipReader and ZipWriter so the two can never disagree.

#include <cstdint>

namespace ckpt::zip {

inline constexpr uint32_t kLocalHeaderSignature = 0x04034b50;
inline constexpr uint32_t kCentralHeaderSignature = 0x02014b50;
inline constexpr uint32_t kEndSignature = 0x06054b50;
inline constexpr uint32_t kZip64EndSignature = 0x06064b50;
inline constexpr uint32_t kZip64LocatorSignature = 0x07064b50;
inline constexpr uint16_t kZip64ExtraId = 0x0001;

// Fixed parts of each record, before variable-length names, extras and comments.
inline constexpr uint64_t kLocalHeaderSize = 30;
inline constexpr uint64_t kCentralHeaderSize = 46;
inline constexpr uint64_t kEndSize = 22;
inline constexpr uint64_t kZip64EndSize = 56;
inline constexpr uint64_t kZip64LocatorSize = 20;

}  // namespace ckpt::zip

#endif  // CKPT_LIBS_FORMAT_ZIP_FORMAT_H_

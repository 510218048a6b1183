#ifndef CKPT_LIBS_FORMAT_SAFETENSORS_H_
#define CKPT_LIBS_FORMAT_SAFETENSORS_H_

// safetensors files (https://github.com/huggingface/safetensors, "Format"): an 8-byte
// little-endian header length N, N bytes of JSON
//   {"__metadata__": {"k": "v"}, "name": {"dtype": "F32", "shape": [2, 3],
//                                         "data_offsets": [BEGIN, END]}, ...}
// then the tensors' raw little-endian bytes, C order, BEGIN/END relative to the end of the header.
//
// The reader makes every check the reference implementation makes -- header length within the
// file and under 100 MB, UTF-8 JSON object starting with '{', known dtypes, offsets that tile the
// data buffer exactly (no gaps, no overlaps, nothing left over), byte lengths that match shapes
// without overflow -- and also rejects duplicate keys, which JSON parsers otherwise resolve
// silently. It never allocates more than the file's size justifies.
//
// The writer follows the reference layout: __metadata__ first, tensors ordered by element size
// (largest first, so every tensor is naturally aligned) then name, header padded with spaces to a
// multiple of 8 bytes.
//
// Example:
//   ASSIGN_OR_RETURN(SafetensorsFile file, ReadSafetensorsFile("model.safetensors"));
//   for (const StateDict::Entry& entry : file.tensors) ...
//   RETURN_IF_ERROR(WriteSafetensorsFile("copy.safetensors", file.tensors, file.header.metadata));

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "libs/format/byte_source.h"
#include "libs/tensor/dtype.h"
#include "libs/tensor/state_dict.h"

namespace ckpt {

// The reference implementation's limit on the JSON header.
inline constexpr uint64_t kSafetensorsMaxHeaderBytes = 100'000'000;

struct SafetensorsTensorInfo {
  std::string name;
  DType dtype = DType::kUnspecified;
  std::vector<int64_t> shape;
  uint64_t begin = 0;  // Offsets into the data buffer (after the header).
  uint64_t end = 0;
};

struct SafetensorsHeader {
  std::vector<SafetensorsTensorInfo> tensors;  // In data-offset order.
  std::map<std::string, std::string> metadata;
  uint64_t data_start = 0;  // 8 + header length.
};

struct SafetensorsFile {
  SafetensorsHeader header;
  StateDict tensors;  // CPU tensors in data-offset order.
};

// Parses and validates the header only; reads no tensor bytes. INVALID_ARGUMENT naming the
// source and the problem for anything that breaks the format; DATA_LOSS / UNAVAILABLE from the
// source.
absl::StatusOr<SafetensorsHeader> ReadSafetensorsHeader(const ByteSource& source);

// Header and every tensor, each read straight into its own buffer. FAILED_PRECONDITION for a
// dtype LibTorch 1.13 cannot hold (F8_*, U16/U32/U64); the header still parses.
absl::StatusOr<SafetensorsFile> ReadSafetensors(const ByteSource& source);
absl::StatusOr<SafetensorsFile> ReadSafetensorsFile(const std::string& path);

// What a tensor will be, for planning a file before its bytes exist.
struct SafetensorsTensorSpec {
  std::string name;
  DType dtype = DType::kUnspecified;
  std::vector<int64_t> shape;
};

// A file's layout: the bytes before the data (length + padded JSON) and where each tensor goes.
// Lets a writer stream tensors one at a time (the loader's export) without holding them all.
struct SafetensorsLayout {
  std::string header_bytes;                    // 8-byte length + JSON + padding.
  std::vector<SafetensorsTensorInfo> tensors;  // Write order; offsets relative to data start.
  uint64_t total_bytes = 0;                    // Whole file.
};

// INVALID_ARGUMENT for an empty or duplicate name, a dtype safetensors cannot name (complex32,
// complex128, quantized), a metadata key "__metadata__"-like clash, or a bad shape.
absl::StatusOr<SafetensorsLayout> PlanSafetensors(
    const std::vector<SafetensorsTensorSpec>& tensors,
    const std::map<std::string, std::string>& metadata);

// Writes `tensors` (any device, any strides; copied to contiguous CPU bytes one at a time)
// atomically: a crash or full disk leaves any previous file at `path` intact.
absl::Status WriteSafetensorsFile(const std::string& path, const StateDict& tensors,
                                  const std::map<std::string, std::string>& metadata);

}  // namespace ckpt

#endif  // CKPT_LIBS_FORMAT_SAFETENSORS_H_

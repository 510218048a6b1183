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

// ---- Hugging Face's sharded layout (what transformers' save_pretrained writes and
// from_pretrained reads): a directory holding model-00001-of-0000N.safetensors ... and
//   model.safetensors.index.json  {"metadata": {"total_size": N}, "weight_map": {key: shard}}
// where total_size is the tensors' bytes (headers excluded); or, when everything fits in one
// shard, model.safetensors alone.

inline constexpr char kSafetensorsIndexName[] = "model.safetensors.index.json";
inline constexpr char kSafetensorsSingleName[] = "model.safetensors";

// "model-00002-of-00005.safetensors" for index 2 (from 1) of 5.
std::string SafetensorsShardName(int index, int count);

// Splits tensors of these byte sizes, in this order, into shards as huggingface_hub's
// split_torch_state_dict_into_shards does: a shard takes tensors until the next would take it
// over `max_shard_bytes`; a tensor larger than that gets a shard of its own, ahead of the shard
// being filled (huggingface_hub's order). Returns each shard's tensor indices; `max_shard_bytes` 0
// means one shard.
std::vector<std::vector<size_t>> PlanSafetensorsShards(const std::vector<uint64_t>& tensor_bytes,
                                                       uint64_t max_shard_bytes);

// The index file's text (keys sorted, indent 2, trailing newline, as transformers writes it).
// `weight_map`: tensor name -> shard file name.
std::string SafetensorsIndexJson(uint64_t total_size,
                                 const std::map<std::string, std::string>& weight_map);

// What `path` names in that layout. `index` is set for an index file (a path ending in ".json")
// or a directory holding model.safetensors.index.json; `file` for a directory holding only
// model.safetensors; both empty for any other path (an ordinary checkpoint file). NOT_FOUND for a
// directory holding neither.
struct HuggingFaceLayout {
  std::string index;
  std::string file;
};
absl::StatusOr<HuggingFaceLayout> LocateHuggingFaceLayout(const std::string& path);

// A sharded checkpoint read as one state dict.
struct ShardedSafetensors {
  std::vector<std::string> shard_paths;  // In file-name order.
  uint64_t file_bytes = 0;               // All shards and the index.
  StateDict tensors;                     // Shard by shard, each in data-offset order.
  // Every shard's __metadata__; the first shard's value where shards differ.
  std::map<std::string, std::string> metadata;
  std::vector<std::string> warnings;  // e.g. a total_size that is not the tensors' bytes.
};

// Reads the index at `index_path` and every shard it names (beside it). Every shard's header is
// checked against the index before any tensor is read: NOT_FOUND naming a missing shard;
// INVALID_ARGUMENT for an index that is not {"weight_map": {key: file}} (a file name with a
// '/' included), a key the index maps to a shard that lacks it, a key two shards hold, a tensor a
// shard holds that the index maps elsewhere or not at all; errors of ReadSafetensors per shard.
absl::StatusOr<ShardedSafetensors> ReadShardedSafetensors(const std::string& index_path);

}  // namespace ckpt

#endif  // CKPT_LIBS_FORMAT_SAFETENSORS_H_

#ifndef CKPT_LIBS_FORMAT_TORCH_READER_H_
#define CKPT_LIBS_FORMAT_TORCH_READER_H_

// Reads files written by Python's torch.save without Python and without executing the pickle.
//
// Two formats:
//   "torch_zip"     the default since PyTorch 1.6: a stored zip archive <stem>/data.pkl (the
//                   pickle), <stem>/data/<key> (one record per storage), <stem>/version and,
//                   since PyTorch 2.1, <stem>/byteorder.
//   "torch_legacy"  _use_new_zipfile_serialization=False: magic-number pickle, protocol version
//                   pickle, sys_info pickle, the main pickle, the storage-key list pickle, then
//                   each storage as an 8-byte element count and its raw bytes.
// A TorchScript archive (torch.jit.save; format "torchscript") reads as its module's
// state_dict(), without running its code (torchscript_archive.h). The tar format of
// PyTorch < 0.4 and non-torch files are recognised and refused with a message saying what the
// file is.
//
// The result is the pickled object as a Value tree (pickle_reader.h): dicts, lists, numbers and
// Value::Tensor for every tensor and nn.Parameter. Tensors:
//   - land on the CPU whatever device they were saved from; the saving device's location tag
//     ("cpu", "cuda:1", "mps") is the Value's tensor_original_device(). Nothing needs that
//     device to exist, so a file saved on cuda:1 reads on a CPU-only machine;
//   - keep their dtype (every dtype LibTorch 1.13 has, including bfloat16, complex, bool and
//     quantized qint8 / quint8 / qint32 tensors with their scales and zero points), sizes,
//     strides and storage offset: a view of a shared storage stays a view, and tensors that
//     share a storage in the file (tied weights) share one buffer here;
//   - keep requires_grad (set for nn.Parameter, as torch.load does).
// Each storage record is read once, straight into its tensor buffer, and checked against its
// CRC-32; memory use is about the tensor bytes plus the pickle.
//
// Objects outside the allow-list (user classes, whole nn.Module objects) come back as
// Value::Opaque with their pickled state; module_state.h recovers state dicts from them. Every
// such class is named once in `warnings`. numpy scalars (numpy.float64 etc.) become Int / Float /
// Bool; torch.Size a Tuple; torch.device and torch dtypes Opaque("torch.device", args) and
// Opaque("torch.float32"). Tensors whose dtype LibTorch 1.13 lacks (float8, uint16/32/64 from
// newer PyTorch) are kept as Opaque(rebuild function, args) whose storage argument is
// Opaque("torch.storage.TypedStorage", (dtype name, uint8 tensor of the bytes)), with a warning.
//
// Thread-safe: calls share no state.
//
// Example:
//   ASSIGN_OR_RETURN(TorchFile file, ReadTorchFile("/ckpts/resnet.pt"));
//   for (const auto& [key, value] : file.root.entries()) { ... value.tensor() ... }

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "libs/format/byte_source.h"
#include "libs/tensor/value.h"

namespace ckpt {

struct TorchFile {
  // What torch.load would return, as data.
  Value root;
  // "torch_zip", "torch_legacy" or "torchscript".
  std::string format;
  // Things the reader kept as data or dropped (opaque classes, tensor-subclass state, unusual
  // versions), one line each, in the order met.
  std::vector<std::string> warnings;
};

// Reads the torch.save file at `path`. Errors name the file and where in it:
//   NOT_FOUND / PERMISSION_DENIED  the path,
//   INVALID_ARGUMENT               not a torch.save file, or a malformed one (the zip, record or
//                                  pickle offset and what was expected vs found),
//   DATA_LOSS                      CRC-32 mismatch, or the file ends before its structures do,
//   UNIMPLEMENTED                  tar-format files, records compressed other than deflate,
//   RESOURCE_EXHAUSTED             pickle nesting / size limits.
absl::StatusOr<TorchFile> ReadTorchFile(const std::string& path);

// The same for bytes in memory (fuzzing, network payloads); `name` stands in for the path in
// messages. Tensors get their own copies of the bytes.
absl::StatusOr<TorchFile> ReadTorchBytes(absl::string_view bytes,
                                         absl::string_view name = "<memory>");

// The same for any ByteSource.
absl::StatusOr<TorchFile> ReadTorchSource(const ByteSource& source);

}  // namespace ckpt

#endif  // CKPT_LIBS_FORMAT_TORCH_READER_H_

#ifndef CKPT_LIBS_FORMAT_INTERNAL_TORCH_HOOKS_H_
#define CKPT_LIBS_FORMAT_INTERNAL_TORCH_HOOKS_H_

// What torch_reader.cc's two formats share (private to :torch_reader, listed in its srcs only;
// the public API is torch_reader.h): Value accessors whose errors say what was expected, storage
// allocation and decoding, and TorchHooks, the pickle hooks that rebuild tensors from storages.
// torch_reader.cc adds each format's persistent-load hook (where storages come from) and the
// file layout around the pickles.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "ATen/core/Tensor.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "c10/core/Storage.h"
#include "libs/format/pickle_reader.h"
#include "libs/tensor/dtype.h"
#include "libs/tensor/value.h"

namespace ckpt::torch_reader_internal {

// --- Small Value accessors with messages ----------------------------------------------------
// Errors are INVALID_ARGUMENT naming `what` and the Value found.

// A str or bytes.
absl::StatusOr<std::string> AsText(const Value& value, absl::string_view what);
absl::StatusOr<int64_t> AsInt(const Value& value, absl::string_view what);

// A class referenced as a value (Opaque with no args and state): its "module.Name".
std::optional<std::string> GlobalName(const Value& value);

// --- Storages -------------------------------------------------------------------------------

// The dtype of a storage class (torch.FloatStorage; untyped storages are uint8).
absl::StatusOr<DType> StorageDType(const Value& type);

// `nbytes` of CPU memory; RESOURCE_EXHAUSTED when LibTorch cannot allocate them.
absl::StatusOr<c10::Storage> AllocateStorage(uint64_t nbytes);

char* StorageBytes(const c10::Storage& storage);

// Big-endian files: reverse each scalar (each half of a complex number).
void ByteSwap(char* data, uint64_t nbytes, DType dtype);

// A storage as the pickle sees it: a 1-D tensor of its dtype over all its bytes, tagged with
// the saving device. Dtypes LibTorch lacks become an opaque TypedStorage over uint8 bytes.
absl::StatusOr<Value> StorageValue(const c10::Storage& storage, DType dtype, int64_t numel,
                                   const std::string& location, std::vector<std::string>& warnings);

// --- Hooks shared by both formats ------------------------------------------------------------

// The globals of a torch.save pickle that ckpt rebuilds rather than keeps opaque: tensors (from
// the storages PersistentLoad returned, as StorageValue makes them), nn.Parameter, quantized
// tensors, sparse tensors, tensor subclasses (as plain tensors), torch.Size, torch.device and numpy scalars.
// Whatever these drop (backward hooks, attributes, requires_grad of integer tensors) or cannot
// rebuild (unsupported dtypes, unknown quantization schemes) is kept as data with a warning.
// Subclasses supply PersistentLoad. One per ReadPickle; not thread-safe.
class TorchHooks : public PickleHooks {
 public:
  bool HandlesGlobal(absl::string_view global) const override;
  absl::StatusOr<std::optional<Value>> CallGlobal(absl::string_view global,
                                                  const Value& args) override;

  // Tensors pickled the pre-1.0 way, as an empty torch.Tensor (or torch.FloatTensor, ...) and a
  // __setstate__ tuple: (storage, offset, size, stride) for a Tensor, (data, ..., requires_grad,
  // hooks) for an old Variable. Torch's Tensor.__setstate__ still reads both; this rebuilds them
  // in `root` (its dicts and sequences, after the storages are read), where the pickle machine
  // kept them as opaque objects.
  absl::Status RebuildSetStateTensors(Value& root);

 protected:
  void Warn(std::string message) { warnings().push_back(std::move(message)); }

 private:
  absl::StatusOr<std::optional<Value>> RebuildTensor(absl::string_view global,
                                                     const Value& storage_value,
                                                     const Value& offset_value,
                                                     const Value& size_value,
                                                     const Value& stride_value, bool requires_grad,
                                                     std::optional<DType> dtype_override);
  at::Tensor SetRequiresGrad(at::Tensor tensor);
  absl::StatusOr<std::optional<Value>> Parameter(const Value& data, bool requires_grad);
  // (storage, storage_offset, size, stride, quantizer_params, requires_grad, backward_hooks)
  absl::StatusOr<std::optional<Value>> RebuildQuantized(const std::vector<Value>& a);
  // torch._utils._rebuild_sparse_tensor / _rebuild_sparse_csr_tensor(layout, data).
  absl::StatusOr<std::optional<Value>> RebuildSparse(const Value& layout, const Value& data);
  // numpy.core.multiarray.scalar(dtype, bytes): numpy.float64(0.5) and friends.
  absl::StatusOr<std::optional<Value>> NumpyScalar(const std::vector<Value>& a);
};

}  // namespace ckpt::torch_reader_internal

#endif  // CKPT_LIBS_FORMAT_INTERNAL_TORCH_HOOKS_H_

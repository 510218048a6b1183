#include "libs/store/checkpoint_contents.h"

#include <algorithm>
#include <sstream>
#include <string>
#include <utility>

#include "ATen/core/Tensor.h"
#include "ATen/ops/_empty_affine_quantized.h"
#include "ATen/ops/_empty_per_channel_affine_quantized.h"
#include "ATen/ops/empty.h"
#include "ATen/ops/from_blob.h"
#include "ATen/ops/tensor.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "libs/io/backoff.h"
#include "libs/io/prefault.h"
#include "libs/status/status_macros.h"
#include "libs/status/torch_status.h"
#include "libs/store/read_checkpoint.h"
#include "libs/store/version_ref.h"
#include "libs/tensor/dtype.h"
#include "libs/tensor/sparse_layout.h"
#include "libs/tensor/value_proto.h"

namespace ckpt {
namespace {

// Attributes that let a quantized tensor be rebuilt exactly (TensorMeta.attributes).
constexpr absl::string_view kQScheme = "qscheme";
constexpr absl::string_view kPerTensorAffine = "per_tensor_affine";
constexpr absl::string_view kPerChannelAffine = "per_channel_affine";

std::string FormatDouble(double value) { return absl::StrFormat("%.17g", value); }

// Fills dtype, shape, byte length and quantization attributes of `meta` from `tensor`.
absl::Status DescribeTensor(const at::Tensor& tensor, v1::TensorMeta& meta) {
  if (!tensor.defined()) {
    return absl::InvalidArgumentError(absl::StrCat("tensor '", meta.key(), "' is undefined"));
  }
  if (IsSparseTensor(tensor)) return DescribeSparseTensor(tensor, meta);
  if (tensor.layout() != at::kStrided) {
    std::ostringstream layout;
    layout << tensor.layout();
    return absl::InvalidArgumentError(
        absl::StrCat("tensor '", meta.key(), "' has layout ", layout.str(),
                     "; the store keeps strided and sparse tensors (convert with to_dense())"));
  }
  ASSIGN_OR_RETURN(DType dtype, FromScalarType(tensor.scalar_type()));
  meta.set_dtype(DTypeToProto(dtype));
  for (int64_t size : tensor.sizes()) meta.add_shape(size);
  ASSIGN_OR_RETURN(int64_t byte_length, ByteLengthOf(dtype, meta.shape()));
  meta.set_byte_length(byte_length);
  meta.set_requires_grad(tensor.requires_grad());
  if (!tensor.is_quantized()) return absl::OkStatus();
  auto& attributes = *meta.mutable_attributes();
  absl::StatusOr<absl::Status> described = CatchTorchErrors([&]() -> absl::Status {
    switch (tensor.qscheme()) {
      case at::kPerTensorAffine:
        attributes[std::string(kQScheme)] = std::string(kPerTensorAffine);
        attributes["scale"] = FormatDouble(tensor.q_scale());
        attributes["zero_point"] = absl::StrCat(tensor.q_zero_point());
        return absl::OkStatus();
      case at::kPerChannelAffine: {
        attributes[std::string(kQScheme)] = std::string(kPerChannelAffine);
        attributes["axis"] = absl::StrCat(tensor.q_per_channel_axis());
        const at::Tensor scales = tensor.q_per_channel_scales().to(at::kDouble).contiguous();
        const at::Tensor zero_points =
            tensor.q_per_channel_zero_points().to(at::kLong).contiguous();
        std::vector<std::string> scale_text, zero_point_text;
        for (int64_t i = 0; i < scales.numel(); ++i) {
          scale_text.push_back(FormatDouble(scales.data_ptr<double>()[i]));
          zero_point_text.push_back(absl::StrCat(zero_points.data_ptr<int64_t>()[i]));
        }
        attributes["scales"] = absl::StrJoin(scale_text, ",");
        attributes["zero_points"] = absl::StrJoin(zero_point_text, ",");
        return absl::OkStatus();
      }
      default:
        return absl::UnimplementedError(absl::StrCat("quantization scheme ",
                                                     c10::toString(tensor.qscheme()),
                                                     " is not supported by the store"));
    }
  });
  return described.ok() ? *described : described.status();
}

absl::StatusOr<std::string> Attribute(const v1::TensorMeta& meta, absl::string_view name) {
  auto it = meta.attributes().find(std::string(name));
  if (it == meta.attributes().end()) {
    return absl::DataLossError(
        absl::StrCat("quantized tensor '", meta.key(), "' lacks its '", name, "' attribute"));
  }
  return it->second;
}

// An empty CPU tensor with the dtype, shape (and quantization) `meta` describes.
absl::StatusOr<at::Tensor> EmptyTensorFor(const v1::TensorMeta& meta) {
  ASSIGN_OR_RETURN(DType dtype, DTypeFromProto(meta.dtype()));
  ASSIGN_OR_RETURN(c10::ScalarType scalar_type, ToScalarType(dtype));
  const std::vector<int64_t> shape(meta.shape().begin(), meta.shape().end());
  const at::TensorOptions options = at::TensorOptions().dtype(scalar_type).device(at::kCPU);
  if (!GetDTypeInfo(dtype).is_quantized) {
    return CatchTorchErrors([&] { return at::empty(shape, options); });
  }
  ASSIGN_OR_RETURN(std::string scheme, Attribute(meta, kQScheme));
  if (scheme == kPerTensorAffine) {
    ASSIGN_OR_RETURN(std::string scale_text, Attribute(meta, "scale"));
    ASSIGN_OR_RETURN(std::string zero_point_text, Attribute(meta, "zero_point"));
    double scale = 0;
    int64_t zero_point = 0;
    if (!absl::SimpleAtod(scale_text, &scale) || !absl::SimpleAtoi(zero_point_text, &zero_point)) {
      return absl::DataLossError(
          absl::StrCat("quantized tensor '", meta.key(), "' has unreadable scale / zero point"));
    }
    return CatchTorchErrors(
        [&] { return at::_empty_affine_quantized(shape, options, scale, zero_point); });
  }
  if (scheme == kPerChannelAffine) {
    ASSIGN_OR_RETURN(std::string axis_text, Attribute(meta, "axis"));
    ASSIGN_OR_RETURN(std::string scales_text, Attribute(meta, "scales"));
    ASSIGN_OR_RETURN(std::string zero_points_text, Attribute(meta, "zero_points"));
    int64_t axis = 0;
    std::vector<double> scales;
    std::vector<int64_t> zero_points;
    bool ok = absl::SimpleAtoi(axis_text, &axis);
    for (absl::string_view part : absl::StrSplit(scales_text, ',', absl::SkipEmpty())) {
      double value = 0;
      ok = ok && absl::SimpleAtod(part, &value);
      scales.push_back(value);
    }
    for (absl::string_view part : absl::StrSplit(zero_points_text, ',', absl::SkipEmpty())) {
      int64_t value = 0;
      ok = ok && absl::SimpleAtoi(part, &value);
      zero_points.push_back(value);
    }
    if (!ok || scales.size() != zero_points.size()) {
      return absl::DataLossError(absl::StrCat("quantized tensor '", meta.key(),
                                              "' has unreadable per-channel parameters"));
    }
    return CatchTorchErrors([&] {
      const at::Tensor scale_tensor = at::tensor(scales, at::TensorOptions().dtype(at::kDouble));
      const at::Tensor zero_point_tensor =
          at::tensor(zero_points, at::TensorOptions().dtype(at::kLong));
      return at::_empty_per_channel_affine_quantized(shape, scale_tensor, zero_point_tensor, axis,
                                                     options);
    });
  }
  return absl::UnimplementedError(
      absl::StrCat("quantized tensor '", meta.key(), "' uses unsupported scheme '", scheme, "'"));
}

// Collects the tensors of a value tree as state tensors under "<prefix>/<path>".
// The devices that shape-only placeholders (meta-device tensors whose bytes other writers
// supply: a ZeRO-1 rank's optimizer state) say their tensors live on, by tensor.
void CollectPlaceholderDevices(const Value& value,
                               absl::flat_hash_map<const void*, std::string>& devices) {
  if (value.is_tensor()) {
    if (value.tensor().is_meta() && !value.tensor_original_device().empty()) {
      devices.emplace(value.tensor().unsafeGetTensorImpl(), value.tensor_original_device());
    }
  } else if (value.is_sequence()) {
    for (const Value& item : value.items()) CollectPlaceholderDevices(item, devices);
  } else if (value.is_dict()) {
    for (const Value::Entry& entry : value.entries()) {
      CollectPlaceholderDevices(entry.second, devices);
    }
  } else if (value.is_opaque()) {
    CollectPlaceholderDevices(value.opaque_args(), devices);
    CollectPlaceholderDevices(value.opaque_state(), devices);
  }
}

class StateTensorTable {
 public:
  absl::StatusOr<v1::Value> Add(absl::string_view prefix, const Value& tree, v1::Manifest& header) {
    absl::flat_hash_map<const void*, std::string> placeholder_devices;
    CollectPlaceholderDevices(tree, placeholder_devices);
    return ValueToProto(
        tree,
        [&](const std::string& path, const at::Tensor& tensor) -> absl::StatusOr<std::string> {
          std::string key = absl::StrCat(prefix, "/", path);
          // Distinct paths can print alike (int key 0 and string key "0"): keep keys unique.
          for (int suffix = 2; keys_.contains(key); ++suffix) {
            key = absl::StrCat(prefix, "/", path, "#", suffix);
          }
          keys_.insert(key);
          v1::TensorMeta* meta = header.add_state_tensors();
          meta->set_key(key);
          meta->set_original_key(absl::StrCat(prefix, "/", path));
          RETURN_IF_ERROR(DescribeTensor(tensor, *meta));
          auto placeholder = placeholder_devices.find(tensor.unsafeGetTensorImpl());
          meta->set_original_device(placeholder != placeholder_devices.end()
                                        ? placeholder->second
                                        : tensor.device().str());
          tensors_.push_back(tensor);
          return key;
        });
  }
  const std::vector<at::Tensor>& tensors() const { return tensors_; }

 private:
  absl::flat_hash_set<std::string> keys_;
  std::vector<at::Tensor> tensors_;
};

// Streams `tensor` into `session` as tensor `index`, one contiguous CPU copy at a time (a sparse
// tensor's parts one after another, StoredBytes).
absl::Status UploadTensor(UploadSession& session, int index, const at::Tensor& tensor) {
  absl::StatusOr<at::Tensor> copied = StoredBytes(tensor);
  if (!copied.ok()) {
    return absl::Status(copied.status().code(),
                        absl::StrCat("copying tensor ", index, " (on ", tensor.device().str(),
                                     ") to the CPU: ", copied.status().message()));
  }
  const at::Tensor& cpu = *copied;
  const int64_t length = static_cast<int64_t>(cpu.nbytes());
  if (length == 0) return absl::OkStatus();
  const absl::string_view bytes(static_cast<const char*>(cpu.data_ptr()),
                                static_cast<size_t>(length));
  // A tensor already contiguous on the CPU is its own bytes, alive in the caller's contents for
  // the whole commit: the session may store it in the background. A copy dies with this call.
  if (!IsSparseTensor(tensor) && cpu.data_ptr() == tensor.data_ptr()) {
    return session.AddStableTensorData(index, 0, bytes);
  }
  return session.AddTensorData(index, 0, bytes);
}

}  // namespace

// Tensors at least this large are prefaulted before they are filled.
constexpr int64_t kPrefaultMinBytes = int64_t{1} << 20;

absl::StatusOr<at::Tensor> ReadTensor(const VersionReader& reader, const v1::TensorMeta& meta) {
  if (meta.has_sparse()) {
    // Its parts' bytes in one buffer, then the parts copied out of it (sparse tensors are small
    // next to the dense ones, and the parts' offsets need not suit their dtypes' alignment).
    std::string bytes(static_cast<size_t>(std::max<int64_t>(meta.byte_length(), 0)), '\0');
    RETURN_IF_ERROR(reader.ReadTensorInto(meta, bytes.data()));
    return SparseTensorFromBytes(meta, bytes);
  }
  ASSIGN_OR_RETURN(at::Tensor tensor, EmptyTensorFor(meta));
  if (static_cast<int64_t>(tensor.nbytes()) != meta.byte_length()) {
    return absl::DataLossError(absl::StrCat(
        "tensor '", meta.key(), "' of ", FormatVersionRef(reader.manifest().model(), reader.manifest().version()),
        ": byte_length ", meta.byte_length(), " disagrees with its dtype and shape (",
        tensor.nbytes(), " bytes)"));
  }
  if (!tensor.is_quantized() && meta.byte_length() > 0) {
    ASSIGN_OR_RETURN(VersionReader::MappedBytes mapped, reader.MapTensorBytes(meta));
    if (mapped.data != nullptr) {
      // Fresh anonymous memory is the expensive part of a load (a page fault per 4 KiB,
      // docs/benchmarks/methods.md); a private mapping shares the page cache until the tensor
      // is written.
      return CatchTorchErrors([&] {
        return at::from_blob(
            mapped.data, tensor.sizes(), [owner = mapped.owner](void*) mutable { owner.reset(); },
            tensor.options());
      });
    }
  }
  // A large tensor is fresh memory (allocators mmap it): its pages mapped in one call rather than
  // faulted in one by one by the copy (1.6x faster on this VM, docs/benchmarks/). Small ones mostly
  // reuse heap memory, where the call would be pure overhead.
  if (meta.byte_length() >= kPrefaultMinBytes) PrefaultForWrite(tensor.data_ptr(), tensor.nbytes());
  RETURN_IF_ERROR(reader.ReadTensorInto(meta, static_cast<char*>(tensor.data_ptr())));
  return tensor;
}

absl::StatusOr<at::Tensor> ReadTensor(const VersionReader& reader, absl::string_view key) {
  for (const v1::TensorMeta& meta : reader.manifest().tensors()) {
    if (meta.key() == key) return ReadTensor(reader, meta);
  }
  for (const v1::TensorMeta& meta : reader.manifest().state_tensors()) {
    if (meta.key() == key) return ReadTensor(reader, meta);
  }
  return absl::NotFoundError(absl::StrCat(
      "no tensor '", key, "' in ", FormatVersionRef(reader.manifest().model(), reader.manifest().version())));
}

absl::StatusOr<PreparedUpload> PrepareUpload(const CheckpointContents& contents,
                                             const CommitOptions& options) {
  PreparedUpload prepared;
  v1::Manifest& header = prepared.header;
  *header.mutable_metadata() = contents.metadata;

  // The producer's keys; NormalizeHeaderKeys makes them canonical below.
  for (const StateDict::Entry& entry : contents.model) {
    v1::TensorMeta* meta = header.add_tensors();
    meta->set_key(entry.key);
    meta->set_original_key(entry.key);
    meta->set_original_device(entry.original_device.empty() ? entry.tensor.device().str()
                                                            : entry.original_device);
    RETURN_IF_ERROR(DescribeTensor(entry.tensor, *meta));
    prepared.tensors.push_back(entry.tensor);
  }

  StateTensorTable state;
  if (contents.optimizer.has_value()) {
    ASSIGN_OR_RETURN(*header.mutable_optimizer_state(),
                     state.Add("optimizer", *contents.optimizer, header));
  }
  if (contents.scheduler.has_value()) {
    ASSIGN_OR_RETURN(*header.mutable_scheduler_state(),
                     state.Add("scheduler", *contents.scheduler, header));
  }
  if (!contents.extra.is_none()) {
    ASSIGN_OR_RETURN(*header.mutable_extra_state(), state.Add("extra", contents.extra, header));
  }
  if (!contents.bundle_layout.placements().empty()) {
    *header.mutable_bundle_layout() = contents.bundle_layout;
  }
  for (const auto& [index, name] : contents.optimizer_param_names) {
    (*header.mutable_optimizer_param_names())[index] = name;
  }
  if (options.normalize_keys) RETURN_IF_ERROR(NormalizeHeaderKeys(header));
  for (const at::Tensor& tensor : state.tensors()) prepared.tensors.push_back(tensor);
  return prepared;
}

absl::Status UploadTensorRanges(UploadPart& part, const std::vector<at::Tensor>& tensors) {
  for (size_t index = 0; index < part.ranges().size(); ++index) {
    const UploadRange& range = part.ranges()[index];
    if (range.tensor_index < 0 || static_cast<size_t>(range.tensor_index) >= tensors.size()) {
      return absl::InvalidArgumentError(absl::StrCat("range of tensor index ", range.tensor_index,
                                                     ": ", tensors.size(), " tensors given"));
    }
    const at::Tensor& tensor = tensors[range.tensor_index];
    // A CPU tensor already contiguous is read in place; another is copied to the CPU whole, the
    // price of a strided or device tensor (a rank's share is then copied twice at most).
    ASSIGN_OR_RETURN(const at::Tensor cpu, StoredBytes(tensor));
    if (range.end > static_cast<int64_t>(cpu.nbytes())) {
      return absl::InvalidArgumentError(absl::StrCat("range ", range.begin, "..", range.end,
                                                     " of tensor index ", range.tensor_index,
                                                     " holds ", cpu.nbytes(), " bytes"));
    }
    const absl::string_view bytes(static_cast<const char*>(cpu.data_ptr()) + range.begin,
                                  static_cast<size_t>(range.end - range.begin));
    RETURN_IF_ERROR(part.AddRangeData(static_cast<int>(index), 0, bytes));
  }
  return part.Finish();
}

absl::StatusOr<CommitResult> CommitCheckpoint(CheckpointStore& store, absl::string_view model,
                                              const CheckpointContents& contents,
                                              const CommitOptions& options) {
  ASSIGN_OR_RETURN(PreparedUpload prepared, PrepareUpload(contents, options));
  int64_t bytes_total = 0;
  std::vector<int64_t> stored_bytes;  // each tensor's byte_length, in upload order.
  for (const v1::TensorMeta& meta : prepared.header.tensors()) {
    stored_bytes.push_back(meta.byte_length());
  }
  for (const v1::TensorMeta& meta : prepared.header.state_tensors()) {
    stored_bytes.push_back(meta.byte_length());
  }
  for (const int64_t bytes : stored_bytes) bytes_total += bytes;
  const absl::Duration retry_window = store.CommitRetryWindow();
  CommitOptions attempt_options = options;
  if (retry_window > absl::ZeroDuration() && attempt_options.idempotency_key.empty()) {
    attempt_options.idempotency_key = RandomUploadName("commit-");
  }
  const auto attempt = [&]() -> absl::StatusOr<CommitResult> {
    ASSIGN_OR_RETURN(std::unique_ptr<UploadSession> session,
                     store.BeginUpload(model, prepared.header, attempt_options));
    int64_t bytes_done = 0;
    for (size_t index = 0; index < prepared.tensors.size(); ++index) {
      const at::Tensor& tensor = prepared.tensors[index];
      RETURN_IF_ERROR(UploadTensor(*session, static_cast<int>(index), tensor));
      bytes_done += stored_bytes[index];
      if (options.progress) options.progress(bytes_done, bytes_total);
    }
    return session->Commit();
  };
  absl::StatusOr<CommitResult> committed = attempt();
  if (retry_window <= absl::ZeroDuration()) return committed;
  // The window counts from the first failure: a long upload that broke at its end still gets
  // the whole window for the store to come back.
  Backoff backoff(BackoffPolicy{}, absl::Now() + retry_window);
  int attempts = 1;
  while (absl::IsUnavailable(committed.status()) && backoff.Wait()) {
    ++attempts;
    committed = attempt();
  }
  if (!committed.ok() && attempts > 1) {
    return absl::Status(committed.status().code(),
                        absl::StrCat(committed.status().message(), " (after ", attempts,
                                     " attempts of this commit within ",
                                     absl::FormatDuration(retry_window), ")"));
  }
  return committed;
}

absl::StatusOr<at::Tensor> ReadTensor(CheckpointStore& store, absl::string_view model,
                                      int64_t version, absl::string_view key) {
  ASSIGN_OR_RETURN(std::unique_ptr<VersionReader> reader,
                   store.OpenVersion(MakeVersionRef(model, version)));
  return ReadTensor(*reader, key);
}

absl::StatusOr<LoadedCheckpoint> LoadCheckpoint(CheckpointStore& store, const v1::VersionRef& ref) {
  ASSIGN_OR_RETURN(std::unique_ptr<VersionReader> reader, store.OpenVersion(ref));
  return ReadCheckpoint(*reader);
}

absl::StatusOr<LoadedCheckpoint> ReadCheckpoint(const VersionReader& reader,
                                                const ReadCheckpointOptions& options) {
  LoadedCheckpoint loaded;
  loaded.manifest = reader.manifest();
  const v1::Manifest& manifest = loaded.manifest;
  CheckpointContents& contents = loaded.contents;
  for (const v1::TensorMeta& meta : manifest.tensors()) {
    ASSIGN_OR_RETURN(at::Tensor tensor, ReadTensor(reader, meta));
    RETURN_IF_ERROR(contents.model.Insert(meta.key(), std::move(tensor), meta.original_device()));
  }
  absl::flat_hash_map<std::string, const v1::TensorMeta*> state_tensors;
  for (const v1::TensorMeta& meta : manifest.state_tensors()) {
    state_tensors.emplace(meta.key(), &meta);
  }
  const TensorResolver resolve = [&](absl::string_view key) -> absl::StatusOr<at::Tensor> {
    auto it = state_tensors.find(key);
    if (it == state_tensors.end()) {
      return absl::DataLossError(absl::StrCat(
          FormatVersionRef(manifest.model(), manifest.version()),
          ": value tree references state tensor '", key, "', which the manifest lacks"));
    }
    return ReadTensor(reader, *it->second);
  };
  if (manifest.has_optimizer_state() && options.optimizer_state) {
    ASSIGN_OR_RETURN(contents.optimizer, ValueFromProto(manifest.optimizer_state(), resolve));
  }
  if (manifest.has_scheduler_state()) {
    ASSIGN_OR_RETURN(contents.scheduler, ValueFromProto(manifest.scheduler_state(), resolve));
  }
  if (manifest.has_extra_state()) {
    ASSIGN_OR_RETURN(contents.extra, ValueFromProto(manifest.extra_state(), resolve));
  }
  contents.metadata = manifest.metadata();
  contents.bundle_layout = manifest.bundle_layout();
  for (const auto& [index, name] : manifest.optimizer_param_names()) {
    contents.optimizer_param_names.emplace(index, name);
  }
  return loaded;
}

}  // namespace ckpt

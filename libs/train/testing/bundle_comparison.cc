#include "libs/train/testing/bundle_comparison.h"

#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <sstream>
#include <string>
#include <tuple>

#include "ATen/core/Tensor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "libs/status/status_macros.h"
#include "libs/store/checkpoint_contents.h"
#include "libs/store/version_ref.h"
#include "libs/train/trainer_state.h"

namespace ckpt::train::testing {
namespace {

absl::Status Differs(absl::string_view path, absl::string_view what) {
  return absl::FailedPreconditionError(absl::StrCat(path, ": ", what));
}

std::string Describe(const at::Tensor& tensor) {
  return absl::StrCat(c10::toString(tensor.scalar_type()), "[", absl::StrJoin(tensor.sizes(), ", "),
                      "]");
}

// The shortest text that reads back as `value`, so two elements that differ never print alike.
template <typename T>
std::string Shortest(T value) {
  char text[64];
  const std::to_chars_result end = std::to_chars(text, text + sizeof(text), value);
  return std::string(text, end.ptr);
}

// One element of a contiguous CPU tensor, for the message.
std::string Element(const at::Tensor& flat, int64_t index) {
  const at::Tensor element = flat.is_quantized() ? flat.int_repr()[index] : flat[index];
  const at::Scalar scalar = element.item();
  if (element.scalar_type() == at::kDouble) return Shortest(scalar.toDouble());
  // Float, Half, BFloat16: each value is exactly a float.
  if (at::isFloatingType(element.scalar_type())) return Shortest(scalar.toFloat());
  std::ostringstream text;
  text << scalar;
  return text.str();
}

std::string KindName(const Value& value) {
  switch (value.kind()) {
    case Value::Kind::kNone:
      return "None";
    case Value::Kind::kBool:
      return "bool";
    case Value::Kind::kInt:
      return "int";
    case Value::Kind::kFloat:
      return "float";
    case Value::Kind::kString:
      return "str";
    case Value::Kind::kBytes:
      return "bytes";
    case Value::Kind::kList:
      return "list";
    case Value::Kind::kTuple:
      return "tuple";
    case Value::Kind::kDict:
      return "dict";
    case Value::Kind::kTensor:
      return "tensor";
    case Value::Kind::kOpaque:
      return "object";
  }
  return "?";
}

// As Value::operator== has floats: NaN equals NaN.
bool SameFloat(double a, double b) { return a == b || (std::isnan(a) && std::isnan(b)); }

template <typename T>
absl::Status CompareField(const T& a, const T& b, absl::string_view path) {
  if (a == b) return absl::OkStatus();
  return Differs(path, absl::StrCat(a, " vs ", b));
}

}  // namespace

absl::Status CompareTensors(const at::Tensor& a, const at::Tensor& b, absl::string_view path) {
  if (a.defined() != b.defined()) {
    return Differs(path, absl::StrCat(a.defined() ? Describe(a) : "undefined", " vs ",
                                      b.defined() ? Describe(b) : "undefined"));
  }
  if (!a.defined()) return absl::OkStatus();
  if (a.scalar_type() != b.scalar_type() || a.sizes() != b.sizes()) {
    return Differs(path, absl::StrCat(Describe(a), " vs ", Describe(b)));
  }
  if (a.numel() == 0) return absl::OkStatus();  // memcmp wants pointers even for no bytes.
  const at::Tensor x = a.contiguous().cpu().reshape(-1);
  const at::Tensor y = b.contiguous().cpu().reshape(-1);
  const size_t size = x.element_size();
  const char* bytes_x = static_cast<const char*>(x.data_ptr());
  const char* bytes_y = static_cast<const char*>(y.data_ptr());
  if (std::memcmp(bytes_x, bytes_y, x.nbytes()) == 0) return absl::OkStatus();
  for (int64_t i = 0; i < x.numel(); ++i) {
    if (std::memcmp(bytes_x + i * size, bytes_y + i * size, size) != 0) {
      return Differs(path, absl::StrCat(Describe(a), " differs first at element ", i, ": ",
                                        Element(x, i), " vs ", Element(y, i)));
    }
  }
  return Differs(path, "bytes differ");  // Unreachable: the whole buffers differed.
}

absl::Status CompareStateDicts(const StateDict& a, const StateDict& b, absl::string_view path) {
  for (size_t i = 0; i < a.size() || i < b.size(); ++i) {
    if (i >= b.size()) return Differs(absl::StrCat(path, "/", a.entry(i).key), "only in the first");
    if (i >= a.size()) {
      return Differs(absl::StrCat(path, "/", b.entry(i).key), "only in the second");
    }
    const StateDict::Entry& x = a.entry(i);
    const StateDict::Entry& y = b.entry(i);
    if (x.key != y.key) {
      return Differs(absl::StrCat(path, "/", i),
                     absl::StrCat("key '", x.key, "' vs '", y.key, "' at position ", i));
    }
    RETURN_IF_ERROR(CompareTensors(x.tensor, y.tensor, absl::StrCat(path, "/", x.key)));
  }
  return absl::OkStatus();
}

absl::Status CompareValues(const Value& a, const Value& b, absl::string_view path) {
  if (a.kind() != b.kind()) return Differs(path, absl::StrCat(KindName(a), " vs ", KindName(b)));
  switch (a.kind()) {
    case Value::Kind::kNone:
      return absl::OkStatus();
    case Value::Kind::kBool:
      return CompareField(a.bool_value(), b.bool_value(), path);
    case Value::Kind::kInt:
      return CompareField(a.int_value(), b.int_value(), path);
    case Value::Kind::kFloat:
      if (SameFloat(a.float_value(), b.float_value())) return absl::OkStatus();
      return Differs(path,
                     absl::StrCat(Shortest(a.float_value()), " vs ", Shortest(b.float_value())));
    case Value::Kind::kString:
    case Value::Kind::kBytes:
      if (a.string_value() == b.string_value()) return absl::OkStatus();
      return Differs(path, absl::StrCat("'", a.string_value(), "' vs '", b.string_value(), "'"));
    case Value::Kind::kList:
    case Value::Kind::kTuple:
      if (a.items().size() != b.items().size()) {
        return Differs(path,
                       absl::StrCat(a.items().size(), " items vs ", b.items().size(), " items"));
      }
      for (size_t i = 0; i < a.items().size(); ++i) {
        RETURN_IF_ERROR(CompareValues(a.items()[i], b.items()[i], absl::StrCat(path, "/", i)));
      }
      return absl::OkStatus();
    case Value::Kind::kDict:
      for (size_t i = 0; i < a.entries().size() || i < b.entries().size(); ++i) {
        if (i >= b.entries().size()) {
          return Differs(absl::StrCat(path, "/", a.entries()[i].first.DebugString()),
                         "only in the first");
        }
        if (i >= a.entries().size()) {
          return Differs(absl::StrCat(path, "/", b.entries()[i].first.DebugString()),
                         "only in the second");
        }
        const auto& [key_a, item_a] = a.entries()[i];
        const auto& [key_b, item_b] = b.entries()[i];
        if (key_a != key_b) {
          return Differs(path, absl::StrCat("key ", key_a.DebugString(), " vs ",
                                            key_b.DebugString(), " at position ", i));
        }
        RETURN_IF_ERROR(
            CompareValues(item_a, item_b, absl::StrCat(path, "/", key_a.DebugString())));
      }
      return absl::OkStatus();
    case Value::Kind::kTensor:
      return CompareTensors(a.tensor(), b.tensor(), path);
    case Value::Kind::kOpaque:
      if (a.opaque_class_name() != b.opaque_class_name()) {
        return Differs(path, absl::StrCat(a.opaque_class_name(), " vs ", b.opaque_class_name()));
      }
      RETURN_IF_ERROR(CompareValues(a.opaque_args(), b.opaque_args(), absl::StrCat(path, "/args")));
      return CompareValues(a.opaque_state(), b.opaque_state(), absl::StrCat(path, "/state"));
  }
  return Differs(path, "unknown kind");
}

absl::Status CompareTrainingBundles(const CheckpointContents& a, const CheckpointContents& b) {
  RETURN_IF_ERROR(CompareStateDicts(a.model, b.model, "model"));
  for (const auto& [part, x, y] : {std::tuple("optimizer", &a.optimizer, &b.optimizer),
                                   std::tuple("scheduler", &a.scheduler, &b.scheduler)}) {
    if (!x->has_value() || !y->has_value()) {
      return Differs(part, absl::StrCat(x->has_value() ? "present" : "missing", " vs ",
                                        y->has_value() ? "present" : "missing"));
    }
    RETURN_IF_ERROR(CompareValues(**x, **y, part));
  }
  if (a.optimizer->TensorCount() == 0) return Differs("optimizer", "holds no tensor in either");

  ASSIGN_OR_RETURN(const TrainerState state_a, DecodeTrainerState(a.extra, "the first bundle"));
  ASSIGN_OR_RETURN(const TrainerState state_b, DecodeTrainerState(b.extra, "the second bundle"));
  RETURN_IF_ERROR(CompareField(state_a.epoch, state_b.epoch, "trainer/epoch"));
  RETURN_IF_ERROR(
      CompareField(state_a.sampler_position, state_b.sampler_position, "trainer/sampler_position"));
  RETURN_IF_ERROR(CompareField(state_a.global_step, state_b.global_step, "trainer/global_step"));
  RETURN_IF_ERROR(CompareField(state_a.target_step, state_b.target_step, "trainer/target_step"));
  // A bundle without the CPU generator's state would make two resumes agree vacuously.
  if (!state_a.rng_cpu.defined() || !state_b.rng_cpu.defined()) {
    return Differs("trainer/rng_cpu",
                   absl::StrCat(state_a.rng_cpu.defined() ? "set" : "not set", " vs ",
                                state_b.rng_cpu.defined() ? "set" : "not set"));
  }
  RETURN_IF_ERROR(CompareTensors(state_a.rng_cpu, state_b.rng_cpu, "trainer/rng_cpu"));
  return CompareTensors(state_a.rng_device, state_b.rng_device, "trainer/rng_device");
}

absl::Status CompareStoredBundles(CheckpointStore& store_a, const v1::VersionRef& ref_a,
                                  CheckpointStore& store_b, const v1::VersionRef& ref_b) {
  ASSIGN_OR_RETURN(const LoadedCheckpoint a, LoadCheckpoint(store_a, ref_a));
  ASSIGN_OR_RETURN(const LoadedCheckpoint b, LoadCheckpoint(store_b, ref_b));
  const absl::Status same = CompareTrainingBundles(a.contents, b.contents);
  if (same.ok()) return same;
  return absl::Status(
      same.code(), absl::StrCat(FormatVersionRef(a.manifest.model(), a.manifest.version()), " vs ",
                                FormatVersionRef(b.manifest.model(), b.manifest.version()), ": ",
                                same.message()));
}

}  // namespace ckpt::train::testing

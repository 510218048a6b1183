#ifndef CKPT_LIBS_FORMAT_PICKLE_READER_H_
#define CKPT_LIBS_FORMAT_PICKLE_READER_H_

// A restricted pickle machine: reads Python pickles (protocols 0-5) into ckpt::Value trees
// without executing anything.
//
// Python's unpickler imports and calls whatever the pickle names. This machine knows a small
// allow-list of harmless builtins itself (containers: dict / collections.OrderedDict / list /
// tuple / set / frozenset (sets become lists); bytes / bytearray / _codecs.encode;
// copyreg._reconstructor / __newobj__), asks a PickleHooks for the globals it is told about
// (torch_reader.h supplies tensors, storages, torch.Size, ...), and keeps every other object as
// data: REDUCE, NEWOBJ, NEWOBJ_EX, INST and OBJ on an unknown class give
// Value::Opaque(class name, args, state) with the state a later BUILD supplies. A warning names
// each such class once.
//
// Value::Opaque conventions for objects that are more than args + state:
//   - a dict subclass that received SETITEMS: state is the items as a Dict when there was no
//     BUILD, else Tuple([build_state, items]);
//   - a list subclass that received APPENDS: likewise with a List;
//   - NEWOBJ_EX with keyword arguments: args is Tuple([args_tuple, kwargs_dict]);
//   - protocol 0/1 objects (copyreg._reconstructor(cls, base, base_state)): args is
//     Tuple([base_state]) when base_state is not None, else Tuple();
//   - a state dict's `_metadata` (a BUILD on a dict, i.e. attributes of an OrderedDict) is
//     dropped: Value::Dict has no attributes;
//   - a dict whose keys are not all str / int (tuple, bytes, float, bool, None keys):
//     Opaque("builtins.dict", Tuple([List([Tuple([key, value]), ...])]), None);
//   - an int that does not fit int64: Opaque("builtins.int", Tuple([String(decimal)]), None);
//   - a class or function referenced as a value (torch.float32, a type): Opaque(name, None, None);
//   - a reference cycle (an object containing itself): the inner reference becomes
//     Opaque("ckpt.RecursiveReference", Tuple([String(class or container kind)]), None).
// Python objects referenced twice in the pickle (the memo) become two equal Values; tensors inside
// them share storage.
//
// Every length is checked against the remaining input before anything is allocated, memo and
// stack misuse are errors naming the opcode's offset, and the Value built is bounded in nesting
// depth and in total size (objects shared through the memo count once per use), so a hostile
// pickle cannot crash, hang or exhaust memory.
//
// Thread-compatible: one ReadPickle call per hooks object at a time.
//
// Example:
//   ASSIGN_OR_RETURN(Value value, ReadPickleBytes(pickle_bytes));
//   if (const Value* lr = value.Find("lr")) { ... }

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "libs/format/byte_source.h"
#include "libs/tensor/value.h"

namespace ckpt {

// What a persistent id (PERSID / BINPERSID) stands for.
struct PersistentObject {
  // The object pushed; ignored when `global_name` is set.
  Value value;
  // When non-empty, a reference to the class or function "module.QualName" (legacy torch.save
  // files pickle a module's class through a persistent id), usable by a later REDUCE / NEWOBJ.
  std::string global_name;
};

// How a reader teaches the machine about its own objects. Both methods see plain Values: a
// storage or tensor the persistent-load hook returned comes back as the same Value (sharing its
// at::Tensor) inside later arguments.
class PickleHooks {
 public:
  virtual ~PickleHooks() = default;

  // Called for PERSID (pid is the String after the opcode) and BINPERSID (pid is the object
  // popped). Default: INVALID_ARGUMENT, since plain pickles have no persistent ids.
  virtual absl::StatusOr<PersistentObject> PersistentLoad(const Value& pid);

  // Whether CallGlobal understands `global` ("torch._utils._rebuild_tensor_v2"). Globals it
  // does not handle never have their arguments converted.
  virtual bool HandlesGlobal(absl::string_view global) const { return false; }

  // The result of calling `global` (REDUCE, NEWOBJ) with `args` (a Tuple). std::nullopt keeps the
  // call as Value::Opaque(global, args, state) with a warning. An error aborts the read; the
  // machine prefixes it with the pickle's name and offset.
  virtual absl::StatusOr<std::optional<Value>> CallGlobal(absl::string_view global,
                                                          const Value& args) {
    return std::nullopt;
  }

  // Warnings the hooks want reported with the machine's.
  std::vector<std::string>& warnings() { return warnings_; }

 private:
  std::vector<std::string> warnings_;
};

struct PickleOptions {
  // How errors name the pickle: "model.pt: archive/data.pkl". Empty: the source's name.
  std::string name;
  // Deepest nesting of containers / objects in the result. Conversion itself is iterative; the
  // bound keeps the recursive consumers of Value (comparison, DebugString, destruction) safe on
  // small thread stacks.
  int max_depth = 512;
  // Most Values the result may hold (each container, scalar and tensor counts one; an object
  // referenced n times counts n times). 0 means 2 Mi + 4 per pickle byte read.
  int64_t max_values = 0;
};

struct PickleResult {
  Value value;
  // Offset in the source just past the STOP opcode (where a following pickle starts).
  uint64_t end_offset = 0;
  // Opaque classes met, ignored BUILD states, and the hooks' warnings, in the order met.
  std::vector<std::string> warnings;
};

// Runs the machine on the pickle starting at `offset` in `source`, up to its STOP opcode.
// Errors name `options.name` and the opcode's offset relative to `offset`:
//   INVALID_ARGUMENT  malformed (unknown opcode, memo / stack misuse, bad literal),
//   DATA_LOSS         input ends, or a length runs, past the end of the source,
//   RESOURCE_EXHAUSTED nesting or size limits,
//   UNIMPLEMENTED     extension-registry codes (EXT1/2/4), out-of-band buffers,
// or the hooks' own errors.
absl::StatusOr<PickleResult> ReadPickle(const ByteSource& source, uint64_t offset,
                                        const PickleOptions& options, PickleHooks* hooks);

// ReadPickle over bytes in memory, dropping the warnings.
absl::StatusOr<Value> ReadPickleBytes(absl::string_view bytes, PickleHooks* hooks = nullptr);

}  // namespace ckpt

#endif  // CKPT_LIBS_FORMAT_PICKLE_READER_H_

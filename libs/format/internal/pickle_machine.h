#ifndef CKPT_LIBS_FORMAT_INTERNAL_PICKLE_MACHINE_H_
#define CKPT_LIBS_FORMAT_INTERNAL_PICKLE_MACHINE_H_

// The restricted pickle machine behind ReadPickle (private to :pickle_reader, listed in its srcs
// only; the public API is pickle_reader.h).
//
// The files, by concern (as RocksDB splits db_impl.cc):
//   pickle_reader.cc             entry points, the run loop, input, the stack, and the opcodes
//                                by family (Step's dispatch; stack, numbers, strings,
//                                containers, memo, protocol)
//   pickle_reader_objects.cc     the object opcodes (globals, calls, BUILD, persistent ids) and
//                                what a call makes: containers and bytes of the allow-listed
//                                builtins, hooks' Values, opaque objects kept as data
//   internal/pickle_machine.h    this file
//   internal/pickle_opcodes.h    the opcodes and protocol limits
//   internal/pickle_node.{h,cc}  the object graph (Node) and its bounded conversion to Value
//   internal/pickle_text.{h,cc}  pure decoding of protocol 0 text, big integers, _codecs.encode

#include <cstdint>
#include <deque>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "libs/format/byte_source.h"
#include "libs/format/internal/pickle_node.h"
#include "libs/format/pickle_reader.h"
#include "libs/tensor/value.h"

namespace ckpt::pickle_internal {

// One run of the machine over one pickle: reads opcodes from `source` at `start` up to STOP,
// building Nodes in an arena it owns, and converts the result to a Value. `source`, `options`
// and `hooks` (which may be null) are borrowed and must outlive it. Single use, not thread-safe.
class PickleMachine {
 public:
  PickleMachine(const ByteSource& source, uint64_t start, const PickleOptions& options,
                PickleHooks* hooks);

  // Runs to the STOP opcode; the errors are ReadPickle's.
  absl::StatusOr<PickleResult> Run();

 private:
  // --- Errors: every message names the pickle and the offset of the opcode being run. --------
  std::string Where() const { return absl::StrCat(options_.name, " offset ", op_offset_, ": "); }
  absl::Status Invalid(absl::string_view message) const {
    return absl::InvalidArgumentError(absl::StrCat(Where(), message));
  }
  // `status` (an error of a function that does not know the offset) prefixed with Where().
  absl::Status AtOpcode(const absl::Status& status) const {
    return absl::Status(status.code(), absl::StrCat(Where(), status.message()));
  }
  absl::Status Truncated(absl::string_view what, uint64_t needed) const;

  // --- Input (pickle_reader.cc) ---------------------------------------------------------------
  uint64_t Remaining() const { return source_.size() > pos_ ? source_.size() - pos_ : 0; }
  // The next `n` bytes, valid until the next read.
  absl::StatusOr<absl::string_view> Take(uint64_t n, absl::string_view what);
  absl::StatusOr<uint64_t> TakeUnsigned(int n, absl::string_view what);
  // A text argument up to (not including) the next newline.
  absl::StatusOr<std::string> TakeLine(absl::string_view what);

  // --- Nodes and the stack (pickle_reader.cc) -------------------------------------------------
  Node* NewNode(Node::Kind kind);
  Node* NewInt(int64_t value);
  Node* NewText(Node::Kind kind, std::string text);
  size_t Floor() const { return marks_.empty() ? 0 : marks_.back(); }
  absl::StatusOr<Node*> Pop(absl::string_view op);
  absl::StatusOr<Node*> Top(absl::string_view op);
  // The objects pushed since the last MARK, removing them and the mark.
  absl::StatusOr<std::vector<Node*>> PopMark(absl::string_view op);
  // The graph under `root` as a Value, charged to this pickle's value budget.
  absl::StatusOr<Value> ConvertTop(Node* root) {
    return converter_.Convert(root, pos_ - start_, op_offset_);
  }

  // --- Opcodes (pickle_reader.cc; the object family in pickle_reader_objects.cc) --------------
  // Step dispatches each opcode to the handler of its family; a handler answers an opcode outside
  // its family as Step answers an unknown one.
  absl::Status Step(uint8_t op);
  absl::Status StepStack(uint8_t op);      // MARK, POP, POP_MARK, DUP.
  absl::Status StepNumber(uint8_t op);     // None, bools, ints, floats.
  absl::Status StepString(uint8_t op);     // str and bytes.
  absl::Status StepContainer(uint8_t op);  // Lists, tuples, dicts, sets and adding items.
  absl::Status StepMemo(uint8_t op);       // PUT, GET, MEMOIZE.
  absl::Status StepProtocol(uint8_t op);   // PROTO, FRAME, and what is not supported.
  absl::Status PushLong(absl::string_view bytes);
  absl::Status PushDecimal(std::string text, absl::string_view op);
  absl::Status Put(int64_t index);
  absl::Status Get(int64_t index, absl::string_view op);

  // --- Objects (pickle_reader_objects.cc) -----------------------------------------------------
  absl::Status StepObject(uint8_t op);        // Globals, calls, BUILD.
  absl::Status StepPersistentId(uint8_t op);  // PERSID, BINPERSID.
  void NoteOpaque(const std::string& name);
  Node* NewObject(const std::string& name, Node* args);
  absl::StatusOr<Node*> MakeContainer(const std::string& name, Node* args);
  absl::StatusOr<Node*> MakeBytes(const std::string& name, Node* args);
  absl::StatusOr<Node*> CallHook(const std::string& name, Node* args);
  // cls.__new__(cls, *args, **kwargs) for NEWOBJ, NEWOBJ_EX, copyreg.__newobj__.
  absl::StatusOr<Node*> Instantiate(Node* cls, Node* args, Node* kwargs, absl::string_view op);
  // callable(*args) for REDUCE, INST and OBJ.
  absl::StatusOr<Node*> Call(Node* callable, Node* args, absl::string_view op);
  absl::Status Build(Node* target, Node* state);
  absl::Status SetItems(Node* target, const std::vector<Node*>& pairs, absl::string_view op);
  absl::Status Append(Node* target, const std::vector<Node*>& items, absl::string_view op);
  absl::Status PushGlobal(absl::string_view module, absl::string_view name);

  const ByteSource& source_;
  const uint64_t start_;
  uint64_t pos_;
  uint64_t op_offset_ = 0;
  std::string buffer_;
  uint64_t buffer_offset_ = 0;
  std::string large_;
  const PickleOptions& options_;
  PickleHooks* hooks_;

  std::deque<Node> arena_;
  Node* none_;
  Node* true_;
  Node* false_;
  std::vector<Node*> stack_;
  std::vector<size_t> marks_;
  absl::flat_hash_map<int64_t, Node*> memo_;

  absl::flat_hash_set<std::string> opaque_seen_;
  std::vector<std::string> warnings_;
  // Declared after warnings_, which it appends to.
  NodeConverter converter_;
};

}  // namespace ckpt::pickle_internal

#endif  // CKPT_LIBS_FORMAT_INTERNAL_PICKLE_MACHINE_H_

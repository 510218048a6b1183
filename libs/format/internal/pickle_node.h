#ifndef CKPT_LIBS_FORMAT_INTERNAL_PICKLE_NODE_H_
#define CKPT_LIBS_FORMAT_INTERNAL_PICKLE_NODE_H_

// The pickle machine's object graph and its conversion to Value (private to :pickle_reader; see
// internal/pickle_machine.h). The machine builds Nodes while it runs and converts them only when
// a hook needs arguments and at STOP, so shared and cyclic references stay plain pointers until
// then.

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "libs/format/pickle_reader.h"
#include "libs/tensor/value.h"

namespace ckpt::pickle_internal {

// One Python object under construction. Containers hold pointers into the machine's arena, so
// shared and even cyclic references are plain pointers; conversion to Value happens at the end.
struct Node {
  enum class Kind : uint8_t {
    kNone,
    kBool,
    kInt,
    kBigInt,
    kFloat,
    kString,
    kBytes,
    kValue,
    kList,
    kTuple,
    kDict,
    kSet,
    kGlobal,
    kObject,
  };
  Kind kind = Kind::kNone;
  bool shared = false;       // Fetched from the memo or DUP'd: conversion caches it.
  bool converting = false;   // On the conversion path now: meeting it again is a cycle.
  bool has_state = false;    // kObject: a BUILD happened.
  uint64_t offset = 0;       // Opcode offset that created it, for messages.
  int64_t int_value = 0;     // kBool, kInt.
  double float_value = 0;    // kFloat.
  std::string text;          // kBigInt (decimal), kString, kBytes, kGlobal / kObject name.
  std::vector<Node*> items;  // kList, kTuple, kSet; kObject APPENDS.
  std::vector<std::pair<Node*, Node*>> entries;  // kDict; kObject SETITEMS.
  Node* args = nullptr;                          // kObject.
  Node* state = nullptr;                         // kObject.
  std::unique_ptr<Value> value;                  // kValue: a hook's result.
};

// The Python type name of `kind`, for messages ("dict", "tuple").
const char* KindName(Node::Kind kind);

// Converts Node graphs to Values within the bounds of a PickleOptions: nesting depth, and a
// budget of Values for the whole pickle that every conversion charges (objects shared through
// the memo count once per reference). Conversion is iterative (an explicit stack of frames), so
// hostile nesting costs heap, bounded by max_depth, never the thread's stack.
//
// Owned by the machine; borrows its options and warnings, which must outlive it. Not
// thread-safe.
class NodeConverter {
 public:
  NodeConverter(const PickleOptions& options, std::vector<std::string>& warnings)
      : options_(options), warnings_(warnings) {}

  // Converts the graph under `root`. `bytes_read` (input consumed so far) sets the default value
  // budget; `op_offset` is the opcode being run, for messages. Errors: RESOURCE_EXHAUSTED past
  // the depth or value limits, INVALID_ARGUMENT for a node that cannot be converted. Nodes are
  // left ready for another conversion, also after an error.
  absl::StatusOr<Value> Convert(Node* root, uint64_t bytes_read, uint64_t op_offset);

 private:
  struct Frame {
    Node* node;
    int64_t values_before;        // values_made_ when the node was entered.
    std::vector<Node*> children;  // In conversion order (ChildrenOf).
    std::vector<Value> values;    // Converted children so far.
  };

  absl::Status Charge(int64_t count);
  absl::StatusOr<std::optional<Value>> LeafValue(const Node* node);
  absl::StatusOr<std::optional<Value>> Enter(Node* node, size_t depth);
  absl::StatusOr<Value> FinishDict(const std::vector<std::pair<Node*, Node*>>& entries,
                                   std::vector<Value>& values, size_t& next, bool ordered);
  absl::StatusOr<Value> Finish(const Node* node, std::vector<Value>& values);
  absl::StatusOr<Value> ConvertIteratively(Node* root);

  const PickleOptions& options_;
  std::vector<std::string>& warnings_;
  // Of the conversion running now.
  uint64_t bytes_read_ = 0;
  uint64_t op_offset_ = 0;

  // Across all conversions of one pickle.
  int64_t values_made_ = 0;
  bool warned_cycle_ = false;

  // Shared nodes converted so far, with the Values each charged; cleared per conversion.
  absl::flat_hash_map<const Node*, std::pair<Value, int64_t>> cache_;
  std::vector<Frame> frames_;
};

}  // namespace ckpt::pickle_internal

#endif  // CKPT_LIBS_FORMAT_INTERNAL_PICKLE_NODE_H_

#include "libs/format/internal/pickle_node.h"

#include <algorithm>
#include <iterator>

#include "absl/strings/str_cat.h"
#include "libs/status/status_macros.h"

namespace ckpt::pickle_internal {
namespace {

// Default bound on the Values one pickle may expand to: kBaseValueBudget + kValuesPerByte per
// pickle byte read (a Value is ~150 bytes with its containers).
constexpr int64_t kBaseValueBudget = int64_t{2} << 20;
constexpr int64_t kValuesPerByte = 4;

bool HasSimpleKeys(const std::vector<std::pair<Node*, Node*>>& entries) {
  return std::all_of(entries.begin(), entries.end(), [](const auto& e) {
    return e.first->kind == Node::Kind::kString || e.first->kind == Node::Kind::kInt;
  });
}

// Dict entries as children: the values when every key is a str or int (keys are read from
// the nodes directly), else key and value alternately.
void AppendEntryChildren(const std::vector<std::pair<Node*, Node*>>& entries,
                         std::vector<Node*>& out) {
  const bool simple = HasSimpleKeys(entries);
  for (const auto& [key, value] : entries) {
    if (!simple) out.push_back(key);
    out.push_back(value);
  }
}

std::vector<Node*> ChildrenOf(const Node* node) {
  std::vector<Node*> out;
  switch (node->kind) {
    case Node::Kind::kList:
    case Node::Kind::kSet:
    case Node::Kind::kTuple:
      out = node->items;
      break;
    case Node::Kind::kDict:
      AppendEntryChildren(node->entries, out);
      break;
    case Node::Kind::kObject:
      if (node->args != nullptr) out.push_back(node->args);
      if (node->has_state) out.push_back(node->state);
      if (!node->entries.empty()) {
        AppendEntryChildren(node->entries, out);
      } else {
        out.insert(out.end(), node->items.begin(), node->items.end());
      }
      break;
    default:
      break;
  }
  return out;
}

}  // namespace

const char* KindName(Node::Kind kind) {
  switch (kind) {
    case Node::Kind::kNone:
      return "None";
    case Node::Kind::kBool:
      return "bool";
    case Node::Kind::kInt:
      return "int";
    case Node::Kind::kBigInt:
      return "int";
    case Node::Kind::kFloat:
      return "float";
    case Node::Kind::kString:
      return "str";
    case Node::Kind::kBytes:
      return "bytes";
    case Node::Kind::kValue:
      return "value";
    case Node::Kind::kList:
      return "list";
    case Node::Kind::kTuple:
      return "tuple";
    case Node::Kind::kDict:
      return "dict";
    case Node::Kind::kSet:
      return "set";
    case Node::Kind::kGlobal:
      return "global";
    case Node::Kind::kObject:
      return "object";
  }
  return "?";
}

absl::StatusOr<Value> NodeConverter::Convert(Node* root, uint64_t bytes_read, uint64_t op_offset) {
  bytes_read_ = bytes_read;
  op_offset_ = op_offset;
  cache_.clear();
  frames_.clear();
  absl::StatusOr<Value> result = ConvertIteratively(root);
  for (Frame& frame : frames_) frame.node->converting = false;  // After an error.
  frames_.clear();
  return result;
}

// Every Value built is charged here. Without sharing, each opcode makes at most a few Values,
// so the default budget grows with the bytes read; sharing through the memo multiplies.
absl::Status NodeConverter::Charge(int64_t count) {
  values_made_ += count;
  const int64_t limit = options_.max_values > 0
                            ? options_.max_values
                            : kBaseValueBudget + kValuesPerByte * static_cast<int64_t>(bytes_read_);
  if (values_made_ > limit) {
    return absl::ResourceExhaustedError(
        absl::StrCat(options_.name, ": the pickle expands to more than ", limit,
                     " values (objects shared through the memo count once per reference)"));
  }
  return absl::OkStatus();
}

// The Value of a node without children, or nullopt for containers.
absl::StatusOr<std::optional<Value>> NodeConverter::LeafValue(const Node* node) {
  switch (node->kind) {
    case Node::Kind::kNone:
      return Value::None();
    case Node::Kind::kBool:
      return Value::Bool(node->int_value != 0);
    case Node::Kind::kInt:
      return Value::Int(node->int_value);
    case Node::Kind::kBigInt:
      RETURN_IF_ERROR(Charge(2));
      return Value::Opaque("builtins.int", Value::Tuple({Value::String(node->text)}),
                           Value::None());
    case Node::Kind::kFloat:
      return Value::Float(node->float_value);
    case Node::Kind::kString:
      return Value::String(node->text);
    case Node::Kind::kBytes:
      return Value::Bytes(node->text);
    case Node::Kind::kValue:
      return *node->value;
    case Node::Kind::kGlobal:
      return Value::Opaque(node->text, Value::None(), Value::None());
    default:
      return std::nullopt;
  }
}

// Starts converting `node` at nesting `depth`: returns its Value when that needs no children
// (a leaf, a cached shared object, a cycle), else pushes a frame and returns nullopt.
absl::StatusOr<std::optional<Value>> NodeConverter::Enter(Node* node, size_t depth) {
  if (depth > static_cast<size_t>(options_.max_depth)) {
    return absl::ResourceExhaustedError(absl::StrCat(
        options_.name, ": objects nest deeper than ", options_.max_depth, " levels (a ",
        KindName(node->kind), " created at offset ", node->offset, ")"));
  }
  if (node->converting) {
    if (!warned_cycle_) {
      warned_cycle_ = true;
      warnings_.push_back(absl::StrCat(options_.name, ": a ", KindName(node->kind),
                                       " created at offset ", node->offset,
                                       " contains itself; the inner reference is kept as "
                                       "ckpt.RecursiveReference"));
    }
    RETURN_IF_ERROR(Charge(2));
    return Value::Opaque(
        "ckpt.RecursiveReference",
        Value::Tuple(
            {Value::String(node->kind == Node::Kind::kObject ? node->text : KindName(node->kind))}),
        Value::None());
  }
  if (node->shared) {
    auto it = cache_.find(node);
    if (it != cache_.end()) {
      RETURN_IF_ERROR(Charge(it->second.second));
      return it->second.first;
    }
  }
  const int64_t before = values_made_;
  RETURN_IF_ERROR(Charge(1));
  ASSIGN_OR_RETURN(std::optional<Value> leaf, LeafValue(node));
  if (leaf.has_value()) {
    if (node->shared) cache_[node] = {*leaf, values_made_ - before};
    return leaf;
  }
  node->converting = true;
  frames_.push_back(Frame{node, before, ChildrenOf(node), {}});
  frames_.back().values.reserve(frames_.back().children.size());
  return std::nullopt;
}

// Builds a dict from `entries` and their converted children starting at values[next].
// `ordered`: the dict was made by collections.OrderedDict.
absl::StatusOr<Value> NodeConverter::FinishDict(const std::vector<std::pair<Node*, Node*>>& entries,
                                                std::vector<Value>& values, size_t& next,
                                                bool ordered) {
  if (!HasSimpleKeys(entries)) {
    std::vector<Value> pairs;
    pairs.reserve(entries.size());
    for (size_t i = 0; i < entries.size(); ++i, next += 2) {
      pairs.push_back(Value::Tuple({std::move(values[next]), std::move(values[next + 1])}));
    }
    RETURN_IF_ERROR(Charge(static_cast<int64_t>(entries.size()) + 2));
    return Value::Opaque("builtins.dict", Value::Tuple({Value::List(std::move(pairs))}),
                         Value::None());
  }
  std::vector<Value::Entry> out;
  out.reserve(entries.size());
  absl::flat_hash_map<std::string, size_t> string_index;
  absl::flat_hash_map<int64_t, size_t> int_index;
  for (const auto& entry : entries) {
    const Node* key = entry.first;
    Value& value = values[next++];
    size_t position = out.size();
    bool inserted;
    if (key->kind == Node::Kind::kString) {
      auto it = string_index.emplace(key->text, position);
      inserted = it.second;
      position = it.first->second;
    } else {
      auto it = int_index.emplace(key->int_value, position);
      inserted = it.second;
      position = it.first->second;
    }
    if (!inserted) {
      out[position].second = std::move(value);  // Python keeps the first position, last value.
    } else if (key->kind == Node::Kind::kString) {
      out.emplace_back(DictKey(key->text), std::move(value));
    } else {
      out.emplace_back(DictKey(key->int_value), std::move(value));
    }
  }
  return ordered ? Value::OrderedDict(std::move(out)) : Value::Dict(std::move(out));
}

absl::StatusOr<Value> NodeConverter::Finish(const Node* node, std::vector<Value>& values) {
  size_t next = 0;
  switch (node->kind) {
    case Node::Kind::kList:
    case Node::Kind::kSet:
      return Value::List(std::move(values));
    case Node::Kind::kTuple:
      return Value::Tuple(std::move(values));
    case Node::Kind::kDict:
      return FinishDict(node->entries, values, next, node->text == "collections.OrderedDict");
    case Node::Kind::kObject: {
      Value args;
      if (node->args != nullptr) args = std::move(values[next++]);
      Value state;
      if (node->has_state) state = std::move(values[next++]);
      std::optional<Value> extra;
      if (!node->entries.empty()) {
        ASSIGN_OR_RETURN(extra, FinishDict(node->entries, values, next, /*ordered=*/false));
      } else if (!node->items.empty()) {
        extra = Value::List(std::vector<Value>(std::make_move_iterator(values.begin() + next),
                                               std::make_move_iterator(values.end())));
      }
      if (extra.has_value()) {
        RETURN_IF_ERROR(Charge(1));
        state = node->has_state ? Value::Tuple({std::move(state), std::move(*extra)})
                                : std::move(*extra);
      }
      return Value::Opaque(node->text, std::move(args), std::move(state));
    }
    default:
      return absl::InvalidArgumentError(absl::StrCat(options_.name, " offset ", op_offset_,
                                                     ": cannot convert a ", KindName(node->kind)));
  }
}

absl::StatusOr<Value> NodeConverter::ConvertIteratively(Node* root) {
  ASSIGN_OR_RETURN(std::optional<Value> value, Enter(root, 0));
  if (value.has_value()) return std::move(*value);
  while (true) {
    Frame& frame = frames_.back();
    if (frame.values.size() < frame.children.size()) {
      Node* child = frame.children[frame.values.size()];
      ASSIGN_OR_RETURN(std::optional<Value> child_value, Enter(child, frames_.size()));
      // Enter may have pushed a frame (invalidating `frame`); if not, the child is done.
      if (child_value.has_value()) frames_.back().values.push_back(std::move(*child_value));
      continue;
    }
    Frame done = std::move(frames_.back());
    frames_.pop_back();
    done.node->converting = false;
    ASSIGN_OR_RETURN(Value finished, Finish(done.node, done.values));
    if (done.node->shared) cache_[done.node] = {finished, values_made_ - done.values_before};
    if (frames_.empty()) return finished;
    frames_.back().values.push_back(std::move(finished));
  }
}

}  // namespace ckpt::pickle_internal

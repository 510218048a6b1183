// PickleMachine's object opcodes and object model (see internal/pickle_machine.h for how the
// machine's files divide): GLOBAL, REDUCE, NEWOBJ, NEWOBJ_EX, INST, OBJ, BUILD and persistent
// ids; what a call of a global makes (a container, bytes, a hook's Value, or an opaque object
// kept as data); and how BUILD, SETITEMS and APPENDS add to an object.

#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "libs/format/internal/pickle_machine.h"
#include "libs/format/internal/pickle_opcodes.h"
#include "libs/format/internal/pickle_text.h"
#include "libs/status/status_macros.h"

namespace ckpt::pickle_internal {
namespace {

// Python 2 module names that Python 3's unpickler maps (fix_imports) for the globals we know.
std::string MapPython2Module(absl::string_view module) {
  if (module == "__builtin__") return "builtins";
  if (module == "copy_reg") return "copyreg";
  return std::string(module);
}

// Classes represented as Opaque by design: harmless values, no warning.
bool IsQuietOpaque(absl::string_view name) {
  return name == "builtins.complex" || name == "builtins.slice" || name == "builtins.range" ||
         name == "builtins.object" || name == "numpy.dtype";
}

bool IsDictClass(absl::string_view name) {
  return name == "builtins.dict" || name == "collections.OrderedDict";
}
bool IsListClass(absl::string_view name) { return name == "builtins.list"; }
bool IsSetClass(absl::string_view name) {
  return name == "builtins.set" || name == "builtins.frozenset";
}
bool IsTupleClass(absl::string_view name) { return name == "builtins.tuple"; }
bool IsBytesClass(absl::string_view name) {
  return name == "builtins.bytes" || name == "builtins.bytearray";
}

absl::StatusOr<const std::vector<Node*>*> Iterable(Node* node) {
  switch (node->kind) {
    case Node::Kind::kList:
    case Node::Kind::kTuple:
    case Node::Kind::kSet:
      return &node->items;
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("expected a list, tuple or set, found a ", KindName(node->kind)));
  }
}

}  // namespace

absl::Status PickleMachine::StepObject(uint8_t op) {
  switch (op) {
    case kGlobal: {
      ASSIGN_OR_RETURN(std::string module, TakeLine("GLOBAL"));
      ASSIGN_OR_RETURN(std::string name, TakeLine("GLOBAL"));
      return PushGlobal(module, name);
    }
    case kStackGlobal: {
      ASSIGN_OR_RETURN(Node * name, Pop("STACK_GLOBAL"));
      ASSIGN_OR_RETURN(Node * module, Pop("STACK_GLOBAL"));
      if (name->kind != Node::Kind::kString || module->kind != Node::Kind::kString) {
        return Invalid("STACK_GLOBAL needs a module and a name that are str");
      }
      return PushGlobal(module->text, name->text);
    }
    case kReduce: {
      ASSIGN_OR_RETURN(Node * args, Pop("REDUCE"));
      ASSIGN_OR_RETURN(Node * callable, Pop("REDUCE"));
      ASSIGN_OR_RETURN(Node * result, Call(callable, args, "REDUCE"));
      stack_.push_back(result);
      return absl::OkStatus();
    }
    case kNewObj: {
      ASSIGN_OR_RETURN(Node * args, Pop("NEWOBJ"));
      ASSIGN_OR_RETURN(Node * cls, Pop("NEWOBJ"));
      ASSIGN_OR_RETURN(Node * result, Instantiate(cls, args, nullptr, "NEWOBJ"));
      stack_.push_back(result);
      return absl::OkStatus();
    }
    case kNewObjEx: {
      ASSIGN_OR_RETURN(Node * kwargs, Pop("NEWOBJ_EX"));
      ASSIGN_OR_RETURN(Node * args, Pop("NEWOBJ_EX"));
      ASSIGN_OR_RETURN(Node * cls, Pop("NEWOBJ_EX"));
      if (kwargs->kind != Node::Kind::kDict) {
        return Invalid(absl::StrCat("NEWOBJ_EX keyword arguments are a ", KindName(kwargs->kind),
                                    ", expected a dict"));
      }
      ASSIGN_OR_RETURN(Node * result, Instantiate(cls, args, kwargs, "NEWOBJ_EX"));
      stack_.push_back(result);
      return absl::OkStatus();
    }
    case kInst: {
      ASSIGN_OR_RETURN(std::string module, TakeLine("INST"));
      ASSIGN_OR_RETURN(std::string name, TakeLine("INST"));
      ASSIGN_OR_RETURN(std::vector<Node*> items, PopMark("INST"));
      RETURN_IF_ERROR(PushGlobal(module, name));
      Node* cls = stack_.back();
      stack_.pop_back();
      Node* args = NewNode(Node::Kind::kTuple);
      args->items = std::move(items);
      ASSIGN_OR_RETURN(Node * result, Call(cls, args, "INST"));
      stack_.push_back(result);
      return absl::OkStatus();
    }
    case kObj: {
      ASSIGN_OR_RETURN(std::vector<Node*> items, PopMark("OBJ"));
      if (items.empty()) return Invalid("OBJ without a class after the MARK");
      Node* args = NewNode(Node::Kind::kTuple);
      args->items.assign(items.begin() + 1, items.end());
      ASSIGN_OR_RETURN(Node * result, Call(items[0], args, "OBJ"));
      stack_.push_back(result);
      return absl::OkStatus();
    }
    case kBuild: {
      ASSIGN_OR_RETURN(Node * state, Pop("BUILD"));
      ASSIGN_OR_RETURN(Node * target, Top("BUILD"));
      return Build(target, state);
    }
    default:
      return Invalid(absl::StrFormat("unknown opcode 0x%02x", op));
  }
}

absl::Status PickleMachine::StepPersistentId(uint8_t op) {
  Node* pid_node;
  if (op == kPersId) {
    ASSIGN_OR_RETURN(std::string line, TakeLine("PERSID"));
    pid_node = NewText(Node::Kind::kString, std::move(line));
  } else {
    ASSIGN_OR_RETURN(pid_node, Pop("BINPERSID"));
  }
  if (hooks_ == nullptr) {
    return Invalid("persistent id in a pickle read without a persistent-load handler");
  }
  ASSIGN_OR_RETURN(Value pid, ConvertTop(pid_node));
  absl::StatusOr<PersistentObject> object = hooks_->PersistentLoad(pid);
  if (!object.ok()) {
    return absl::Status(object.status().code(),
                        absl::StrCat(Where(), "persistent id ", pid.DebugString().substr(0, 200),
                                     ": ", object.status().message()));
  }
  if (!object->global_name.empty()) {
    stack_.push_back(NewText(Node::Kind::kGlobal, object->global_name));
  } else {
    Node* node = NewNode(Node::Kind::kValue);
    node->value = std::make_unique<Value>(std::move(object->value));
    stack_.push_back(node);
  }
  return absl::OkStatus();
}

void PickleMachine::NoteOpaque(const std::string& name) {
  if (IsQuietOpaque(name) || !opaque_seen_.insert(name).second) return;
  warnings_.push_back(absl::StrCat(options_.name, ": kept '", name,
                                   "' as opaque data (not on the allow-list; nothing executed)"));
}

Node* PickleMachine::NewObject(const std::string& name, Node* args) {
  Node* node = NewText(Node::Kind::kObject, name);
  node->args = args;
  NoteOpaque(name);
  return node;
}

absl::StatusOr<Node*> PickleMachine::MakeContainer(const std::string& name, Node* args) {
  const std::vector<Node*>& arg_items = args->items;
  if (IsDictClass(name)) {
    Node* dict = NewNode(Node::Kind::kDict);
    dict->text = name;  // OrderedDict or dict: written back as the same class.
    if (arg_items.empty()) return dict;
    Node* source = arg_items[0];
    if (source->kind == Node::Kind::kDict) {
      dict->entries = source->entries;
      return dict;
    }
    auto items = Iterable(source);
    if (!items.ok()) return Invalid(absl::StrCat(name, "(): ", items.status().message()));
    for (Node* pair : **items) {
      if ((pair->kind != Node::Kind::kTuple && pair->kind != Node::Kind::kList) ||
          pair->items.size() != 2) {
        return Invalid(absl::StrCat(name, "(): items must be (key, value) pairs, found a ",
                                    KindName(pair->kind)));
      }
      dict->entries.emplace_back(pair->items[0], pair->items[1]);
    }
    return dict;
  }
  Node::Kind kind = IsListClass(name)    ? Node::Kind::kList
                    : IsTupleClass(name) ? Node::Kind::kTuple
                                         : Node::Kind::kSet;
  Node* container = NewNode(kind);
  if (arg_items.empty()) return container;
  auto items = Iterable(arg_items[0]);
  if (!items.ok()) return Invalid(absl::StrCat(name, "(): ", items.status().message()));
  container->items = **items;
  return container;
}

absl::StatusOr<Node*> PickleMachine::MakeBytes(const std::string& name, Node* args) {
  const std::vector<Node*>& a = args->items;
  if (a.empty()) return NewText(Node::Kind::kBytes, "");
  Node* data = a[0];
  if (data->kind == Node::Kind::kBytes) return NewText(Node::Kind::kBytes, data->text);
  if (data->kind == Node::Kind::kString) {
    if (a.size() < 2 || a[1]->kind != Node::Kind::kString) {
      return Invalid(absl::StrCat(name, "() of a str needs an encoding"));
    }
    absl::StatusOr<std::string> bytes = EncodeText(data->text, a[1]->text);
    if (!bytes.ok()) return AtOpcode(bytes.status());
    return NewText(Node::Kind::kBytes, *std::move(bytes));
  }
  auto items = Iterable(data);
  if (!items.ok()) return Invalid(absl::StrCat(name, "(): ", items.status().message()));
  std::string bytes;
  for (Node* item : **items) {
    if (item->kind != Node::Kind::kInt || item->int_value < 0 || item->int_value > 255) {
      return Invalid(absl::StrCat(name, "(): items must be ints in [0, 255]"));
    }
    bytes.push_back(static_cast<char>(item->int_value));
  }
  return NewText(Node::Kind::kBytes, std::move(bytes));
}

absl::StatusOr<Node*> PickleMachine::CallHook(const std::string& name, Node* args) {
  ASSIGN_OR_RETURN(Value args_value, ConvertTop(args));
  absl::StatusOr<std::optional<Value>> result = hooks_->CallGlobal(name, args_value);
  if (!result.ok()) {
    return absl::Status(result.status().code(),
                        absl::StrCat(Where(), name, ": ", result.status().message()));
  }
  if (!result->has_value()) return NewObject(name, args);
  Node* node = NewNode(Node::Kind::kValue);
  node->value = std::make_unique<Value>(std::move(**result));
  return node;
}

// cls.__new__(cls, *args, **kwargs) for NEWOBJ, NEWOBJ_EX, copyreg.__newobj__.
absl::StatusOr<Node*> PickleMachine::Instantiate(Node* cls, Node* args, Node* kwargs,
                                                 absl::string_view op) {
  if (cls->kind != Node::Kind::kGlobal) {
    return Invalid(absl::StrCat(op, ": the class is a ", KindName(cls->kind), ", not a global"));
  }
  if (args->kind != Node::Kind::kTuple) {
    return Invalid(
        absl::StrCat(op, ": arguments are a ", KindName(args->kind), ", expected a tuple"));
  }
  const std::string& name = cls->text;
  if (IsDictClass(name) || IsListClass(name) || IsSetClass(name)) {
    // __new__ of these ignores its arguments; the items follow as SETITEMS / APPENDS.
    Node* container = NewNode(IsDictClass(name)   ? Node::Kind::kDict
                              : IsListClass(name) ? Node::Kind::kList
                                                  : Node::Kind::kSet);
    if (IsDictClass(name)) container->text = name;
    return container;
  }
  if (IsTupleClass(name) || IsBytesClass(name)) return Call(cls, args, op);
  if (hooks_ != nullptr && hooks_->HandlesGlobal(name)) return CallHook(name, args);
  if (kwargs != nullptr && !kwargs->entries.empty()) {
    Node* both = NewNode(Node::Kind::kTuple);
    both->items = {args, kwargs};
    return NewObject(name, both);
  }
  return NewObject(name, args);
}

// callable(*args) for REDUCE, INST and OBJ.
absl::StatusOr<Node*> PickleMachine::Call(Node* callable, Node* args, absl::string_view op) {
  if (args->kind != Node::Kind::kTuple) {
    return Invalid(
        absl::StrCat(op, ": arguments are a ", KindName(args->kind), ", expected a tuple"));
  }
  if (callable->kind == Node::Kind::kObject) {
    // Calling something that was itself never executed: record the call as data.
    return NewObject(absl::StrCat(callable->text, "()"), args);
  }
  if (callable->kind != Node::Kind::kGlobal) {
    return Invalid(
        absl::StrCat(op, ": the callable is a ", KindName(callable->kind), ", not a global"));
  }
  const std::string& name = callable->text;
  const std::vector<Node*>& a = args->items;
  if (IsDictClass(name) || IsListClass(name) || IsSetClass(name) || IsTupleClass(name)) {
    return MakeContainer(name, args);
  }
  if (IsBytesClass(name)) return MakeBytes(name, args);
  if (name == "_codecs.encode") {
    if (a.empty() || a[0]->kind != Node::Kind::kString ||
        (a.size() > 1 && a[1]->kind != Node::Kind::kString)) {
      return Invalid("_codecs.encode needs (str, encoding)");
    }
    absl::StatusOr<std::string> bytes = EncodeText(a[0]->text, a.size() > 1 ? a[1]->text : "utf-8");
    if (!bytes.ok()) return AtOpcode(bytes.status());
    return NewText(Node::Kind::kBytes, *std::move(bytes));
  }
  if (name == "copyreg._reconstructor") {
    if (a.size() != 3 || a[0]->kind != Node::Kind::kGlobal) {
      return Invalid("copyreg._reconstructor needs (class, base, state)");
    }
    Node* ctor_args = NewNode(Node::Kind::kTuple);
    if (a[2]->kind != Node::Kind::kNone) ctor_args->items.push_back(a[2]);
    return Instantiate(a[0], ctor_args, nullptr, op);
  }
  if (name == "copyreg.__newobj__") {
    if (a.empty()) return Invalid("copyreg.__newobj__ needs a class");
    Node* rest = NewNode(Node::Kind::kTuple);
    rest->items.assign(a.begin() + 1, a.end());
    return Instantiate(a[0], rest, nullptr, op);
  }
  if (name == "copyreg.__newobj_ex__") {
    if (a.size() != 3 || a[2]->kind != Node::Kind::kDict) {
      return Invalid("copyreg.__newobj_ex__ needs (class, args, kwargs)");
    }
    return Instantiate(a[0], a[1], a[2], op);
  }
  if (hooks_ != nullptr && hooks_->HandlesGlobal(name)) return CallHook(name, args);
  return NewObject(name, args);
}

absl::Status PickleMachine::Build(Node* target, Node* state) {
  switch (target->kind) {
    case Node::Kind::kObject:
      target->state = state;
      target->has_state = true;
      return absl::OkStatus();
    case Node::Kind::kDict:
      // Attributes of a dict subclass instance, e.g. a state dict's `_metadata` (the
      // per-module version numbers load_state_dict consults): not part of the mapping.
      return absl::OkStatus();
    default:
      warnings_.push_back(
          absl::StrCat(Where(), "ignored BUILD state on a ", KindName(target->kind)));
      return absl::OkStatus();
  }
}

absl::Status PickleMachine::SetItems(Node* target, const std::vector<Node*>& pairs,
                                     absl::string_view op) {
  if (pairs.size() % 2 != 0) {
    return Invalid(absl::StrCat(op, " with an odd number (", pairs.size(), ") of keys and values"));
  }
  if (target->kind != Node::Kind::kDict && target->kind != Node::Kind::kObject) {
    return Invalid(absl::StrCat(op, " on a ", KindName(target->kind), ", expected a dict"));
  }
  for (size_t i = 0; i < pairs.size(); i += 2) target->entries.emplace_back(pairs[i], pairs[i + 1]);
  return absl::OkStatus();
}

absl::Status PickleMachine::Append(Node* target, const std::vector<Node*>& items,
                                   absl::string_view op) {
  if (target->kind != Node::Kind::kList && target->kind != Node::Kind::kSet &&
      target->kind != Node::Kind::kObject) {
    return Invalid(absl::StrCat(op, " on a ", KindName(target->kind), ", expected a list"));
  }
  target->items.insert(target->items.end(), items.begin(), items.end());
  return absl::OkStatus();
}

absl::Status PickleMachine::PushGlobal(absl::string_view module, absl::string_view name) {
  if (module.empty() || name.empty()) return Invalid("GLOBAL with an empty module or name");
  stack_.push_back(NewText(Node::Kind::kGlobal, absl::StrCat(MapPython2Module(module), ".", name)));
  return absl::OkStatus();
}

}  // namespace ckpt::pickle_internal

#include "libs/format/pickle_reader.h"

#include <algorithm>
#include <cstring>
#include <deque>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/strip.h"
#include "libs/status/status_macros.h"

namespace ckpt {
namespace {

// Opcodes of pickle protocols 0-5 (Python's Lib/pickle.py).
enum Opcode : uint8_t {
  kMark = '(',
  kStop = '.',
  kPop = '0',
  kPopMark = '1',
  kDup = '2',
  kFloat = 'F',
  kInt = 'I',
  kBinInt = 'J',
  kBinInt1 = 'K',
  kLong = 'L',
  kBinInt2 = 'M',
  kNone = 'N',
  kPersId = 'P',
  kBinPersId = 'Q',
  kReduce = 'R',
  kString = 'S',
  kBinString = 'T',
  kShortBinString = 'U',
  kUnicode = 'V',
  kBinUnicode = 'X',
  kAppend = 'a',
  kBuild = 'b',
  kGlobal = 'c',
  kDict = 'd',
  kEmptyDict = '}',
  kAppends = 'e',
  kGet = 'g',
  kBinGet = 'h',
  kInst = 'i',
  kLongBinGet = 'j',
  kList = 'l',
  kEmptyList = ']',
  kObj = 'o',
  kPut = 'p',
  kBinPut = 'q',
  kLongBinPut = 'r',
  kSetItem = 's',
  kTuple = 't',
  kEmptyTuple = ')',
  kSetItems = 'u',
  kBinFloat = 'G',
  kProto = 0x80,
  kNewObj = 0x81,
  kExt1 = 0x82,
  kExt2 = 0x83,
  kExt4 = 0x84,
  kTuple1 = 0x85,
  kTuple2 = 0x86,
  kTuple3 = 0x87,
  kNewTrue = 0x88,
  kNewFalse = 0x89,
  kLong1 = 0x8a,
  kLong4 = 0x8b,
  kBinBytes = 'B',
  kShortBinBytes = 'C',
  kShortBinUnicode = 0x8c,
  kBinUnicode8 = 0x8d,
  kBinBytes8 = 0x8e,
  kEmptySet = 0x8f,
  kAddItems = 0x90,
  kFrozenSet = 0x91,
  kNewObjEx = 0x92,
  kStackGlobal = 0x93,
  kMemoize = 0x94,
  kFrame = 0x95,
  kByteArray8 = 0x96,
  kNextBuffer = 0x97,
  kReadOnlyBuffer = 0x98,
};

constexpr int kHighestProtocol = 5;
constexpr size_t kChunkSize = 64 * 1024;
// Integers wider than this (8192 bits) are refused rather than converted to decimal.
constexpr size_t kMaxBigIntBytes = 1024;
// Default bound on the Values one pickle may expand to: kBaseValueBudget + kValuesPerByte per
// pickle byte read (a Value is ~150 bytes with its containers).
constexpr int64_t kBaseValueBudget = int64_t{2} << 20;
constexpr int64_t kValuesPerByte = 4;

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

void AppendUtf8(uint32_t code_point, std::string& out) {
  if (code_point < 0x80) {
    out.push_back(static_cast<char>(code_point));
  } else if (code_point < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (code_point >> 6)));
    out.push_back(static_cast<char>(0x80 | (code_point & 0x3F)));
  } else if (code_point < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (code_point >> 12)));
    out.push_back(static_cast<char>(0x80 | ((code_point >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (code_point & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (code_point >> 18)));
    out.push_back(static_cast<char>(0x80 | ((code_point >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((code_point >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (code_point & 0x3F)));
  }
}

int HexDigit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// Decodes UTF-8 into code points; false on malformed input.
bool DecodeUtf8(absl::string_view text, std::vector<uint32_t>& out) {
  for (size_t i = 0; i < text.size();) {
    const unsigned char c = static_cast<unsigned char>(text[i]);
    int length;
    uint32_t code_point;
    if (c < 0x80) {
      length = 1;
      code_point = c;
    } else if ((c & 0xE0) == 0xC0) {
      length = 2;
      code_point = c & 0x1F;
    } else if ((c & 0xF0) == 0xE0) {
      length = 3;
      code_point = c & 0x0F;
    } else if ((c & 0xF8) == 0xF0) {
      length = 4;
      code_point = c & 0x07;
    } else {
      return false;
    }
    if (i + length > text.size()) return false;
    for (int k = 1; k < length; ++k) {
      const unsigned char next = static_cast<unsigned char>(text[i + k]);
      if ((next & 0xC0) != 0x80) return false;
      code_point = (code_point << 6) | (next & 0x3F);
    }
    out.push_back(code_point);
    i += length;
  }
  return true;
}

// Two's-complement little-endian bytes (LONG1 / LONG4) to decimal text.
std::string LittleEndianToDecimal(absl::string_view bytes) {
  std::vector<uint8_t> magnitude(bytes.begin(), bytes.end());
  const bool negative = !magnitude.empty() && (magnitude.back() & 0x80);
  if (negative) {
    // Negate: invert and add one.
    int carry = 1;
    for (uint8_t& b : magnitude) {
      const int sum = static_cast<uint8_t>(~b) + carry;
      b = static_cast<uint8_t>(sum & 0xFF);
      carry = sum >> 8;
    }
  }
  // Repeated division by 10^9, most significant byte first.
  std::vector<uint8_t> digits(magnitude.rbegin(), magnitude.rend());
  std::string decimal;
  while (true) {
    size_t first = 0;
    while (first < digits.size() && digits[first] == 0) ++first;
    if (first == digits.size()) break;
    uint64_t remainder = 0;
    for (size_t i = first; i < digits.size(); ++i) {
      const uint64_t current = (remainder << 8) | digits[i];
      digits[i] = static_cast<uint8_t>(current / 1000000000);
      remainder = current % 1000000000;
    }
    std::string chunk = absl::StrFormat("%09d", remainder);
    decimal.insert(0, chunk);
  }
  absl::string_view trimmed = decimal;
  while (trimmed.size() > 1 && trimmed.front() == '0') trimmed.remove_prefix(1);
  if (trimmed.empty()) trimmed = "0";
  return absl::StrCat(negative ? "-" : "", trimmed);
}

class Machine {
 public:
  Machine(const ByteSource& source, uint64_t start, const PickleOptions& options,
          PickleHooks* hooks)
      : source_(source), start_(start), pos_(start), options_(options), hooks_(hooks) {
    max_values_ = options.max_values;
    none_ = NewNode(Node::Kind::kNone);
    true_ = NewNode(Node::Kind::kBool);
    true_->int_value = 1;
    false_ = NewNode(Node::Kind::kBool);
  }

  absl::StatusOr<PickleResult> Run();

 private:
  // --- Errors -----------------------------------------------------------------------------------
  std::string Where() const { return absl::StrCat(options_.name, " offset ", op_offset_, ": "); }
  absl::Status Invalid(absl::string_view message) const {
    return absl::InvalidArgumentError(absl::StrCat(Where(), message));
  }
  absl::Status Truncated(absl::string_view what, uint64_t needed) const {
    return absl::DataLossError(absl::StrCat(Where(), what, " needs ", needed, " bytes but only ",
                                            Remaining(),
                                            " remain in the input (truncated or corrupt)"));
  }

  // --- Input ------------------------------------------------------------------------------------
  uint64_t Remaining() const { return source_.size() > pos_ ? source_.size() - pos_ : 0; }

  // The next `n` bytes, valid until the next read.
  absl::StatusOr<absl::string_view> Take(uint64_t n, absl::string_view what) {
    if (n > Remaining()) return Truncated(what, n);
    const uint64_t buffer_end = buffer_offset_ + buffer_.size();
    if (pos_ >= buffer_offset_ && pos_ + n <= buffer_end) {
      absl::string_view out(buffer_.data() + (pos_ - buffer_offset_), n);
      pos_ += n;
      return out;
    }
    if (n <= kChunkSize) {
      const uint64_t fill = std::min<uint64_t>(kChunkSize, Remaining());
      buffer_.resize(fill);
      RETURN_IF_ERROR(source_.ReadAt(pos_, absl::MakeSpan(buffer_)));
      buffer_offset_ = pos_;
      pos_ += n;
      return absl::string_view(buffer_.data(), n);
    }
    large_.resize(n);
    RETURN_IF_ERROR(source_.ReadAt(pos_, absl::MakeSpan(large_)));
    pos_ += n;
    return absl::string_view(large_);
  }

  absl::StatusOr<uint64_t> TakeUnsigned(int n, absl::string_view what) {
    ASSIGN_OR_RETURN(absl::string_view bytes, Take(n, what));
    uint64_t value = 0;
    for (int i = 0; i < n; ++i) value |= uint64_t{static_cast<uint8_t>(bytes[i])} << (8 * i);
    return value;
  }

  // A text argument up to (not including) the next newline. Scans the buffered bytes first, so
  // a pickle of many short lines costs one read per buffer, not one per line.
  absl::StatusOr<std::string> TakeLine(absl::string_view what) {
    std::string line;
    while (true) {
      if (Remaining() == 0) {
        return absl::DataLossError(
            absl::StrCat(Where(), what, ": no newline before the end of the input"));
      }
      if (pos_ < buffer_offset_ || pos_ >= buffer_offset_ + buffer_.size()) {
        buffer_.resize(std::min<uint64_t>(kChunkSize, Remaining()));
        RETURN_IF_ERROR(source_.ReadAt(pos_, absl::MakeSpan(buffer_)));
        buffer_offset_ = pos_;
      }
      const absl::string_view available(buffer_.data() + (pos_ - buffer_offset_),
                                        buffer_offset_ + buffer_.size() - pos_);
      const size_t newline = available.find('\n');
      if (newline != absl::string_view::npos) {
        line.append(available.data(), newline);
        pos_ += newline + 1;
        return line;
      }
      line.append(available.data(), available.size());
      pos_ += available.size();
    }
  }

  // --- Nodes and the stack ----------------------------------------------------------------------
  Node* NewNode(Node::Kind kind) {
    arena_.emplace_back();
    Node* node = &arena_.back();
    node->kind = kind;
    node->offset = op_offset_;
    return node;
  }
  Node* NewInt(int64_t value) {
    Node* node = NewNode(Node::Kind::kInt);
    node->int_value = value;
    return node;
  }
  Node* NewText(Node::Kind kind, std::string text) {
    Node* node = NewNode(kind);
    node->text = std::move(text);
    return node;
  }

  size_t Floor() const { return marks_.empty() ? 0 : marks_.back(); }

  absl::StatusOr<Node*> Pop(absl::string_view op) {
    if (stack_.size() <= Floor()) {
      return Invalid(
          absl::StrCat(op, " needs an object on the stack but ",
                       stack_.empty() ? "the stack is empty" : "there is none above the mark"));
    }
    Node* node = stack_.back();
    stack_.pop_back();
    return node;
  }
  absl::StatusOr<Node*> Top(absl::string_view op) {
    if (stack_.size() <= Floor()) {
      return Invalid(
          absl::StrCat(op, " needs an object on the stack but ",
                       stack_.empty() ? "the stack is empty" : "there is none above the mark"));
    }
    return stack_.back();
  }
  // The objects pushed since the last MARK, removing them and the mark.
  absl::StatusOr<std::vector<Node*>> PopMark(absl::string_view op) {
    if (marks_.empty()) return Invalid(absl::StrCat(op, " without a MARK before it"));
    const size_t mark = marks_.back();
    marks_.pop_back();
    std::vector<Node*> items(stack_.begin() + mark, stack_.end());
    stack_.resize(mark);
    return items;
  }

  // --- Objects ----------------------------------------------------------------------------------
  void NoteOpaque(const std::string& name) {
    if (IsQuietOpaque(name) || !opaque_seen_.insert(name).second) return;
    warnings_.push_back(absl::StrCat(options_.name, ": kept '", name,
                                     "' as opaque data (not on the allow-list; nothing executed)"));
  }

  Node* NewObject(const std::string& name, Node* args) {
    Node* node = NewText(Node::Kind::kObject, name);
    node->args = args;
    NoteOpaque(name);
    return node;
  }

  static absl::StatusOr<const std::vector<Node*>*> Iterable(Node* node) {
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

  absl::StatusOr<Node*> MakeContainer(const std::string& name, Node* args) {
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

  absl::StatusOr<std::string> EncodeText(const std::string& text, absl::string_view encoding) {
    const std::string lower = absl::AsciiStrToLower(encoding);
    if (lower == "utf-8" || lower == "utf8") return text;
    if (lower == "latin1" || lower == "latin-1" || lower == "iso-8859-1" || lower == "ascii") {
      std::vector<uint32_t> code_points;
      if (!DecodeUtf8(text, code_points)) return Invalid("_codecs.encode of malformed UTF-8 text");
      std::string out;
      out.reserve(code_points.size());
      for (uint32_t c : code_points) {
        if (c > 0xFF)
          return Invalid(
              absl::StrCat("_codecs.encode: U+", absl::Hex(c), " does not fit ", encoding));
        out.push_back(static_cast<char>(c));
      }
      return out;
    }
    return Invalid(absl::StrCat("_codecs.encode with unsupported encoding '", encoding, "'"));
  }

  absl::StatusOr<Node*> MakeBytes(const std::string& name, Node* args) {
    const std::vector<Node*>& a = args->items;
    if (a.empty()) return NewText(Node::Kind::kBytes, "");
    Node* data = a[0];
    if (data->kind == Node::Kind::kBytes) return NewText(Node::Kind::kBytes, data->text);
    if (data->kind == Node::Kind::kString) {
      if (a.size() < 2 || a[1]->kind != Node::Kind::kString) {
        return Invalid(absl::StrCat(name, "() of a str needs an encoding"));
      }
      ASSIGN_OR_RETURN(std::string bytes, EncodeText(data->text, a[1]->text));
      return NewText(Node::Kind::kBytes, std::move(bytes));
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

  absl::StatusOr<Node*> CallHook(const std::string& name, Node* args) {
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
  absl::StatusOr<Node*> Instantiate(Node* cls, Node* args, Node* kwargs, absl::string_view op) {
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
  absl::StatusOr<Node*> Call(Node* callable, Node* args, absl::string_view op) {
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
      ASSIGN_OR_RETURN(std::string bytes,
                       EncodeText(a[0]->text, a.size() > 1 ? a[1]->text : "utf-8"));
      return NewText(Node::Kind::kBytes, std::move(bytes));
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

  absl::Status Build(Node* target, Node* state) {
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

  absl::Status SetItems(Node* target, const std::vector<Node*>& pairs, absl::string_view op) {
    if (pairs.size() % 2 != 0) {
      return Invalid(
          absl::StrCat(op, " with an odd number (", pairs.size(), ") of keys and values"));
    }
    if (target->kind != Node::Kind::kDict && target->kind != Node::Kind::kObject) {
      return Invalid(absl::StrCat(op, " on a ", KindName(target->kind), ", expected a dict"));
    }
    for (size_t i = 0; i < pairs.size(); i += 2)
      target->entries.emplace_back(pairs[i], pairs[i + 1]);
    return absl::OkStatus();
  }

  absl::Status Append(Node* target, const std::vector<Node*>& items, absl::string_view op) {
    if (target->kind != Node::Kind::kList && target->kind != Node::Kind::kSet &&
        target->kind != Node::Kind::kObject) {
      return Invalid(absl::StrCat(op, " on a ", KindName(target->kind), ", expected a list"));
    }
    target->items.insert(target->items.end(), items.begin(), items.end());
    return absl::OkStatus();
  }

  absl::Status Put(int64_t index) {
    ASSIGN_OR_RETURN(Node * top, Top("PUT"));
    if (index < 0) return Invalid(absl::StrCat("PUT of negative memo index ", index));
    memo_[index] = top;
    return absl::OkStatus();
  }

  absl::Status Get(int64_t index, absl::string_view op) {
    auto it = memo_.find(index);
    if (it == memo_.end()) {
      return Invalid(absl::StrCat(op, " of memo index ", index, " that was never PUT"));
    }
    it->second->shared = true;
    stack_.push_back(it->second);
    return absl::OkStatus();
  }

  absl::Status PushGlobal(absl::string_view module, absl::string_view name) {
    if (module.empty() || name.empty()) return Invalid("GLOBAL with an empty module or name");
    stack_.push_back(
        NewText(Node::Kind::kGlobal, absl::StrCat(MapPython2Module(module), ".", name)));
    return absl::OkStatus();
  }

  absl::Status PushLong(absl::string_view bytes) {
    if (bytes.size() > kMaxBigIntBytes) {
      return Invalid(absl::StrCat("integer of ", bytes.size(), " bytes is too large"));
    }
    // Drop redundant sign-extension bytes, then see whether it fits int64.
    size_t length = bytes.size();
    while (length > 1) {
      const uint8_t top = static_cast<uint8_t>(bytes[length - 1]);
      const uint8_t next = static_cast<uint8_t>(bytes[length - 2]);
      if ((top == 0x00 && !(next & 0x80)) || (top == 0xFF && (next & 0x80))) {
        --length;
      } else {
        break;
      }
    }
    if (length <= 8) {
      uint64_t value = 0;
      for (size_t i = 0; i < length; ++i) {
        value |= uint64_t{static_cast<uint8_t>(bytes[i])} << (8 * i);
      }
      if (length > 0 && length < 8 && (static_cast<uint8_t>(bytes[length - 1]) & 0x80)) {
        value |= ~uint64_t{0} << (8 * length);  // Sign-extend.
      }
      stack_.push_back(NewInt(static_cast<int64_t>(value)));
      return absl::OkStatus();
    }
    stack_.push_back(NewText(Node::Kind::kBigInt, LittleEndianToDecimal(bytes)));
    return absl::OkStatus();
  }

  // INT / LONG text: Python's int(text, 0) for the forms pickle writes.
  absl::Status PushDecimal(std::string text, absl::string_view op) {
    absl::string_view digits = absl::StripAsciiWhitespace(text);
    int64_t value;
    if (absl::SimpleAtoi(digits, &value)) {
      stack_.push_back(NewInt(value));
      return absl::OkStatus();
    }
    absl::string_view magnitude = digits;
    const bool negative = absl::ConsumePrefix(&magnitude, "-");
    if (!negative) absl::ConsumePrefix(&magnitude, "+");
    if (magnitude.empty() || magnitude.size() > kMaxBigIntBytes * 3 ||
        !std::all_of(magnitude.begin(), magnitude.end(), absl::ascii_isdigit)) {
      return Invalid(absl::StrCat(op, " argument '", absl::CHexEscape(text.substr(0, 40)),
                                  "' is not an integer"));
    }
    while (magnitude.size() > 1 && magnitude.front() == '0') magnitude.remove_prefix(1);
    stack_.push_back(NewText(Node::Kind::kBigInt, absl::StrCat(negative ? "-" : "", magnitude)));
    return absl::OkStatus();
  }

  // Python's codecs.escape_decode, for protocol 0 STRING.
  absl::StatusOr<std::string> EscapeDecode(absl::string_view in) {
    std::string out;
    for (size_t i = 0; i < in.size(); ++i) {
      if (in[i] != '\\') {
        out.push_back(in[i]);
        continue;
      }
      if (++i == in.size()) return Invalid("STRING ends with a lone backslash");
      const char c = in[i];
      switch (c) {
        case '\n':
          break;
        case '\\':
          out.push_back('\\');
          break;
        case '\'':
          out.push_back('\'');
          break;
        case '"':
          out.push_back('"');
          break;
        case 'a':
          out.push_back('\a');
          break;
        case 'b':
          out.push_back('\b');
          break;
        case 'f':
          out.push_back('\f');
          break;
        case 'n':
          out.push_back('\n');
          break;
        case 'r':
          out.push_back('\r');
          break;
        case 't':
          out.push_back('\t');
          break;
        case 'v':
          out.push_back('\v');
          break;
        case 'x': {
          if (i + 2 >= in.size()) return Invalid("STRING has a truncated \\x escape");
          const int high = HexDigit(in[i + 1]);
          const int low = HexDigit(in[i + 2]);
          if (high < 0 || low < 0) return Invalid("STRING has an invalid \\x escape");
          out.push_back(static_cast<char>(high * 16 + low));
          i += 2;
          break;
        }
        default:
          if (c >= '0' && c <= '7') {
            int value = c - '0';
            for (int k = 0; k < 2 && i + 1 < in.size() && in[i + 1] >= '0' && in[i + 1] <= '7';
                 ++k) {
              value = value * 8 + (in[++i] - '0');
            }
            out.push_back(static_cast<char>(value & 0xFF));
          } else {
            out.push_back('\\');
            out.push_back(c);
          }
      }
    }
    return out;
  }

  // Python's raw-unicode-escape decoding (protocol 0 UNICODE) to UTF-8.
  absl::StatusOr<std::string> RawUnicodeEscapeDecode(absl::string_view in) {
    std::string out;
    for (size_t i = 0; i < in.size(); ++i) {
      const unsigned char c = static_cast<unsigned char>(in[i]);
      if (c == '\\' && i + 1 < in.size() && (in[i + 1] == 'u' || in[i + 1] == 'U')) {
        // An odd run of backslashes escapes; Python counts preceding backslashes the same way.
        size_t backslashes = 0;
        for (size_t k = i; k-- > 0 && in[k] == '\\';) ++backslashes;
        if (backslashes % 2 == 0) {
          const int digits = in[i + 1] == 'u' ? 4 : 8;
          if (i + 2 + digits > in.size()) return Invalid("UNICODE has a truncated \\u escape");
          uint32_t code_point = 0;
          for (int k = 0; k < digits; ++k) {
            const int d = HexDigit(in[i + 2 + k]);
            if (d < 0) return Invalid("UNICODE has an invalid \\u escape");
            code_point = code_point * 16 + d;
          }
          if (code_point > 0x10FFFF) return Invalid("UNICODE escape beyond U+10FFFF");
          AppendUtf8(code_point, out);
          i += 1 + digits;
          continue;
        }
      }
      AppendUtf8(c, out);  // Latin-1.
    }
    return out;
  }

  absl::Status Step(uint8_t op);

  // --- Conversion to Value ----------------------------------------------------------------------
  // Every Value built is charged here. Without sharing, each opcode makes at most a few Values,
  // so the default budget grows with the bytes read; sharing through the memo multiplies.
  absl::Status Charge(int64_t count) {
    values_made_ += count;
    const int64_t limit =
        max_values_ > 0 ? max_values_
                        : kBaseValueBudget + kValuesPerByte * static_cast<int64_t>(pos_ - start_);
    if (values_made_ > limit) {
      return absl::ResourceExhaustedError(
          absl::StrCat(options_.name, ": the pickle expands to more than ", limit,
                       " values (objects shared through the memo count once per reference)"));
    }
    return absl::OkStatus();
  }

  // Converts the object graph under `root` to a Value. Iterative (an explicit stack of frames),
  // so hostile nesting costs heap, bounded by max_depth, never the thread's stack.
  absl::StatusOr<Value> ConvertTop(Node* root) {
    cache_.clear();
    frames_.clear();
    absl::StatusOr<Value> result = ConvertIteratively(root);
    for (Frame& frame : frames_) frame.node->converting = false;  // After an error.
    frames_.clear();
    return result;
  }

  struct Frame {
    Node* node;
    int64_t values_before;        // values_made_ when the node was entered.
    std::vector<Node*> children;  // In conversion order (ChildrenOf).
    std::vector<Value> values;    // Converted children so far.
  };

  static bool HasSimpleKeys(const std::vector<std::pair<Node*, Node*>>& entries) {
    return std::all_of(entries.begin(), entries.end(), [](const auto& e) {
      return e.first->kind == Node::Kind::kString || e.first->kind == Node::Kind::kInt;
    });
  }

  // Dict entries as children: the values when every key is a str or int (keys are read from
  // the nodes directly), else key and value alternately.
  static void AppendEntryChildren(const std::vector<std::pair<Node*, Node*>>& entries,
                                  std::vector<Node*>& out) {
    const bool simple = HasSimpleKeys(entries);
    for (const auto& [key, value] : entries) {
      if (!simple) out.push_back(key);
      out.push_back(value);
    }
  }

  static std::vector<Node*> ChildrenOf(const Node* node) {
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

  // The Value of a node without children, or nullopt for containers.
  absl::StatusOr<std::optional<Value>> LeafValue(const Node* node) {
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
  absl::StatusOr<std::optional<Value>> Enter(Node* node, size_t depth) {
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
          Value::Tuple({Value::String(node->kind == Node::Kind::kObject ? node->text
                                                                        : KindName(node->kind))}),
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
  absl::StatusOr<Value> FinishDict(const std::vector<std::pair<Node*, Node*>>& entries,
                                   std::vector<Value>& values, size_t& next, bool ordered) {
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

  absl::StatusOr<Value> Finish(const Node* node, std::vector<Value>& values) {
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
        return Invalid(absl::StrCat("cannot convert a ", KindName(node->kind)));
    }
  }

  absl::StatusOr<Value> ConvertIteratively(Node* root) {
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

  int64_t max_values_;
  int64_t values_made_ = 0;
  absl::flat_hash_map<const Node*, std::pair<Value, int64_t>> cache_;
  std::vector<Frame> frames_;
  bool warned_cycle_ = false;
  absl::flat_hash_set<std::string> opaque_seen_;
  std::vector<std::string> warnings_;
};

absl::Status Machine::Step(uint8_t op) {
  switch (op) {
    case kMark:
      marks_.push_back(stack_.size());
      return absl::OkStatus();
    case kPop: {
      if (stack_.size() > Floor()) {
        stack_.pop_back();
      } else if (!marks_.empty() && stack_.size() == marks_.back()) {
        marks_.pop_back();  // Python's POP discards a mark when nothing is above it.
      } else {
        return Invalid("POP with an empty stack");
      }
      return absl::OkStatus();
    }
    case kPopMark:
      return PopMark("POP_MARK").status();
    case kDup: {
      ASSIGN_OR_RETURN(Node * top, Top("DUP"));
      top->shared = true;
      stack_.push_back(top);
      return absl::OkStatus();
    }
    case kFloat: {
      ASSIGN_OR_RETURN(std::string line, TakeLine("FLOAT"));
      double value;
      if (!absl::SimpleAtod(absl::StripAsciiWhitespace(line), &value)) {
        return Invalid(absl::StrCat("FLOAT argument '", absl::CHexEscape(line.substr(0, 40)),
                                    "' is not a number"));
      }
      Node* node = NewNode(Node::Kind::kFloat);
      node->float_value = value;
      stack_.push_back(node);
      return absl::OkStatus();
    }
    case kBinFloat: {
      ASSIGN_OR_RETURN(absl::string_view bytes, Take(8, "BINFLOAT"));
      uint64_t bits = 0;
      for (int i = 0; i < 8; ++i) bits = (bits << 8) | static_cast<uint8_t>(bytes[i]);
      double value;
      std::memcpy(&value, &bits, sizeof(value));
      Node* node = NewNode(Node::Kind::kFloat);
      node->float_value = value;
      stack_.push_back(node);
      return absl::OkStatus();
    }
    case kInt: {
      ASSIGN_OR_RETURN(std::string line, TakeLine("INT"));
      if (line == "00") {
        stack_.push_back(false_);
        return absl::OkStatus();
      }
      if (line == "01") {
        stack_.push_back(true_);
        return absl::OkStatus();
      }
      return PushDecimal(std::move(line), "INT");
    }
    case kLong: {
      ASSIGN_OR_RETURN(std::string line, TakeLine("LONG"));
      if (!line.empty() && line.back() == 'L') line.pop_back();
      return PushDecimal(std::move(line), "LONG");
    }
    case kBinInt: {
      ASSIGN_OR_RETURN(uint64_t value, TakeUnsigned(4, "BININT"));
      stack_.push_back(NewInt(static_cast<int32_t>(static_cast<uint32_t>(value))));
      return absl::OkStatus();
    }
    case kBinInt1: {
      ASSIGN_OR_RETURN(uint64_t value, TakeUnsigned(1, "BININT1"));
      stack_.push_back(NewInt(static_cast<int64_t>(value)));
      return absl::OkStatus();
    }
    case kBinInt2: {
      ASSIGN_OR_RETURN(uint64_t value, TakeUnsigned(2, "BININT2"));
      stack_.push_back(NewInt(static_cast<int64_t>(value)));
      return absl::OkStatus();
    }
    case kLong1: {
      ASSIGN_OR_RETURN(uint64_t length, TakeUnsigned(1, "LONG1"));
      ASSIGN_OR_RETURN(absl::string_view bytes, Take(length, "LONG1"));
      return PushLong(bytes);
    }
    case kLong4: {
      ASSIGN_OR_RETURN(uint64_t raw, TakeUnsigned(4, "LONG4"));
      const int32_t length = static_cast<int32_t>(static_cast<uint32_t>(raw));
      if (length < 0) return Invalid(absl::StrCat("LONG4 with negative length ", length));
      if (static_cast<size_t>(length) > kMaxBigIntBytes) {
        return Invalid(absl::StrCat("integer of ", length, " bytes is too large"));
      }
      ASSIGN_OR_RETURN(absl::string_view bytes, Take(length, "LONG4"));
      return PushLong(bytes);
    }
    case kNone:
      stack_.push_back(none_);
      return absl::OkStatus();
    case kNewTrue:
      stack_.push_back(true_);
      return absl::OkStatus();
    case kNewFalse:
      stack_.push_back(false_);
      return absl::OkStatus();
    case kString: {
      ASSIGN_OR_RETURN(std::string line, TakeLine("STRING"));
      absl::string_view quoted = absl::StripTrailingAsciiWhitespace(line);
      if (quoted.size() < 2 || quoted.front() != quoted.back() ||
          (quoted.front() != '\'' && quoted.front() != '"')) {
        return Invalid("the STRING opcode argument must be quoted");
      }
      ASSIGN_OR_RETURN(std::string text, EscapeDecode(quoted.substr(1, quoted.size() - 2)));
      stack_.push_back(NewText(Node::Kind::kString, std::move(text)));
      return absl::OkStatus();
    }
    case kBinString: {
      ASSIGN_OR_RETURN(uint64_t raw, TakeUnsigned(4, "BINSTRING"));
      const int32_t length = static_cast<int32_t>(static_cast<uint32_t>(raw));
      if (length < 0) return Invalid(absl::StrCat("BINSTRING with negative length ", length));
      ASSIGN_OR_RETURN(absl::string_view bytes, Take(length, "BINSTRING"));
      stack_.push_back(NewText(Node::Kind::kString, std::string(bytes)));
      return absl::OkStatus();
    }
    case kShortBinString:
    case kShortBinUnicode:
    case kShortBinBytes: {
      const char* what = op == kShortBinString    ? "SHORT_BINSTRING"
                         : op == kShortBinUnicode ? "SHORT_BINUNICODE"
                                                  : "SHORT_BINBYTES";
      ASSIGN_OR_RETURN(uint64_t length, TakeUnsigned(1, what));
      ASSIGN_OR_RETURN(absl::string_view bytes, Take(length, what));
      stack_.push_back(NewText(op == kShortBinBytes ? Node::Kind::kBytes : Node::Kind::kString,
                               std::string(bytes)));
      return absl::OkStatus();
    }
    case kUnicode: {
      ASSIGN_OR_RETURN(std::string line, TakeLine("UNICODE"));
      ASSIGN_OR_RETURN(std::string text, RawUnicodeEscapeDecode(line));
      stack_.push_back(NewText(Node::Kind::kString, std::move(text)));
      return absl::OkStatus();
    }
    case kBinUnicode:
    case kBinBytes: {
      const char* what = op == kBinUnicode ? "BINUNICODE" : "BINBYTES";
      ASSIGN_OR_RETURN(uint64_t length, TakeUnsigned(4, what));
      ASSIGN_OR_RETURN(absl::string_view bytes, Take(length, what));
      stack_.push_back(
          NewText(op == kBinBytes ? Node::Kind::kBytes : Node::Kind::kString, std::string(bytes)));
      return absl::OkStatus();
    }
    case kBinUnicode8:
    case kBinBytes8:
    case kByteArray8: {
      const char* what = op == kBinUnicode8 ? "BINUNICODE8"
                         : op == kBinBytes8 ? "BINBYTES8"
                                            : "BYTEARRAY8";
      ASSIGN_OR_RETURN(uint64_t length, TakeUnsigned(8, what));
      ASSIGN_OR_RETURN(absl::string_view bytes, Take(length, what));
      stack_.push_back(NewText(op == kBinUnicode8 ? Node::Kind::kString : Node::Kind::kBytes,
                               std::string(bytes)));
      return absl::OkStatus();
    }
    case kEmptyList:
      stack_.push_back(NewNode(Node::Kind::kList));
      return absl::OkStatus();
    case kEmptyTuple:
      stack_.push_back(NewNode(Node::Kind::kTuple));
      return absl::OkStatus();
    case kEmptyDict:
      stack_.push_back(NewNode(Node::Kind::kDict));
      return absl::OkStatus();
    case kEmptySet:
      stack_.push_back(NewNode(Node::Kind::kSet));
      return absl::OkStatus();
    case kList:
    case kTuple:
    case kFrozenSet: {
      ASSIGN_OR_RETURN(std::vector<Node*> items, PopMark(op == kList    ? "LIST"
                                                         : op == kTuple ? "TUPLE"
                                                                        : "FROZENSET"));
      Node* node = NewNode(op == kList    ? Node::Kind::kList
                           : op == kTuple ? Node::Kind::kTuple
                                          : Node::Kind::kSet);
      node->items = std::move(items);
      stack_.push_back(node);
      return absl::OkStatus();
    }
    case kTuple1:
    case kTuple2:
    case kTuple3: {
      const size_t count = op - kTuple1 + 1;
      if (stack_.size() < Floor() + count) {
        return Invalid(absl::StrCat("TUPLE", count, " needs ", count,
                                    " objects on the stack above the mark, found ",
                                    stack_.size() - Floor()));
      }
      Node* node = NewNode(Node::Kind::kTuple);
      node->items.assign(stack_.end() - count, stack_.end());
      stack_.resize(stack_.size() - count);
      stack_.push_back(node);
      return absl::OkStatus();
    }
    case kDict: {
      ASSIGN_OR_RETURN(std::vector<Node*> items, PopMark("DICT"));
      Node* node = NewNode(Node::Kind::kDict);
      RETURN_IF_ERROR(SetItems(node, items, "DICT"));
      stack_.push_back(node);
      return absl::OkStatus();
    }
    case kAppend: {
      ASSIGN_OR_RETURN(Node * item, Pop("APPEND"));
      ASSIGN_OR_RETURN(Node * target, Top("APPEND"));
      return Append(target, {item}, "APPEND");
    }
    case kAppends:
    case kAddItems: {
      const char* what = op == kAppends ? "APPENDS" : "ADDITEMS";
      ASSIGN_OR_RETURN(std::vector<Node*> items, PopMark(what));
      ASSIGN_OR_RETURN(Node * target, Top(what));
      return Append(target, items, what);
    }
    case kSetItem: {
      ASSIGN_OR_RETURN(Node * value, Pop("SETITEM"));
      ASSIGN_OR_RETURN(Node * key, Pop("SETITEM"));
      ASSIGN_OR_RETURN(Node * target, Top("SETITEM"));
      return SetItems(target, {key, value}, "SETITEM");
    }
    case kSetItems: {
      ASSIGN_OR_RETURN(std::vector<Node*> items, PopMark("SETITEMS"));
      ASSIGN_OR_RETURN(Node * target, Top("SETITEMS"));
      return SetItems(target, items, "SETITEMS");
    }
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
    case kPersId:
    case kBinPersId: {
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
        return absl::Status(object.status().code(), absl::StrCat(Where(), "persistent id ",
                                                                 pid.DebugString().substr(0, 200),
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
    case kPut: {
      ASSIGN_OR_RETURN(std::string line, TakeLine("PUT"));
      int64_t index;
      if (!absl::SimpleAtoi(line, &index)) {
        return Invalid(absl::StrCat("PUT argument '", absl::CHexEscape(line.substr(0, 40)),
                                    "' is not an integer"));
      }
      return Put(index);
    }
    case kBinPut: {
      ASSIGN_OR_RETURN(uint64_t index, TakeUnsigned(1, "BINPUT"));
      return Put(static_cast<int64_t>(index));
    }
    case kLongBinPut: {
      ASSIGN_OR_RETURN(uint64_t index, TakeUnsigned(4, "LONG_BINPUT"));
      return Put(static_cast<int64_t>(index));
    }
    case kMemoize:
      return Put(static_cast<int64_t>(memo_.size()));
    case kGet: {
      ASSIGN_OR_RETURN(std::string line, TakeLine("GET"));
      int64_t index;
      if (!absl::SimpleAtoi(line, &index)) {
        return Invalid(absl::StrCat("GET argument '", absl::CHexEscape(line.substr(0, 40)),
                                    "' is not an integer"));
      }
      return Get(index, "GET");
    }
    case kBinGet: {
      ASSIGN_OR_RETURN(uint64_t index, TakeUnsigned(1, "BINGET"));
      return Get(static_cast<int64_t>(index), "BINGET");
    }
    case kLongBinGet: {
      ASSIGN_OR_RETURN(uint64_t index, TakeUnsigned(4, "LONG_BINGET"));
      return Get(static_cast<int64_t>(index), "LONG_BINGET");
    }
    case kProto: {
      ASSIGN_OR_RETURN(uint64_t version, TakeUnsigned(1, "PROTO"));
      if (version > kHighestProtocol) {
        return Invalid(absl::StrCat("unsupported pickle protocol ", version, " (highest known is ",
                                    kHighestProtocol, ")"));
      }
      return absl::OkStatus();
    }
    case kFrame: {
      ASSIGN_OR_RETURN(uint64_t length, TakeUnsigned(8, "FRAME"));
      if (length > Remaining()) return Truncated("FRAME", length);
      return absl::OkStatus();  // Framing only batches reads; the opcodes inside are read as usual.
    }
    case kExt1:
    case kExt2:
    case kExt4:
      return absl::UnimplementedError(
          absl::StrCat(Where(), "EXT",
                       op == kExt1   ? 1
                       : op == kExt2 ? 2
                                     : 4,
                       ": the copyreg extension registry is not supported"));
    case kNextBuffer:
      return absl::UnimplementedError(
          absl::StrCat(Where(), "NEXT_BUFFER: out-of-band pickle buffers are not supported"));
    case kReadOnlyBuffer:
      return Top("READONLY_BUFFER").status();
    default:
      return Invalid(absl::StrFormat("unknown opcode 0x%02x", op));
  }
}

absl::StatusOr<PickleResult> Machine::Run() {
  while (true) {
    op_offset_ = pos_ - start_;
    if (Remaining() == 0) {
      return absl::DataLossError(
          absl::StrCat(Where(), "the pickle ends without a STOP opcode (truncated?)"));
    }
    ASSIGN_OR_RETURN(absl::string_view op, Take(1, "opcode"));
    const uint8_t code = static_cast<uint8_t>(op[0]);
    if (code == kStop) break;
    RETURN_IF_ERROR(Step(code));
  }
  ASSIGN_OR_RETURN(Node * top, Pop("STOP"));
  PickleResult result;
  ASSIGN_OR_RETURN(result.value, ConvertTop(top));
  result.end_offset = pos_;
  result.warnings = std::move(warnings_);
  if (hooks_ != nullptr) {
    for (std::string& warning : hooks_->warnings()) result.warnings.push_back(std::move(warning));
    hooks_->warnings().clear();
  }
  return result;
}

}  // namespace

absl::StatusOr<PersistentObject> PickleHooks::PersistentLoad(const Value& pid) {
  return absl::InvalidArgumentError("this pickle has persistent ids, which plain pickles do not");
}

absl::StatusOr<PickleResult> ReadPickle(const ByteSource& source, uint64_t offset,
                                        const PickleOptions& options, PickleHooks* hooks) {
  if (offset > source.size()) {
    return absl::DataLossError(absl::StrCat(options.name, ": starts at offset ", offset,
                                            " past the end of ", source.name(), " (", source.size(),
                                            " bytes)"));
  }
  PickleOptions named = options;
  if (named.name.empty()) named.name = source.name();
  Machine machine(source, offset, named, hooks);
  return machine.Run();
}

absl::StatusOr<Value> ReadPickleBytes(absl::string_view bytes, PickleHooks* hooks) {
  std::unique_ptr<ByteSource> source = MemorySource(bytes, "pickle");
  ASSIGN_OR_RETURN(PickleResult result, ReadPickle(*source, 0, PickleOptions(), hooks));
  return std::move(result.value);
}

}  // namespace ckpt

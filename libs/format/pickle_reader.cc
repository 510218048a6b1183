// ReadPickle and the pickle machine's run loop, input and opcodes (see internal/pickle_machine.h
// for how the machine's files divide).

#include "libs/format/pickle_reader.h"

#include <algorithm>
#include <cstring>
#include <memory>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/strip.h"
#include "libs/format/internal/pickle_machine.h"
#include "libs/format/internal/pickle_opcodes.h"
#include "libs/format/internal/pickle_text.h"
#include "libs/status/status_macros.h"

namespace ckpt {
namespace pickle_internal {
namespace {

constexpr size_t kChunkSize = 64 * 1024;

}  // namespace

PickleMachine::PickleMachine(const ByteSource& source, uint64_t start, const PickleOptions& options,
                             PickleHooks* hooks)
    : source_(source),
      start_(start),
      pos_(start),
      options_(options),
      hooks_(hooks),
      converter_(options, warnings_) {
  none_ = NewNode(Node::Kind::kNone);
  true_ = NewNode(Node::Kind::kBool);
  true_->int_value = 1;
  false_ = NewNode(Node::Kind::kBool);
}

absl::StatusOr<PickleResult> PickleMachine::Run() {
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

absl::Status PickleMachine::Truncated(absl::string_view what, uint64_t needed) const {
  return absl::DataLossError(absl::StrCat(Where(), what, " needs ", needed, " bytes but only ",
                                          Remaining(),
                                          " remain in the input (truncated or corrupt)"));
}

absl::StatusOr<absl::string_view> PickleMachine::Take(uint64_t n, absl::string_view what) {
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

absl::StatusOr<uint64_t> PickleMachine::TakeUnsigned(int n, absl::string_view what) {
  ASSIGN_OR_RETURN(absl::string_view bytes, Take(n, what));
  uint64_t value = 0;
  for (int i = 0; i < n; ++i) value |= uint64_t{static_cast<uint8_t>(bytes[i])} << (8 * i);
  return value;
}

// Scans the buffered bytes first, so a pickle of many short lines costs one read per buffer, not
// one per line.
absl::StatusOr<std::string> PickleMachine::TakeLine(absl::string_view what) {
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

Node* PickleMachine::NewNode(Node::Kind kind) {
  arena_.emplace_back();
  Node* node = &arena_.back();
  node->kind = kind;
  node->offset = op_offset_;
  return node;
}
Node* PickleMachine::NewInt(int64_t value) {
  Node* node = NewNode(Node::Kind::kInt);
  node->int_value = value;
  return node;
}
Node* PickleMachine::NewText(Node::Kind kind, std::string text) {
  Node* node = NewNode(kind);
  node->text = std::move(text);
  return node;
}

absl::StatusOr<Node*> PickleMachine::Pop(absl::string_view op) {
  if (stack_.size() <= Floor()) {
    return Invalid(
        absl::StrCat(op, " needs an object on the stack but ",
                     stack_.empty() ? "the stack is empty" : "there is none above the mark"));
  }
  Node* node = stack_.back();
  stack_.pop_back();
  return node;
}
absl::StatusOr<Node*> PickleMachine::Top(absl::string_view op) {
  if (stack_.size() <= Floor()) {
    return Invalid(
        absl::StrCat(op, " needs an object on the stack but ",
                     stack_.empty() ? "the stack is empty" : "there is none above the mark"));
  }
  return stack_.back();
}
absl::StatusOr<std::vector<Node*>> PickleMachine::PopMark(absl::string_view op) {
  if (marks_.empty()) return Invalid(absl::StrCat(op, " without a MARK before it"));
  const size_t mark = marks_.back();
  marks_.pop_back();
  std::vector<Node*> items(stack_.begin() + mark, stack_.end());
  stack_.resize(mark);
  return items;
}

absl::Status PickleMachine::Step(uint8_t op) {
  switch (op) {
    case kMark:
    case kPop:
    case kPopMark:
    case kDup:
      return StepStack(op);
    case kFloat:
    case kBinFloat:
    case kInt:
    case kLong:
    case kBinInt:
    case kBinInt1:
    case kBinInt2:
    case kLong1:
    case kLong4:
    case kNone:
    case kNewTrue:
    case kNewFalse:
      return StepNumber(op);
    case kString:
    case kBinString:
    case kShortBinString:
    case kShortBinUnicode:
    case kShortBinBytes:
    case kUnicode:
    case kBinUnicode:
    case kBinBytes:
    case kBinUnicode8:
    case kBinBytes8:
    case kByteArray8:
      return StepString(op);
    case kEmptyList:
    case kEmptyTuple:
    case kEmptyDict:
    case kEmptySet:
    case kList:
    case kTuple:
    case kFrozenSet:
    case kTuple1:
    case kTuple2:
    case kTuple3:
    case kDict:
    case kAppend:
    case kAppends:
    case kAddItems:
    case kSetItem:
    case kSetItems:
      return StepContainer(op);
    case kGlobal:
    case kStackGlobal:
    case kReduce:
    case kNewObj:
    case kNewObjEx:
    case kInst:
    case kObj:
    case kBuild:
      return StepObject(op);
    case kPersId:
    case kBinPersId:
      return StepPersistentId(op);
    case kPut:
    case kBinPut:
    case kLongBinPut:
    case kMemoize:
    case kGet:
    case kBinGet:
    case kLongBinGet:
      return StepMemo(op);
    case kProto:
    case kFrame:
    case kExt1:
    case kExt2:
    case kExt4:
    case kNextBuffer:
    case kReadOnlyBuffer:
      return StepProtocol(op);
    default:
      return Invalid(absl::StrFormat("unknown opcode 0x%02x", op));
  }
}

absl::Status PickleMachine::StepStack(uint8_t op) {
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
    default:
      return Invalid(absl::StrFormat("unknown opcode 0x%02x", op));
  }
}

absl::Status PickleMachine::StepNumber(uint8_t op) {
  switch (op) {
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
    default:
      return Invalid(absl::StrFormat("unknown opcode 0x%02x", op));
  }
}

absl::Status PickleMachine::StepString(uint8_t op) {
  switch (op) {
    case kString: {
      ASSIGN_OR_RETURN(std::string line, TakeLine("STRING"));
      absl::string_view quoted = absl::StripTrailingAsciiWhitespace(line);
      if (quoted.size() < 2 || quoted.front() != quoted.back() ||
          (quoted.front() != '\'' && quoted.front() != '"')) {
        return Invalid("the STRING opcode argument must be quoted");
      }
      absl::StatusOr<std::string> text = EscapeDecode(quoted.substr(1, quoted.size() - 2));
      if (!text.ok()) return AtOpcode(text.status());
      stack_.push_back(NewText(Node::Kind::kString, *std::move(text)));
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
      absl::StatusOr<std::string> text = RawUnicodeEscapeDecode(line);
      if (!text.ok()) return AtOpcode(text.status());
      stack_.push_back(NewText(Node::Kind::kString, *std::move(text)));
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
    default:
      return Invalid(absl::StrFormat("unknown opcode 0x%02x", op));
  }
}

absl::Status PickleMachine::StepContainer(uint8_t op) {
  switch (op) {
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
    default:
      return Invalid(absl::StrFormat("unknown opcode 0x%02x", op));
  }
}

absl::Status PickleMachine::StepMemo(uint8_t op) {
  switch (op) {
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
    default:
      return Invalid(absl::StrFormat("unknown opcode 0x%02x", op));
  }
}

absl::Status PickleMachine::StepProtocol(uint8_t op) {
  switch (op) {
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

absl::Status PickleMachine::Put(int64_t index) {
  ASSIGN_OR_RETURN(Node * top, Top("PUT"));
  if (index < 0) return Invalid(absl::StrCat("PUT of negative memo index ", index));
  memo_[index] = top;
  return absl::OkStatus();
}

absl::Status PickleMachine::Get(int64_t index, absl::string_view op) {
  auto it = memo_.find(index);
  if (it == memo_.end()) {
    return Invalid(absl::StrCat(op, " of memo index ", index, " that was never PUT"));
  }
  it->second->shared = true;
  stack_.push_back(it->second);
  return absl::OkStatus();
}

absl::Status PickleMachine::PushLong(absl::string_view bytes) {
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
absl::Status PickleMachine::PushDecimal(std::string text, absl::string_view op) {
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

}  // namespace pickle_internal

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
  pickle_internal::PickleMachine machine(source, offset, named, hooks);
  return machine.Run();
}

absl::StatusOr<Value> ReadPickleBytes(absl::string_view bytes, PickleHooks* hooks) {
  std::unique_ptr<ByteSource> source = MemorySource(bytes, "pickle");
  ASSIGN_OR_RETURN(PickleResult result, ReadPickle(*source, 0, PickleOptions(), hooks));
  return std::move(result.value);
}

}  // namespace ckpt

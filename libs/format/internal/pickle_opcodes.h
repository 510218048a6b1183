#ifndef CKPT_LIBS_FORMAT_INTERNAL_PICKLE_OPCODES_H_
#define CKPT_LIBS_FORMAT_INTERNAL_PICKLE_OPCODES_H_

// The pickle machine's opcodes and protocol limits (private to :pickle_reader; see
// internal/pickle_machine.h for how its files fit together).

#include <cstddef>
#include <cstdint>

namespace ckpt::pickle_internal {

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
// Integers wider than this (8192 bits) are refused rather than converted to decimal.
constexpr size_t kMaxBigIntBytes = 1024;

}  // namespace ckpt::pickle_internal

#endif  // CKPT_LIBS_FORMAT_INTERNAL_PICKLE_OPCODES_H_

#include "libs/status/rocksdb_status.h"

#include <string>

#include "absl/strings/str_cat.h"

namespace ckpt {
namespace {

absl::StatusCode CodeFor(const rocksdb::Status& status) {
  using Code = rocksdb::Status::Code;
  using SubCode = rocksdb::Status::SubCode;
  switch (status.subcode()) {
    case SubCode::kNoSpace:
    case SubCode::kSpaceLimit:
    case SubCode::kMemoryLimit:
      return absl::StatusCode::kResourceExhausted;
    case SubCode::kPathNotFound:
      return absl::StatusCode::kNotFound;
    case SubCode::kLockTimeout:
      return absl::StatusCode::kDeadlineExceeded;
    default:
      break;
  }
  switch (status.code()) {
    case Code::kOk:
      return absl::StatusCode::kOk;
    case Code::kNotFound:
      return absl::StatusCode::kNotFound;
    case Code::kCorruption:
      return absl::StatusCode::kDataLoss;
    case Code::kNotSupported:
      return absl::StatusCode::kUnimplemented;
    case Code::kInvalidArgument:
      return absl::StatusCode::kInvalidArgument;
    case Code::kIOError:
      return absl::StatusCode::kUnavailable;
    case Code::kMergeInProgress:
    case Code::kBusy:
    case Code::kAborted:
      return absl::StatusCode::kAborted;
    case Code::kIncomplete:
    case Code::kShutdownInProgress:
    case Code::kTryAgain:
      return absl::StatusCode::kUnavailable;
    case Code::kTimedOut:
      return absl::StatusCode::kDeadlineExceeded;
    case Code::kExpired:
      return absl::StatusCode::kFailedPrecondition;
    case Code::kCompactionTooLarge:
      return absl::StatusCode::kResourceExhausted;
    case Code::kColumnFamilyDropped:
      return absl::StatusCode::kFailedPrecondition;
    default:
      return absl::StatusCode::kUnknown;
  }
}

}  // namespace

absl::Status FromRocksDbStatus(const rocksdb::Status& status, absl::string_view context) {
  if (status.ok()) return absl::OkStatus();
  std::string message = status.ToString();
  if (!context.empty()) message = absl::StrCat(context, ": ", message);
  return absl::Status(CodeFor(status), absl::StrCat("RocksDB: ", message));
}

rocksdb::Status ToRocksDbStatus(const absl::Status& status) {
  const std::string message(status.message());
  switch (status.code()) {
    case absl::StatusCode::kOk:
      return rocksdb::Status::OK();
    case absl::StatusCode::kNotFound:
      return rocksdb::Status::NotFound(message);
    case absl::StatusCode::kDataLoss:
      return rocksdb::Status::Corruption(message);
    case absl::StatusCode::kUnimplemented:
      return rocksdb::Status::NotSupported(message);
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kOutOfRange:
    case absl::StatusCode::kFailedPrecondition:
      return rocksdb::Status::InvalidArgument(message);
    case absl::StatusCode::kResourceExhausted:
      return rocksdb::Status::NoSpace(message);
    case absl::StatusCode::kAborted:
      return rocksdb::Status::Aborted(message);
    case absl::StatusCode::kDeadlineExceeded:
      return rocksdb::Status::TimedOut(message);
    case absl::StatusCode::kUnavailable:
      return rocksdb::Status::TryAgain(message);
    default:
      return rocksdb::Status::IOError(message);
  }
}

}  // namespace ckpt

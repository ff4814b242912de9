#include "kvbridge/status.h"

namespace kvbridge {

std::string_view StatusCodeName(StatusCode code) {
  switch (code) {
    case StatusCode::kOk:
      return "OK";
    case StatusCode::kCancelled:
      return "CANCELLED";
    case StatusCode::kUnknown:
      return "UNKNOWN";
    case StatusCode::kInvalidArgument:
      return "INVALID_ARGUMENT";
    case StatusCode::kDeadlineExceeded:
      return "DEADLINE_EXCEEDED";
    case StatusCode::kNotFound:
      return "NOT_FOUND";
    case StatusCode::kAlreadyExists:
      return "ALREADY_EXISTS";
    case StatusCode::kPermissionDenied:
      return "PERMISSION_DENIED";
    case StatusCode::kResourceExhausted:
      return "RESOURCE_EXHAUSTED";
    case StatusCode::kFailedPrecondition:
      return "FAILED_PRECONDITION";
    case StatusCode::kAborted:
      return "ABORTED";
    case StatusCode::kOutOfRange:
      return "OUT_OF_RANGE";
    case StatusCode::kUnimplemented:
      return "UNIMPLEMENTED";
    case StatusCode::kInternal:
      return "INTERNAL";
    case StatusCode::kUnavailable:
      return "UNAVAILABLE";
    case StatusCode::kDataLoss:
      return "DATA_LOSS";
    case StatusCode::kUnauthenticated:
      return "UNAUTHENTICATED";
  }
  return "UNKNOWN_CODE";
}

Status::Status(StatusCode code, std::string message)
    : code_(code), message_(code == StatusCode::kOk ? std::string() : std::move(message)) {}

std::string Status::ToString() const {
  if (ok()) return "OK";
  std::string out(StatusCodeName(code_));
  out += ": ";
  out += message_;
  return out;
}

Status Status::WithContext(std::string_view context) const {
  if (ok()) return *this;
  std::string msg(context);
  msg += ": ";
  msg += message_;
  return Status(code_, std::move(msg));
}

#define KVB_DEFINE_ERROR_(Name, Code) \
  Status Name(std::string message) { return Status(StatusCode::Code, std::move(message)); }
KVB_DEFINE_ERROR_(InvalidArgumentError, kInvalidArgument)
KVB_DEFINE_ERROR_(NotFoundError, kNotFound)
KVB_DEFINE_ERROR_(FailedPreconditionError, kFailedPrecondition)
KVB_DEFINE_ERROR_(UnavailableError, kUnavailable)
KVB_DEFINE_ERROR_(DeadlineExceededError, kDeadlineExceeded)
KVB_DEFINE_ERROR_(AbortedError, kAborted)
KVB_DEFINE_ERROR_(DataLossError, kDataLoss)
KVB_DEFINE_ERROR_(ResourceExhaustedError, kResourceExhausted)
KVB_DEFINE_ERROR_(InternalError, kInternal)
KVB_DEFINE_ERROR_(UnimplementedError, kUnimplemented)
KVB_DEFINE_ERROR_(AlreadyExistsError, kAlreadyExists)
KVB_DEFINE_ERROR_(OutOfRangeError, kOutOfRange)
KVB_DEFINE_ERROR_(UnauthenticatedError, kUnauthenticated)
#undef KVB_DEFINE_ERROR_

}  // namespace kvbridge

// Status and Result<T>: the one error type of kvbridge.
//
// Every fallible call returns a Status (or a Result<T> carrying a value or a
// Status). Codes follow the canonical set (as in abseil / gRPC) so callers can
// decide what to do from the code alone:
//   kUnavailable        a peer or service is gone or unreachable; retry elsewhere.
//   kDeadlineExceeded   a phase or transfer ran past its deadline.
//   kFailedPrecondition the system is not in a state (or layout) that allows it.
//   kInvalidArgument    the caller passed a bad value; fix the call.
//   kAborted            the operation was aborted (by either side).
//   kDataLoss           bytes arrived corrupted.
//   kUnauthenticated    a request lacked the shared secret (or had a wrong one).
// "In progress" is never an error: it is a poll state (see KVPoll).
//
// Thread safety: Status and Result are values; const methods are safe to call
// concurrently, mutation needs external synchronisation.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <variant>

#include "kvbridge/export.h"

namespace kvbridge {

enum class StatusCode : int {
  kOk = 0,
  kCancelled = 1,
  kUnknown = 2,
  kInvalidArgument = 3,
  kDeadlineExceeded = 4,
  kNotFound = 5,
  kAlreadyExists = 6,
  kPermissionDenied = 7,
  kResourceExhausted = 8,
  kFailedPrecondition = 9,
  kAborted = 10,
  kOutOfRange = 11,
  kUnimplemented = 12,
  kInternal = 13,
  kUnavailable = 14,
  kDataLoss = 15,
  kUnauthenticated = 16,
};

// Canonical upper-snake name of a code, e.g. "INVALID_ARGUMENT".
KVB_EXPORT std::string_view StatusCodeName(StatusCode code);

class [[nodiscard]] KVB_EXPORT Status {
 public:
  Status() = default;  // OK
  Status(StatusCode code, std::string message);

  static Status Ok() { return Status(); }

  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }

  // "INVALID_ARGUMENT: page index 7 out of range [0, 4)" or "OK".
  std::string ToString() const;

  // Returns a copy whose message is "context: message". OK stays OK.
  Status WithContext(std::string_view context) const;

  // Explicitly drop a status whose failure the caller has decided to ignore.
  void IgnoreError() const {}

  friend bool operator==(const Status& a, const Status& b) {
    return a.code_ == b.code_ && a.message_ == b.message_;
  }

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

KVB_EXPORT Status InvalidArgumentError(std::string message);
KVB_EXPORT Status NotFoundError(std::string message);
KVB_EXPORT Status FailedPreconditionError(std::string message);
KVB_EXPORT Status UnavailableError(std::string message);
KVB_EXPORT Status DeadlineExceededError(std::string message);
KVB_EXPORT Status AbortedError(std::string message);
KVB_EXPORT Status DataLossError(std::string message);
KVB_EXPORT Status ResourceExhaustedError(std::string message);
KVB_EXPORT Status InternalError(std::string message);
KVB_EXPORT Status UnimplementedError(std::string message);
KVB_EXPORT Status AlreadyExistsError(std::string message);
KVB_EXPORT Status OutOfRangeError(std::string message);
KVB_EXPORT Status UnauthenticatedError(std::string message);

// A value or an error. Constructing from an OK Status is a programming error
// and yields an kInternal error instead.
template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : v_(std::move(value)) {}        // NOLINT: implicit by design
  Result(Status status) : v_(std::move(status)) {  // NOLINT: implicit by design
    if (std::get<Status>(v_).ok()) v_ = InternalError("Result constructed from OK status");
  }

  bool ok() const { return std::holds_alternative<T>(v_); }
  const Status& status() const {
    static const Status kOkStatus;
    return ok() ? kOkStatus : std::get<Status>(v_);
  }
  // Preconditions: ok().
  T& value() & { return std::get<T>(v_); }
  const T& value() const& { return std::get<T>(v_); }
  T&& value() && { return std::get<T>(std::move(v_)); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }

 private:
  std::variant<T, Status> v_;
};

}  // namespace kvbridge

#define KVB_CONCAT_INNER_(a, b) a##b
#define KVB_CONCAT_(a, b) KVB_CONCAT_INNER_(a, b)

// Returns from the current function when `expr` (a Status) is not OK.
#define KVB_RETURN_IF_ERROR(expr)              \
  do {                                         \
    ::kvbridge::Status kvb_status_ = (expr);   \
    if (!kvb_status_.ok()) return kvb_status_; \
  } while (0)

// `lhs = value of rexpr` (a Result<T>), or return its error.
#define KVB_ASSIGN_OR_RETURN(lhs, rexpr) \
  KVB_ASSIGN_OR_RETURN_IMPL_(KVB_CONCAT_(kvb_result_, __LINE__), lhs, rexpr)
#define KVB_ASSIGN_OR_RETURN_IMPL_(tmp, lhs, rexpr) \
  auto tmp = (rexpr);                               \
  if (!tmp.ok()) return tmp.status();               \
  lhs = std::move(tmp).value()

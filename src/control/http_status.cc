#include "control/http_status.h"

#include <optional>

#include "control/json_fields.h"

namespace kvbridge::internal {
namespace {

std::optional<StatusCode> CodeFromName(std::string_view name) {
  for (int c = 1; c <= static_cast<int>(StatusCode::kUnauthenticated); ++c) {
    if (StatusCodeName(static_cast<StatusCode>(c)) == name) return static_cast<StatusCode>(c);
  }
  return std::nullopt;
}

StatusCode CodeFromHttp(int http_status) {
  switch (http_status) {
    case 400:
    case 413:
    case 414:
      return StatusCode::kInvalidArgument;
    case 401:
      return StatusCode::kUnauthenticated;
    case 403:
      return StatusCode::kPermissionDenied;
    case 404:
      return StatusCode::kNotFound;
    case 409:
      return StatusCode::kFailedPrecondition;
    case 429:
    case 431:
      return StatusCode::kResourceExhausted;
    case 503:
      return StatusCode::kUnavailable;
    case 504:
      return StatusCode::kDeadlineExceeded;
    default:
      return http_status >= 500 ? StatusCode::kInternal : StatusCode::kUnknown;
  }
}

}  // namespace

int HttpStatusFor(StatusCode code) {
  switch (code) {
    case StatusCode::kOk:
      return 200;
    case StatusCode::kInvalidArgument:
    case StatusCode::kOutOfRange:
      return 400;
    case StatusCode::kUnauthenticated:
      return 401;
    case StatusCode::kPermissionDenied:
      return 403;
    case StatusCode::kNotFound:
      return 404;
    case StatusCode::kFailedPrecondition:
    case StatusCode::kAlreadyExists:
    case StatusCode::kAborted:
      return 409;
    case StatusCode::kResourceExhausted:
      return 429;
    case StatusCode::kUnavailable:
      return 503;
    case StatusCode::kDeadlineExceeded:
      return 504;
    default:
      return 500;
  }
}

nlohmann::json ErrorBody(const Status& status) {
  return {{"error", StatusCodeName(status.code())}, {"message", status.message()}};
}

Status StatusFromResponse(int http_status, std::string_view body, std::string_view context) {
  StatusCode code = CodeFromHttp(http_status);
  std::string message(body);
  Result<nlohmann::json> parsed = ParseJson(body, "error body", size_t{1} << 20);
  const nlohmann::json j = parsed.ok() ? std::move(parsed).value() : nlohmann::json();
  if (j.is_object()) {
    auto error = j.find("error");
    auto msg = j.find("message");
    if (error != j.end() && error->is_string()) {
      if (auto named = CodeFromName(error->get<std::string>())) code = *named;
    }
    if (msg != j.end() && msg->is_string()) message = msg->get<std::string>();
  }
  if (message.empty()) message = "HTTP " + std::to_string(http_status);
  message = Clip(message, 4096);  // a stranger's bytes: bounded, valid UTF-8 (ValidUtf8)
  return Status(code, std::string(context) + ": " + message);
}

}  // namespace kvbridge::internal

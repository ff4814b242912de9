// The mapping between Status and HTTP used by the bootstrap server and its
// client, so that an error crosses the wire with its code intact.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "kvbridge/status.h"

namespace kvbridge::internal {

// 400 InvalidArgument/OutOfRange, 404 NotFound, 409 FailedPrecondition/
// AlreadyExists/Aborted, 503 Unavailable, 504 DeadlineExceeded, 500 other.
int HttpStatusFor(StatusCode code);

// {"error": "NOT_FOUND", "message": "..."}.
nlohmann::json ErrorBody(const Status& status);

// The Status an error response stands for: the code named in its "error"
// field when the body is ours, else one derived from the HTTP status; the
// message is the body's "message" (or its text), prefixed with `context`.
Status StatusFromResponse(int http_status, std::string_view body, std::string_view context);

}  // namespace kvbridge::internal

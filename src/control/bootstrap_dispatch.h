// The bootstrap server's request handling without a socket: one raw HTTP
// request (the bytes a client would send) in, the server's answer out,
// through the same httplib routing, pre- and post-routing handlers (bearer
// check, limits, metrics) as a request on the wire. For the HTTP fuzz
// target (fuzz/http_handlers.cc) and tests.
#pragma once

#include <string>
#include <string_view>

#include "kvbridge/bootstrap.h"

namespace kvbridge::internal {

class BootstrapServerAccess {
 public:
  // The bytes `server` writes back for `raw_request`, read as one request on
  // a connection that closes after it; empty when the request is too
  // garbled for any answer. Thread-safe as the server's own threads are.
  static std::string Answer(BootstrapServer& server, std::string_view raw_request);
};

}  // namespace kvbridge::internal

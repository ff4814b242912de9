// Fuzz target: the bootstrap server's HTTP handling, fed raw request bytes
// without a socket (control/bootstrap_dispatch.h): httplib's request parser,
// routing by method and path, query strings, headers (count limit, the
// bearer check), bodies (size limits, ParseJson, every route's reader), the
// registry writes behind them and the metrics hook, all as on the wire.
// The registry persists across inputs, so its bounds (records kept, decode
// ranks, dp entries) are reached too.
//
// Checks: nothing crashes, leaks or hangs; an answer, when there is one, is
// an HTTP/1.1 status line with a 2xx, 4xx or 503 code (503: a rank not
// registered yet; any other 5xx is the exception handler's, a handler that
// threw); an error answer with a body says why in JSON.
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

#include "common/log.h"
#include "control/bootstrap_dispatch.h"
#include "kvbridge/bootstrap.h"

using namespace kvbridge;            // NOLINT: a fuzz target's own namespace
using namespace kvbridge::internal;  // NOLINT

namespace {

void Check(bool ok) {
  if (!ok) std::abort();
}

BootstrapServer& TheServer() {
  static std::unique_ptr<BootstrapServer> server = [] {
    SetLogLevel("off");  // the server logs refused requests and records
    BootstrapServerOptions o;
    o.host = "127.0.0.1";
    o.port = 0;
    o.auth_token = "fuzz-token";  // the seeds' Authorization: Bearer fuzz-token
    o.max_failure_records = 16;
    auto s = BootstrapServer::Start(o);
    Check(s.ok());
    return std::move(s).value();
  }();
  return *server;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view raw(reinterpret_cast<const char*>(data), size);
  const std::string answer = BootstrapServerAccess::Answer(TheServer(), raw);
  if (answer.empty()) return 0;
  Check(answer.rfind("HTTP/1.1 ", 0) == 0 && answer.size() >= 12);
  const char klass = answer[9];
  Check(klass == '2' || klass == '4' || answer.compare(9, 3, "503") == 0);
  const size_t body = answer.find("\r\n\r\n");
  Check(body != std::string::npos);
  if (klass != '2' && body + 4 < answer.size())
    Check(answer.find("\"error\"", body) != std::string::npos ||
          answer.find("\"message\"", body) != std::string::npos);
  return 0;
}

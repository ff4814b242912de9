// A program that uses kvbridge as an outside user does: the public headers
// (include/kvbridge/) and libkvbridge.so, nothing from src/. It links only
// if every function it calls is exported (KVB_EXPORT), and checks that the
// calls work across the library boundary. Exits 0 on success.
#include <cstdio>
#include <cstdlib>
#include <string>

#include "kvbridge/bootstrap.h"
#include "kvbridge/errors.h"
#include "kvbridge/kv_poll.h"
#include "kvbridge/manager.h"
#include "kvbridge/memory.h"
#include "kvbridge/options.h"
#include "kvbridge/receiver.h"
#include "kvbridge/sender.h"
#include "kvbridge/status.h"

namespace {

int failures = 0;

void Check(bool ok, const std::string& what) {
  if (!ok) {
    std::fprintf(stderr, "FAIL: %s\n", what.c_str());
    ++failures;
  }
}

}  // namespace

int main() {
  using namespace kvbridge;
  Status s = InvalidArgumentError("page index 7 out of range");
  Check(s.ToString() == "INVALID_ARGUMENT: page index 7 out of range", s.ToString());
  Check(s.WithContext("send").message() == "send: page index 7 out of range", "WithContext");
  Check(StatusCodeName(StatusCode::kUnavailable) == "UNAVAILABLE", "StatusCodeName");
  for (FailureCause c : AllFailureCauses()) {
    FailureCause parsed;
    Check(ParseFailureCause(FailureCauseName(c), &parsed) && parsed == c,
          "cause round trip " + std::string(FailureCauseName(c)));
    Check(!FailureHint(c).empty(), "hint");
  }
  Check(RoleName(Role::kDecode) == "decode", "RoleName");
  Check(!KVPollName(KVPoll::kSuccess).empty(), "KVPollName");

  // Registry writes need a shared secret; the environment is where a
  // deployment gives it to every process.
  setenv("KVBRIDGE_AUTH_TOKEN", "public-api-consumer", /*overwrite=*/0);
  BootstrapServerOptions bo;
  bo.host = "127.0.0.1";
  bo.port = 0;
  Result<std::unique_ptr<BootstrapServer>> server = BootstrapServer::Start(bo);
  Check(server.ok(), "BootstrapServer::Start: " + server.status().ToString());
  if (server.ok()) {
    Check((*server)->port() > 0, "port");
    (*server)->Stop();
  }

  ManagerOptions mo;
  mo.heartbeat_misses = 0;  // invalid: refused before anything starts
  Result<std::unique_ptr<KVManager>> manager = KVManager::Create(mo);
  Check(!manager.ok() && manager.status().code() == StatusCode::kInvalidArgument,
        "KVManager::Create with heartbeat_misses 0: " + manager.status().ToString());

  if (failures == 0) std::puts("OK: the public API works through libkvbridge.so alone");
  return failures == 0 ? 0 : 1;
}

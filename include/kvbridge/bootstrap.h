// BootstrapServer: the HTTP registry where the ranks of a prefill instance
// register and where decode ranks find them (sglang's bootstrap server, same
// routes and semantics), extended with a liveness table and recent failure
// records so that ranks and `kvbridge status` can see who is alive and what
// failed.
//
// One server serves one prefill instance and any number of decode instances.
// It is started by the prefill instance (rank 0's manager) or standalone
// (`kvbridge bootstrap`). State lives in memory: a restarted server starts
// empty and ranks register again.
//
// Writes need the deployment's shared secret: PUT /route, PUT /heartbeat and
// POST /failure (and the tables that name processes, GET /ranks and GET
// /failures) answer 401 without "Authorization: Bearer <token>"; GET /route
// and GET /health stay open so that any rank can rendezvous (sglang's rule).
// Every request is bounded: body size, header count, records kept, decode
// ranks listed; a limit that is hit is named in the error.
//
// Routes (JSON bodies; errors are {"error": "<CODE NAME>", "message": "..."}
// with HTTP 400 InvalidArgument, 401 Unauthenticated, 403 PermissionDenied,
// 404 NotFound, 409 FailedPrecondition or AlreadyExists, 429/431
// ResourceExhausted, 503 Unavailable, 500 otherwise):
//   PUT  /route        register a rank (a rank record; "role" decides prefill
//                      or decode). 200 "OK", with the registration's
//                      credential in the X-Kvbridge-Rank-Credential header
//                      (to the registrant only). Registering again the
//                      incarnation that holds the position needs that
//                      credential (403 without).
//   GET  /route?prefill_dp_rank=D&prefill_cp_rank=C&target_tp_rank=T&target_pp_rank=P
//                      200 one prefill rank's record; all four -1: 200 the
//                      prefill parallel info (sizes, page size, dtype,
//                      ranks_registered, ranks_expected) once any prefill rank
//                      registered. 503 until every prefill rank registered
//                      (or, for all -1, until the first did); 404 for a rank
//                      outside the layout; 400 for a missing or malformed
//                      parameter, or a mix of -1 and ranks.
//   GET  /health       200 "OK".
//   PUT  /heartbeat    {"role", "dp", "cp", "tp", "pp", "incarnation"}: 200;
//                      404 when not registered; 409 when that incarnation was
//                      replaced or declared dead (re-register with a new one);
//                      403 without that registration's credential.
//   GET  /ranks        200 {"ranks": [{"record", "age_ms", "state" (alive,
//                      unresponsive, dead), "restarts", "dead_by_seq"}, ...]}.
//   POST /failure      a failure record (JSON object): 200 {"seq": N}. An
//                      "origin" {role, dp, tp, pp, cp, incarnation} naming a
//                      registered rank marks it dead. 403 unless its
//                      "detected_by" names a registered rank whose credential
//                      the request carries and that may report it (itself,
//                      the other role, a sibling; docs/security.md).
//   GET  /failures?since=N
//                      200 {"records": [...], "latest_seq", "truncated"}:
//                      records with seq > N (default 0), oldest first.
//
// Thread safety: Start, port and address may be called from any thread; Stop
// may be called concurrently with itself and with requests in flight.
#pragma once

#include <chrono>
#include <cstddef>
#include <functional>
#include <memory>
#include <string>

#include "kvbridge/export.h"
#include "kvbridge/status.h"

namespace kvbridge {

struct BootstrapServerOptions {
  // Address to listen on: loopback unless told otherwise. "0.0.0.0" (every
  // IPv4 interface) only when asked for; give the host's address on the
  // network the ranks share.
  std::string host = "127.0.0.1";
  // TCP port; 0 = pick a free port (see BootstrapServer::port()).
  int port = 8998;
  // A rank that has not sent a heartbeat (or registered) for this long is
  // reported unresponsive.
  std::chrono::milliseconds unresponsive_after{1000};
  // ... and for this long, dead. Must be >= unresponsive_after.
  std::chrono::milliseconds dead_after{10000};
  // Decode ranks silent this long leave the table. Must be >= dead_after.
  std::chrono::milliseconds forget_decode_after{std::chrono::minutes(10)};
  // Failure records kept for GET /failures; older ones are dropped.
  size_t max_failure_records = 1024;
  // The shared secret writes must carry (see above). Empty: from
  // $KVBRIDGE_AUTH_TOKEN, else $SGLANG_DISAGGREGATION_BOOTSTRAP_AUTH_TOKEN;
  // Start fails (FailedPrecondition, saying how to set one) without any.
  std::string auth_token;
  // Most connections served at once, a thread each (a slow or idle client
  // holds only its own); connections beyond wait for a free thread.
  int threads = 1024;
  // Time source for liveness; null = std::chrono::steady_clock::now. Tests
  // inject a fake clock here.
  std::function<std::chrono::steady_clock::time_point()> clock;
};

namespace internal {
class BootstrapServerAccess;  // src/control/bootstrap_dispatch.h (fuzzing)
}  // namespace internal

class KVB_EXPORT BootstrapServer {
 public:
  // Binds, starts serving on a thread of its own, and returns once the
  // server accepts requests. InvalidArgument for bad options (named);
  // AlreadyExists "host:port" when the port is taken; Unavailable
  // "host:port: why" for any other bind failure (unknown host, no
  // permission).
  static Result<std::unique_ptr<BootstrapServer>> Start(const BootstrapServerOptions& options);

  BootstrapServer(const BootstrapServer&) = delete;
  BootstrapServer& operator=(const BootstrapServer&) = delete;
  ~BootstrapServer();  // Stop()s.

  // The port actually bound (the chosen one when options.port was 0).
  int port() const;
  // "host:port" as bound, e.g. "0.0.0.0:8998" or "[::1]:8998"; the host is
  // options.host, so a wildcard host must be replaced by a reachable name
  // before handing the address to ranks on other machines.
  std::string address() const;

  // Stops accepting, finishes the requests in flight and joins the server
  // thread. Idempotent.
  void Stop();

 private:
  friend class internal::BootstrapServerAccess;
  struct Impl;
  explicit BootstrapServer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace kvbridge

// BootstrapClient: typed calls to a BootstrapServer's routes (see
// include/kvbridge/bootstrap.h for the routes and their semantics).
//
// Errors, decided here once and given the server's address:
//   Unavailable  "bootstrap server HOST:PORT unreachable: <why>" when the
//                connection is refused, fails or times out; also the
//                server's 503 ("N of M prefill ranks registered").
//   NotFound / InvalidArgument / FailedPrecondition  the server's 404 / 400 /
//                409 (the code travels in the error body).
//   Internal     the server answered with a body that is not what the route
//                promises (bad JSON or missing fields), or with something
//                that is not HTTP (a malformed answer, a compressed body).
//   ResourceExhausted  the answer passed a bound (its head over 80 KiB, over
//                100 header fields, a body over 64 MiB, 1 MiB from a rank
//                endpoint); the rest of it is not read (HttpCall).
//
// Rank credential: the client keeps the credential the server handed to the
// rank it last registered (RegisterRank) and shows it with that rank's
// heartbeats and failure records (control/registry.h, "Reporters"); one
// client serves one rank. A heartbeat the server answers NotFound (a
// restarted server that lost its table) registers that rank again, once, and
// retries.
//
// Thread safety: every method is const and may be called concurrently. The
// calls a rank makes every heartbeat interval keep a connection open:
// Heartbeat one, FailuresSince and ListRanks another (each taken in turn, so
// a slow read never holds a heartbeat back); every other call opens its own.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "control/registry.h"
#include "control/registry_client.h"
#include "kvbridge/status.h"

namespace httplib {
class Client;
}

namespace kvbridge::internal {

class BootstrapClient final : public RegistryClient {
 public:
  // `address` is "host:port" or "[ipv6]:port" with port 1..65535;
  // InvalidArgument naming the address otherwise. `timeout` bounds connect,
  // send and receive of each call (must be > 0). `auth_token` (the
  // deployment's secret, control/auth.h) goes with every call as a bearer
  // token; with an empty one the server refuses writes (Unauthenticated).
  static Result<std::unique_ptr<BootstrapClient>> Create(std::string_view address,
                                                         std::chrono::milliseconds timeout,
                                                         std::string auth_token);
  ~BootstrapClient() override;

  const std::string& host() const { return host_; }
  int port() const { return port_; }
  const std::string& address() const override { return address_; }  // as given

  // PUT /route. The record is validated locally first (InvalidArgument).
  // Keeps the credential the server answers (see above); registering the
  // same rank again shows it.
  Status RegisterRank(const RankRecord& record) const override;
  // GET /route for one prefill rank; ranks must be >= 0.
  Result<RankRecord> GetRank(int dp, int cp, int tp, int pp) const override;
  Result<RankRecord> LookUpRank(int dp, int cp, int tp, int pp, std::string* unanswered,
                                std::string* listed = nullptr) const override;
  // GET /route with every rank -1.
  Result<ParallelInfo> GetParallelInfo() const override;
  // GET /health.
  Status Health() const override;
  // PUT /heartbeat, with the registered rank's credential.
  Status Heartbeat(RankRole role, int dp, int cp, int tp, int pp,
                   uint64_t incarnation) const override;
  // GET /ranks.
  Result<std::vector<RankStatus>> ListRanks() const override;
  // POST /failure, with the registered rank's credential (the record's
  // "detected_by" must name that rank); returns the record's sequence number.
  Result<uint64_t> PublishFailure(const nlohmann::json& record) const override;
  // GET /failures?since=N.
  Result<FailureBatch> FailuresSince(uint64_t since) const override;
  // POST /register_dp_rank (sglang: the prefill dp rank a room went to).
  Status RegisterDpRank(uint64_t room, int dp_rank) const;
  // POST /query_dp_ranks: the dp rank of each of `rooms` the server knows.
  Result<std::map<uint64_t, int>> QueryDpRanks(const std::vector<uint64_t>& rooms) const;
  // Whether the server has kvbridge's routes (/heartbeat, /failure,
  // /failures) or is sglang's own, which answers 404 there. Unavailable
  // when it cannot be asked.
  Result<bool> SpeaksKvbridge() const;

 private:
  BootstrapClient(std::string address, std::string host, int port,
                  std::chrono::milliseconds timeout, std::string auth_token);

  // Bytes of an answer's body read at most: the registry's (as CallJson
  // parses it), and a rank endpoint's (a record is a few KiB).
  static constexpr size_t kMaxRegistryAnswer = size_t{64} << 20;
  static constexpr size_t kMaxRankAnswer = size_t{1} << 20;
  // A kept keep-alive connection and the lock that takes it.
  struct Session {
    std::mutex mu;
    std::unique_ptr<httplib::Client> client;  // guarded by mu
    bool used = false;                        // guarded by mu: it answered a request
  };
  // Sends one request to the registry, with `credential` as the rank
  // credential header when non-empty; the body of a 2xx answer, or the
  // error. `answered_credential` (may be null) receives the credential
  // header of the answer. With a `session`, on its kept connection
  // (idempotent requests only: one that fails on a reused connection is sent
  // again on a new one).
  Result<std::string> Call(const char* method, const std::string& path, const std::string& body,
                           const std::string& credential = "",
                           std::string* answered_credential = nullptr,
                           Session* session = nullptr) const;
  // The same to another server, named `who` in errors ("bootstrap server
  // HOST:PORT", "rank IP:PORT"); `auth`: send the shared secret (and the
  // credential): never to a server that is not the registry. Without a
  // `session`, CallOnce: the answer is read within bounds (`max_body`, the
  // head, a connection within `timeout_`, the whole call within twice it). With one, httplib's
  // client, whose reads are not bounded: only for the bootstrap server's own routes.
  Result<std::string> CallAt(const std::string& host, int port, const std::string& who,
                             const char* method, const std::string& path, const std::string& body,
                             bool auth, const std::string& credential = "",
                             std::string* answered_credential = nullptr, Session* session = nullptr,
                             bool* no_answer = nullptr, size_t max_body = kMaxRegistryAnswer) const;
  // CallAt without a session: one bounded call (HttpCall) on a connection
  // of its own; an answer over `max_body` bytes is an error, not read.
  Result<std::string> CallOnce(const std::string& host, int port, const std::string& who,
                               const char* method, const std::string& path, const std::string& body,
                               bool auth, const std::string& credential,
                               std::string* answered_credential, bool* no_answer,
                               size_t max_body) const;
  // A rank sglang's server listed by its location only: its record, read
  // from the rank itself (RankEndpoint) and checked to be at `key`.
  Result<RankRecord> RecordFromRank(const nlohmann::json& where, const RankKey& key,
                                    std::string* unanswered, std::string* listed) const;
  // Call() and parse the answer as JSON (Internal when it is not).
  Result<nlohmann::json> CallJson(const char* method, const std::string& path,
                                  const std::string& body, const std::string& credential = "",
                                  Session* session = nullptr) const;
  // The credential of the rank this client registered; "" before.
  std::string Credential() const;
  std::unique_ptr<httplib::Client> NewClient(const std::string& host, int port,
                                             bool keep_alive) const;
  Status Malformed(const std::string& what, const Status& parse_error) const;

  std::string address_;
  std::string host_;
  int port_;
  std::chrono::milliseconds timeout_;
  std::string auth_token_;
  mutable Session beats_;  // Heartbeat
  mutable Session reads_;  // FailuresSince, ListRanks
  mutable std::mutex mu_;
  mutable std::optional<RankRecord> registered_;  // guarded by mu_: the last RankRegister
  mutable std::string credential_;                // guarded by mu_: the server's answer to it
  mutable std::optional<RankRecord> proposed_;    // guarded by mu_: a registration not yet answered
  mutable std::string proposal_;                  // guarded by mu_: the credential it proposes
};

// Splits "host:port" / "[v6]:port" strictly. InvalidArgument naming the text.
Status ParseHostPort(std::string_view address, std::string* host, int* port);

}  // namespace kvbridge::internal

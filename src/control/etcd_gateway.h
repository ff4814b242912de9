// EtcdGateway: the calls kvbridge makes to an etcd cluster, over etcd's v3
// JSON gateway (grpc-gateway on each member's client port: POST /v3/kv/...,
// /v3/lease/..., /v3/watch) with cpp-httplib. Keys and values are bytes
// (base64 on the wire); 64-bit integers arrive as JSON strings; a field at
// its default value (0, false, PUT) is left out of an answer.
//
// Failover: a call goes to the member that answered last; when that member
// cannot be reached or says it has no leader, the next member is tried, round
// after round, until `retry_for` has passed. Every answer is parsed as a
// stranger's: bounded, never thrown across.
//
// Authentication: with a user name, each member is asked for a token
// (POST /v3/auth/authenticate) before the first call to it, and again once
// when it says the token is invalid (etcd's simple tokens are per member).
//
// Errors: Unavailable "etcd HOST:PORT[,...] unreachable: <why of the last
// member tried>"; Unauthenticated / PermissionDenied from etcd's auth;
// InvalidArgument / NotFound / FailedPrecondition for etcd's own codes;
// Internal for an answer that is not what the call promises.
//
// Thread safety: every method may be called concurrently; each call uses its
// own connection. StopWatches() may be called from any thread.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "common/thread_annotations.h"
#include "kvbridge/status.h"

namespace httplib {
class Client;
}

namespace kvbridge::internal {

struct EtcdEndpoint {
  std::string host;
  int port = 0;
  std::string ToString() const;  // "host:port" ("[v6]:port")
};

struct EtcdGatewayOptions {
  std::vector<EtcdEndpoint> endpoints;  // at least one
  // Connect / send / receive bound of one call to one member.
  std::chrono::milliseconds timeout{2000};
  // How long a call keeps trying the members (an election takes about one
  // election timeout, 1 s by default).
  std::chrono::milliseconds retry_for{5000};
  // etcd authentication; empty user = none.
  std::string user;
  std::string password;
};

// One key-value pair as etcd holds it.
struct EtcdKv {
  std::string key;
  std::string value;
  int64_t create_revision = 0;
  int64_t mod_revision = 0;
  int64_t version = 0;
  int64_t lease = 0;
};

struct EtcdEvent {
  bool is_delete = false;
  EtcdKv kv;  // for a delete: key and mod_revision only
};

// Parses "HOST:PORT[,HOST:PORT...]" (IPv6 hosts in brackets). InvalidArgument
// naming the bad entry.
Result<std::vector<EtcdEndpoint>> ParseEtcdEndpoints(std::string_view list);

// The smallest key greater than every key that starts with `prefix`.
std::string EtcdPrefixEnd(std::string_view prefix);

class EtcdGateway {
 public:
  static Result<std::unique_ptr<EtcdGateway>> Create(EtcdGatewayOptions options);
  ~EtcdGateway();

  // "etcd 127.0.0.1:2379,127.0.0.1:2381" for messages.
  const std::string& name() const { return name_; }

  // POST `path` with a JSON body to the members, as described above; the
  // answer's JSON. `retry` false: each member once, no waiting (a best-effort
  // call such as a revoke at shutdown).
  Result<nlohmann::json> Call(const std::string& path, const nlohmann::json& body,
                              bool retry = true) const;

  // Every pair with a key starting with `prefix`, and the store's revision.
  Status RangePrefix(const std::string& prefix, std::vector<EtcdKv>* kvs, int64_t* revision) const;
  // The revision of the newest write of a key under `prefix` that is there
  // now (0 when none): not the store's revision, which other writers of the
  // same etcd (another namespace) move too. A deletion is not seen.
  Result<int64_t> NewestUnder(const std::string& prefix) const;
  // One key; found false when absent.
  Status Get(const std::string& key, EtcdKv* kv, bool* found) const;
  // A lease of `ttl_s` seconds; the granted TTL (etcd may raise it to its
  // minimum) in *granted_s.
  Result<int64_t> LeaseGrant(int64_t ttl_s, int64_t* granted_s) const;
  // Refreshes each lease once (one request); the TTL etcd reports for each,
  // 0 for a lease it no longer has. Each member is given at most
  // `per_member` (and the call timeout) before the next is tried: a member
  // that went silent (stopped, black-holed) must not hold a keep-alive past
  // the lease it keeps.
  Result<std::vector<int64_t>> LeaseKeepAlive(const std::vector<int64_t>& leases,
                                              std::chrono::milliseconds per_member) const;
  Status LeaseRevoke(int64_t lease) const;

  // Streams the events of keys under `prefix` from `start_revision` to
  // `on_events` (events of one revision arrive together, in revision order)
  // until it returns false, the stream ends (Unavailable) or StopWatches().
  // When etcd compacted past `start_revision`, returns FailedPrecondition and
  // sets *compacted to the oldest revision it still has.
  Status Watch(
      const std::string& prefix, int64_t start_revision,
      const std::function<bool(const std::vector<EtcdEvent>&, int64_t revision)>& on_events,
      int64_t* compacted) const;
  // Ends the running Watch calls (and every later one) promptly. Returns
  // whether one was running.
  bool StopWatches() const;

  // Base64 of bytes, and a JSON int64 field of an answer (string or number,
  // 0 when absent); false when present but not an integer.
  static std::string B64(std::string_view bytes);
  static bool Int64Field(const nlohmann::json& j, const char* name, int64_t* out);
  // A JSON bool field (false when absent); false when present but not a bool.
  static bool BoolField(const nlohmann::json& j, const char* name, bool* out);

 private:
  explicit EtcdGateway(EtcdGatewayOptions options);
  struct Attempt;
  // One call to member `index`: 0 and *answer on success; otherwise a Status
  // and whether the next member should be tried.
  Status CallOne(size_t index, const std::string& path, const std::string& body,
                 nlohmann::json* answer, bool* try_next) const;
  Result<std::string> Token(size_t index, bool refresh) const;
  Status WatchOne(size_t index, const std::string& body,
                  const std::function<bool(const std::vector<EtcdEvent>&, int64_t)>& on_events,
                  int64_t* compacted) const;

  EtcdGatewayOptions options_;
  std::string name_;
  mutable Mutex mu_;
  mutable size_t current_ KVB_GUARDED_BY(mu_) = 0;               // the member that answered last
  mutable std::vector<std::string> tokens_ KVB_GUARDED_BY(mu_);  // per member; "" = none yet
  mutable bool stopping_ KVB_GUARDED_BY(mu_) = false;
  mutable std::vector<httplib::Client*> watching_ KVB_GUARDED_BY(mu_);
};

}  // namespace kvbridge::internal

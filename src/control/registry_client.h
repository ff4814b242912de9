// RegistryClient: what a rank asks of the cluster registry (who is in the
// prefill instance, who is alive, which failures were seen), whichever
// registry serves it: sglang's HTTP bootstrap server (BootstrapClient, the
// one-machine default) or an etcd cluster (EtcdRegistryClient,
// docs/registry.md).
//
// The semantics of every call are the bootstrap registry's (control/registry.h):
// the same liveness states, the same fencing of a declared-dead incarnation,
// dense failure sequence numbers. Errors: Unavailable when the registry
// cannot be reached, its message "<registry> unreachable: <why>" (the
// bootstrap deadline names the registry by it); InvalidArgument / NotFound / FailedPrecondition as
// the Registry methods say; Internal when the registry holds or answers something that is not what
// the call promises (bad JSON, an unknown schema version), naming what was wrong.
//
// Thread safety: every method may be called concurrently.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "control/registry.h"
#include "kvbridge/status.h"

namespace kvbridge::internal {

class RegistryClient {
 public:
  virtual ~RegistryClient() = default;

  // Where the registry is, for messages ("127.0.0.1:8998", "etcd://a:1,b:2/ns").
  virtual const std::string& address() const = 0;

  // Adds or replaces this process's record (a prefill rank's position, a
  // decode rank's (position, incarnation)); the record is validated first.
  virtual Status RegisterRank(const RankRecord& record) const = 0;
  // One prefill rank's record; ranks must be >= 0.
  virtual Result<RankRecord> GetRank(int dp, int cp, int tp, int pp) const = 0;
  // GetRank, saying which step did not answer when it fails: with a
  // registry that lists only where a rank is (sglang's server), the rank
  // serves the rest of its record itself; when the registry answered and
  // that rank did not, `*unanswered` is the rank's endpoint's host (else
  // left as it was). A registry that holds whole records has no such step.
  // `*listed`: that endpoint's host whenever the registry named one (so a
  // failure after it is the rank's, not the registry's).
  virtual Result<RankRecord> LookUpRank(int dp, int cp, int tp, int pp, std::string* /*unanswered*/,
                                        std::string* /*listed*/ = nullptr) const {
    return GetRank(dp, cp, tp, pp);
  }
  // The prefill layout once every prefill rank registered (Unavailable before).
  virtual Result<ParallelInfo> GetParallelInfo() const = 0;
  // OK when the registry answers.
  virtual Status Health() const = 0;
  // A sign of life of a registered rank (this process's own).
  virtual Status Heartbeat(RankRole role, int dp, int cp, int tp, int pp,
                           uint64_t incarnation) const = 0;
  // Every registered rank: prefill by position, then decode.
  virtual Result<std::vector<RankStatus>> ListRanks() const = 0;
  // Appends a failure record (it must read as a FailureRecord); its seq.
  virtual Result<uint64_t> PublishFailure(const nlohmann::json& record) const = 0;
  // Records with seq > `since`, oldest first.
  virtual Result<FailureBatch> FailuresSince(uint64_t since) const = 0;

  // Waits (bounded by the call timeout) until this client's reads show
  // every write the registry had taken when the call began (with etcd: of
  // a key still there; a deletion is not waited for): a client that
  // reads from a watched copy (etcd) may lag the store by a few
  // milliseconds, enough to take a rank that has just restarted for its
  // dead incarnation. Unavailable when the registry did not answer or the
  // copy did not catch up in time (reads then stay as they were). A client
  // that reads from the registry itself has nothing to wait for.
  virtual Status CatchUp() const { return Status(); }

  // A registry that pushes changes (etcd's watch) calls `on_change` from its
  // own thread after new failure records or membership changes arrived, so
  // the caller reads them at once instead of at its next round. The default
  // (a polled registry) never calls it. Setting null waits until no call is
  // running; after that none starts.
  virtual void SetChangeCallback(std::function<void()> on_change) const {}
};

// The registry a rank uses. `registry` is "" or "bootstrap" (the HTTP
// bootstrap server at `bootstrap_addr`) or "etcd://HOST:PORT[,HOST:PORT...]
// [/NAMESPACE]". `timeout` bounds each call; `auth_token` is kvbridge's
// shared secret (the bootstrap server's; etcd is protected by its own
// authentication, docs/registry.md). `unresponsive_after` is how long a
// silent rank stays alive (etcd: the liveness lease's TTL, rounded up to
// whole seconds). InvalidArgument naming a malformed `registry`; Unavailable
// when an etcd cluster cannot be reached.
Result<std::unique_ptr<RegistryClient>> CreateRegistryClient(
    std::string_view registry, std::string_view bootstrap_addr, std::chrono::milliseconds timeout,
    std::string auth_token, std::chrono::milliseconds unresponsive_after);

// True for an "etcd://" registry.
bool IsEtcdRegistry(std::string_view registry);

}  // namespace kvbridge::internal

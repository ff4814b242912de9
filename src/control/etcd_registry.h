// EtcdRegistryClient: the cluster registry kept in etcd (docs/registry.md).
// Every rank talks to etcd directly, so no prefill host is the single place
// that knows who is alive: decode finds prefill ranks in etcd, and a 3-member
// etcd cluster survives the loss of any one member.
//
// - Registration: a transaction puts the rank's record under a long "record"
//   lease and a small alive key under a short "alive" lease (EtcdView has the
//   key layout and the liveness rules).
// - Heartbeat: one keep-alive of both leases (at most every third of the
//   alive lease's TTL). While etcd cannot be reached the rank still counts as
//   registered until its record lease could have expired; only then is the
//   heartbeat Unavailable. A record lease that expired is FailedPrecondition:
//   etcd counts this incarnation dead (fenced), as a failure record naming it.
// - Failure records: a transaction on the failure_seq counter gives dense,
//   increasing sequence numbers; the oldest beyond max_failure_records go.
// - Reads (GetRank, ListRanks, FailuresSince, ...) are answered from the
//   EtcdView that a watch thread keeps current, so every rank learns of new
//   records and membership changes by watch, not by polling; the watch
//   reconnects (to the next member) from the last revision it saw, and reads
//   everything again when etcd compacted past it. A write returns once the
//   watch delivered it (or after the call timeout), so a rank reads its own
//   writes.
//
// Thread safety: every method may be called concurrently.
#pragma once

#include <chrono>
#include <map>
#include <memory>
#include <string>
#include <string_view>

#include "control/etcd_gateway.h"
#include "control/registry_client.h"

namespace kvbridge::internal {

struct EtcdRegistryOptions {
  EtcdGatewayOptions gateway;
  // Keys live under /kvbridge/<ns>/: one namespace per deployment (one
  // prefill instance and its decode instances). Up to 64 of [A-Za-z0-9._-].
  std::string ns = "default";
  // TTL of the alive lease (rounded up to whole seconds; etcd may raise it to
  // its minimum, 1.5 x its election timeout): silent this long = unresponsive.
  std::chrono::milliseconds unresponsive_after{1000};
  // TTL of the record lease: silent this long = dead. >= unresponsive_after.
  std::chrono::milliseconds dead_after{3000};
  // Failure records kept in etcd.
  size_t max_failure_records = 1024;
  // What address() reports; empty = built from the endpoints and namespace.
  std::string url;
  // The deployment's secret (control/auth.h): every value written is sealed
  // with it and every value read must open with it (etcd_seal.h). Required.
  std::string auth_token;
};

// "etcd://HOST:PORT[,HOST:PORT...][/NAMESPACE]". etcd authentication from the
// environment: $KVBRIDGE_ETCD_USER and $KVBRIDGE_ETCD_PASSWORD. InvalidArgument
// naming what is wrong.
Result<EtcdRegistryOptions> ParseEtcdRegistryUrl(std::string_view url);

class EtcdRegistryClient final : public RegistryClient {
 public:
  // Reads the deployment's keys once and starts the watch. Unavailable when
  // no member answers; InvalidArgument for bad options.
  static Result<std::unique_ptr<EtcdRegistryClient>> Create(EtcdRegistryOptions options);
  // Stops the watch and revokes this process's leases (its keys go at once).
  ~EtcdRegistryClient() override;

  const std::string& address() const override;
  Status RegisterRank(const RankRecord& record) const override;
  Result<RankRecord> GetRank(int dp, int cp, int tp, int pp) const override;
  Result<ParallelInfo> GetParallelInfo() const override;
  Status Health() const override;
  Status Heartbeat(RankRole role, int dp, int cp, int tp, int pp,
                   uint64_t incarnation) const override;
  Result<std::vector<RankStatus>> ListRanks() const override;
  Result<uint64_t> PublishFailure(const nlohmann::json& record) const override;
  Result<FailureBatch> FailuresSince(uint64_t since) const override;
  void SetChangeCallback(std::function<void()> on_change) const override;
  Status CatchUp() const override;

  // "/kvbridge/<ns>/".
  const std::string& prefix() const;
  // Keys whose value is not used, with why (EtcdView::problems).
  std::map<std::string, std::string> Problems() const;
  // Watch batches applied so far; AwaitChange waits until more than `seen`
  // were applied or `timeout` passed (true when they were).
  uint64_t changes() const;
  // Forgets this process's leases without revoking them, so that they run
  // out as after a crash (tests of lease expiry).
  void AbandonLeases() const;
  bool AwaitChange(uint64_t seen, std::chrono::milliseconds timeout) const;

  struct State;

 private:
  explicit EtcdRegistryClient(std::unique_ptr<State> state);
  std::unique_ptr<State> s_;
};

}  // namespace kvbridge::internal

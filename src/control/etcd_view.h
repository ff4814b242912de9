// EtcdView: one rank's picture of a deployment's keys in etcd, built from a
// range read and kept current by the watch. Pure logic (no I/O, "now" is an
// argument): EtcdRegistryClient feeds it and answers reads from it.
//
// Key layout under the deployment prefix ("/kvbridge/<namespace>/"), values
// JSON with "schema": kEtcdSchemaVersion and "mac", the seal (etcd_seal.h):
//   ranks/prefill/dp<D>/cp<C>/tp<T>/pp<P>          {"schema", "record", "unresponsive_ttl_ms",
//   ranks/decode/dp<D>/cp<C>/tp<T>/pp<P>/<inc>      "dead_ttl_ms"}   under the rank's record lease
//   alive/<the same path>                          {"schema", "incarnation"} under its alive lease
//   failures/<seq, 20 digits>                      {"schema", "seq", "record"}
//   failure_seq                                    the latest seq, decimal
//
// Liveness, as control/registry.h: a rank is alive while both its keys
// exist; unresponsive once its alive key is gone (the short lease expired:
// no keep-alive for its TTL); dead once its record key is gone (the long
// lease expired or was revoked) or a failure record names its incarnation.
// A deleted rank stays listed as dead (a prefill position until another
// incarnation takes it; a decode rank for forget_decode_after).
//
// A value that is not valid JSON, has an unknown schema version, is not
// sealed with this deployment's secret for its key, does not
// read as its record type, or sits at a key that is not its own position is
// not used: the key is listed in problems() with what was wrong, and a read
// of that prefill position is Internal naming it.
//
// Thread safety: none; the client guards it with its mutex.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "control/etcd_gateway.h"
#include "control/etcd_seal.h"
#include "control/registry.h"
#include "kvbridge/errors.h"

namespace kvbridge::internal {

// 2: every value sealed (etcd_seal.h).
inline constexpr int kEtcdSchemaVersion = 2;

// "prefill/dp0/cp0/tp1/pp0" or "decode/dp0/cp0/tp1/pp0/<incarnation>".
std::string EtcdRankPath(RankRole role, const RankKey& key, uint64_t incarnation);
// "%020llu": keys sort as their numbers.
std::string EtcdSeqKey(uint64_t seq);

// The sealed values to store at `key` (the full etcd key).
std::string EncodeEtcdRank(const EtcdSeal& seal, std::string_view key, const RankRecord& record,
                           std::chrono::milliseconds unresponsive_ttl,
                           std::chrono::milliseconds dead_ttl);
std::string EncodeEtcdAlive(const EtcdSeal& seal, std::string_view key, uint64_t incarnation);
std::string EncodeEtcdFailure(const EtcdSeal& seal, std::string_view key, uint64_t seq,
                              const nlohmann::json& record);

class EtcdView {
 public:
  using Time = std::chrono::steady_clock::time_point;

  // `prefix` ends with '/'; `seal` opens every value read.
  EtcdView(std::string prefix, EtcdSeal seal,
           std::chrono::milliseconds forget_decode_after = std::chrono::minutes(10));

  // Replaces the picture with the keys of one range read (a rank not among
  // them is now deleted).
  void Reset(const std::vector<EtcdKv>& kvs, Time now);
  void Apply(const EtcdEvent& event, Time now);

  Result<RankRecord> GetRank(int dp, int cp, int tp, int pp) const;
  Result<ParallelInfo> GetParallelInfo() const;
  std::vector<RankStatus> ListRanks(Time now) const;
  FailureBatch FailuresSince(uint64_t since) const;
  uint64_t latest_seq() const { return latest_seq_; }

  // The failure record that declared this incarnation dead; 0 = none.
  uint64_t DeadBySeq(RankRole role, const RankKey& key, uint64_t incarnation) const;
  // The incarnation whose record key is held at a position now, if any.
  std::optional<uint64_t> HolderOf(RankRole role, const RankKey& key, uint64_t incarnation) const;
  // As Registry::Register: FailedPrecondition when `record` (a prefill rank)
  // brings a layout other than the live prefill ranks'. When none is live,
  // the dead ones of another layout are forgotten.
  Status CheckLayout(const RankRecord& record, Time now);

  // Keys whose value is not used, with why.
  const std::map<std::string, std::string>& problems() const { return problems_; }

 private:
  struct Entry {
    RankRecord record;
    bool present = false;  // the record key exists
    Time deleted_at{};
    std::chrono::milliseconds unresponsive_ttl{0};
    std::chrono::milliseconds dead_ttl{0};
    uint64_t restarts = 0;
  };
  struct Stored {
    nlohmann::json record;  // canonical, with "seq"
    FailureRecord parsed;
  };

  void ApplyRank(const std::string& path, const EtcdEvent& event, Time now);
  void ApplyAlive(const std::string& path, const EtcdEvent& event, Time now);
  void ApplyFailure(const std::string& name, const EtcdEvent& event);
  void Problem(const std::string& key, const std::string& why);
  // The JSON object of a value with this build's schema version and a
  // seal that opens.
  Result<nlohmann::json> Read(const std::string& key, const std::string& value) const;
  Entry* Find(const std::string& path);
  RankStatus StatusOf(const std::string& path, const Entry& e, Time now) const;
  void Forget(Time now);

  std::string prefix_;
  EtcdSeal seal_;
  std::chrono::milliseconds forget_decode_after_;
  std::map<RankKey, Entry> prefill_;
  std::map<std::pair<RankKey, uint64_t>, Entry> decode_;
  std::map<RankKey, std::string> prefill_problems_;  // position -> why its value is unused
  std::map<std::string, uint64_t> alive_;            // rank path -> incarnation in its alive key
  std::map<std::string, Time> alive_lost_;           // rank path -> when its alive key went
  std::map<uint64_t, Stored> failures_;
  uint64_t latest_seq_ = 0;
  std::map<std::string, std::string> problems_;
};

}  // namespace kvbridge::internal

// EtcdRegistryClient's writes: registration under leases, keep-alive as the
// heartbeat, failure records with dense sequence numbers.
#include <charconv>

#include "common/log.h"
#include "control/etcd_registry_state.h"
#include "control/json_fields.h"
#include "control/record_json.h"

namespace kvbridge::internal {
namespace {

using nlohmann::json;
using std::chrono::milliseconds;

// Concurrent publishers retry the counter transaction; this many losses in a
// row means something else is wrong.
constexpr int kMaxSeqAttempts = 64;

int64_t CeilSeconds(milliseconds ms) { return std::max<int64_t>(1, (ms.count() + 999) / 1000); }

json Put(const std::string& key, const std::string& value, int64_t lease = 0) {
  json put{{"key", EtcdGateway::B64(key)}, {"value", EtcdGateway::B64(value)}};
  if (lease != 0) put["lease"] = std::to_string(lease);
  return json{{"request_put", put}};
}

}  // namespace

Result<int64_t> EtcdRegistryClient::State::Txn(const json& compare, const json& success,
                                               bool* succeeded) const {
  KVB_ASSIGN_OR_RETURN(
      json a, gateway->Call("/v3/kv/txn", json{{"compare", compare}, {"success", success}}));
  // A stranger's answer: a field of another type is an error, never a throw
  // (nlohmann's value() threw on the heartbeat thread and aborted the rank).
  if (!EtcdGateway::BoolField(a, "succeeded", succeeded))
    return InternalError(gateway->name() + " txn answered a 'succeeded' that is not a bool");
  int64_t rev = 0;
  if (!a.contains("header") || !a["header"].is_object() ||
      !EtcdGateway::Int64Field(a["header"], "revision", &rev)) {
    return InternalError(gateway->name() + " txn answered without a revision");
  }
  return rev;
}

Status EtcdRegistryClient::State::GrantLeases(Own* o) {
  int64_t alive_s = 0, record_s = 0;
  KVB_ASSIGN_OR_RETURN(o->alive_lease,
                       gateway->LeaseGrant(CeilSeconds(options.unresponsive_after), &alive_s));
  KVB_ASSIGN_OR_RETURN(
      o->record_lease,
      gateway->LeaseGrant(std::max(CeilSeconds(options.dead_after), alive_s), &record_s));
  o->alive_ttl = std::chrono::seconds(alive_s);
  o->record_ttl = std::chrono::seconds(record_s);
  return Status::Ok();
}

Status EtcdRegistryClient::RegisterRank(const RankRecord& record) const {
  KVB_RETURN_IF_ERROR(record.Validate());
  State::Own own;
  {
    MutexLock lock(s_->mu);
    if (uint64_t seq = s_->view.DeadBySeq(record.role, record.key(), record.incarnation)) {
      return FailedPreconditionError(record.Describe() + " was declared dead by failure record " +
                                     std::to_string(seq) +
                                     "; a restarted process must register a new incarnation");
    }
    KVB_RETURN_IF_ERROR(s_->view.CheckLayout(record, State::Clock::now()));
    own = s_->own;
  }
  const std::string path = EtcdRankPath(record.role, record.key(), record.incarnation);
  if (!own.registered || own.path != path || own.incarnation != record.incarnation) {
    if (own.registered) {
      for (int64_t lease : {own.alive_lease, own.record_lease})
        s_->gateway->LeaseRevoke(lease).IgnoreError();
    }
    own = State::Own{};
    KVB_RETURN_IF_ERROR(s_->GrantLeases(&own).WithContext("etcd registry " + s_->address));
  }
  json success =
      json::array({Put(s_->Key("ranks/" + path),
                       EncodeEtcdRank(s_->seal, s_->Key("ranks/" + path), record, own.alive_ttl,
                                      own.record_ttl),
                       own.record_lease),
                   Put(s_->Key("alive/" + path),
                       EncodeEtcdAlive(s_->seal, s_->Key("alive/" + path), record.incarnation),
                       own.alive_lease)});
  bool succeeded = false;
  KVB_ASSIGN_OR_RETURN(int64_t rev, s_->Txn(json::array(), success, &succeeded));
  own.registered = true;
  own.role = record.role;
  own.key = record.key();
  own.incarnation = record.incarnation;
  own.path = path;
  own.last_ok = own.last_try = State::Clock::now();
  {
    MutexLock lock(s_->mu);
    s_->own = own;
  }
  KVB_LOG_INFO("etcd registry: {} registered (leases {} s / {} s)", record.Describe(),
               own.alive_ttl.count() / 1000, own.record_ttl.count() / 1000);
  s_->AwaitRevision(rev);
  return Status::Ok();
}

Status EtcdRegistryClient::Heartbeat(RankRole role, int dp, int cp, int tp, int pp,
                                     uint64_t incarnation) const {
  const RankKey key{dp, cp, tp, pp};
  const auto now = State::Clock::now();
  State::Own own;
  {
    MutexLock lock(s_->mu);
    own = s_->own;
    if (!own.registered || own.role != role || own.key != key || own.incarnation != incarnation) {
      return NotFoundError("heartbeat from unregistered " + std::string(RankRoleName(role)) +
                           " rank " + key.ToString() + " (incarnation " +
                           std::to_string(incarnation) + ") in etcd registry " + s_->address);
    }
    if (uint64_t seq = s_->view.DeadBySeq(role, key, incarnation)) {
      return FailedPreconditionError(own.path + " incarnation " + std::to_string(incarnation) +
                                     " was declared dead by failure record " + std::to_string(seq) +
                                     "; a restarted process must register a new incarnation");
    }
    std::optional<uint64_t> holder = s_->view.HolderOf(role, key, incarnation);
    if (holder && *holder != incarnation) {
      return FailedPreconditionError(
          "heartbeat from " + own.path + " incarnation " + std::to_string(incarnation) +
          ", but the position is now held by incarnation " + std::to_string(*holder));
    }
    if (now - own.last_try < own.alive_ttl / 3) return Status::Ok();
    s_->own.last_try = now;
  }
  // A third of the alive lease per member: one that went silent costs that
  // much, and the next member still refreshes the lease before it runs out
  // (it was last refreshed at most a third of it ago). With the full call
  // timeout (2 s) a silent first member let a 2 s lease expire: the rank
  // was counted unresponsive, and its siblings failed it (review finding).
  Result<std::vector<int64_t>> ttls = s_->gateway->LeaseKeepAlive(
      {own.alive_lease, own.record_lease},
      std::chrono::duration_cast<std::chrono::milliseconds>(own.alive_ttl / 3));
  if (!ttls.ok()) {
    // etcd cannot be reached (an election, a member gone): the record lease
    // still holds for a while, and etcd extends every lease when a new
    // leader takes over, so the rank is still registered until then.
    if (now - own.last_ok < own.record_ttl) {
      KVB_LOG_DEBUG("etcd registry keep-alive failed, leases still valid: {}",
                    ttls.status().message());
      return Status::Ok();
    }
    return ttls.status();
  }
  if ((*ttls)[1] <= 0) {
    return FailedPreconditionError(
        own.path + " incarnation " + std::to_string(incarnation) +
        ": etcd expired its record lease (no keep-alive for " +
        std::to_string(own.record_ttl.count() / 1000) +
        " s), so every rank counts it dead; a restarted process must register a new incarnation");
  }
  if ((*ttls)[0] <= 0) {
    // Silent longer than the alive lease (e.g. stopped) but not dead: a new
    // alive key makes the rank alive again.
    int64_t granted = 0;
    KVB_ASSIGN_OR_RETURN(int64_t lease,
                         s_->gateway->LeaseGrant(own.alive_ttl.count() / 1000, &granted));
    bool ok = false;
    KVB_RETURN_IF_ERROR(
        s_->Txn(json::array(),
                json::array({Put(
                    s_->Key("alive/" + own.path),
                    EncodeEtcdAlive(s_->seal, s_->Key("alive/" + own.path), incarnation), lease)}),
                &ok)
            .status());
    KVB_LOG_WARN("etcd registry: {} was unresponsive (alive lease expired); alive again", own.path);
    MutexLock lock(s_->mu);
    s_->own.alive_lease = lease;
  }
  MutexLock lock(s_->mu);
  s_->own.last_ok = now;
  return Status::Ok();
}

Result<uint64_t> EtcdRegistryClient::PublishFailure(const json& record) const {
  Result<FailureRecord> parsed = FailureRecordFromJson(record);
  if (!parsed.ok()) return parsed.status();
  json canonical = FailureRecordToJson(*parsed);
  const std::string counter = s_->Key("failure_seq");
  const std::string counter64 = EtcdGateway::B64(counter);
  for (int attempt = 0; attempt < kMaxSeqAttempts; ++attempt) {
    EtcdKv kv;
    bool found = false;
    KVB_RETURN_IF_ERROR(s_->gateway->Get(counter, &kv, &found));
    uint64_t latest = 0;
    if (found) {
      auto [end, ec] = std::from_chars(kv.value.data(), kv.value.data() + kv.value.size(), latest);
      if (kv.value.empty() || ec != std::errc() || end != kv.value.data() + kv.value.size()) {
        return InternalError("etcd key " + counter + " holds '" + Clip(kv.value, 40) +
                             "', not a sequence number");
      }
    }
    const uint64_t seq = latest + 1;
    canonical["seq"] = seq;
    json compare = json::array({found ? json{{"key", counter64},
                                             {"target", "MOD"},
                                             {"result", "EQUAL"},
                                             {"mod_revision", std::to_string(kv.mod_revision)}}
                                      : json{{"key", counter64},
                                             {"target", "VERSION"},
                                             {"result", "EQUAL"},
                                             {"version", "0"}}});
    json success = json::array(
        {Put(counter, std::to_string(seq)),
         Put(s_->Key("failures/" + EtcdSeqKey(seq)),
             EncodeEtcdFailure(s_->seal, s_->Key("failures/" + EtcdSeqKey(seq)), seq, canonical))});
    if (seq > s_->options.max_failure_records) {
      const std::string old =
          s_->Key("failures/" + EtcdSeqKey(seq - s_->options.max_failure_records));
      success.push_back(json{{"request_delete_range", {{"key", EtcdGateway::B64(old)}}}});
    }
    bool won = false;
    KVB_ASSIGN_OR_RETURN(int64_t rev, s_->Txn(compare, success, &won));
    if (!won) continue;  // another rank published first: read the counter again
    KVB_LOG_WARN("etcd registry: failure record seq {}: {}", seq, Clip(parsed->Message(), 1024));
    s_->AwaitRevision(rev);
    return seq;
  }
  return AbortedError("etcd registry: lost the failure sequence counter " +
                      std::to_string(kMaxSeqAttempts) + " times in a row");
}

}  // namespace kvbridge::internal

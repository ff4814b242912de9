#include "control/registry.h"

#include <algorithm>
#include <cctype>
#include <deque>
#include <map>
#include <mutex>
#include <optional>
#include <utility>

#include "common/log.h"
#include "control/auth.h"
#include "control/json_fields.h"
#include "control/record_json.h"
#include "kvbridge/errors.h"

namespace kvbridge::internal {
namespace {

using nlohmann::json;
using Clock = std::chrono::steady_clock;

int ExpectedRanks(const RankRecord& r) {
  return r.attn_tp_size * r.attn_cp_size * r.attn_dp_size * r.pp_size;
}

// The rank a failure record's "origin" names, when it names one.
struct Origin {
  RankRole role;
  RankKey key;
  std::optional<uint64_t> incarnation;
};

// The rank table entry a record's origin names; none for the bootstrap
// registry itself. Incarnation 0 means the record does not say which
// process (it then names whichever holds the position).
std::optional<Origin> OriginOf(const FailureRecord& record) {
  if (record.origin.role == Role::kBootstrap) return std::nullopt;
  Origin o;
  o.role = record.origin.role == Role::kPrefill ? RankRole::kPrefill : RankRole::kDecode;
  o.key = RankKey{record.origin.dp, record.origin.cp, record.origin.tp, record.origin.pp};
  if (record.origin.incarnation != 0) o.incarnation = record.origin.incarnation;
  return o;
}

Status Denied(std::string message) {
  return Status(StatusCode::kPermissionDenied, std::move(message));
}

// The credential a new registration gets: the one its registrant proposed
// (a retry whose first answer was lost then shows what the registry took),
// else a fresh one. InvalidArgument for a proposal that is not 32 to 256
// characters of [0-9A-Za-z_-].
Result<std::string> NewCredential(std::string_view proposed, const RankRecord& record) {
  if (proposed.empty()) return NewAuthToken();
  const bool charset = std::all_of(proposed.begin(), proposed.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-';
  });
  if (proposed.size() < 32 || proposed.size() > 256 || !charset)
    return InvalidArgumentError("registration of " + record.Describe() +
                                ": the rank credential it proposes must be 32 to 256 characters "
                                "of [0-9A-Za-z_-]");
  return std::string(proposed);
}

RankRole RankRoleOf(Role role) {
  return role == Role::kPrefill ? RankRole::kPrefill : RankRole::kDecode;
}

RankKey KeyOf(const RankId& id) { return RankKey{id.dp, id.cp, id.tp, id.pp}; }

// "decode dp0 cp0 tp1 pp0 incarnation 7", for refusals.
std::string Named(const RankId& id) {
  return std::string(RoleName(id.role)) + " " + KeyOf(id).ToString() + " incarnation " +
         std::to_string(id.incarnation);
}

class MemoryRegistry final : public Registry {
 public:
  explicit MemoryRegistry(RegistryOptions options) : options_(std::move(options)) {
    if (!options_.clock) options_.clock = [] { return Clock::now(); };
  }

  Result<std::string> Register(const RankRecord& record, std::string_view credential) override {
    KVB_RETURN_IF_ERROR(record.Validate());
    std::lock_guard<std::mutex> lock(mu_);
    const Clock::time_point now = options_.clock();
    ForgetSilentDecodeRanks(now);
    if (record.role == RankRole::kDecode) return RegisterDecode(record, credential, now);
    if (auto held = prefill_.find(record.key());
        held != prefill_.end() && held->second.record.incarnation == record.incarnation) {
      KVB_RETURN_IF_ERROR(CheckCredential(held->second, credential, "registers again"));
    }
    KVB_RETURN_IF_ERROR(CheckPrefillLayout(record, now));
    KVB_ASSIGN_OR_RETURN(const std::string fresh, NewCredential(credential, record));
    auto [it, inserted] = prefill_.try_emplace(record.key());
    Entry& e = it->second;
    if (!inserted) {
      if (e.record.incarnation == record.incarnation) {
        KVB_RETURN_IF_ERROR(CheckNotFenced(e));
      } else {
        e.credential = fresh;
        ++e.restarts;
        e.dead_by_seq = 0;
        KVB_LOG_INFO("registry: {} replaces incarnation {} (restart {})", record.Describe(),
                     e.record.incarnation, e.restarts);
      }
    } else {
      e.credential = fresh;
      KVB_LOG_INFO("registry: {} registered ({} of {} prefill ranks)", record.Describe(),
                   prefill_.size(), ExpectedRanks(record));
    }
    e.record = record;
    e.last_seen = now;
    return e.credential;
  }

  Result<RankRecord> GetRank(int dp, int cp, int tp, int pp) const override {
    if (dp < 0 || cp < 0 || tp < 0 || pp < 0) {
      return InvalidArgumentError("prefill rank " + RankKey{dp, cp, tp, pp}.ToString() +
                                  " has a negative rank");
    }
    std::lock_guard<std::mutex> lock(mu_);
    if (prefill_.empty()) return UnavailableError("no prefill rank registered yet");
    const RankRecord& ref = prefill_.begin()->second.record;
    if (dp >= ref.attn_dp_size || cp >= ref.attn_cp_size || tp >= ref.attn_tp_size ||
        pp >= ref.pp_size) {
      return NotFoundError(
          "prefill rank " + RankKey{dp, cp, tp, pp}.ToString() +
          " is outside the prefill layout (attn_dp_size " + std::to_string(ref.attn_dp_size) +
          ", attn_cp_size " + std::to_string(ref.attn_cp_size) + ", attn_tp_size " +
          std::to_string(ref.attn_tp_size) + ", pp_size " + std::to_string(ref.pp_size) + ")");
    }
    if (static_cast<int>(prefill_.size()) < ExpectedRanks(ref)) {
      return UnavailableError(std::to_string(prefill_.size()) + " of " +
                              std::to_string(ExpectedRanks(ref)) + " prefill ranks registered");
    }
    return prefill_.at(RankKey{dp, cp, tp, pp}).record;
  }

  Result<ParallelInfo> GetParallelInfo() const override {
    std::lock_guard<std::mutex> lock(mu_);
    if (prefill_.empty()) return UnavailableError("no prefill rank registered yet");
    const RankRecord& ref = prefill_.begin()->second.record;
    ParallelInfo info = ParallelInfo::Of(ref);
    for (const auto& [key, e] : prefill_) {
      if (info.prefill_http_port == 0) info.prefill_http_port = e.record.prefill_http_port;
    }
    info.ranks_registered = static_cast<int>(prefill_.size());
    info.ranks_expected = ExpectedRanks(ref);
    // As sglang's server: decode reads the layout only once it is whole.
    if (!info.complete()) {
      return UnavailableError(std::to_string(info.ranks_registered) + " of " +
                              std::to_string(info.ranks_expected) + " prefill ranks registered");
    }
    return info;
  }

  Status Heartbeat(RankRole role, int dp, int cp, int tp, int pp, uint64_t incarnation,
                   std::string_view credential) override {
    const RankKey key{dp, cp, tp, pp};
    std::lock_guard<std::mutex> lock(mu_);
    const Clock::time_point now = options_.clock();
    ForgetSilentDecodeRanks(now);
    Entry* e = nullptr;
    if (role == RankRole::kPrefill) {
      auto it = prefill_.find(key);
      if (it != prefill_.end()) e = &it->second;
    } else {
      auto it = decode_.find({key, incarnation});
      if (it != decode_.end()) e = &it->second;
    }
    if (e == nullptr) {
      return NotFoundError("heartbeat from unregistered " + std::string(RankRoleName(role)) +
                           " rank " + key.ToString() + " (incarnation " +
                           std::to_string(incarnation) + ")");
    }
    if (e->record.incarnation != incarnation) {
      return FailedPreconditionError("heartbeat from prefill rank " + key.ToString() +
                                     " incarnation " + std::to_string(incarnation) +
                                     ", but the position is now held by incarnation " +
                                     std::to_string(e->record.incarnation));
    }
    KVB_RETURN_IF_ERROR(CheckCredential(*e, credential, "heartbeat"));
    KVB_RETURN_IF_ERROR(CheckNotFenced(*e));
    e->last_seen = now;
    return Status::Ok();
  }

  Result<std::vector<RankStatus>> ListRanks() const override {
    std::lock_guard<std::mutex> lock(mu_);
    const Clock::time_point now = options_.clock();
    std::vector<RankStatus> out;
    out.reserve(prefill_.size() + decode_.size());
    for (const auto& [key, e] : prefill_) out.push_back(StatusOf(e, now));
    for (const auto& [key, e] : decode_) {
      if (now - e.last_seen <= options_.forget_decode_after) out.push_back(StatusOf(e, now));
    }
    return out;
  }

  Result<uint64_t> Publish(json record, std::string_view credential) override {
    // The one schema: a record that does not read as a FailureRecord is
    // refused here, so no rank ever reads a malformed one back.
    Result<FailureRecord> parsed = FailureRecordFromJson(record);
    if (!parsed.ok()) return parsed.status();
    std::optional<Origin> origin = OriginOf(*parsed);
    // A request's failure on a healthy rank (bad input, abort, deadline,
    // layout) travels to the request's other ranks; it marks no rank dead.
    if (!IsRankFailure(parsed->cause)) origin.reset();
    json stored = FailureRecordToJson(*parsed);
    std::lock_guard<std::mutex> lock(mu_);
    KVB_ASSIGN_OR_RETURN(const Entry* reporter, ReporterLocked(*parsed, credential));
    KVB_RETURN_IF_ERROR(CheckStanding(*reporter, *parsed));
    const uint64_t seq = ++latest_seq_;
    stored["seq"] = seq;
    std::string marked = origin ? MarkDead(*origin, seq) : std::string();
    KVB_LOG_WARN("registry: failure record seq {}{}: {}", seq, marked,
                 Clip(parsed->Message(), 1024));
    failures_.emplace_back(seq, std::move(stored));
    while (failures_.size() > options_.max_failure_records) failures_.pop_front();
    return seq;
  }

  Status RegisterDpRank(uint64_t room, int dp_rank) override {
    std::lock_guard<std::mutex> lock(mu_);
    const Clock::time_point now = options_.clock();
    std::erase_if(dp_ranks_,
                  [&](const auto& kv) { return now - kv.second.at > options_.dp_rank_ttl; });
    if (dp_ranks_.size() >= options_.max_dp_rank_entries && !dp_ranks_.contains(room)) {
      return ResourceExhaustedError("registry: " + std::to_string(dp_ranks_.size()) +
                                    " room dp ranks held, the limit (max_dp_rank_entries)");
    }
    dp_ranks_[room] = DpRank{dp_rank, now};
    return Status::Ok();
  }

  std::map<uint64_t, int> QueryDpRanks(const std::vector<uint64_t>& rooms) const override {
    std::lock_guard<std::mutex> lock(mu_);
    const Clock::time_point now = options_.clock();
    std::map<uint64_t, int> out;
    for (uint64_t room : rooms) {
      auto it = dp_ranks_.find(room);
      if (it != dp_ranks_.end() && now - it->second.at <= options_.dp_rank_ttl) {
        out[room] = it->second.dp_rank;
      }
    }
    return out;
  }

  Result<FailureBatch> FailuresSince(uint64_t since) const override {
    std::lock_guard<std::mutex> lock(mu_);
    FailureBatch batch;
    batch.latest_seq = latest_seq_;
    // Sequence numbers are dense, so a gap between `since` and the oldest
    // kept record means records the caller never saw were dropped.
    const uint64_t oldest = failures_.empty() ? latest_seq_ + 1 : failures_.front().first;
    batch.truncated = since + 1 < oldest && since < latest_seq_;
    for (const auto& [seq, record] : failures_) {
      if (seq > since) batch.records.push_back(record);
    }
    return batch;
  }

 private:
  struct Entry {
    RankRecord record;
    Clock::time_point last_seen;
    uint64_t restarts = 0;
    uint64_t dead_by_seq = 0;
    std::string credential;  // handed to the registrant alone; never listed
  };

  // Ok when `credential` is the one `e` was given; PermissionDenied saying
  // what `what` ("heartbeat", "registers again") needed otherwise.
  static Status CheckCredential(const Entry& e, std::string_view credential, const char* what) {
    if (credential.empty()) {
      return Denied(std::string(what) + " of " + e.record.Describe() +
                    " without its rank credential (" + kRankCredentialHeader +
                    "): only the process PUT /route gave it to may");
    }
    if (ConstantTimeEquals(credential, e.credential)) return Status::Ok();
    return Denied(std::string(what) + " of " + e.record.Describe() +
                  " with a rank credential that is not the one it was given");
  }

  // Requires mu_. The registration of role, position and incarnation; null
  // when none (a prefill position held by another incarnation included).
  Entry* FindLocked(RankRole role, const RankKey& key, uint64_t incarnation) {
    if (role == RankRole::kPrefill) {
      auto it = prefill_.find(key);
      return it != prefill_.end() && it->second.record.incarnation == incarnation ? &it->second
                                                                                  : nullptr;
    }
    auto it = decode_.find({key, incarnation});
    return it != decode_.end() ? &it->second : nullptr;
  }

  // Requires mu_. The registered rank that reports `r`: the one its
  // "detected_by" names, proven by `credential`.
  Result<const Entry*> ReporterLocked(const FailureRecord& r, std::string_view credential) {
    const RankId& by = r.detected_by;
    if (credential.empty()) {
      return Denied(std::string("failure record without a rank credential (") +
                    kRankCredentialHeader +
                    "): only a registered rank may report a failure, showing the credential "
                    "PUT /route gave it");
    }
    if (by.role == Role::kBootstrap) {
      return Denied(
          "failure record: 'detected_by' names the bootstrap registry, not the "
          "registered rank that reports it");
    }
    const Entry* e = FindLocked(RankRoleOf(by.role), KeyOf(by), by.incarnation);
    if (e == nullptr) {
      return Denied("failure record: 'detected_by' names " + Named(by) +
                    ", which is not registered here; a record must name the registered rank "
                    "that reports it");
    }
    if (!ConstantTimeEquals(credential, e->credential)) {
      return Denied("failure record: the rank credential is not the one given to " +
                    e->record.Describe() + ", which 'detected_by' names");
    }
    return e;
  }

  // Whether `reporter` may report `r` (see Registry::Publish).
  static Status CheckStanding(const Entry& reporter, const FailureRecord& r) {
    const RankRecord& me = reporter.record;
    const RankId& o = r.origin;
    const bool itself =
        o.role != Role::kBootstrap && RankRoleOf(o.role) == me.role && KeyOf(o) == me.key();
    if (reporter.dead_by_seq != 0 && !itself) {
      return Denied(me.Describe() + " was declared dead by failure record " +
                    std::to_string(reporter.dead_by_seq) +
                    "; a fenced rank reports only about itself");
    }
    // A request's failure fences nobody; any rank of the deployment may
    // fail a request it took part in.
    if (itself || o.role == Role::kBootstrap || !IsRankFailure(r.cause)) return Status::Ok();
    if (RankRoleOf(o.role) != me.role) return Status::Ok();  // prefill and decode are peers
    if (o.dp == me.attn_dp_rank && o.instance == me.instance) return Status::Ok();  // a sibling
    return Denied(me.Describe() + " has no standing to declare " + Named(o) +
                  " failed: a rank failure is accepted from the rank itself, a rank of the other "
                  "role, or a sibling (same role, dp group and instance)");
  }

  RankStatus StatusOf(const Entry& e, Clock::time_point now) const {
    RankStatus s;
    s.record = e.record;
    s.age = std::max(std::chrono::milliseconds(0),
                     std::chrono::duration_cast<std::chrono::milliseconds>(now - e.last_seen));
    s.restarts = e.restarts;
    s.dead_by_seq = e.dead_by_seq;
    if (e.dead_by_seq != 0 || now - e.last_seen > options_.dead_after) {
      s.state = Liveness::kDead;
    } else if (now - e.last_seen > options_.unresponsive_after) {
      s.state = Liveness::kUnresponsive;
    }
    return s;
  }

  static Status CheckNotFenced(const Entry& e) {
    if (e.dead_by_seq == 0) return Status::Ok();
    return FailedPreconditionError(e.record.Describe() + " was declared dead by failure record " +
                                   std::to_string(e.dead_by_seq) +
                                   "; a restarted process must register a new incarnation");
  }

  // Requires mu_. Rejects a layout that differs from the live prefill ranks;
  // when none is live, a different layout starts a fresh instance.
  Status CheckPrefillLayout(const RankRecord& record, Clock::time_point now) {
    const RankRecord* live = nullptr;
    for (const auto& [key, e] : prefill_) {
      bool replaced = key == record.key() && e.record.incarnation != record.incarnation;
      if (!replaced && StatusOf(e, now).state != Liveness::kDead) {
        live = &e.record;
        break;
      }
    }
    if (live != nullptr) return CompareInstanceLayout(*live, record);
    if (!prefill_.empty() && !CompareInstanceLayout(prefill_.begin()->second.record, record).ok()) {
      KVB_LOG_WARN(
          "registry: every prefill rank is dead and {} brings a new layout; "
          "forgetting the {} old prefill ranks",
          record.Describe(), prefill_.size());
      prefill_.clear();
    }
    return Status::Ok();
  }

  // Requires mu_.
  Result<std::string> RegisterDecode(const RankRecord& record, std::string_view credential,
                                     Clock::time_point now) {
    const std::pair<RankKey, uint64_t> key{record.key(), record.incarnation};
    if (decode_.size() >= options_.max_decode_ranks && !decode_.contains(key)) {
      return ResourceExhaustedError("registry: " + std::to_string(decode_.size()) +
                                    " decode ranks registered, the limit (max_decode_ranks); " +
                                    record.Describe() +
                                    " is refused until silent ones are forgotten");
    }
    Result<std::string> fresh = std::string();
    if (!decode_.contains(key) && !(fresh = NewCredential(credential, record)).ok())
      return fresh.status();
    auto [it, inserted] = decode_.try_emplace(key);
    if (!inserted) {
      KVB_RETURN_IF_ERROR(CheckCredential(it->second, credential, "registers again"));
      KVB_RETURN_IF_ERROR(CheckNotFenced(it->second));
    } else {
      it->second.credential = *fresh;
      KVB_LOG_INFO("registry: {} registered", record.Describe());
    }
    it->second.record = record;
    it->second.last_seen = now;
    return it->second.credential;
  }

  // Requires mu_.
  void ForgetSilentDecodeRanks(Clock::time_point now) {
    std::erase_if(decode_, [&](const auto& kv) {
      return now - kv.second.last_seen > options_.forget_decode_after;
    });
  }

  // Requires mu_. Returns " (marks ...)" for the log line, or "".
  std::string MarkDead(const Origin& o, uint64_t seq) {
    std::string marked;
    auto mark = [&](Entry& e) {
      if (o.incarnation && *o.incarnation != e.record.incarnation) return;  // a stale report
      if (e.dead_by_seq == 0) e.dead_by_seq = seq;
      marked += (marked.empty() ? " (marks " : ", ") + e.record.Describe() + " dead";
    };
    if (o.role == RankRole::kPrefill) {
      auto it = prefill_.find(o.key);
      if (it != prefill_.end()) mark(it->second);
    } else {
      for (auto& [key, e] : decode_) {
        if (key.first == o.key) mark(e);
      }
    }
    return marked.empty() ? marked : marked + ")";
  }

  RegistryOptions options_;
  mutable std::mutex mu_;
  std::map<RankKey, Entry> prefill_;                      // guarded by mu_
  std::map<std::pair<RankKey, uint64_t>, Entry> decode_;  // guarded by mu_
  std::deque<std::pair<uint64_t, json>> failures_;        // guarded by mu_
  struct DpRank {
    int dp_rank;
    Clock::time_point at;
  };
  std::map<uint64_t, DpRank> dp_ranks_;  // guarded by mu_
  uint64_t latest_seq_ = 0;              // guarded by mu_
};

}  // namespace

Status CompareInstanceLayout(const RankRecord& r, const RankRecord& n) {
  auto conflict = [&](const char* field, const std::string& mine, const std::string& theirs) {
    return FailedPreconditionError(n.Describe() + " registers " + field + " " + theirs +
                                   ", but the prefill ranks already registered have " + field +
                                   " " + mine);
  };
  auto num = [](int v) { return std::to_string(v); };
  if (n.attn_tp_size != r.attn_tp_size) {
    return conflict("attn_tp_size", num(r.attn_tp_size), num(n.attn_tp_size));
  }
  if (n.attn_cp_size != r.attn_cp_size) {
    return conflict("attn_cp_size", num(r.attn_cp_size), num(n.attn_cp_size));
  }
  if (n.attn_dp_size != r.attn_dp_size) {
    return conflict("attn_dp_size", num(r.attn_dp_size), num(n.attn_dp_size));
  }
  if (n.pp_size != r.pp_size) return conflict("pp_size", num(r.pp_size), num(n.pp_size));
  if (n.page_size != r.page_size) return conflict("page_size", num(r.page_size), num(n.page_size));
  if (n.kv_cache_dtype != r.kv_cache_dtype) {
    return conflict("kv_cache_dtype", r.kv_cache_dtype, n.kv_cache_dtype);
  }
  if (n.dsv41_spec_layout != r.dsv41_spec_layout) {  // sglang: "... differs across prefill ranks"
    auto shown = [](const json& v) { return Clip(DumpJson(v), 200); };
    return conflict("dsv41_spec_layout (DeepSeek-V4.1 DSpark PD layout)",
                    shown(r.dsv41_spec_layout), shown(n.dsv41_spec_layout));
  }
  return Status::Ok();
}

std::unique_ptr<Registry> CreateMemoryRegistry(RegistryOptions options) {
  return std::make_unique<MemoryRegistry>(std::move(options));
}

}  // namespace kvbridge::internal

// The bootstrap registry: who is in a prefill instance, who is alive, and
// which failures have been seen. Pure logic, no HTTP: BootstrapServer serves
// it, a later etcd-backed implementation can replace the in-memory one.
//
// Scope: one registry serves one prefill instance (sglang runs one bootstrap
// server per prefill instance) and any number of decode instances. Prefill
// ranks are keyed by their position (dp, cp, tp, pp); a position is held by
// one process at a time, and a new incarnation at a position replaces the old
// one (a restarted rank). Decode ranks are listed for the status table only;
// several decode instances may share positions, so decode records are keyed by
// (position, incarnation) and forgotten after `forget_decode_after` of silence.
//
// Reporters: registering hands the registrant a credential (256 random
// bits, hex; returned to it alone). A heartbeat and a failure record must
// show the credential of the rank that sends them, and a record is kept
// only when that rank may report it (Publish, docs/security.md "Failure
// records are bound to their reporter"). The shared secret admits a client;
// the credential says which registered rank it is.
//
// Liveness: a rank's last sign of life is its registration or its latest
// heartbeat. State: dead when a failure record named it (sticky for that
// incarnation: a fenced process must re-register with a new incarnation) or
// silent for more than dead_after; unresponsive when silent for more than
// unresponsive_after; alive otherwise.
//
// Thread safety: every method of Registry may be called concurrently.
#pragma once

#include <chrono>
#include <compare>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "kvbridge/status.h"

namespace kvbridge::internal {

enum class RankRole { kPrefill, kDecode };
std::string_view RankRoleName(RankRole role);  // "prefill" / "decode"
// Accepts "prefill"/"decode" in any letter case (sglang sends "Prefill").
Result<RankRole> ParseRankRole(std::string_view name);

// A rank's position in its instance (attention dp/cp/tp rank and pp rank).
struct RankKey {
  int dp = 0;
  int cp = 0;
  int tp = 0;
  int pp = 0;
  auto operator<=>(const RankKey&) const = default;
  std::string ToString() const;  // "dp0 cp0 tp1 pp0"
};

// The HTTP header that carries a registration's credential: in the answer
// to PUT /route, and in every PUT /heartbeat and POST /failure.
inline constexpr const char* kRankCredentialHeader = "X-Kvbridge-Rank-Credential";

// Upper bound on attn_tp * attn_cp * attn_dp * pp of one instance.
inline constexpr int64_t kMaxRanksPerInstance = 65536;
// A boot id is a 36-character UUID and its PID namespace (at most 53 bytes
// in all, host_identity.h); a record may carry at most this many.
inline constexpr size_t kMaxBootIdBytes = 64;

// What a rank registers (PUT /route). Field names follow sglang, and
// sglang's own registration body is a valid record: kvbridge's fields (role,
// host, boot_id, pid, incarnation, instance, transport_address, layout) are optional
// extensions, given defaults when absent (see FromJson).
struct RankRecord {
  RankRole role = RankRole::kPrefill;
  int attn_tp_size = 1;
  int attn_tp_rank = 0;
  int attn_cp_size = 1;
  int attn_cp_rank = 0;
  int attn_dp_size = 1;
  int attn_dp_rank = 0;
  int pp_size = 1;
  int pp_rank = 0;
  std::string rank_ip;            // non-empty
  int rank_port = 0;              // 0..65535; 0 = no side-channel port
  int page_size = 0;              // tokens per page, >= 1
  std::string kv_cache_dtype;     // e.g. "bfloat16", non-empty
  std::string host;               // host name of the process, non-empty
  std::string boot_id;            // its host's boot id; may be empty
  int64_t pid = 0;                // >= 0; 0 = not given (an sglang rank)
  uint64_t incarnation = 0;       // non-zero, new for every process start
  std::string instance;           // ManagerOptions::instance_id; may be empty
  std::string transport_address;  // binary; base64 in JSON; may be empty
  // The rank's tag over its position, incarnation, instance and transport
  // address, under the deployment's secret (connector/record_tag.h): a
  // reader connects to the address only when it checks. Binary, at most
  // kMaxAddressTagBytes; base64 in JSON; empty for a rank that gives none.
  std::string address_tag;
  static constexpr size_t kMaxAddressTagBytes = 64;
  nlohmann::json layout = nlohmann::json::object();  // opaque, filled by the connector
  // sglang's fields that decode reads back in the parallel info.
  int prefill_http_port = 0;          // 0 = not given
  bool follow_bootstrap_room = true;  // load_balance_method == "follow_bootstrap_room"
  bool enable_dsa_cache_layer_split = false;
  // sglang's DeepSeek-V4.1 DSpark PD layout: an object, opaque here; null
  // when not given. Every rank of an instance must give the same.
  nlohmann::json dsv41_spec_layout;
  static constexpr size_t kMaxSpecLayoutBytes = 64 << 10;

  RankKey key() const { return {attn_dp_rank, attn_cp_rank, attn_tp_rank, pp_rank}; }
  // "prefill dp0 cp0 tp1 pp0 (host a, pid 12, incarnation 7)".
  std::string Describe() const;

  // InvalidArgument naming the first bad field and its value.
  Status Validate() const;
  nlohmann::json ToJson() const;
  // Requires sglang's fields (the attn_tp/cp/dp and pp sizes and ranks,
  // rank_ip, rank_port, page_size, kv_cache_dtype); ignores unknown fields.
  // Optional: role (default prefill), system_dp_size/system_dp_rank (when
  // the size is > 1 they are the rank's dp group, as in sglang), host
  // (default rank_ip), pid (default 0), incarnation (default: derived from
  // the rank's address and position, so a restarted sglang rank, which binds
  // a new port, counts as a new incarnation), instance, transport_address,
  // layout, prefill_http_port, load_balance_method,
  // enable_dsa_cache_layer_split, dsv41_spec_layout. InvalidArgument naming the field that is
  // missing, mistyped or out of range.
  static Result<RankRecord> FromJson(const nlohmann::json& j);
};

// The prefill instance's parallel layout (GET /route with all ranks -1),
// served once every prefill rank registered. Its JSON is exactly sglang's
// PrefillServerInfo (decode builds that dataclass from it, so no other key
// may appear): attn_tp_size, attn_cp_size, dp_size, pp_size, page_size,
// kv_cache_dtype, follow_bootstrap_room, enable_dsa_cache_layer_split,
// prefill_http_port, and the rank-mapping fields decode fills itself (null);
// dsv41_spec_layout only when the ranks gave one (newer sglang's field).
struct ParallelInfo {
  int attn_tp_size = 0;
  int attn_cp_size = 0;
  int attn_dp_size = 0;  // sglang's dp_size
  int pp_size = 0;
  int page_size = 0;
  std::string kv_cache_dtype;
  bool follow_bootstrap_room = true;
  bool enable_dsa_cache_layer_split = false;
  int prefill_http_port = 0;  // 0 = none (null)
  // The ranks' DSpark layout; in the JSON only when not null, as sglang's
  // server leaves it out.
  nlohmann::json dsv41_spec_layout;
  int ranks_registered = 0;
  int ranks_expected = 0;  // product of the four sizes

  bool complete() const { return ranks_registered == ranks_expected; }
  // The instance's layout as a registered prefill rank gives it (the rank
  // counts and the HTTP port are left to the registry, which sees all).
  static ParallelInfo Of(const RankRecord& ref);
  nlohmann::json ToJson() const;
  // A served info is complete: ranks_registered = ranks_expected.
  static Result<ParallelInfo> FromJson(const nlohmann::json& j);
};

enum class Liveness { kAlive, kUnresponsive, kDead };
std::string_view LivenessName(Liveness state);  // "alive" / "unresponsive" / "dead"
Result<Liveness> ParseLiveness(std::string_view name);

// One row of the liveness table (GET /ranks).
struct RankStatus {
  RankRecord record;
  std::chrono::milliseconds age{0};  // since the last heartbeat or registration
  Liveness state = Liveness::kAlive;
  uint64_t restarts = 0;     // replaced incarnations at this prefill position
  uint64_t dead_by_seq = 0;  // failure record that declared it dead; 0 = none

  nlohmann::json ToJson() const;
  static Result<RankStatus> FromJson(const nlohmann::json& j);
};

// Failure records newer than a sequence number (GET /failures?since=N).
struct FailureBatch {
  std::vector<nlohmann::json> records;  // oldest first, each with "seq"
  uint64_t latest_seq = 0;              // highest seq ever assigned; 0 = none yet
  bool truncated = false;               // records after `since` were dropped (retention limit)

  nlohmann::json ToJson() const;
  static Result<FailureBatch> FromJson(const nlohmann::json& j);
};

struct RegistryOptions {
  // A rank silent this long is unresponsive.
  std::chrono::milliseconds unresponsive_after{1000};
  // A rank silent this long is dead. Must be >= unresponsive_after.
  std::chrono::milliseconds dead_after{10000};
  // Decode records silent this long are dropped from the table.
  std::chrono::milliseconds forget_decode_after{std::chrono::minutes(10)};
  // Failure records kept; older ones are dropped (FailureBatch::truncated).
  size_t max_failure_records = 1024;
  // sglang's room -> dp rank entries: how long each lives, how many at once.
  std::chrono::milliseconds dp_rank_ttl{std::chrono::seconds(120)};
  size_t max_dp_rank_entries = size_t{1} << 20;
  // Decode ranks listed at once; a registration beyond is refused
  // (ResourceExhausted) so that no client can grow the table without bound.
  size_t max_decode_ranks = 4096;
  // Time source; null = std::chrono::steady_clock::now. Tests inject one.
  std::function<std::chrono::steady_clock::time_point()> clock;
};

// InvalidArgument naming the bad option.
Status ValidateRegistryOptions(const RegistryOptions& options);

// An instance id (ManagerOptions::instance_id): empty, or up to 64 of
// [A-Za-z0-9._:-]. InvalidArgument naming `field` and the value.
Status ValidateInstanceId(const char* field, const std::string& id);

class Registry {
 public:
  virtual ~Registry() = default;

  // Adds or replaces a rank's record. The record must be valid
  // (InvalidArgument). A prefill record whose attn_tp/cp/dp/pp size, page
  // size or dtype differs from the live prefill ranks already registered
  // -> FailedPrecondition naming both values (once every registered prefill
  // rank is dead, a new layout starts a fresh instance). Re-registering a
  // prefill position with a new incarnation replaces the record and counts a
  // restart; with the same incarnation after a failure record declared it
  // dead -> FailedPrecondition.
  //
  // Returns the registration's credential for a new position, decode rank
  // or incarnation: the one the registrant proposes in `credential` (32 to
  // 256 characters of [0-9A-Za-z_-], else InvalidArgument), so that a retry
  // whose first answer was lost after the registry took it shows what it
  // took; a fresh one when none is proposed. Registering again the incarnation that holds
  // the position (a retry, a rank re-registering) must show the credential
  // it was given (`credential`) and keeps it; without it PermissionDenied,
  // so that no other client takes over a live registration unseen (a new
  // incarnation is a visible restart).
  virtual Result<std::string> Register(const RankRecord& record, std::string_view credential) = 0;

  // One prefill rank's record. Unavailable while no prefill rank or not every
  // prefill rank is registered ("N of M prefill ranks registered"); NotFound
  // for a position outside the registered sizes; InvalidArgument for a
  // negative rank.
  virtual Result<RankRecord> GetRank(int dp, int cp, int tp, int pp) const = 0;

  // The prefill parallel layout once every prefill rank registered;
  // Unavailable before that ("N of M prefill ranks registered"), as sglang's
  // server answers 503.
  virtual Result<ParallelInfo> GetParallelInfo() const = 0;

  // Records a sign of life. NotFound when no such rank is registered;
  // FailedPrecondition when the position is held by another incarnation or
  // this incarnation was declared dead (the caller is fenced);
  // PermissionDenied when `credential` is not the one Register gave it.
  virtual Status Heartbeat(RankRole role, int dp, int cp, int tp, int pp, uint64_t incarnation,
                           std::string_view credential) = 0;

  // Every registered rank: prefill by position, then decode.
  virtual Result<std::vector<RankStatus>> ListRanks() const = 0;

  // Appends a failure record and returns its sequence number (1, 2, ...),
  // also stored in the record as "seq". The record must read as a
  // FailureRecord (control/record_json.h; InvalidArgument naming the bad
  // field otherwise) and is kept in that canonical form. A rank failure
  // (IsRankFailure) whose origin is a prefill/decode rank marks that rank
  // dead (the incarnation it names, or any when 0).
  //
  // The reporter is the rank the record's "detected_by" names (role,
  // position, incarnation); it must be registered and `credential` must be
  // its own. It may report its own failure and any request's failure; a
  // rank failure of another rank only when it has standing: the origin is
  // of the other role (its peers) or a sibling (same role, dp group and
  // instance). A fenced reporter reports only about itself. Otherwise
  // PermissionDenied naming the rule, and nothing is kept or marked.
  virtual Result<uint64_t> Publish(nlohmann::json record, std::string_view credential) = 0;

  // Records with seq > `since`, oldest first, and the latest seq.
  virtual Result<FailureBatch> FailuresSince(uint64_t since) const = 0;

  // sglang's room -> prefill dp rank table (POST /register_dp_rank and
  // /query_dp_ranks, used when prefill dp > 1 and requests do not follow
  // the room). An entry lives dp_rank_ttl; past max_dp_rank_entries live
  // ones a new room is ResourceExhausted.
  virtual Status RegisterDpRank(uint64_t room, int dp_rank) = 0;
  // The dp rank of each of `rooms` that is known.
  virtual std::map<uint64_t, int> QueryDpRanks(const std::vector<uint64_t>& rooms) const = 0;
};

// FailedPrecondition naming the first field (attn_tp/cp/dp size, pp size,
// page size, dtype) on which `newcomer` differs from `registered`, a prefill
// rank of the same instance.
Status CompareInstanceLayout(const RankRecord& registered, const RankRecord& newcomer);

// The in-memory registry. Precondition: ValidateRegistryOptions(options).ok().
std::unique_ptr<Registry> CreateMemoryRegistry(RegistryOptions options);

}  // namespace kvbridge::internal

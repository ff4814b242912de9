// Shared by the registry's tests (registry_test.cc,
// registry_reporter_test.cc): rank records, a registry on a hand-moved
// clock, and calls that carry each rank's credential as a rank's client does.
#pragma once

#include <gtest/gtest.h>

#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <tuple>

#include "control/registry.h"

namespace kvbridge::internal::registry_test {

using nlohmann::json;
using std::chrono::milliseconds;

inline RankRecord Rank(RankRole role, int tp, int tp_size = 2, uint64_t incarnation = 0) {
  RankRecord r;
  r.role = role;
  r.attn_tp_size = tp_size;
  r.attn_tp_rank = tp;
  r.rank_ip = "10.0.0.1";
  r.rank_port = 17000 + tp;
  r.page_size = 16;
  r.kv_cache_dtype = "bfloat16";
  r.host = "node-a";
  r.pid = 1000 + tp;
  r.incarnation = incarnation != 0 ? incarnation : 100 + tp;
  r.transport_address = std::string("\x00\x01ucx\xff", 6);
  r.layout = json{{"layers", 32}};
  return r;
}
// A request's own failure (an abort on decode tp0) about `room`: a valid
// record that marks no rank dead.
inline json RoomRecord(int room) {
  return json{{"room", room},
              {"cause", "aborted"},
              {"origin", {{"role", "decode"}, {"dp", 0}, {"tp", 0}, {"pp", 0}}}};
}

inline RankRecord Prefill(int tp, int tp_size = 2, uint64_t inc = 0) {
  return Rank(RankRole::kPrefill, tp, tp_size, inc);
}
inline RankRecord Decode(int tp, uint64_t inc) { return Rank(RankRole::kDecode, tp, 2, inc); }

// A registry on a clock the test moves by hand.
class RegistryTest : public ::testing::Test {
 protected:
  RegistryTest() { Reset({}); }
  void Reset(RegistryOptions o) {
    o.clock = [this] { return now_; };
    registry_ = CreateMemoryRegistry(std::move(o));
  }
  void Advance(milliseconds d) { now_ += d; }

  // Register, keeping the credential the registry hands out; registering
  // the same rank again shows it, as a rank's client does.
  Status Reg(const RankRecord& r) {
    std::string& credential = credentials_[{r.role, r.key(), r.incarnation}];
    Result<std::string> given = registry_->Register(r, credential);
    if (given.ok()) credential = *given;
    return given.status();
  }
  std::string CredentialOf(RankRole role, const RankKey& key, uint64_t incarnation) {
    auto it = credentials_.find({role, key, incarnation});
    return it == credentials_.end() ? std::string() : it->second;
  }
  // A heartbeat with the credential the rank was given.
  Status Beat(RankRole role, int dp, int cp, int tp, int pp, uint64_t incarnation) {
    return registry_->Heartbeat(role, dp, cp, tp, pp, incarnation,
                                CredentialOf(role, RankKey{dp, cp, tp, pp}, incarnation));
  }
  // A record reported by `reporter` (registered first when it is not yet),
  // with its credential.
  Result<uint64_t> Pub(json record, const RankRecord& reporter) {
    if (CredentialOf(reporter.role, reporter.key(), reporter.incarnation).empty()) {
      Status s = Reg(reporter);
      if (!s.ok()) return s;
    }
    if (record.is_object())
      record["detected_by"] = {{"role", RankRoleName(reporter.role)},
                               {"dp", reporter.attn_dp_rank},
                               {"cp", reporter.attn_cp_rank},
                               {"tp", reporter.attn_tp_rank},
                               {"pp", reporter.pp_rank},
                               {"incarnation", reporter.incarnation}};
    return registry_->Publish(std::move(record),
                              CredentialOf(reporter.role, reporter.key(), reporter.incarnation));
  }
  // By a decode rank that names no other rank in these tests.
  Result<uint64_t> Pub(json record) {
    return Pub(std::move(record), Rank(RankRole::kDecode, 1, 2, 99));
  }
  RankStatus StatusAt(RankRole role, int tp) {
    auto ranks = registry_->ListRanks();
    EXPECT_TRUE(ranks.ok());
    for (const RankStatus& s : *ranks) {
      if (s.record.role == role && s.record.attn_tp_rank == tp) return s;
    }
    ADD_FAILURE() << "rank tp" << tp << " not listed";
    return {};
  }

  std::chrono::steady_clock::time_point now_{std::chrono::hours(1)};
  std::unique_ptr<Registry> registry_;
  std::map<std::tuple<RankRole, RankKey, uint64_t>, std::string> credentials_;
};

inline void ExpectError(const Status& s, StatusCode code, const std::string& part) {
  EXPECT_EQ(s.code(), code) << s.ToString();
  EXPECT_NE(s.message().find(part), std::string::npos) << s.ToString();
}

}  // namespace kvbridge::internal::registry_test

// Sharded state between prefill and decode of different tp sizes, end to end
// through the managers (plan.h, StateSharding; sglang's mamba state slicing):
// every prefill rank's slot holds its shard of one whole state, and after
// the request every decode rank's slot must hold its own shard, by the
// definition (rank r of T holds [r * g / T, (r + 1) * g / T) of each
// sub-block g), with the slots around it untouched. The KV pages are checked
// as in every transfer test.
#include <gtest/gtest.h>

#include <cstring>
#include <numeric>
#include <vector>

#include "connector/connector_test_util.h"
#include "connector/test_cluster.h"

namespace kvbridge::internal {
namespace {

// GDN-like conv state: [q | k | v] of 8, 8 and 16 elements of 4 bytes.
const std::vector<uint32_t> kGroups = {8, 8, 16};
constexpr uint64_t kElement = 4;
constexpr uint64_t kFull = 32;
constexpr int kLargestItem = kFull * kElement;  // tp 1

uint8_t Whole(uint64_t i, uint64_t k) { return static_cast<uint8_t>(7 * i + k + 1); }

std::vector<uint8_t> Shard(int r, int t) {
  std::vector<uint8_t> out;
  uint64_t first = 0;
  for (uint64_t g : kGroups) {
    for (uint64_t i = first + r * g / t; i < first + (r + 1) * g / t; ++i)
      for (uint64_t k = 0; k < kElement; ++k) out.push_back(Whole(i, k));
    first += g;
  }
  return out;
}

uint8_t* StateBase(ClusterRank& rank) {
  return reinterpret_cast<uint8_t*>(rank.pool->Args().state_data_ptrs.at(0));
}

struct TpPair {
  int prefill_tp, decode_tp, heads;
  bool mla;
};

class StateSliceTransferTest : public ::testing::TestWithParam<TpPair> {};

TEST_P(StateSliceTransferTest, EveryDecodeRankGetsItsShardOfTheState) {
  const TpPair tp = GetParam();
  ClusterOptions o;
  o.prefill_tp = tp.prefill_tp;
  o.decode_tp = tp.decode_tp;
  o.shape.total_kv_heads = tp.heads;
  o.shape.mla = tp.mla;
  o.shape.state_item_len = kLargestItem;
  // Each rank declares its own share: the pool's slots are the largest
  // (tp 1) ones, so the smaller items fit in the same buffer.
  o.tweak = [](ManagerOptions& m) {
    const uint32_t dim = kFull / m.parallel.tp_size;
    m.args.state_item_lens = {dim * kElement};
    m.args.state_slice_dims = {dim};
    m.args.state_slice_groups = {kGroups};
  };
  auto c = TestCluster::Create(o);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  for (auto& d : (*c)->decode) std::memset(StateBase(d), 0xEE, 3 * kLargestItem);

  Request r{.room = 41, .src = Scattered(6, 64, 1), .dst = Scattered(6, 64, 2)};
  r.src_state = {2};
  r.dst_state = {1};
  Start(**c, r, /*senders_first=*/false);
  for (int p = 0; p < tp.prefill_tp; ++p) {
    const std::vector<uint8_t> shard = Shard(p, tp.prefill_tp);
    std::memcpy(StateBase((*c)->prefill[p]) + 2 * shard.size(), shard.data(), shard.size());
  }
  SendChunks(r, {4, 2});
  ASSERT_NO_FATAL_FAILURE(WaitForSuccess(r));
  for (int d = 0; d < tp.decode_tp; ++d) {
    ClusterRank& rank = (*c)->decode[d];
    EXPECT_EQ(rank.pool->CountCorruptPages(r.room, r.dst), 0u) << "decode rank " << d;
    EXPECT_TRUE(rank.pool->AuxMatches(r.room, r.dst_aux)) << "decode rank " << d;
    const std::vector<uint8_t> want = Shard(d, tp.decode_tp);
    const uint8_t* base = StateBase(rank);
    EXPECT_EQ(std::vector<uint8_t>(base + want.size(), base + 2 * want.size()), want)
        << "decode rank " << d << " of " << tp.decode_tp << " from prefill tp " << tp.prefill_tp;
    for (size_t k = 0; k < want.size(); ++k) {
      ASSERT_EQ(base[k], 0xEE) << "slot 0 of decode rank " << d << " written at " << k;
      ASSERT_EQ(base[2 * want.size() + k], 0xEE) << "slot 2 of decode rank " << d;
    }
  }
}

// 2 kv heads: with tp 4 a head sits on two ranks, and a decode rank's state
// share comes from prefill ranks it reads no head from (a flow of state
// only); MLA: decode rank d reads its pages from prefill d % tp alone.
INSTANTIATE_TEST_SUITE_P(Pairs, StateSliceTransferTest,
                         ::testing::Values(TpPair{2, 1, 4, false}, TpPair{1, 2, 4, false},
                                           TpPair{4, 2, 2, false}, TpPair{2, 4, 2, false},
                                           TpPair{4, 2, 1, true}, TpPair{1, 4, 1, true}),
                         [](const auto& info) {
                           return "p" + std::to_string(info.param.prefill_tp) + "d" +
                                  std::to_string(info.param.decode_tp) +
                                  (info.param.mla ? "mla"
                                                  : "heads" + std::to_string(info.param.heads));
                         });

// A decode rank that shards its state while prefill does not (or the other
// way) cannot be placed: the request fails naming the layout, nothing moves.
TEST(StateSliceTest, ShardedOnOneSideOnlyIsALayoutMismatch) {
  ClusterOptions o;
  o.prefill_tp = 2;
  o.shape.state_item_len = kLargestItem;
  o.tweak = [](ManagerOptions& m) {
    if (m.role != Role::kDecode) return;
    m.args.state_slice_dims = {kFull};
  };
  auto c = TestCluster::Create(o);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  auto rc = KVReceiver::Create(*(*c)->decode[0].manager, 42);
  ASSERT_TRUE(rc.ok());
  const Status init = (*rc)->Init(0);
  ASSERT_TRUE(WaitFor([&] { return (*rc)->Poll() == KVPoll::kFailed; }))
      << KVPollName((*rc)->Poll()) << " " << init.ToString();
  ASSERT_TRUE((*rc)->Failure().has_value());
  EXPECT_EQ((*rc)->Failure()->cause, FailureCause::kLayoutMismatch);
  EXPECT_NE((*rc)->Failure()->detail.find("sharded across tp ranks on decode only"),
            std::string::npos)
      << (*rc)->Failure()->Message();
}

}  // namespace
}  // namespace kvbridge::internal

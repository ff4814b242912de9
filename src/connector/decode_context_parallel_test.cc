// sglang's decode context parallelism (KVArgs dcp_size/dcp_rank on the
// decode server, MLA; docs/sglang.md row A9): the ranks of a dcp group give
// the same page list, one page per dcp_size of prefill's, and each holds in
// those pages only the tokens it owns (position p on rank p % dcp_size, at
// row p / dcp_size).
#include <gtest/gtest.h>

#include <algorithm>
#include <memory>
#include <vector>

#include "connector/connector_test_util.h"

namespace kvbridge::internal {
namespace {

// prefill tp1 -> decode tp2, the decode ranks dcp ranks 0 and 1 of one group.
ClusterOptions DcpCluster() {
  ClusterOptions o;
  o.shape.mla = true;
  o.shape.total_kv_heads = 1;
  o.prefill_tp = 1;
  o.decode_tp = 2;
  o.tweak = [](ManagerOptions& m) {
    if (m.role != Role::kDecode) return;
    m.parallel.dcp_size = 2;
    m.parallel.dcp_rank = m.parallel.tp_rank;
  };
  return o;
}

TEST(DecodeContextParallelTest, EachDcpRankHoldsItsTokensAtTheirRows) {
  auto c = TestCluster::Create(DcpCluster());
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  Request r{.room = 1};
  r.src = {3, 9, 4, 12, 7};  // 5 pages of 4 tokens
  r.dst = {6, 2, 11};        // one per two of prefill's, the same on both ranks
  for (auto& d : (*c)->decode) d.pool->Scrub(r.dst, 0xdd);
  Start(**c, r, false);
  SendChunks(r, {2, 3});  // the second chunk starts at token 8: rank 0's again
  ASSERT_NO_FATAL_FAILURE(WaitForSuccess(r));
  for (int rank = 0; rank < 2; ++rank) {
    const KvPool& pool = *(*c)->decode[rank].pool;
    EXPECT_EQ(pool.CountCorruptDcpRows(1, r.dst, 5, 2, rank), 0u) << "dcp rank " << rank;
    // Read as if it held every token (no dcp), the pages are not the request.
    EXPECT_GT(pool.CountCorruptPages(1, r.dst), 0u) << "dcp rank " << rank;
    EXPECT_TRUE(pool.AuxMatches(1, r.dst_aux)) << "dcp rank " << rank;
    EXPECT_TRUE(pool.StateMatches(1, r.dst_state)) << "dcp rank " << rank;
  }
}

// With decode's prefix (whole virtual pages: 2 pages of 3 tokens under dcp
// 2) prefill skips those pages; a chunk that starts at token 3 (odd) starts
// with rank 1's token, and ownership still counts from the first token
// after the prefix.
TEST(DecodeContextParallelTest, APrefixAndAChunkStartingMidGroupKeepEveryTokenInPlace) {
  ClusterOptions o = DcpCluster();
  o.shape.page_size = 3;
  auto c = TestCluster::Create(o);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  const uint64_t room = 3;
  const std::vector<int32_t> after{3, 9, 4, 12, 7}, dst{6, 2, 11};
  const int64_t src_aux = 1, dst_aux = 2;
  const std::vector<int32_t> src_state{3}, dst_state{5};
  std::vector<std::unique_ptr<KVReceiver>> rx;
  for (auto& d : (*c)->decode) {
    rx.push_back(std::move(KVReceiver::Create(*d.manager, room)).value());
    ASSERT_TRUE(rx.back()->Init(0).ok());
    ASSERT_TRUE(rx.back()->SendMetadata(dst, dst_aux, dst_state, /*decode_prefix_len=*/6).ok());
  }
  auto tx = std::move(KVSender::Create(*(*c)->prefill[0].manager, room)).value();
  ASSERT_TRUE(WaitFor([&] { return tx->Poll() == KVPoll::kWaitingForInput; }));
  (*c)->prefill[0].pool->Fill(room, after, src_aux, src_state);  // positions from the prefix on
  ASSERT_TRUE(tx->Init(7, src_aux).ok());
  const std::vector<int32_t> first{20, 21, 3}, rest{9, 4, 12, 7};  // 20, 21: decode's prefix
  ASSERT_TRUE(tx->Send(first).ok());
  ASSERT_TRUE(tx->Send(rest, src_state).ok());
  ASSERT_TRUE(WaitFor([&] {
    return tx->Poll() == KVPoll::kSuccess && rx[0]->Poll() == KVPoll::kSuccess &&
           rx[1]->Poll() == KVPoll::kSuccess;
  })) << KVPollName(tx->Poll());
  for (int rank = 0; rank < 2; ++rank) {
    const KvPool& pool = *(*c)->decode[rank].pool;
    EXPECT_EQ(pool.CountCorruptDcpRows(room, dst, 5, 2, rank), 0u) << "dcp rank " << rank;
    EXPECT_TRUE(pool.AuxMatches(room, dst_aux)) << "dcp rank " << rank;
  }
}

// sglang's draft (MTP) entries under dcp (KVArgs num_draft_entries: the
// tail of the kv buffers): each decode rank holds every draft token, in
// pages dcp_size times wider than prefill's, while the target's tokens stay
// sharded. One draft buffer per rank here, after the pool's.
TEST(DecodeContextParallelTest, DraftEntriesReachEveryDcpRankWhole) {
  ClusterOptions o = DcpCluster();
  struct Draft {
    Role role;
    int tp;
    std::vector<uint8_t> bytes;
  };
  std::vector<std::unique_ptr<Draft>> drafts;  // outlive the cluster
  o.tweak = [base = o.tweak, &drafts](ManagerOptions& m) {
    base(m);
    const uint64_t wide = m.role == Role::kDecode ? 2 : 1;
    const uint64_t item = m.args.kv_item_lens[0] * wide;
    const uint64_t pages = m.args.kv_data_lens[0] / m.args.kv_item_lens[0];
    drafts.push_back(std::make_unique<Draft>(
        Draft{m.role, m.parallel.tp_rank, std::vector<uint8_t>(pages * item, 0xdd)}));
    m.args.kv_data_ptrs.push_back(reinterpret_cast<uint64_t>(drafts.back()->bytes.data()));
    m.args.kv_data_lens.push_back(pages * item);
    m.args.kv_item_lens.push_back(item);
    m.args.num_draft_entries = 1;
  };
  auto c = TestCluster::Create(o);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  ASSERT_EQ(drafts.size(), 3u);
  const uint64_t page = static_cast<uint64_t>(o.shape.page_size);
  const uint64_t token = (*c)->prefill[0].pool->page_bytes() / page;
  Request r{.room = 5};
  r.src = {3, 9, 4, 12, 7};
  r.dst = {6, 2, 11};
  const uint64_t tokens = r.src.size() * page;
  Start(**c, r, false);
  for (auto& d : drafts) {
    if (d->role != Role::kPrefill) continue;
    for (uint64_t t = 0; t < tokens; ++t)  // token t's row holds 0x40 + t
      std::fill_n(d->bytes.begin() + r.src[t / page] * page * token + (t % page) * token, token,
                  static_cast<uint8_t>(0x40 + t));
  }
  SendChunks(r, {2, 3});
  ASSERT_NO_FATAL_FAILURE(WaitForSuccess(r));
  for (auto& d : drafts) {
    if (d->role != Role::kDecode) continue;
    const uint64_t wide = 2 * page;  // draft rows per decode page
    for (uint64_t slot = 0; slot < d->bytes.size() / (wide * token); ++slot) {
      const auto at = std::find(r.dst.begin(), r.dst.end(), static_cast<int32_t>(slot));
      for (uint64_t row = 0; row < wide; ++row) {
        const uint64_t t = static_cast<uint64_t>(at - r.dst.begin()) * wide + row;
        const uint8_t want =
            at != r.dst.end() && t < tokens ? static_cast<uint8_t>(0x40 + t) : 0xdd;
        ASSERT_EQ(d->bytes[(slot * wide + row) * token], want)
            << "decode tp" << d->tp << " draft page " << slot << " row " << row;
        ASSERT_EQ(d->bytes[(slot * wide + row + 1) * token - 1], want)
            << "decode tp" << d->tp << " draft page " << slot << " row " << row;
      }
    }
  }
  for (int rank = 0; rank < 2; ++rank) {
    const KvPool& pool = *(*c)->decode[rank].pool;
    EXPECT_EQ(pool.CountCorruptDcpRows(5, r.dst, 5, 2, rank), 0u) << "dcp rank " << rank;
    EXPECT_TRUE(pool.AuxMatches(5, r.dst_aux)) << "dcp rank " << rank;
  }
}

// Decode's prefix must be whole virtual pages (page size x dcp size), as
// sglang requires; and a page list of prefill's length (not one per dcp
// size) is refused by prefill, naming the counts.
TEST(DecodeContextParallelTest, APrefixOrPageListThatDoesNotFitIsRefusedByName) {
  auto c = TestCluster::Create(DcpCluster());
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  auto rx = std::move(KVReceiver::Create(*(*c)->decode[0].manager, 7)).value();
  ASSERT_TRUE(rx->Init(0).ok());
  std::vector<int32_t> dst{1, 2};
  Status s = rx->SendMetadata(dst, 0, {}, /*decode_prefix_len=*/4);  // one page of 4
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("multiple of 8 (page size x dcp size"), std::string::npos)
      << s.ToString();

  // A page list of prefill's length: two too many under dcp 2.
  const std::vector<int32_t> src{3, 9, 4, 12}, four{6, 2, 11, 5};
  std::vector<std::unique_ptr<KVReceiver>> receivers;
  for (auto& d : (*c)->decode) {
    receivers.push_back(std::move(KVReceiver::Create(*d.manager, 8)).value());
    ASSERT_TRUE(receivers.back()->Init(0).ok());
    ASSERT_TRUE(receivers.back()->SendMetadata(four, 0, {}).ok());
  }
  auto tx = std::move(KVSender::Create(*(*c)->prefill[0].manager, 8)).value();
  ASSERT_TRUE(WaitFor([&] { return tx->Poll() == KVPoll::kWaitingForInput; }));
  s = tx->Init(static_cast<int64_t>(src.size()), 0);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("sent 4 destination pages, prefill has 4 to send (one per 2 under "
                             "dcp)"),
            std::string::npos)
      << s.ToString();
  for (auto& rx8 : receivers) EXPECT_TRUE(WaitFor([&] { return rx8->Poll() == KVPoll::kFailed; }));

  // A prefix longer than the request: under dcp its page count rounds to 0,
  // which must not pass for an empty request.
  receivers.clear();
  for (auto& d : (*c)->decode) {
    receivers.push_back(std::move(KVReceiver::Create(*d.manager, 9)).value());
    ASSERT_TRUE(receivers.back()->Init(0).ok());
    ASSERT_TRUE(receivers.back()->SendMetadata({}, 0, {}, /*decode_prefix_len=*/8).ok());
  }
  tx = std::move(KVSender::Create(*(*c)->prefill[0].manager, 9)).value();
  ASSERT_TRUE(WaitFor([&] { return tx->Poll() == KVPoll::kWaitingForInput; }));
  s = tx->Init(1, 0);
  EXPECT_NE(s.message().find("prefix of 2 pages is longer than the request's 1"), std::string::npos)
      << s.ToString();
}

// Prefill does not take decode's word for its prefix: metadata from a dcp
// rank whose prefix is not whole virtual pages (1 page under dcp 2: every
// token would move to the other rank's rows) fails the request by name, as
// from a decode that skipped its own check.
TEST(DecodeContextParallelTest, PrefillRefusesAPrefixThatIsNotWholeVirtualPages) {
  auto c = TestCluster::Create(DcpCluster());
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  Request warm{.room = 1};
  warm.src = {3, 9};
  warm.dst = {6};
  Start(**c, warm, false);  // the handshake with both dcp ranks is done
  SendChunks(warm, {2});
  ASSERT_NO_FATAL_FAILURE(WaitForSuccess(warm));
  KVManager& prefill = *(*c)->prefill[0].manager;
  KVManager& decode = *(*c)->decode[0].manager;
  auto tx = std::move(KVSender::Create(prefill, 11)).value();
  MetaMsg meta;
  meta.room = 11;
  meta.generation = 9001;
  meta.decode_tp_size = 2;
  meta.pages = {5};
  meta.aux_index = 0;
  meta.prefix_pages = 1;
  ASSERT_TRUE(
      ManagerAccess::Of(decode)
          .transport()
          .SendMessage(ProvenEndpoint(decode, prefill.self()), EncodeMessage(decode.self(), meta))
          .ok());
  ASSERT_TRUE(WaitFor([&] { return tx->Poll() == KVPoll::kFailed; })) << KVPollName(tx->Poll());
  EXPECT_EQ(tx->Failure()->cause, FailureCause::kInvalidRequest) << tx->Failure()->Message();
  EXPECT_NE(tx->Failure()->detail.find("prefix of 1 pages is not whole virtual pages of 2"),
            std::string::npos)
      << tx->Failure()->Message();
}

// Context parallelism is decode's: a prefill rank with dcp_size > 1 is
// refused when it is created, by name.
TEST(DecodeContextParallelTest, APrefillRankWithDcpIsRefusedWhenCreated) {
  ClusterOptions o = DcpCluster();
  o.tweak = [](ManagerOptions& m) { m.parallel.dcp_size = 2; };
  auto c = TestCluster::Create(o);
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("dcp_size 2 on a prefill rank"), std::string::npos)
      << c.status().ToString();
}

}  // namespace
}  // namespace kvbridge::internal

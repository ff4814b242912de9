// sglang's prefill context parallelism (attn_cp_size > 1; common/conn.py,
// docs/sglang.md row M10). Default mode: decode reads every request from
// prefill cp rank 0; the other cp ranks are dummy senders (WaitingForInput
// at once, Success on the last chunk, nothing sent). Every cp rank sending
// (all_cp_ranks): each sends its share of the pages. A decode rank takes no
// cp; the two modes mixed are refused by name.
#include <gtest/gtest.h>

#include <memory>
#include <span>
#include <vector>

#include "connector/api_internal.h"
#include "connector/connector_test_util.h"
#include "transport/fault/fault_transport.h"

namespace kvbridge::internal {
namespace {

// A prefill rank at cp rank `cp_rank` of the cluster's (tp 1) prefill
// instance, on the cluster's fabric and bootstrap server, its transport in
// faults (to count what it posts).
struct CpRank {
  std::unique_ptr<KvPool> pool;
  FaultTransport* faults = nullptr;
  std::unique_ptr<KVManager> manager;
};

Result<CpRank> MakeCpRank(TestCluster& c, const ClusterOptions& o, int cp_size, int cp_rank) {
  CpRank r;
  PoolOptions po;
  po.shape = o.shape;
  po.num_pages = o.num_pages;
  KVB_ASSIGN_OR_RETURN(r.pool, KvPool::Create(po));
  ManagerOptions mo;
  mo.role = Role::kPrefill;
  mo.args = r.pool->Args();
  if (o.tweak) o.tweak(mo);
  mo.parallel.cp_size = cp_size;
  mo.parallel.cp_rank = cp_rank;
  mo.is_mla = o.shape.mla;
  mo.bootstrap_addr = c.server->address();
  mo.start_bootstrap_server = false;
  KVB_ASSIGN_OR_RETURN(std::unique_ptr<Transport> t,
                       CreateLoopbackTransport(c.fabric(), "prefill cp" + std::to_string(cp_rank)));
  auto f = std::make_unique<FaultTransport>(std::move(t));
  r.faults = f.get();
  KVB_ASSIGN_OR_RETURN(r.manager, CreateManager(mo, std::move(f)));
  return r;
}

// Both servers in sglang's every-cp-rank mode, prefill with `cp_size` cp
// ranks (the cluster's prefill rank is cp rank 0; MakeCpRank adds others).
ClusterOptions EveryCpRankSends(int cp_size) {
  ClusterOptions o;
  o.tweak = [cp_size](ManagerOptions& m) {
    m.parallel.all_cp_ranks = true;
    if (m.role == Role::kPrefill) m.parallel.cp_size = cp_size;
  };
  return o;
}

TEST(ContextParallelTest, OnlyCpRankZeroSendsAndTheOthersSucceedOnTheirLastChunk) {
  ClusterOptions o;
  o.tweak = [](ManagerOptions& m) {
    if (m.role == Role::kPrefill) m.parallel.cp_size = 2;
  };
  auto c = TestCluster::Create(o);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  auto cp1 = MakeCpRank(**c, o, 2, 1);
  ASSERT_TRUE(cp1.ok()) << cp1.status().ToString();

  Request r{.room = 51, .src = {1, 2, 3, 4}, .dst = {20, 21, 22, 23}};
  // cp rank 1's sender waits for no metadata: no decode rank exists yet.
  auto dummy = KVSender::Create(*cp1->manager, r.room);
  ASSERT_TRUE(dummy.ok()) << dummy.status().ToString();
  EXPECT_EQ((*dummy)->Poll(), KVPoll::kWaitingForInput);
  // Its pool holds another request's pattern: were any of it sent, decode's
  // pages would not hold cp rank 0's.
  cp1->pool->Fill(r.room + 1000, r.src, r.src_aux, r.src_state);

  ASSERT_NO_FATAL_FAILURE(Start(**c, r, /*senders_first=*/false));
  ASSERT_TRUE((*dummy)->Init(static_cast<int64_t>(r.src.size()), r.src_aux).ok());
  ASSERT_TRUE((*dummy)->Send(std::span(r.src).first(2)).ok());
  EXPECT_EQ((*dummy)->Poll(), KVPoll::kWaitingForInput) << "no last chunk yet";
  ASSERT_NO_FATAL_FAILURE(SendChunks(r, {2, 2}));
  ASSERT_TRUE((*dummy)->Send(std::span(r.src).subspan(2), r.src_state).ok());
  EXPECT_EQ((*dummy)->Poll(), KVPoll::kSuccess);
  // Barrier: decode's pages and cp rank 0's sender at Success.
  ASSERT_NO_FATAL_FAILURE(ExpectDelivered(**c, r));
  EXPECT_EQ(cp1->faults->counters().batches_forwarded, 0u) << "a dummy cp rank wrote";
  EXPECT_EQ(cp1->faults->counters().messages_forwarded, 0u) << "a dummy cp rank sent";
  EXPECT_EQ(cp1->manager->Stats().rooms_succeeded, 1u);
  EXPECT_EQ(cp1->manager->Stats().bytes_written, 0u);
  // Like any sender, a dummy refuses a chunk past its pages.
  auto again = KVSender::Create(*cp1->manager, r.room + 1);
  ASSERT_TRUE(again.ok());
  ASSERT_TRUE((*again)->Init(1, r.src_aux).ok());
  Status over = (*again)->Send(std::span(r.src).first(2));
  EXPECT_EQ(over.code(), StatusCode::kInvalidArgument) << over.ToString();
  EXPECT_EQ((*again)->Poll(), KVPoll::kFailed);
}

// sglang's every-cp-rank transfer (all_cp_ranks on both servers): cp rank r
// of 2 sends its share of the pages (of 5: cp rank 0 the first 3, cp rank 1
// the last 2), whole state and aux come from cp rank 0 only; decode reads
// both and succeeds once both sent their last chunk. Each pool holds
// garbage where the other rank's share is, and each rank's bytes written
// are exactly its share's.
TEST(ContextParallelTest, WithEveryCpRankSendingEachSendsItsShareOfThePages) {
  const ClusterOptions o = EveryCpRankSends(2);
  auto c = TestCluster::Create(o);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  auto cp1 = MakeCpRank(**c, o, 2, 1);
  ASSERT_TRUE(cp1.ok()) << cp1.status().ToString();
  Request r{.room = 61, .src = {1, 2, 3, 4, 5}, .dst = {20, 21, 22, 23, 24}};
  ASSERT_NO_FATAL_FAILURE(Start(**c, r, /*senders_first=*/false));
  auto tx1 = KVSender::Create(*cp1->manager, r.room);
  ASSERT_TRUE(tx1.ok()) << tx1.status().ToString();
  ASSERT_TRUE(WaitFor([&] { return (*tx1)->Poll() == KVPoll::kWaitingForInput; }))
      << "cp rank 1 got no metadata: " << KVPollName((*tx1)->Poll());
  cp1->pool->Fill(r.room, r.src, r.src_aux, r.src_state);
  const std::vector<int32_t> share0{1, 2, 3}, share1{4, 5};
  (*c)->prefill[0].pool->Scrub(share1, 0xa5);
  cp1->pool->Scrub(share0, 0x5a);
  ASSERT_TRUE((*tx1)->Init(static_cast<int64_t>(r.src.size()), r.src_aux).ok());
  r.senders.push_back(std::move(tx1).value());
  ASSERT_NO_FATAL_FAILURE(SendChunks(r, {2, 3}));  // the share boundary inside a chunk
  ASSERT_NO_FATAL_FAILURE(ExpectDelivered(**c, r));
  const uint64_t page = cp1->pool->page_bytes() * cp1->pool->num_kv_buffers();
  EXPECT_EQ(cp1->manager->Stats().bytes_written, 2 * page) << "cp rank 1 wrote beyond its share";
  EXPECT_GE((*c)->prefill[0].manager->Stats().bytes_written, 3 * page);
  EXPECT_LT((*c)->prefill[0].manager->Stats().bytes_written, 4 * page);
}

// Every cp rank of 3 sending, behind decode's prefix of 2 pages: the shares
// split the 2 pages after it (cp rank 0 the first, cp rank 1 the second),
// so cp rank 2's share is empty. It writes nothing and still concludes, as
// do decode's request and the other two cp ranks.
TEST(ContextParallelTest, WithEveryCpRankSendingThePrefixIsSkippedAndAnEmptyShareConcludes) {
  const ClusterOptions o = EveryCpRankSends(3);
  auto c = TestCluster::Create(o);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  auto cp1 = MakeCpRank(**c, o, 3, 1);
  auto cp2 = MakeCpRank(**c, o, 3, 2);
  ASSERT_TRUE(cp1.ok() && cp2.ok()) << cp1.status().ToString() << cp2.status().ToString();
  const uint64_t room = 81;
  const std::vector<int32_t> after{3, 4}, dst{20, 21};  // the pages after the prefix
  const int64_t src_aux = 1, dst_aux = 2;
  const std::vector<int32_t> src_state{3}, dst_state{5};
  auto rx = std::move(KVReceiver::Create(*(*c)->decode[0].manager, room)).value();
  ASSERT_TRUE(rx->Init(0).ok());
  ASSERT_TRUE(rx->SendMetadata(dst, dst_aux, dst_state, 2 * o.shape.page_size).ok());
  std::vector<std::unique_ptr<KVSender>> tx;
  for (KVManager* m : {(*c)->prefill[0].manager.get(), cp1->manager.get(), cp2->manager.get()}) {
    tx.push_back(std::move(KVSender::Create(*m, room)).value());
    ASSERT_TRUE(WaitFor([&] { return tx.back()->Poll() == KVPoll::kWaitingForInput; }))
        << "cp rank " << tx.size() - 1 << ": " << KVPollName(tx.back()->Poll());
  }
  // Each pool holds the request only where its own share is.
  (*c)->prefill[0].pool->Fill(room, after, src_aux, src_state);
  (*c)->prefill[0].pool->Scrub(std::vector<int32_t>{4}, 0xa5);
  cp1->pool->Fill(room, after, src_aux, src_state);
  cp1->pool->Scrub(std::vector<int32_t>{3}, 0x5a);
  cp2->pool->Fill(room, after, src_aux, src_state);
  cp2->pool->Scrub(after, 0x3c);
  for (auto& t : tx) {
    ASSERT_TRUE(t->Init(4, src_aux).ok());
    ASSERT_TRUE(t->Send(std::vector<int32_t>{30, 31, 3}).ok());  // 30, 31: decode's prefix
  }
  for (auto& t : tx) ASSERT_TRUE(t->Send(std::vector<int32_t>{4}, src_state).ok());
  ASSERT_TRUE(WaitFor([&] {
    for (auto& t : tx)
      if (t->Poll() != KVPoll::kSuccess) return false;
    return rx->Poll() == KVPoll::kSuccess;
  })) << "receiver "
      << KVPollName(rx->Poll()) << ", cp rank 2 " << KVPollName(tx[2]->Poll());
  const KvPool& pool = *(*c)->decode[0].pool;
  EXPECT_EQ(pool.CountCorruptPages(room, dst), 0u);
  EXPECT_TRUE(pool.AuxMatches(room, dst_aux));
  EXPECT_TRUE(pool.StateMatches(room, dst_state));
  const uint64_t page = cp1->pool->page_bytes() * cp1->pool->num_kv_buffers();
  EXPECT_EQ(cp1->manager->Stats().bytes_written, page) << "cp rank 1 wrote beyond its share";
  EXPECT_EQ(cp2->manager->Stats().bytes_written, 0u) << "cp rank 2's share is empty";
  EXPECT_EQ(cp2->manager->Stats().rooms_succeeded, 1u);
}

// The two modes mixed would lose pages silently (decode reading cp rank 0
// only while it sends its share) or send them twice: a request fails at
// once with a layout mismatch naming the setting, either way round.
TEST(ContextParallelTest, TheTwoCpModesMixedAreRefusedByName) {
  for (bool prefill_all : {true, false}) {
    ClusterOptions o;
    o.tweak = [prefill_all](ManagerOptions& m) {
      const bool prefill = m.role == Role::kPrefill;
      if (prefill) m.parallel.cp_size = 2;
      m.parallel.all_cp_ranks = prefill == prefill_all;
    };
    auto c = TestCluster::Create(o);
    ASSERT_TRUE(c.ok()) << c.status().ToString();
    auto cp1 = MakeCpRank(**c, o, 2, 1);
    ASSERT_TRUE(cp1.ok()) << cp1.status().ToString();
    auto rx = std::move(KVReceiver::Create(*(*c)->decode[0].manager, 71)).value();
    ASSERT_TRUE(rx->Init(0).ok());
    ASSERT_TRUE(WaitFor([&] { return rx->Poll() == KVPoll::kFailed; }, std::chrono::seconds(10)))
        << "prefill all " << prefill_all << ": " << KVPollName(rx->Poll());
    EXPECT_EQ(rx->Failure()->cause, FailureCause::kLayoutMismatch) << rx->Failure()->Message();
    EXPECT_NE(rx->Failure()->detail.find("cp transfer mode mismatch"), std::string::npos)
        << rx->Failure()->Message();
  }
}

TEST(ContextParallelTest, ADecodeRankWithCpIsRefusedByName) {
  ClusterOptions o;
  auto c = TestCluster::Create(o);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  PoolOptions po;
  po.shape = o.shape;
  auto pool = KvPool::Create(po);
  ASSERT_TRUE(pool.ok());
  ManagerOptions mo;
  mo.role = Role::kDecode;
  mo.args = (*pool)->Args();
  mo.parallel.cp_size = 2;
  mo.bootstrap_addr = (*c)->server->address();
  auto t = CreateLoopbackTransport((*c)->fabric(), "decode cp0");
  ASSERT_TRUE(t.ok());
  auto m = CreateManager(mo, std::move(*t));
  EXPECT_EQ(m.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(m.status().message().find("cp size 2 on a decode rank"), std::string::npos)
      << m.status().ToString();
}

}  // namespace
}  // namespace kvbridge::internal

// Pipeline parallelism end to end: prefill pp stages each hold a range of the
// model's layers and write them into the matching layers of decode, every
// byte checked (the pool's pattern is keyed by the model layer, so a page in
// the wrong layer is corrupt).
#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <thread>

#include "connector/connector_test_util.h"
#include "connector/test_cluster.h"

namespace kvbridge::internal {
namespace {

struct PpCase {
  int prefill_pp;
  int prefill_tp;
  int decode_pp;
  int decode_tp;
  int layers;
  int heads;
  bool mla;
};

ClusterOptions Options(const PpCase& pc) {
  ClusterOptions o;
  o.prefill_pp = pc.prefill_pp;
  o.prefill_tp = pc.prefill_tp;
  o.decode_pp = pc.decode_pp;
  o.decode_tp = pc.decode_tp;
  o.shape.layers = pc.layers;
  o.shape.total_kv_heads = pc.heads;
  o.shape.mla = pc.mla;
  return o;
}

class PpTransferTest : public ::testing::TestWithParam<PpCase> {};

TEST_P(PpTransferTest, ChunkedTransferLandsEveryByteInItsLayer) {
  const PpCase& pc = GetParam();
  ClusterOptions o = Options(pc);
  auto c = TestCluster::Create(o);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  // Each rank holds exactly its stage's layers.
  ASSERT_EQ((*c)->prefill.size(), static_cast<size_t>(pc.prefill_pp * pc.prefill_tp));
  ASSERT_EQ((*c)->decode.size(), static_cast<size_t>(pc.decode_pp * pc.decode_tp));
  for (int pp = 0; pp < pc.prefill_pp; ++pp) {
    for (int tp = 0; tp < pc.prefill_tp; ++tp) {
      const KvPool& pool = *(*c)->prefill_at(pp, tp).pool;
      EXPECT_EQ(pool.first_layer(), LayersOfStage(pc.layers, pc.prefill_pp, pp).first);
      EXPECT_EQ(pool.num_layers(), LayersOfStage(pc.layers, pc.prefill_pp, pp).count);
    }
  }
  Request r{.room = 42};
  r.src = Scattered(12, o.num_pages, 1);
  r.dst = Scattered(12, o.num_pages, 2);
  Start(**c, r, /*senders_first=*/false);
  SendChunks(r, {5, 4, 3});
  ExpectDelivered(**c, r);
  // Every byte decode needed was written once: no stage wrote another
  // stage's layers, an aux row or a state slot a second time (a second writer
  // of equal bytes leaves the pattern intact; only the count shows it).
  EXPECT_EQ(PrefillBytesWritten(**c), DecodeBytesNeeded(**c, r));
  // A second request on the same ranks (connections reused).
  const uint64_t before = PrefillBytesWritten(**c);
  Request r2{.room = 43};
  r2.src = Scattered(7, o.num_pages, 3);
  r2.dst = Scattered(7, o.num_pages, 4);
  r2.src_aux = r2.dst_aux = 6;
  Start(**c, r2, /*senders_first=*/true);
  SendChunks(r2, {1, 6});
  ExpectDelivered(**c, r2);
  EXPECT_EQ(PrefillBytesWritten(**c) - before, DecodeBytesNeeded(**c, r2));
}

INSTANTIATE_TEST_SUITE_P(
    Layouts, PpTransferTest,
    ::testing::Values(PpCase{2, 1, 1, 1, 4, 4, false},  // the simplest split
                      PpCase{2, 2, 1, 1, 4, 4, false},  // decode gathers 4 ranks
                      PpCase{2, 2, 1, 2, 4, 4, false},  // same tp, two stages
                      PpCase{2, 1, 1, 2, 4, 4, false},  // decode tp > prefill tp
                      PpCase{3, 1, 1, 2, 5, 4, false},  // uneven split: 2, 2, 1 layers
                      PpCase{4, 1, 1, 1, 4, 2, false},  // one layer per stage
                      PpCase{2, 1, 1, 1, 4, 1, true},   // MLA
                      PpCase{2, 2, 1, 1, 4, 1, true},   // MLA with a dummy rank per stage
                      PpCase{2, 1, 1, 2, 4, 1, true},   // MLA, decode tp 2
                      PpCase{2, 2, 2, 2, 4, 4, false},  // decode pp = prefill pp
                      PpCase{2, 1, 2, 2, 6, 2, true}),  // MLA, decode pp = prefill pp
    [](const auto& info) {
      const PpCase& p = info.param;
      return std::string(p.mla ? "mla" : "mha") + "_pp" + std::to_string(p.prefill_pp) + "tp" +
             std::to_string(p.prefill_tp) + "_to_pp" + std::to_string(p.decode_pp) + "tp" +
             std::to_string(p.decode_tp) + "_l" + std::to_string(p.layers) + "h" +
             std::to_string(p.heads);
    });

// Exactly one prefill rank writes a decode rank's aux row and state slots: the
// lowest tp rank feeding it, on the last stage. Every rank of a stage writes
// the same number of page bytes (equal layer counts), so the aux and state
// bytes show up only in that rank's count.
TEST(PpTest, AuxAndStateComeFromTheLastStageOnly) {
  ClusterOptions o = Options({2, 2, 1, 1, 4, 4, false});
  auto c = TestCluster::Create(o);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  // The aux rows of the first stage hold another request's pattern: were
  // they written, decode's aux row would not match.
  const std::vector<int32_t> state_slots{3};
  for (int tp = 0; tp < 2; ++tp) (*c)->prefill_at(0, tp).pool->Fill(999, {}, 1, state_slots);
  Request r{.room = 5};
  r.src = Scattered(9, o.num_pages, 5);
  r.dst = Scattered(9, o.num_pages, 6);
  for (auto& d : (*c)->decode) {
    r.receivers.push_back(std::move(KVReceiver::Create(*d.manager, r.room)).value());
    ASSERT_TRUE(r.receivers.back()->Init(0).ok());
    ASSERT_TRUE(r.receivers.back()->SendMetadata(r.dst, r.dst_aux, r.dst_state).ok());
  }
  for (auto& p : (*c)->prefill)
    r.senders.push_back(std::move(KVSender::Create(*p.manager, r.room)).value());
  for (int tp = 0; tp < 2; ++tp) {
    (*c)->prefill_at(0, tp).pool->Fill(r.room, r.src, -1, {});  // pages only
    (*c)->prefill_at(1, tp).pool->Fill(r.room, r.src, r.src_aux, r.src_state);
  }
  ASSERT_TRUE(WaitFor([&] {
    for (auto& s : r.senders)
      if (s->Poll() != KVPoll::kWaitingForInput) return false;
    return true;
  }));
  for (auto& s : r.senders) ASSERT_TRUE(s->Init(r.src.size(), r.src_aux).ok());
  SendChunks(r, {4, 5});
  ExpectDelivered(**c, r);
  auto bytes = [&](int pp, int tp) {
    return (*c)->prefill_at(pp, tp).manager->Stats().bytes_written;
  };
  const uint64_t pages =
      (*c)->prefill_at(0, 0).pool->page_bytes() * 2 /*layers*/ * 2 /*K, V*/ * r.src.size();
  const uint64_t aux_and_state = o.shape.aux_item_len + o.shape.state_item_len * r.src_state.size();
  EXPECT_EQ(bytes(0, 0), pages);
  EXPECT_EQ(bytes(0, 1), pages);
  EXPECT_EQ(bytes(1, 0), pages + aux_and_state);  // lowest tp rank, last stage
  EXPECT_EQ(bytes(1, 1), pages);
}

// State named by model layer (sglang's state_layer_ids): each stage holds
// its own layers' state and writes it into decode's buffers of those
// layers, from the lowest tp rank feeding decode; aux still comes from the
// last stage only. Decode's pool checks every layer's state against the
// pattern of that layer.
TEST(PpTest, EachStageSendsItsOwnLayersStateNamedByLayerId) {
  ClusterOptions o = Options({2, 2, 1, 1, 4, 4, false});
  o.shape.state_per_layer = true;
  auto c = TestCluster::Create(o);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  ASSERT_EQ((*c)->decode_at(0, 0).pool->Args().state_layer_ids, (std::vector<int32_t>{0, 1, 2, 3}));
  ASSERT_EQ((*c)->prefill_at(1, 0).pool->Args().state_layer_ids, (std::vector<int32_t>{2, 3}));
  Request r{.room = 7};
  r.src = Scattered(6, o.num_pages, 11);
  r.dst = Scattered(6, o.num_pages, 12);
  Start(**c, r, false);
  SendChunks(r, {2, 4});
  ExpectDelivered(**c, r);  // includes every layer's state slots
  auto bytes = [&](int pp, int tp) {
    return (*c)->prefill_at(pp, tp).manager->Stats().bytes_written;
  };
  const uint64_t pages =
      (*c)->prefill_at(0, 0).pool->page_bytes() * 2 /*layers*/ * 2 /*K, V*/ * r.src.size();
  const uint64_t state = uint64_t{2} /*layers*/ * o.shape.state_item_len * r.src_state.size();
  EXPECT_EQ(bytes(0, 0), pages + state);
  EXPECT_EQ(bytes(0, 1), pages);
  EXPECT_EQ(bytes(1, 0), pages + state + o.shape.aux_item_len);
  EXPECT_EQ(bytes(1, 1), pages);
}

// With decode pp = prefill pp, stage s of prefill feeds stage s of decode
// and writes that stage's aux row and state: sglang's decode waits on every
// stage until the request's metadata row holds its room (its metadata gate),
// so a stage without its row would never see the request succeed, and a
// decode stage's state can come from no other stage.
TEST(PpTest, StageToStageEveryDecodeStageGetsItsAuxRowAndStateFromItsStage) {
  ClusterOptions o = Options({2, 1, 2, 1, 4, 4, false});
  auto c = TestCluster::Create(o);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  Request r{.room = 6};
  r.src = Scattered(5, o.num_pages, 7);
  r.dst = Scattered(5, o.num_pages, 8);
  Start(**c, r, false);
  SendChunks(r, {5});
  ExpectDelivered(**c, r);
  EXPECT_TRUE((*c)->decode_at(0, 0).pool->AuxMatches(r.room, r.dst_aux));
  EXPECT_TRUE((*c)->decode_at(0, 0).pool->StateMatches(r.room, r.dst_state));
  EXPECT_TRUE((*c)->decode_at(1, 0).pool->AuxMatches(r.room, r.dst_aux));
  EXPECT_TRUE((*c)->decode_at(1, 0).pool->StateMatches(r.room, r.dst_state));
  // Both stages wrote the same: their two layers' pages, one aux row and
  // the state slots.
  EXPECT_EQ((*c)->prefill_at(0, 0).manager->Stats().bytes_written,
            (*c)->prefill_at(1, 0).manager->Stats().bytes_written);
}

// Stages run their own chunking (a stage's chunk may be empty): decode
// counts each stage's chunks separately and succeeds after the last chunk of
// every stage.
TEST(PpTest, StagesChunkIndependentlyAndEmptyChunksStillConclude) {
  ClusterOptions o = Options({2, 1, 1, 1, 4, 4, false});
  auto c = TestCluster::Create(o);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  Request r{.room = 8};
  r.src = Scattered(10, o.num_pages, 9);
  r.dst = Scattered(10, o.num_pages, 10);
  Start(**c, r, false);
  std::span<const int32_t> src(r.src);
  KVSender& first = *r.senders[0];
  KVSender& last = *r.senders[1];
  ASSERT_TRUE(first.Send(src.first(3)).ok());
  ASSERT_TRUE(first.Send(std::span<const int32_t>()).ok());  // nothing this time
  ASSERT_TRUE(last.Send(src.first(10), r.src_state).ok());
  ASSERT_TRUE(WaitFor([&] { return last.Poll() == KVPoll::kSuccess; }));
  // Decode waits for the first stage: whatever notifications it has seen
  // (their order across stages is not fixed), it is not done before the
  // first stage's last chunk. The pause lets the last stage's notification
  // arrive; the check holds with or without it.
  ASSERT_TRUE(WaitFor([&] { return r.receivers[0]->Poll() == KVPoll::kTransferring; }))
      << KVPollName(r.receivers[0]->Poll());
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_EQ(r.receivers[0]->Poll(), KVPoll::kTransferring);
  ASSERT_TRUE(first.Send(src.subspan(3)).ok());
  ExpectDelivered(**c, r);
}

TEST(PpTest, RequestWithoutPagesConcludesOnEveryStage) {
  ClusterOptions o = Options({2, 2, 1, 1, 4, 4, false});
  auto c = TestCluster::Create(o);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  Request r{.room = 9};  // no pages: each stage sends one empty last chunk
  Start(**c, r, false);
  SendChunks(r, {0});
  ExpectDelivered(**c, r);  // aux and state from the last stage
  EXPECT_EQ((*c)->prefill_at(0, 0).manager->Stats().bytes_written, 0u);
  EXPECT_EQ((*c)->prefill_at(1, 1).manager->Stats().bytes_written, 0u);
  EXPECT_GT((*c)->prefill_at(1, 0).manager->Stats().bytes_written, 0u);
}

TEST(PpTest, DecodePrefixChunkHasNoPagesOnAnyStage) {
  ClusterOptions o = Options({2, 1, 1, 1, 4, 4, false});
  auto c = TestCluster::Create(o);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  const uint8_t kFiller = 0x5A;
  std::vector<int32_t> src = Scattered(6, o.num_pages, 11), dst_tail = {40, 41, 42, 43};
  std::vector<int32_t> prefix_pages = {50, 51};
  (*c)->decode[0].pool->Scrub(prefix_pages, kFiller);
  auto recv = std::move(KVReceiver::Create(*(*c)->decode[0].manager, 12)).value();
  ASSERT_TRUE(recv->Init(0).ok());
  // Decode already holds the first two pages (8 tokens) of the prompt.
  ASSERT_TRUE(recv->SendMetadata(dst_tail, 2, {}, /*decode_prefix_len=*/8).ok());
  std::vector<std::unique_ptr<KVSender>> senders;
  for (auto& p : (*c)->prefill) {
    p.pool->Fill(12, src, 1, {});
    senders.push_back(std::move(KVSender::Create(*p.manager, 12)).value());
  }
  for (auto& s : senders) {
    ASSERT_TRUE(WaitFor([&] { return s->Poll() == KVPoll::kWaitingForInput; }));
    ASSERT_TRUE(s->Init(6, 1).ok());
    ASSERT_TRUE(s->Send(std::span(src).first(2)).ok());  // prefix only: nothing to write
  }
  for (auto& s : senders) ASSERT_TRUE(s->Send(std::span(src).subspan(2)).ok());
  ASSERT_TRUE(WaitFor([&] { return recv->Poll() == KVPoll::kSuccess; }))
      << KVPollName(recv->Poll());
  for (auto& s : senders)
    ASSERT_TRUE(WaitFor([&] { return s->Poll() == KVPoll::kSuccess; })) << KVPollName(s->Poll());
  EXPECT_EQ((*c)->decode[0].pool->CountCorruptPages(12, dst_tail, /*first_position=*/2), 0u);
  EXPECT_TRUE((*c)->decode[0].pool->AuxMatches(12, 2));
  EXPECT_TRUE((*c)->decode[0].pool->PagesHold(prefix_pages, kFiller));
}

// sglang's rule: decode pp is 1 (decode gathers every stage) or equal to
// prefill pp (stage to stage). Anything else fails the request as soon as
// Init's lookup (on the resolver thread) finds it, naming both.
TEST(PpTest, DecodePpThatDoesNotLineUpFailsAtInit) {
  for (auto [prefill_pp, decode_pp] : {std::pair{2, 3}, {1, 2}, {4, 2}}) {
    SCOPED_TRACE("prefill pp " + std::to_string(prefill_pp) + ", decode pp " +
                 std::to_string(decode_pp));
    ClusterOptions o = Options({prefill_pp, 1, decode_pp, 1, 12, 4, false});
    auto c = TestCluster::Create(o);
    ASSERT_TRUE(c.ok()) << c.status().ToString();
    for (auto& d : (*c)->decode) {
      auto rx = std::move(KVReceiver::Create(*d.manager, 3)).value();
      ASSERT_TRUE(rx->Init(0).ok());  // the resolver finds the mismatch
      ASSERT_TRUE(WaitFor([&] { return rx->Poll() == KVPoll::kFailed; }));
      ASSERT_TRUE(rx->Failure().has_value());
      const std::string detail = rx->Failure()->detail;
      const std::string want =
          "prefill " + std::to_string(prefill_pp) + ", decode " + std::to_string(decode_pp);
      EXPECT_NE(detail.find("pp size"), std::string::npos) << detail;
      EXPECT_NE(detail.find(want), std::string::npos) << detail;
      EXPECT_EQ(rx->Failure()->cause, FailureCause::kLayoutMismatch);
      // No single rank is to blame: the record names the prefill instance's
      // first rank, not a prefill rank at this decode rank's tp/pp.
      EXPECT_EQ(rx->Failure()->origin.ShortName(), "prefill tp0") << rx->Failure()->Message();
      std::vector<int32_t> pages{1, 2};
      EXPECT_FALSE(rx->SendMetadata(pages, 0, {}).ok());
      EXPECT_TRUE(rx->Quiesced());
    }
  }
}

// A layout mismatch found against one prefill rank names that rank (its tp
// and pp), not a prefill rank at the decode rank's own position.
TEST(PpTest, LayoutMismatchNamesTheIncompatiblePrefillRank) {
  ClusterOptions o = Options({2, 2, 1, 1, 4, 4, false});
  o.tweak = [](ManagerOptions& m) {
    // Prefill tp1 pp1 says its pages are twice as large: bytes per head per
    // token no longer match decode's.
    if (m.role == Role::kPrefill && m.parallel.pp_rank == 1 && m.parallel.tp_rank == 1)
      for (uint64_t& len : m.args.kv_item_lens) len *= 2;
  };
  auto c = TestCluster::Create(o);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  auto rx = std::move(KVReceiver::Create(*(*c)->decode[0].manager, 4)).value();
  ASSERT_TRUE(rx->Init(0).ok());  // the resolver finds the mismatch
  ASSERT_TRUE(WaitFor([&] { return rx->Poll() == KVPoll::kFailed; }));
  ASSERT_TRUE(rx->Failure().has_value());
  const FailureRecord f = *rx->Failure();
  EXPECT_NE(f.detail.find("bytes per head per token mismatch for layer 2"), std::string::npos)
      << f.detail;
  EXPECT_EQ(f.cause, FailureCause::kLayoutMismatch);
  EXPECT_EQ(f.origin.role, Role::kPrefill);
  EXPECT_EQ(f.origin.tp, 1) << f.Message();
  EXPECT_EQ(f.origin.pp, 1) << f.Message();
  EXPECT_TRUE(f.is_from_another_rank);
  EXPECT_NE(f.Message().find("prefill tp1 pp1"), std::string::npos) << f.Message();
}

}  // namespace
}  // namespace kvbridge::internal

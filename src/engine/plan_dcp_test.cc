// Decode context parallelism (PlanKvDcpTokens): prefill's pages, token by
// token, into the rows of the decode rank that owns each token.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <vector>

#include "engine/plan.h"
#include "engine/plan_test_util.h"

namespace kvbridge::internal {
namespace {

using testing::LayoutSpec;
using testing::MakeLayout;

RankLayout Mla(int page_size, int layers, uint64_t pages, int dcp_size = 1, int dcp_rank = 0) {
  LayoutSpec s;
  s.mla = true;
  s.page_size = page_size;
  s.total_heads = 1;
  s.end_layer = layers;
  s.pages = pages;
  s.aux_buffers = 0;
  RankLayout l = MakeLayout(s);
  l.dcp_size = dcp_size;
  l.dcp_rank = dcp_rank;
  return l;
}

// Page 2 tokens of 4 bytes (one layer): dcp rank 1 of 2 owns positions 1
// and 3, which land in rows 0 and 1 of decode's one page.
TEST(PlanKvDcpTest, EachOwnedTokenIsOneRunToItsRow) {
  const RankLayout p = Mla(2, 1, 8);
  const RankLayout d = Mla(2, 1, 8, 2, 1);
  std::vector<int32_t> src{5, 3}, dst{6};
  auto runs = PlanKvDcpTokens(p, d, src, dst, 0);
  ASSERT_TRUE(runs.ok()) << runs.status().ToString();
  const std::vector<CopyRun> want{{BufferClass::kKv, 0, 5 * 8 + 4, 0, 6 * 8 + 0, 4},
                                  {BufferClass::kKv, 0, 3 * 8 + 4, 0, 6 * 8 + 4, 4}};
  EXPECT_EQ(*runs, want);
}

// A draft (MTP) entry appended to `l`'s kv buffers: prefill's pages of
// page_size tokens, decode's (under dcp) dcp_size times wider.
RankLayout WithDraft(RankLayout l) {
  const uint64_t item = l.kv[0].item_len * static_cast<uint64_t>(l.dcp_size);
  const uint64_t pages = l.kv[0].length / l.kv[0].item_len;
  l.kv.push_back({l.kv.back().addr + 0x100000, pages * item, item});
  l.num_draft_entries = 1;
  return l;
}

// The storage rule sglang states for a dcp group, checked on bytes: token
// p of the request lives on rank p % dcp at row p / dcp of the request's
// pages. Every token of every layer, sent in the chunks `split` (pages per
// chunk), lands exactly there on exactly one rank, and no other row of any
// rank is written. With `draft`, a draft entry rides along, and every rank
// holds every draft token p at row p of pages dcp times wider (page
// dst[p / (page_size * dcp)]), nothing else of that buffer written.
void ExpectStorageRule(int page_size, int dcp, const std::vector<int>& split, bool draft = false) {
  constexpr int kLayers = 2;
  constexpr uint64_t kSlots = 16;
  const RankLayout p =
      draft ? WithDraft(Mla(page_size, kLayers, kSlots)) : Mla(page_size, kLayers, kSlots);
  std::vector<int32_t> src;
  for (int n : split)
    for (int i = 0; i < n; ++i) src.push_back(static_cast<int32_t>((src.size() * 5 + 3) % kSlots));
  const int pages = static_cast<int>(src.size());
  std::vector<int32_t> dst;  // one per dcp pages of prefill's, the same on every rank
  for (int i = 0; i < (pages + dcp - 1) / dcp; ++i)
    dst.push_back(static_cast<int32_t>(kSlots - 1 - 2 * i));
  const int tokens = pages * page_size;
  const uint64_t token = p.kv[0].item_len / page_size;
  // Prefill's memory: each token row of buffer L at position q holds bytes
  // 100 * L + q (the position in the request, not in the page).
  std::vector<std::vector<uint8_t>> prefill(p.kv.size(),
                                            std::vector<uint8_t>(p.kv[0].length, 0xee));
  for (size_t l = 0; l < p.kv.size(); ++l)
    for (int q = 0; q < tokens; ++q)
      for (uint64_t b = 0; b < token; ++b)
        prefill[l][src[q / page_size] * p.kv[0].item_len + (q % page_size) * token + b] =
            static_cast<uint8_t>(100 * l + q);
  std::map<int, int> landed;  // position -> times
  for (int rank = 0; rank < dcp; ++rank) {
    RankLayout d = Mla(page_size, kLayers, kSlots, dcp, rank);
    if (draft) d = WithDraft(d);
    std::vector<std::vector<uint8_t>> decode;
    for (const BufferSpan& b : d.kv) decode.emplace_back(b.length, 0xdd);
    int first = 0;
    for (int n : split) {
      std::span<const int32_t> chunk(src.data() + first, n);
      auto runs = PlanKvDcpTokens(p, d, chunk, dst, first);
      ASSERT_TRUE(runs.ok()) << runs.status().ToString();
      first += n;
      for (const CopyRun& r : *runs) {
        ASSERT_EQ(r.cls, BufferClass::kKv);
        ASSERT_LE(r.dst_offset + r.length, decode[r.dst_buffer].size());
        std::copy_n(prefill[r.src_buffer].begin() + r.src_offset, r.length,
                    decode[r.dst_buffer].begin() + r.dst_offset);
      }
    }
    for (int l = 0; l < kLayers; ++l) {
      for (uint64_t slot = 0; slot < kSlots; ++slot) {
        const auto at = std::find(dst.begin(), dst.end(), static_cast<int32_t>(slot));
        for (int row = 0; row < page_size; ++row) {
          const int local = static_cast<int>(at - dst.begin()) * page_size + row;
          const int q = local * dcp + rank;  // the position this row holds
          const bool written = at != dst.end() && q < tokens;
          const uint8_t want = written ? static_cast<uint8_t>(100 * l + q) : 0xdd;
          for (uint64_t b = 0; b < token; ++b)
            ASSERT_EQ(decode[l][slot * d.kv[0].item_len + row * token + b], want)
                << "rank " << rank << " layer " << l << " page " << slot << " row " << row;
          if (written && l == 0) ++landed[q];
        }
      }
    }
    if (!draft) continue;
    const int wide = page_size * dcp;  // draft rows per decode page
    for (uint64_t slot = 0; slot < kSlots; ++slot) {
      const auto at = std::find(dst.begin(), dst.end(), static_cast<int32_t>(slot));
      for (int row = 0; row < wide; ++row) {
        const int q = static_cast<int>(at - dst.begin()) * wide + row;
        const bool written = at != dst.end() && q < tokens;
        const uint8_t want = written ? static_cast<uint8_t>(100 * kLayers + q) : 0xdd;
        for (uint64_t b = 0; b < token; ++b)
          ASSERT_EQ(decode[kLayers][slot * d.kv[kLayers].item_len + row * token + b], want)
              << "rank " << rank << " draft page " << slot << " row " << row;
      }
    }
  }
  ASSERT_EQ(landed.size(), static_cast<size_t>(tokens));
  for (auto [q, times] : landed) EXPECT_EQ(times, 1) << "position " << q;
}

TEST(PlanKvDcpTest, EveryTokenLandsOnTheRankThatOwnsItAtItsRow) {
  ExpectStorageRule(4, 3, {3, 4});  // chunks start where rank 0 owns
}

// A chunk whose first token another rank owns (page size 1 or 2 with dcp
// 3): ownership wraps around from the chunk's first token.
TEST(PlanKvDcpTest, ChunksThatStartMidGroupWrapOwnershipAround) {
  ExpectStorageRule(2, 3, {1, 3, 3});
  ExpectStorageRule(1, 3, {1, 2, 5});
  ExpectStorageRule(3, 2, {1, 1, 3});
}

// sglang's draft (MTP) entries under dcp (num_draft_entries, the tail of
// the kv buffers): replicated on every rank of the group, whole pages into
// pages dcp_size times wider, while the target's tokens stay sharded.
TEST(PlanKvDcpTest, DraftEntriesLandWholeOnEveryRankInWiderPages) {
  ExpectStorageRule(4, 3, {3, 4}, /*draft=*/true);
  ExpectStorageRule(2, 3, {1, 3, 3}, /*draft=*/true);
  ExpectStorageRule(1, 2, {1, 2, 2}, /*draft=*/true);
}

// sglang's worked case (page 2, dcp 4, prefill pages 5 2 11 4 into decode
// page 7): each rank's draft rows are 56..63 of the wider pool, one run
// per prefill page; the second case is a chunk from page 1 (dcp 2) into
// decode pages 4 and 6: rows 18, 19 and 24, 25.
TEST(PlanKvDcpTest, DraftRowsAreSglangsWorkedCase) {
  for (int rank = 0; rank < 4; ++rank) {
    const RankLayout p = WithDraft(Mla(2, 1, 16));
    const RankLayout d = WithDraft(Mla(2, 1, 16, 4, rank));
    auto runs =
        PlanKvDcpTokens(p, d, std::vector<int32_t>{5, 2, 11, 4}, std::vector<int32_t>{7}, 0);
    ASSERT_TRUE(runs.ok()) << runs.status().ToString();
    std::vector<uint64_t> rows;  // draft rows written, from each run
    for (const CopyRun& r : *runs)
      if (r.dst_buffer == 1)
        for (uint64_t b = 0; b < r.length; b += 4) rows.push_back((r.dst_offset + b) / 4);
    EXPECT_EQ(rows, (std::vector<uint64_t>{56, 57, 58, 59, 60, 61, 62, 63})) << "rank " << rank;
  }
  const RankLayout p = WithDraft(Mla(2, 1, 16));
  const RankLayout d = WithDraft(Mla(2, 1, 16, 2, 1));
  auto runs = PlanKvDcpTokens(p, d, std::vector<int32_t>{9, 3}, std::vector<int32_t>{4, 6}, 1);
  ASSERT_TRUE(runs.ok()) << runs.status().ToString();
  std::vector<uint64_t> rows;
  for (const CopyRun& r : *runs)
    if (r.dst_buffer == 1)
      for (uint64_t b = 0; b < r.length; b += 4) rows.push_back((r.dst_offset + b) / 4);
  EXPECT_EQ(rows, (std::vector<uint64_t>{18, 19, 24, 25}));
}

// A draft entry that is one side's only, or whose decode page is not
// dcp_size of prefill's, is refused by name; so is a count out of range.
TEST(PlanKvDcpTest, DraftEntriesThatDoNotLineUpAreRefusedByName) {
  const RankLayout p = WithDraft(Mla(2, 1, 16));
  RankLayout d = WithDraft(Mla(2, 1, 16, 2, 0));
  EXPECT_TRUE(CheckCompatible(p, d).ok()) << CheckCompatible(p, d).ToString();
  RankLayout narrow = d;  // decode's draft pages as narrow as prefill's
  narrow.kv[1].item_len = p.kv[1].item_len;
  EXPECT_NE(CheckCompatible(p, narrow).message().find("bytes per head per token mismatch for draft "
                                                      "entry 0 (kv[1])"),
            std::string::npos)
      << CheckCompatible(p, narrow).ToString();
  RankLayout none = d;  // decode counts no draft entry: a layer too many
  none.num_draft_entries = 0;
  EXPECT_FALSE(CheckCompatible(p, none).ok());
  RankLayout ids_p = p, ids_d = d;  // by layer id: prefill's draft into decode's target
  ids_p.kv_layer_ids = {0, 1000000};
  ids_d.kv_layer_ids = {1000000, 0};
  EXPECT_NE(CheckCompatible(ids_p, ids_d).message().find("draft entry mismatch under dcp"),
            std::string::npos)
      << CheckCompatible(ids_p, ids_d).ToString();
  RankLayout over = p;
  over.num_draft_entries = 3;
  EXPECT_NE(CheckLayout(over).message().find("num_draft_entries 3 out of range [0, 2]"),
            std::string::npos)
      << CheckLayout(over).ToString();
  // Too few decode pages for a draft page: 3 prefill pages need 2 under dcp 2.
  EXPECT_FALSE(
      PlanKvDcpTokens(p, d, std::vector<int32_t>{1, 2, 3}, std::vector<int32_t>{4}, 0).ok());
}

TEST(PlanKvDcpTest, TooFewDestinationPagesAreRefusedByName) {
  const RankLayout p = Mla(2, 1, 8);
  const RankLayout d = Mla(2, 1, 8, 2, 0);
  std::vector<int32_t> src{1, 2, 3}, dst{4};  // 6 tokens: rank 0 needs rows 0..2, 2 pages
  auto runs = PlanKvDcpTokens(p, d, src, dst, 0);
  ASSERT_FALSE(runs.ok());
  EXPECT_EQ(runs.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(runs.status().message().find("gave 1 pages"), std::string::npos)
      << runs.status().ToString();
  EXPECT_FALSE(PlanKvDcpTokens(p, d, src, std::vector<int32_t>{4, 99}, 0).ok());  // past the pool
  EXPECT_FALSE(PlanKvDcpTokens(p, Mla(2, 1, 8), src, dst, 0).ok());  // decode without dcp
  EXPECT_FALSE(PlanKvDcpTokens(p, d, src, dst, -1).ok());
}

TEST(PlanKvDcpTest, DestinationPagesAreOnePerDcpSizeOfPrefillPages) {
  EXPECT_EQ(DestinationPageCount(Mla(2, 1, 8), 7), 7);
  EXPECT_EQ(DestinationPageCount(Mla(2, 1, 8, 3, 2), 7), 3);
  EXPECT_EQ(DestinationPageCount(Mla(2, 1, 8, 3, 2), 6), 2);
  EXPECT_EQ(DestinationPageCount(Mla(2, 1, 8, 3, 2), 0), 0);
}

TEST(PlanKvDcpTest, LayoutsDcpCannotServeAreRefusedByName) {
  RankLayout mha = MakeLayout(LayoutSpec{});
  mha.dcp_size = 2;
  EXPECT_NE(CheckLayout(mha).message().find("without MLA"), std::string::npos);
  RankLayout bad_rank = Mla(2, 1, 8, 2, 2);
  EXPECT_NE(CheckLayout(bad_rank).message().find("dcp_rank 2 out of range"), std::string::npos);
  const Status prefill_dcp = CheckCompatible(Mla(2, 1, 8, 2, 0), Mla(2, 1, 8, 2, 0));
  EXPECT_EQ(prefill_dcp.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(prefill_dcp.message().find("prefill dcp_size 2"), std::string::npos);
  EXPECT_TRUE(CheckCompatible(Mla(2, 1, 8), Mla(2, 1, 8, 2, 1)).ok());
}

// sglang's split of a request's pages among prefill cp ranks when every cp
// rank transfers: base pages each, one more for the first (pages % C).
TEST(CpPageShareTest, EveryCpRankSendsOnlyInTheEveryRankMode) {
  EXPECT_EQ(SendingCpRanks(4, true), 4);
  EXPECT_EQ(SendingCpRanks(4, false), 1);  // cp rank 0; the others are dummies
  EXPECT_EQ(SendingCpRanks(1, true), 1);
  EXPECT_EQ(SendingCpRanks(0, true), 1);  // an info without cp: one rank
}

TEST(CpPageShareTest, PagesSplitInRankOrderWithTheRemainderFirst) {
  EXPECT_EQ(CpPageShare(5, 2, 0), (PageShare{0, 3}));
  EXPECT_EQ(CpPageShare(5, 2, 1), (PageShare{3, 2}));
  EXPECT_EQ(CpPageShare(7, 3, 0), (PageShare{0, 3}));
  EXPECT_EQ(CpPageShare(7, 3, 1), (PageShare{3, 2}));
  EXPECT_EQ(CpPageShare(7, 3, 2), (PageShare{5, 2}));
  EXPECT_EQ(CpPageShare(1, 3, 0), (PageShare{0, 1}));
  EXPECT_EQ(CpPageShare(1, 3, 2), (PageShare{1, 0}));  // a rank with no page
  EXPECT_EQ(CpPageShare(0, 2, 0), (PageShare{}));
  EXPECT_EQ(CpPageShare(4, 2, 2), (PageShare{}));  // out of range
}

}  // namespace
}  // namespace kvbridge::internal

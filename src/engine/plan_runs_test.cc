// Copy-run planning: exact runs for small cases, bad input, and a brute-force
// comparison against a naive per-(layer, page, token, head) copy.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "engine/plan.h"
#include "engine/plan_test_util.h"

namespace kvbridge::internal {
namespace {

using ::kvbridge::internal::testing::LayoutSpec;
using ::kvbridge::internal::testing::MakeLayout;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

constexpr BufferClass kKv = BufferClass::kKv;

std::vector<CopyRun> Plan(const RankLayout& p, const RankLayout& d, const HeadSlice& slice,
                          std::vector<int32_t> src, std::vector<int32_t> dst) {
  Result<std::vector<CopyRun>> r = PlanKvPages(p, d, slice, src, dst);
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  return r.ok() ? *r : std::vector<CopyRun>{};
}

// ------------------------------------------------------------ exact runs

TEST(PlanKvPagesTest, ConsecutivePagesCoalescePerBuffer) {
  // 2 heads x 4 bytes x 2 tokens: item 16. K0, K1, V0, V1.
  const RankLayout p = MakeLayout({.pages = 16});
  const RankLayout d = MakeLayout({.pages = 16});
  const HeadSlice all{0, 0, 0, 0, 2};
  std::vector<CopyRun> want;
  for (uint32_t b = 0; b < 4; ++b) {
    want.push_back({kKv, b, 3 * 16, b, 0, 3 * 16});   // pages 3,4,5 -> 0,1,2
    want.push_back({kKv, b, 9 * 16, b, 7 * 16, 16});  // page 9 -> 7
  }
  EXPECT_EQ(Plan(p, d, all, {3, 4, 5, 9}, {0, 1, 2, 7}), want);
}

TEST(PlanKvPagesTest, RunsBreakWhenEitherSideJumps) {
  const RankLayout p = MakeLayout({.end_layer = 1});
  const RankLayout d = MakeLayout({.end_layer = 1});
  const HeadSlice all{0, 0, 0, 0, 2};
  // Source consecutive, destination backwards; then destination consecutive,
  // source not.
  EXPECT_THAT(Plan(p, d, all, {1, 2}, {5, 4}),
              ElementsAre(CopyRun{kKv, 0, 16, 0, 80, 16}, CopyRun{kKv, 0, 32, 0, 64, 16},
                          CopyRun{kKv, 1, 16, 1, 80, 16}, CopyRun{kKv, 1, 32, 1, 64, 16}));
  EXPECT_THAT(Plan(p, d, all, {0, 2, 3}, {4, 5, 6}),
              ElementsAre(CopyRun{kKv, 0, 0, 0, 64, 16}, CopyRun{kKv, 0, 32, 0, 80, 32},
                          CopyRun{kKv, 1, 0, 1, 64, 16}, CopyRun{kKv, 1, 32, 1, 80, 32}));
}

TEST(PlanKvPagesTest, EmptyPageListPlansNothing) {
  const RankLayout l = MakeLayout({});
  EXPECT_THAT(Plan(l, l, {0, 0, 0, 0, 2}, {}, {}), IsEmpty());
}

TEST(PlanKvPagesTest, ScatterHeadSliceGivesOneRunPerToken) {
  // Prefill tp 1 holds heads 0..3; decode tp 2 rank 1 holds heads 2,3.
  // Source item 2 tokens x 4 heads x 4 bytes = 32; destination item 16.
  const RankLayout p = MakeLayout({.total_heads = 4, .end_layer = 1});
  const RankLayout d = MakeLayout({.tp_size = 2, .tp_rank = 1, .total_heads = 4, .end_layer = 1});
  const HeadSlice slice{0, 1, 2, 0, 2};
  // Page 1 -> 3: token t at 32 + (4t + 2) * 4 -> 48 + 2t * 4, 8 bytes each.
  // Destination tokens are contiguous but source ones are not: no merge.
  EXPECT_THAT(Plan(p, d, slice, {1}, {3}),
              ElementsAre(CopyRun{kKv, 0, 40, 0, 48, 8}, CopyRun{kKv, 0, 56, 0, 56, 8},
                          CopyRun{kKv, 1, 40, 1, 48, 8}, CopyRun{kKv, 1, 56, 1, 56, 8}));
}

TEST(PlanKvPagesTest, GatherHeadSliceGivesOneRunPerToken) {
  // Prefill tp 2 rank 1 (heads 2,3) into decode tp 1 (heads 0..3).
  const RankLayout p = MakeLayout({.tp_size = 2, .tp_rank = 1, .total_heads = 4, .end_layer = 1});
  const RankLayout d = MakeLayout({.total_heads = 4, .end_layer = 1});
  const HeadSlice slice{1, 0, 0, 2, 2};
  EXPECT_THAT(Plan(p, d, slice, {0, 1}, {2, 3}),
              ElementsAre(CopyRun{kKv, 0, 0, 0, 72, 8}, CopyRun{kKv, 0, 8, 0, 88, 8},
                          CopyRun{kKv, 0, 16, 0, 104, 8}, CopyRun{kKv, 0, 24, 0, 120, 8},
                          CopyRun{kKv, 1, 0, 1, 72, 8}, CopyRun{kKv, 1, 8, 1, 88, 8},
                          CopyRun{kKv, 1, 16, 1, 104, 8}, CopyRun{kKv, 1, 24, 1, 120, 8}));
}

TEST(PlanKvPagesTest, SingleTokenPagesWithHeadSliceStillCoalesceNothing) {
  // page_size 1: each page is one token; a head slice is never contiguous
  // across pages on the side that holds more heads.
  const RankLayout p = MakeLayout({.page_size = 1, .total_heads = 4, .end_layer = 1});
  const RankLayout d =
      MakeLayout({.page_size = 1, .tp_size = 2, .tp_rank = 0, .total_heads = 4, .end_layer = 1});
  EXPECT_THAT(Plan(p, d, {0, 0, 0, 0, 2}, {0, 1}, {0, 1}),
              ElementsAre(CopyRun{kKv, 0, 0, 0, 0, 8}, CopyRun{kKv, 0, 16, 0, 8, 8},
                          CopyRun{kKv, 1, 0, 1, 0, 8}, CopyRun{kKv, 1, 16, 1, 8, 8}));
}

TEST(PlanKvPagesTest, PipelineStageLandsOnItsGlobalLayers) {
  // Prefill holds layers [2, 4): K2 K3 V2 V3. Decode holds [0, 4):
  // K0..K3 V0..V3, so buffers map 0->2, 1->3, 2->6, 3->7.
  const RankLayout p = MakeLayout({.total_heads = 1, .start_layer = 2, .end_layer = 4});
  const RankLayout d = MakeLayout({.total_heads = 1, .end_layer = 4});
  const HeadSlice all{0, 0, 0, 0, 1};
  // item = 2 tokens x 1 head x 4 bytes = 8.
  EXPECT_THAT(Plan(p, d, all, {1}, {6}),
              ElementsAre(CopyRun{kKv, 0, 8, 2, 48, 8}, CopyRun{kKv, 1, 8, 3, 48, 8},
                          CopyRun{kKv, 2, 8, 6, 48, 8}, CopyRun{kKv, 3, 8, 7, 48, 8}));
  // Decode itself a stage [1, 4): K1 K2 K3 V1 V2 V3.
  const RankLayout d2 = MakeLayout({.total_heads = 1, .start_layer = 1, .end_layer = 4});
  EXPECT_THAT(Plan(p, d2, all, {1}, {6}),
              ElementsAre(CopyRun{kKv, 0, 8, 1, 48, 8}, CopyRun{kKv, 1, 8, 2, 48, 8},
                          CopyRun{kKv, 2, 8, 4, 48, 8}, CopyRun{kKv, 3, 8, 5, 48, 8}));
}

TEST(PlanKvPagesTest, MlaSendsWholePagesOneBufferPerLayer) {
  // MLA, 3 layers, one buffer each; item 2 tokens x 1 x 4 = 8.
  const RankLayout p = MakeLayout({.mla = true, .tp_size = 2, .tp_rank = 1, .end_layer = 3});
  const RankLayout d = MakeLayout({.mla = true, .tp_size = 4, .tp_rank = 3, .end_layer = 3});
  EXPECT_THAT(Plan(p, d, {1, 3, 0, 0, 1}, {0, 1, 5}, {4, 5, 6}),
              ElementsAre(CopyRun{kKv, 0, 0, 0, 32, 16}, CopyRun{kKv, 0, 40, 0, 48, 8},
                          CopyRun{kKv, 1, 0, 1, 32, 16}, CopyRun{kKv, 1, 40, 1, 48, 8},
                          CopyRun{kKv, 2, 0, 2, 32, 16}, CopyRun{kKv, 2, 40, 2, 48, 8}));
}

TEST(PlanKvPagesTest, LongRunIsOneWritePerBuffer) {
  // The benchmark shape (8 heads x 128 dim x 2 bytes, page 16) over 512
  // contiguous pages: 64 writes for 32 layers, not 64 x 512.
  const RankLayout l = MakeLayout(
      {.page_size = 16, .total_heads = 8, .end_layer = 32, .head_bytes = 256, .pages = 1024});
  std::vector<int32_t> src(512), dst(512);
  for (int i = 0; i < 512; ++i) src[i] = 100 + i, dst[i] = 400 + i;
  const std::vector<CopyRun> runs = Plan(l, l, {0, 0, 0, 0, 8}, src, dst);
  ASSERT_EQ(runs.size(), 64u);
  EXPECT_EQ(runs[5], (CopyRun{kKv, 5, 100 * 32768ull, 5, 400 * 32768ull, 512 * 32768ull}));
}

// ------------------------------------------------------------ bad input

struct BadKvCase {
  const char* name;
  LayoutSpec prefill;
  LayoutSpec decode;
  HeadSlice slice;
  std::vector<int32_t> src;
  std::vector<int32_t> dst;
  StatusCode code;
  const char* message;
};

class PlanKvPagesBadInputTest : public ::testing::TestWithParam<BadKvCase> {};

TEST_P(PlanKvPagesBadInputTest, FailsWithCodeAndMessage) {
  const BadKvCase& c = GetParam();
  Result<std::vector<CopyRun>> r =
      PlanKvPages(MakeLayout(c.prefill), MakeLayout(c.decode), c.slice, c.src, c.dst);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), c.code) << r.status().ToString();
  EXPECT_EQ(r.status().message(), c.message);
}

constexpr StatusCode kInvalid = StatusCode::kInvalidArgument;
constexpr StatusCode kPrecondition = StatusCode::kFailedPrecondition;
const HeadSlice kAll{0, 0, 0, 0, 2};

INSTANTIATE_TEST_SUITE_P(
    PlanKvPages, PlanKvPagesBadInputTest,
    ::testing::Values(
        BadKvCase{"length_mismatch",
                  {},
                  {},
                  kAll,
                  {1, 2},
                  {1},
                  kInvalid,
                  "page list length mismatch: source 2, destination 1"},
        BadKvCase{"negative_source",
                  {},
                  {},
                  kAll,
                  {0, -1},
                  {0, 1},
                  kInvalid,
                  "source: page index -1 at position 1 out of range [0, 8)"},
        BadKvCase{"source_past_end",
                  {.pages = 4},
                  {},
                  kAll,
                  {0, 1, 2, 4},
                  {0, 1, 2, 3},
                  kInvalid,
                  "source: page index 4 at position 3 out of range [0, 4)"},
        BadKvCase{"destination_past_end",
                  {},
                  {},
                  kAll,
                  {0, 1, 2, 3},
                  {0, 1, 2, 9},
                  kInvalid,
                  "destination: page index 9 at position 3 out of range [0, 8)"},
        BadKvCase{"negative_destination",
                  {},
                  {},
                  kAll,
                  {0},
                  {-5},
                  kInvalid,
                  "destination: page index -5 at position 0 out of range [0, 8)"},
        BadKvCase{"page_size",
                  {.page_size = 16},
                  {.page_size = 32},
                  kAll,
                  {0},
                  {0},
                  kPrecondition,
                  "page size mismatch: prefill 16, decode 32"},
        BadKvCase{"layers",
                  {.end_layer = 3},
                  {},
                  kAll,
                  {0},
                  {0},
                  kPrecondition,
                  "layer range mismatch: prefill [0, 3), decode [0, 2) (decode must hold every "
                  "prefill layer)"},
        BadKvCase{"slice_rank",
                  {},
                  {},
                  {1, 0, 0, 0, 2},
                  {0},
                  {0},
                  kInvalid,
                  "slice is for prefill rank 1 -> decode rank 0, layouts are prefill rank 0 -> "
                  "decode rank 0"},
        BadKvCase{
            "slice_no_heads", {}, {}, {0, 0, 0, 0, 0}, {0}, {0}, kInvalid, "slice num_heads 0 < 1"},
        BadKvCase{"slice_source_heads",
                  {},
                  {},
                  {0, 0, 1, 0, 2},
                  {0},
                  {0},
                  kInvalid,
                  "slice source heads [1, 3) out of range [0, 2)"},
        BadKvCase{"slice_destination_heads",
                  {.total_heads = 4},
                  {.tp_size = 2, .tp_rank = 0, .total_heads = 4},
                  {0, 0, 0, 1, 2},
                  {0},
                  {0},
                  kInvalid,
                  "slice destination heads [1, 3) out of range [0, 2)"},
        BadKvCase{"slice_wrong_head",
                  {.total_heads = 4},
                  {.tp_size = 2, .tp_rank = 1, .total_heads = 4},
                  {0, 1, 0, 0, 2},
                  {0},
                  {0},
                  kInvalid,
                  "slice maps model head 0 of prefill to model head 2 of decode"}),
    [](const ::testing::TestParamInfo<BadKvCase>& info) { return info.param.name; });

TEST(PlanCheckPageIndicesTest, RangeAndDuplicates) {
  const RankLayout l = MakeLayout({});  // 8 pages
  const std::vector<int32_t> ok = {7, 0, 3};
  EXPECT_TRUE(CheckPageIndices(l, ok, true).ok());
  const std::vector<int32_t> far = {1, 2, 3, 9};
  Status s = CheckPageIndices(l, far, false);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), "page index 9 at position 3 out of range [0, 8)");
  const std::vector<int32_t> neg = {-1};
  EXPECT_EQ(CheckPageIndices(l, neg, true).message(),
            "page index -1 at position 0 out of range [0, 8)");
  // Duplicates only matter when asked; the earliest repeat is named.
  const std::vector<int32_t> dup = {5, 1, 2, 1, 5};
  EXPECT_TRUE(CheckPageIndices(l, dup, false).ok());
  s = CheckPageIndices(l, dup, true);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), "duplicate page index 1 at position 3 (first at 1)");
  const std::vector<int32_t> triple = {4, 4, 4};
  EXPECT_EQ(CheckPageIndices(l, triple, true).message(),
            "duplicate page index 4 at position 1 (first at 0)");
  EXPECT_TRUE(CheckPageIndices(l, {}, true).ok());
  // The bound is the smallest kv buffer's page count.
  RankLayout shrunk = l;
  shrunk.kv[2].length = 5 * shrunk.kv[2].item_len + 3;
  const std::vector<int32_t> five = {5};
  EXPECT_EQ(CheckPageIndices(shrunk, five, false).message(),
            "page index 5 at position 0 out of range [0, 5)");
}

// ------------------------------------------------------------ aux and state

TEST(PlanAuxTest, OneRowPerAuxBuffer) {
  const RankLayout p = MakeLayout({.aux_buffers = 2});
  const RankLayout d = MakeLayout({.aux_buffers = 2, .aux_rows = 8});
  Result<std::vector<CopyRun>> r = PlanAux(p, d, 3, 7);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_THAT(*r, ElementsAre(CopyRun{BufferClass::kAux, 0, 48, 0, 112, 16},
                              CopyRun{BufferClass::kAux, 1, 48, 1, 112, 16}));
  r = PlanAux(MakeLayout({.aux_buffers = 0}), MakeLayout({.aux_buffers = 0}), 0, 0);
  ASSERT_TRUE(r.ok());
  EXPECT_THAT(*r, IsEmpty());
}

TEST(PlanAuxTest, BadInput) {
  const RankLayout l = MakeLayout({});  // 4 aux rows
  EXPECT_EQ(PlanAux(l, l, 4, 0).status().message(), "source aux index 4 out of range [0, 4)");
  EXPECT_EQ(PlanAux(l, l, 0, -1).status().message(),
            "destination aux index -1 out of range [0, 4)");
  EXPECT_EQ(PlanAux(l, l, 0, -1).status().code(), StatusCode::kInvalidArgument);
  const Status s = PlanAux(l, MakeLayout({.aux_item = 8}), 0, 0).status();
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(s.message(), "aux[0] item_len mismatch: prefill 16, decode 8");
}

TEST(PlanStateTest, ConsecutiveSlotsCoalesce) {
  const RankLayout l = MakeLayout({.state_buffers = 2, .state_slots = 8});
  Result<std::vector<CopyRun>> r =
      PlanState(l, l, std::vector<int32_t>{1, 2, 6}, std::vector<int32_t>{3, 4, 5});
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  constexpr BufferClass kState = BufferClass::kState;
  EXPECT_THAT(*r, ElementsAre(CopyRun{kState, 0, 8, 0, 24, 16}, CopyRun{kState, 0, 48, 0, 40, 8},
                              CopyRun{kState, 1, 8, 1, 24, 16}, CopyRun{kState, 1, 48, 1, 40, 8}));
}

// Two state types with their own buffers (sglang's mamba + SWA): each
// section of the indices addresses only its type's buffers.
TEST(PlanStateTest, SectionsAddressOnlyTheirTypesBuffers) {
  RankLayout l = MakeLayout({.state_buffers = 3, .state_slots = 8});
  l.state_types = {0, 1, 1};
  const std::vector<int32_t> src{2, kStateSectionEnd, 5, 6}, dst{7, kStateSectionEnd, 1, 2};
  Result<std::vector<CopyRun>> r = PlanState(l, l, src, dst);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  const uint64_t item = l.state[0].item_len;
  constexpr BufferClass kState = BufferClass::kState;
  EXPECT_THAT(*r, ElementsAre(CopyRun{kState, 0, 2 * item, 0, 7 * item, item},
                              CopyRun{kState, 1, 5 * item, 1, 1 * item, 2 * item},
                              CopyRun{kState, 2, 5 * item, 2, 1 * item, 2 * item}));
  // Without a separator every index still addresses every buffer.
  r = PlanState(l, l, std::vector<int32_t>{3}, std::vector<int32_t>{4});
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->size(), 3u);
}

TEST(PlanStateTest, SectionsBadInput) {
  RankLayout l = MakeLayout({.state_buffers = 2, .state_slots = 4});
  l.state_types = {0, 1};
  const std::vector<int32_t> three{1, -1, 2, -1, 3}, ok{1, -1, 2}, short_dst{1, -1};
  Status s = PlanState(l, l, three, three).status();
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(),
            "state indices hold 3 sections (separated by -1), the layout has 2 state type(s)");
  s = PlanState(l, l, ok, std::vector<int32_t>{1, -1, 9}).status();
  EXPECT_EQ(s.message(),
            "state type 1: destination state slot 9 at position 0 out of range [0, 4)");
  s = PlanState(l, l, std::vector<int32_t>{1, 2, -1}, std::vector<int32_t>{1, -1, 2}).status();
  EXPECT_EQ(s.message(), "state type 0: state slot list length mismatch: source 2, destination 1");
  EXPECT_EQ(PlanState(l, l, ok, short_dst).status().code(), StatusCode::kInvalidArgument);
  // One type: a separator is an error, not an index.
  l.state_types = {};
  EXPECT_EQ(PlanState(l, l, ok, ok).status().message(),
            "state indices hold 2 sections (separated by -1), the layout has 1 state type(s)");
}

TEST(PlanStateTest, BadInput) {
  const RankLayout l = MakeLayout({.state_buffers = 1});  // 4 slots
  const std::vector<int32_t> two = {0, 1}, one = {0}, far = {0, 4}, neg = {-2, 0};
  Status s = PlanState(l, l, two, one).status();
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), "state slot list length mismatch: source 2, destination 1");
  s = PlanState(l, l, far, two).status();
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), "source state slot 4 at position 1 out of range [0, 4)");
  EXPECT_EQ(PlanState(l, l, two, neg).status().message(),
            "destination state slot -2 at position 0 out of range [0, 4)");
  s = PlanState(l, MakeLayout({}), two, two).status();
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(s.message(), "state buffer count mismatch: prefill 1, decode 0");
  // No state buffers: nothing to send, whatever the slots.
  Result<std::vector<CopyRun>> r = PlanState(MakeLayout({}), MakeLayout({}), far, far);
  ASSERT_TRUE(r.ok());
  EXPECT_THAT(*r, IsEmpty());
}

// ------------------------------------------------------------ brute force

// Byte `offset` of kv buffer `buffer` on prefill rank `rank`: distinct enough
// that a copy from the wrong rank, buffer, page, token or head shows.
uint8_t Pattern(int rank, uint32_t buffer, uint64_t offset) {
  uint64_t x = (uint64_t(rank) << 48) ^ (uint64_t(buffer) << 32) ^ offset;
  x *= 0x9E3779B97F4A7C15ull;
  x ^= x >> 29;
  return static_cast<uint8_t>(x >> 17);
}

using Memory = std::vector<std::vector<uint8_t>>;  // one byte array per kv buffer

Memory Allocate(const RankLayout& l, int pattern_rank) {
  Memory m(l.kv.size());
  for (uint32_t b = 0; b < m.size(); ++b) {
    m[b].resize(l.kv[b].length);
    for (uint64_t i = 0; i < m[b].size(); ++i) {
      m[b][i] = pattern_rank < 0 ? 0xEE : Pattern(pattern_rank, b, i);
    }
  }
  return m;
}

// A list of `count` distinct pages below `limit`, mostly in consecutive runs
// (as a paged allocator hands them out) with jumps in between.
std::vector<int32_t> ScatteredPages(std::mt19937& rng, int count, int limit) {
  std::vector<bool> used(limit, false);
  std::vector<int32_t> pages;
  while (static_cast<int>(pages.size()) < count) {
    int next = -1;
    if (!pages.empty() && rng() % 4 != 0) next = pages.back() + 1;
    if (next < 0 || next >= limit || used[next]) {
      do next = static_cast<int>(rng() % limit);
      while (used[next]);
    }
    used[next] = true;
    pages.push_back(next);
  }
  return pages;
}

// One random shape for the brute-force check below.
struct BruteCase {
  bool mla;
  int total, ptp, dtp, page_size;
  uint64_t head_bytes;
  int d_start, d_end, p_start, p_end;  // layers: prefill's within decode's
  int p_pages, d_pages;
  std::vector<int32_t> src, dst;

  LayoutSpec Spec(int tp, int rank, int start, int end, int pages) const {
    return LayoutSpec{.mla = mla,
                      .page_size = page_size,
                      .tp_size = tp,
                      .tp_rank = rank,
                      .total_heads = total,
                      .start_layer = start,
                      .end_layer = end,
                      .head_bytes = head_bytes,
                      .pages = static_cast<uint64_t>(pages)};
  }
  std::string Name() const {
    return std::string(mla ? "MLA" : "MHA") + " heads " + std::to_string(total) + " tp " +
           std::to_string(ptp) + "->" + std::to_string(dtp) + " page_size " +
           std::to_string(page_size) + " head_bytes " + std::to_string(head_bytes) + " layers [" +
           std::to_string(p_start) + "," + std::to_string(p_end) + ") into [" +
           std::to_string(d_start) + "," + std::to_string(d_end) + ")";
  }
};

BruteCase RandomCase(std::mt19937& rng) {
  auto pick = [&](std::initializer_list<int> values) {
    return *(values.begin() + rng() % values.size());
  };
  BruteCase c;
  c.mla = rng() % 4 == 0;
  c.total = pick({1, 2, 4, 8});
  c.ptp = 1 + rng() % 8;
  c.dtp = 1 + rng() % 8;
  c.page_size = pick({1, 2, 3, 4});
  c.head_bytes = pick({1, 2, 3, 4});
  c.d_start = rng() % 2;
  c.d_end = c.d_start + 1 + rng() % 3;
  c.p_start = c.d_start + rng() % (c.d_end - c.d_start);
  c.p_end = c.p_start + 1 + rng() % (c.d_end - c.p_start);
  c.p_pages = 4 + rng() % 9;
  c.d_pages = 4 + rng() % 9;
  const int count = rng() % (std::min(c.p_pages, c.d_pages) + 1);
  c.src = ScatteredPages(rng, count, c.p_pages);
  c.dst = ScatteredPages(rng, count, c.d_pages);
  return c;
}

// Copies `runs` from `pm` into `got` after checking each against the
// buffers' bounds, and that they are fully coalesced: no run continues its
// predecessor on both sides. Adds the bytes copied to `written`.
void ApplyRuns(const std::vector<CopyRun>& runs, const Memory& pm, Memory& got, uint64_t* written) {
  for (size_t i = 0; i < runs.size(); ++i) {
    const CopyRun& r = runs[i];
    ASSERT_EQ(r.cls, BufferClass::kKv);
    ASSERT_LT(r.src_buffer, pm.size());
    ASSERT_LT(r.dst_buffer, got.size());
    ASSERT_GT(r.length, 0u);
    ASSERT_LE(r.src_offset + r.length, pm[r.src_buffer].size());
    ASSERT_LE(r.dst_offset + r.length, got[r.dst_buffer].size());
    std::memcpy(&got[r.dst_buffer][r.dst_offset], &pm[r.src_buffer][r.src_offset], r.length);
    *written += r.length;
    if (i > 0) {
      const CopyRun& prev = runs[i - 1];
      EXPECT_FALSE(prev.src_buffer == r.src_buffer && prev.dst_buffer == r.dst_buffer &&
                   prev.src_offset + prev.length == r.src_offset &&
                   prev.dst_offset + prev.length == r.dst_offset)
          << "runs " << i - 1 << " and " << i << " should be one";
    }
  }
}

// The naive reference: one head of one token of one page at a time,
// straight from the memory model in plan.h.
void NaivePerHeadCopy(const BruteCase& c, const RankLayout& pl, const Memory& pm,
                      const RankLayout& decode, const HeadSlice& f, Memory& want) {
  const int np = c.p_end - c.p_start;
  const int nd = c.d_end - c.d_start;
  for (int half = 0; half < (c.mla ? 1 : 2); ++half) {
    for (int layer = c.p_start; layer < c.p_end; ++layer) {
      const uint32_t sb = half * np + (layer - c.p_start);
      const uint32_t db = half * nd + (layer - c.d_start);
      for (size_t k = 0; k < c.src.size(); ++k) {
        for (int t = 0; t < c.page_size; ++t) {
          for (int h = 0; h < f.num_heads; ++h) {
            const uint64_t s_off = c.src[k] * pl.kv[sb].item_len +
                                   (uint64_t(t) * pl.kv_heads + f.src_head + h) * c.head_bytes;
            const uint64_t d_off = c.dst[k] * decode.kv[db].item_len +
                                   (uint64_t(t) * decode.kv_heads + f.dst_head + h) * c.head_bytes;
            std::memcpy(&want[db][d_off], &pm[sb][s_off], c.head_bytes);
          }
        }
      }
    }
  }
}

void CheckBruteCase(const BruteCase& c) {
  std::vector<RankLayout> prefill;
  std::vector<Memory> prefill_mem;
  for (int p = 0; p < c.ptp; ++p) {
    prefill.push_back(MakeLayout(c.Spec(c.ptp, p, c.p_start, c.p_end, c.p_pages)));
    prefill_mem.push_back(Allocate(prefill.back(), p));
  }
  Result<std::vector<HeadSlice>> flows = ComputeFlows(c.ptp, c.dtp, c.total, c.mla);
  ASSERT_TRUE(flows.ok());
  for (int d = 0; d < c.dtp; ++d) {
    const RankLayout decode = MakeLayout(c.Spec(c.dtp, d, c.d_start, c.d_end, c.d_pages));
    Memory got = Allocate(decode, -1);
    Memory want = Allocate(decode, -1);
    uint64_t written = 0;
    for (const HeadSlice& f : FlowsToDecode(*flows, d)) {
      Result<std::vector<CopyRun>> runs =
          PlanKvPages(prefill[f.prefill_rank], decode, f, c.src, c.dst);
      ASSERT_TRUE(runs.ok()) << runs.status().ToString();
      ApplyRuns(*runs, prefill_mem[f.prefill_rank], got, &written);
      NaivePerHeadCopy(c, prefill[f.prefill_rank], prefill_mem[f.prefill_rank], decode, f, want);
    }
    // Every byte of every decode buffer, including the ones nobody should
    // have touched; and no byte written twice.
    for (size_t b = 0; b < got.size(); ++b) {
      ASSERT_EQ(got[b], want[b]) << "decode rank " << d << " buffer " << b;
    }
    const uint64_t layers = c.p_end - c.p_start;
    const uint64_t expected =
        layers * (c.mla ? 1 : 2) * c.src.size() * c.page_size * decode.kv_heads * c.head_bytes;
    EXPECT_EQ(written, expected) << "decode rank " << d;
  }
}

TEST(PlanKvPagesBruteForceTest, MatchesNaivePerHeadCopy) {
  std::mt19937 rng(20261129);
  for (int iter = 0; iter < 500; ++iter) {
    const BruteCase c = RandomCase(rng);
    SCOPED_TRACE("iter " + std::to_string(iter) + " " + c.Name());
    CheckBruteCase(c);
    if (HasFatalFailure()) return;
  }
}

}  // namespace
}  // namespace kvbridge::internal

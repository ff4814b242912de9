#include "connector/kv_pool.h"

#include <gtest/gtest.h>

#include <cstring>
#include <vector>

namespace kvbridge::internal {
namespace {

std::unique_ptr<KvPool> MakePool(int tp_size = 1, int tp_rank = 0) {
  PoolOptions o;
  o.shape.layers = 2;
  o.shape.total_kv_heads = 4;
  o.shape.head_dim = 8;
  o.shape.page_size = 4;
  o.num_pages = 32;
  o.tp_size = tp_size;
  o.tp_rank = tp_rank;
  auto p = KvPool::Create(o);
  EXPECT_TRUE(p.ok()) << p.status().ToString();
  return std::move(p).value();
}

// Copies page `from` of pool `a` into page `to` of pool `b`, every buffer.
void CopyPage(const KvPool& a, int from, KvPool& b, int to) {
  KVArgs src = a.Args(), dst = b.Args();
  for (size_t i = 0; i < src.kv_data_ptrs.size(); ++i)
    std::memcpy(reinterpret_cast<void*>(dst.kv_data_ptrs[i] + to * dst.kv_item_lens[i]),
                reinterpret_cast<const void*>(src.kv_data_ptrs[i] + from * src.kv_item_lens[i]),
                src.kv_item_lens[i]);
}

TEST(KvPoolTest, PatternSurvivesACopyAndCatchesEveryMisplacedPage) {
  auto a = MakePool(), b = MakePool();
  std::vector<int32_t> src{3, 7, 8}, dst{10, 2, 5};
  a->Fill(42, src, 0, {});
  for (size_t i = 0; i < src.size(); ++i) CopyPage(*a, src[i], *b, dst[i]);
  EXPECT_EQ(b->CountCorruptPages(42, dst), 0u);
  // Another room's pattern, swapped pages, or one flipped byte: corrupt.
  EXPECT_EQ(b->CountCorruptPages(43, dst), 4u * 3);  // 4 buffers: K and V of 2 layers
  std::vector<int32_t> swapped{2, 10, 5};
  EXPECT_EQ(b->CountCorruptPages(42, swapped), 4u * 2);
  reinterpret_cast<uint8_t*>(b->Args().kv_data_ptrs[1])[5 * b->page_bytes() + 17] ^= 1;
  EXPECT_EQ(b->CountCorruptPages(42, dst), 1u);
}

// The check is vectorized with a word-by-word tail: a flipped bit at any
// byte of a page, in the vector part, the whole-word tail or the last
// partial word of a run, is caught, for head sizes that leave each kind of
// tail (5 x 2 B: one word and 2 bytes; 8 x 2 B: vectors only; 68 x 2 B:
// vectors and a word).
TEST(KvPoolTest, EveryFlippedByteOfAPageIsCaught) {
  for (int head_dim : {5, 8, 68}) {
    PoolOptions o;
    o.shape.layers = 1;
    o.shape.total_kv_heads = 2;
    o.shape.head_dim = head_dim;
    o.shape.page_size = 2;
    o.num_pages = 4;
    auto pool = KvPool::Create(o);
    ASSERT_TRUE(pool.ok()) << pool.status().ToString();
    KvPool& p = **pool;
    std::vector<int32_t> pages{1, 3};
    p.Fill(77, pages, -1, {});
    ASSERT_EQ(p.CountCorruptPages(77, pages), 0u) << "head_dim " << head_dim;
    uint8_t* page = reinterpret_cast<uint8_t*>(p.Args().kv_data_ptrs[1]) + 3 * p.page_bytes();
    for (uint64_t i = 0; i < p.page_bytes(); ++i) {
      page[i] ^= 0x10;
      ASSERT_EQ(p.CountCorruptPages(77, pages), 1u) << "head_dim " << head_dim << " byte " << i;
      page[i] ^= 0x10;
    }
    EXPECT_EQ(p.CountCorruptPages(77, pages), 0u);
  }
}

TEST(KvPoolTest, HeadSliceOfATpRankMatchesTheFullPattern) {
  // Each tp rank of 2 holds 2 of the 4 heads: its pattern is the full one's slice.
  auto full = MakePool(1, 0), half = MakePool(2, 1);
  std::vector<int32_t> pages{4};
  full->Fill(9, pages, 0, {});
  const uint64_t hb = full->head_bytes();
  const uint8_t* f =
      reinterpret_cast<const uint8_t*>(full->Args().kv_data_ptrs[0]) + 4 * full->page_bytes();
  uint8_t* h = reinterpret_cast<uint8_t*>(half->Args().kv_data_ptrs[0]) + 4 * half->page_bytes();
  for (int t = 0; t < 4; ++t) std::memcpy(h + t * 2 * hb, f + (t * 4 + 2) * hb, 2 * hb);
  // Only buffer 0 was copied: the page of the 3 other buffers is corrupt.
  EXPECT_EQ(half->CountCorruptPages(9, pages), 3u);
}

TEST(KvPoolTest, StrideFillsAndChecksOnlyTheSampledPositions) {
  auto a = MakePool();
  std::vector<int32_t> pages{0, 1, 2, 3, 4, 5, 6, 7, 8};
  a->Fill(5, pages, 0, {}, /*stride=*/4);
  EXPECT_EQ(a->CountCorruptPages(5, pages, 0, 4), 0u);  // positions 0, 4, 8
  EXPECT_EQ(a->CountCorruptPages(5, pages, 0, 1), 4u * 6);
  // A tail chunk keeps absolute positions: pages[4..] start at position 4.
  std::span<const int32_t> tail(pages.data() + 4, 5);
  EXPECT_EQ(a->CountCorruptPages(5, tail, 4, 4), 0u);
}

std::unique_ptr<KvPool> MakeStagePool(int first_layer, int num_layers, bool mla = false,
                                      int layers = 4) {
  PoolOptions o;
  o.shape.layers = layers;
  o.shape.total_kv_heads = mla ? 1 : 4;
  o.shape.head_dim = 8;
  o.shape.page_size = 4;
  o.shape.mla = mla;
  o.num_pages = 32;
  o.first_layer = first_layer;
  o.num_layers = num_layers;
  auto p = KvPool::Create(o);
  EXPECT_TRUE(p.ok()) << p.status().ToString();
  return std::move(p).value();
}

// Copies page `from` of kv buffer `src_buffer` of `a` into page `to` of kv
// buffer `dst_buffer` of `b`.
void CopyBufferPage(const KvPool& a, size_t src_buffer, int from, KvPool& b, size_t dst_buffer,
                    int to) {
  KVArgs src = a.Args(), dst = b.Args();
  std::memcpy(
      reinterpret_cast<void*>(dst.kv_data_ptrs[dst_buffer] + to * dst.kv_item_lens[dst_buffer]),
      reinterpret_cast<const void*>(src.kv_data_ptrs[src_buffer] +
                                    from * src.kv_item_lens[src_buffer]),
      src.kv_item_lens[src_buffer]);
}

TEST(KvPoolTest, LayersOfStageSplitsLikeSglang) {
  // Even split.
  EXPECT_EQ(LayersOfStage(32, 2, 0), (LayerRange{0, 16}));
  EXPECT_EQ(LayersOfStage(32, 2, 1), (LayerRange{16, 16}));
  EXPECT_EQ(LayersOfStage(4, 1, 0), (LayerRange{0, 4}));
  // The remainder goes one apiece to the stages just before the last:
  // 10 layers over 4 stages are 2, 3, 3, 2 (get_pp_indices).
  EXPECT_EQ(LayersOfStage(10, 4, 0), (LayerRange{0, 2}));
  EXPECT_EQ(LayersOfStage(10, 4, 1), (LayerRange{2, 3}));
  EXPECT_EQ(LayersOfStage(10, 4, 2), (LayerRange{5, 3}));
  EXPECT_EQ(LayersOfStage(10, 4, 3), (LayerRange{8, 2}));
  EXPECT_EQ(LayersOfStage(3, 2, 0), (LayerRange{0, 2}));
  EXPECT_EQ(LayersOfStage(3, 2, 1), (LayerRange{2, 1}));
  // Every layer is held by exactly one stage.
  for (int layers : {1, 5, 7, 32, 61})
    for (int pp = 1; pp <= 8; ++pp) {
      int next = 0;
      for (int r = 0; r < pp; ++r) {
        LayerRange range = LayersOfStage(layers, pp, r);
        EXPECT_EQ(range.first, next) << layers << " layers, pp " << pp << " rank " << r;
        next += range.count;
      }
      EXPECT_EQ(next, layers) << layers << " layers, pp " << pp;
    }
  EXPECT_EQ(LayersOfStage(1, 2, 1), (LayerRange{1, 0}));  // more stages than layers
  EXPECT_EQ(LayersOfStage(4, 2, 2), (LayerRange{}));
  EXPECT_EQ(LayersOfStage(4, 0, 0), (LayerRange{}));
}

TEST(KvPoolTest, LayerRangeHoldsOnlyItsLayersAndSaysSoInArgs) {
  auto stage = MakeStagePool(2, 2);  // layers [2, 4) of 4
  EXPECT_EQ(stage->first_layer(), 2);
  EXPECT_EQ(stage->num_layers(), 2);
  EXPECT_EQ(stage->num_kv_buffers(), 4u);  // K2 K3 V2 V3
  KVArgs a = stage->Args();
  EXPECT_EQ(a.kv_data_ptrs.size(), 4u);
  EXPECT_EQ(a.prefill_start_layer, 2);
  EXPECT_EQ(a.prefill_end_layer, 4);
  auto mla = MakeStagePool(1, 2, /*mla=*/true);
  EXPECT_EQ(mla->num_kv_buffers(), 2u);
  EXPECT_EQ(mla->Args().prefill_start_layer, 1);
  EXPECT_EQ(mla->Args().prefill_end_layer, 3);
  // Default: every layer.
  auto all = MakePool();
  EXPECT_EQ(all->first_layer(), 0);
  EXPECT_EQ(all->num_layers(), 2);
  EXPECT_EQ(all->Args().prefill_start_layer, 0);
  EXPECT_EQ(all->Args().prefill_end_layer, 2);
  // num_layers -1: up to the last layer.
  auto tail = MakeStagePool(3, -1);
  EXPECT_EQ(tail->num_layers(), 1);
  EXPECT_EQ(tail->Args().prefill_end_layer, 4);
}

TEST(KvPoolTest, LayerRangeOutsideTheModelIsRefused) {
  PoolOptions o;
  o.shape.layers = 4;
  for (auto [first, count] : {std::pair{-1, 2}, {0, 0}, {3, 2}, {4, -1}, {0, 5}}) {
    o.first_layer = first;
    o.num_layers = count;
    auto p = KvPool::Create(o);
    EXPECT_EQ(p.status().code(), StatusCode::kInvalidArgument) << first << " " << count;
  }
}

TEST(KvPoolTest, StagePagesVerifyOnlyInTheirOwnLayers) {
  // Stage 1 of 2 holds layers [2, 4): K2 K3 V2 V3. A decode pool of every
  // layer holds K0..K3 then V0..V3.
  auto stage = MakeStagePool(2, 2), all = MakeStagePool(0, 4);
  std::vector<int32_t> src{3, 9}, dst{20, 6};
  stage->Fill(77, src, 0, {});
  // Stage 0's pages hold other bytes than stage 1's for the same room and
  // position: the pattern is keyed by the model layer, not the pool index.
  auto stage0 = MakeStagePool(0, 2);
  stage0->Fill(77, src, 0, {});
  for (size_t b = 0; b < 4; ++b)
    EXPECT_NE(std::memcmp(reinterpret_cast<const void*>(stage->Args().kv_data_ptrs[b] +
                                                        3 * stage->page_bytes()),
                          reinterpret_cast<const void*>(stage0->Args().kv_data_ptrs[b] +
                                                        3 * stage0->page_bytes()),
                          stage->page_bytes()),
              0)
        << "buffer " << b;
  // Into the matching layers (stage buffer i -> K or V of layer 2 + i % 2).
  const size_t into[4] = {2, 3, 6, 7};
  for (size_t b = 0; b < 4; ++b)
    for (size_t i = 0; i < src.size(); ++i)
      CopyBufferPage(*stage, b, src[i], *all, into[b], dst[i]);
  // Layers 0 and 1 (4 buffers) were never written; layers 2 and 3 verify.
  EXPECT_EQ(all->CountCorruptPages(77, dst), 4u * 2);
  // And back into another pool of stage 1: the same bytes verify there.
  auto roundtrip = MakeStagePool(2, 2);
  for (size_t b = 0; b < 4; ++b)
    for (size_t i = 0; i < dst.size(); ++i)
      CopyBufferPage(*all, into[b], dst[i], *roundtrip, b, src[i]);
  EXPECT_EQ(roundtrip->CountCorruptPages(77, src), 0u);
  // The same bytes one layer off (K2 into K1, V3 into V2...) do not verify.
  auto wrong = MakeStagePool(0, 4);
  const size_t shifted[4] = {1, 2, 5, 6};
  for (size_t b = 0; b < 4; ++b)
    for (size_t i = 0; i < src.size(); ++i)
      CopyBufferPage(*stage, b, src[i], *wrong, shifted[b], dst[i]);
  EXPECT_EQ(wrong->CountCorruptPages(77, dst), 8u * 2);
  // K and V of the same layer are not interchangeable either.
  auto swapped = MakeStagePool(0, 4);
  const size_t kv_swapped[4] = {6, 7, 2, 3};
  for (size_t b = 0; b < 4; ++b)
    for (size_t i = 0; i < src.size(); ++i)
      CopyBufferPage(*stage, b, src[i], *swapped, kv_swapped[b], dst[i]);
  EXPECT_EQ(swapped->CountCorruptPages(77, dst), 8u * 2);
}

TEST(KvPoolTest, MlaStagePagesVerifyOnlyInTheirOwnLayers) {
  auto stage = MakeStagePool(1, 2, /*mla=*/true), all = MakeStagePool(0, 4, /*mla=*/true);
  std::vector<int32_t> src{5}, dst{11};
  stage->Fill(8, src, 0, {});
  CopyBufferPage(*stage, 0, 5, *all, 1, 11);      // layer 1
  CopyBufferPage(*stage, 1, 5, *all, 3, 11);      // layer 2 put under layer 3
  EXPECT_EQ(all->CountCorruptPages(8, dst), 3u);  // layers 0, 2, 3
  CopyBufferPage(*stage, 1, 5, *all, 2, 11);
  EXPECT_EQ(all->CountCorruptPages(8, dst), 2u);  // layers 0 and 3 never written
}

TEST(KvPoolTest, PoolOfEveryLayerKeepsItsPattern) {
  // The first word of a page is the page's seed, which for a pool of every
  // layer is keyed by the pool's buffer index exactly as before layer ranges
  // existed (these values come from that pattern): data written or checked
  // by tools of either version agrees.
  auto pool = MakePool();
  std::vector<int32_t> pages{1, 4};
  pool->Fill(3, pages, 0, {});
  const uint64_t expected[4][2] = {{0x546f36061b6b1313ull, 0x51a403998c90b689ull},
                                   {0x5564fa0600422600ull, 0x28ad05200e0526c1ull},
                                   {0x0d0e41eb2a0950feull, 0xd62a7f6e291fef64ull},
                                   {0x0978444f4b1a8a30ull, 0xa31e84160062faaaull}};
  for (size_t b = 0; b < pool->num_kv_buffers(); ++b)
    for (size_t i = 0; i < pages.size(); ++i) {
      uint64_t word;
      std::memcpy(&word,
                  reinterpret_cast<const void*>(pool->Args().kv_data_ptrs[b] +
                                                pages[i] * pool->page_bytes()),
                  8);
      EXPECT_EQ(word, expected[b][i]) << "buffer " << b << " position " << i;
    }
}

}  // namespace
}  // namespace kvbridge::internal

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

}  // namespace
}  // namespace kvbridge::internal

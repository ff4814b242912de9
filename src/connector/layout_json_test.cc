// The layout as the registry carries it: state sharding round-trips, a
// layout published without it still reads, and a malformed one is refused
// by name (it comes from the network).
#include "connector/layout_json.h"

#include <gtest/gtest.h>

namespace kvbridge::internal {
namespace {

RankLayout Sharded() {
  RankLayout l;
  l.page_size = 16;
  l.dtype = "bfloat16";
  l.tp_size = 2;
  l.kv = {{0x1000, 4096, 256}, {0x2000, 4096, 256}};
  l.state = {{0x9000, 4096, 64}, {0xa000, 4096, 32}};
  l.state_sharding = {{16, 1, {8, 8, 16}}, {0, 1, {}}};
  return l;
}

TEST(LayoutJsonTest, StateShardingRoundTrips) {
  const RankLayout l = Sharded();
  auto back = LayoutFromJson(LayoutToJson(l));
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(back->state_sharding, l.state_sharding);
  EXPECT_EQ(back->state.size(), 2u);
}

TEST(LayoutJsonTest, ALayoutWithoutShardingReadsAsUnsharded) {
  nlohmann::json j = LayoutToJson(Sharded());
  j.erase("state_sharding");
  auto back = LayoutFromJson(j);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_TRUE(back->state_sharding.empty());
}

TEST(LayoutJsonTest, MalformedShardingIsRefusedByName) {
  for (const char* bad : {R"("x")", R"([[1, 1]])", R"([[-1, 1, []]])", R"([[1, 1, [2, -2]]])",
                          R"([[4294967296, 1, []]])", R"([[1, 1, 3]])"}) {
    nlohmann::json j = LayoutToJson(Sharded());
    j["state_sharding"] = nlohmann::json::parse(bad);
    auto back = LayoutFromJson(j);
    ASSERT_FALSE(back.ok()) << bad;
    EXPECT_EQ(back.status().message(), "layout field 'state_sharding' malformed") << bad;
  }
  nlohmann::json j = LayoutToJson(Sharded());
  j["state_sharding"][0][2] = nlohmann::json::array();
  for (int i = 0; i < 65; ++i) j["state_sharding"][0][2].push_back(2);
  EXPECT_FALSE(LayoutFromJson(j).ok()) << "65 sub-blocks";
}

TEST(LayoutJsonTest, StateLayoutFromArgsNamesEveryMisfit) {
  KVArgs a;
  RankLayout l = Sharded();
  l.state_sharding.clear();
  a.state_slice_dims = {16};
  EXPECT_EQ(StateLayoutFromArgs(a, l).message(),
            "KVArgs: state_slice_dims has 1 entries, state_data_ptrs 2");
  a.state_slice_dims = {};
  a.state_slice_outer = {1, 1};
  EXPECT_EQ(StateLayoutFromArgs(a, l).message(),
            "KVArgs: state_slice_outer or state_slice_groups without state_slice_dims");
  a.state_slice_dims = {16, 0};
  a.state_slice_groups = {{8, 8, 16}, {}};
  ASSERT_TRUE(StateLayoutFromArgs(a, l).ok());
  EXPECT_EQ(l.state_sharding, Sharded().state_sharding);
}

// kv layer ids: they round-trip, a layout without them reads as none, and
// anything but one id in [0, INT32_MAX] per kv buffer is refused.
TEST(LayoutJsonTest, LayerIdsRoundTripAndMalformedOnesAreRefusedByName) {
  RankLayout l = Sharded();
  l.kv_layer_ids = {3, 1'000'000};
  auto back = LayoutFromJson(LayoutToJson(l));
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(back->kv_layer_ids, l.kv_layer_ids);
  nlohmann::json j = LayoutToJson(l);
  j.erase("kv_layer_ids");
  back = LayoutFromJson(j);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_TRUE(back->kv_layer_ids.empty());
  for (const char* bad :
       {R"("x")", R"([3])", R"([3, -1])", R"([3, 2147483648])", R"([3, 18446744073709551615])",
        R"([3, 1.5])", R"([3, 4, 5])", R"({"0": 3})"}) {
    j = LayoutToJson(l);
    j["kv_layer_ids"] = nlohmann::json::parse(bad);
    back = LayoutFromJson(j);
    ASSERT_FALSE(back.ok()) << bad;
    EXPECT_EQ(back.status().message(), "layout field 'kv_layer_ids' malformed") << bad;
  }
}

// Prefill's cp size and transfer mode: they round-trip, default to cp 1
// and cp rank 0 sending when absent, and anything else is refused by name.
TEST(LayoutJsonTest, CpSizeAndModeRoundTripAndMalformedOnesAreRefusedByName) {
  RankLayout l = Sharded();
  l.cp_size = 4;
  l.all_cp_ranks = true;
  auto back = LayoutFromJson(LayoutToJson(l));
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(back->cp_size, 4);
  EXPECT_TRUE(back->all_cp_ranks);
  nlohmann::json j = LayoutToJson(l);
  j.erase("cp_size");
  j.erase("all_cp_ranks");
  back = LayoutFromJson(j);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(back->cp_size, 1);
  EXPECT_FALSE(back->all_cp_ranks);
  for (const char* bad : {R"("x")", "0", "-1", "1025", "18446744073709551615", "1.5", "[2]"}) {
    j = LayoutToJson(l);
    j["cp_size"] = nlohmann::json::parse(bad);
    back = LayoutFromJson(j);
    ASSERT_FALSE(back.ok()) << bad;
    EXPECT_EQ(back.status().message(), "layout field 'cp_size' malformed") << bad;
  }
  for (const char* bad : {"1", R"("true")", "null", "{}"}) {
    j = LayoutToJson(l);
    j["all_cp_ranks"] = nlohmann::json::parse(bad);
    back = LayoutFromJson(j);
    ASSERT_FALSE(back.ok()) << bad;
    EXPECT_EQ(back.status().message(), "layout field 'all_cp_ranks' malformed") << bad;
  }
}

TEST(LayoutJsonTest, DraftEntryCountRoundTripsAndMalformedOnesAreRefusedByName) {
  RankLayout l = Sharded();
  ASSERT_GE(l.kv.size(), 1u);
  l.num_draft_entries = 1;
  auto back = LayoutFromJson(LayoutToJson(l));
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(back->num_draft_entries, 1);
  nlohmann::json j = LayoutToJson(l);
  j.erase("num_draft_entries");  // a layout from before draft entries: none
  back = LayoutFromJson(j);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(back->num_draft_entries, 0);
  const std::string past = std::to_string(l.kv.size() + 1);
  for (const std::string bad :
       {std::string(R"("1")"), std::string("-1"), past, std::string("1.5"), std::string("null")}) {
    j = LayoutToJson(l);
    j["num_draft_entries"] = nlohmann::json::parse(bad);
    back = LayoutFromJson(j);
    ASSERT_FALSE(back.ok()) << bad;
    EXPECT_EQ(back.status().message(), "layout field 'num_draft_entries' malformed") << bad;
  }
}

// sglang's compression ratios (DeepSeek V4), which a prefill rank publishes
// for decode's sglang adapter: they round-trip, a layout without them
// reads as none, and a malformed list from the wire is refused by name.
TEST(LayoutJsonTest, CompressionRatiosRoundTripAndMalformedOnesAreRefusedByName) {
  RankLayout l = Sharded();
  l.mla_compression_ratios = {4, 128, 0, 4};
  auto back = LayoutFromJson(LayoutToJson(l));
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(back->mla_compression_ratios, (std::vector<int32_t>{4, 128, 0, 4}));
  nlohmann::json j = LayoutToJson(l);
  j.erase("mla_compression_ratios");  // a layout from before: none
  back = LayoutFromJson(j);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_TRUE(back->mla_compression_ratios.empty());
  for (const std::string bad : {std::string("[-1]"), std::string(R"(["4"])"), std::string("[1.5]"),
                                std::string("4"), std::string("[4294967296]")}) {
    j = LayoutToJson(l);
    j["mla_compression_ratios"] = nlohmann::json::parse(bad);
    back = LayoutFromJson(j);
    ASSERT_FALSE(back.ok()) << bad;
    EXPECT_EQ(back.status().message(), "layout field 'mla_compression_ratios' malformed") << bad;
  }
  j = LayoutToJson(l);
  j["mla_compression_ratios"] = std::vector<int>(4097, 4);  // more than kMaxBuffers layers
  EXPECT_FALSE(LayoutFromJson(j).ok());
}

// A rank's own ratios: copied into its layout; a negative one refused by name.
TEST(LayoutJsonTest, CompressionRatiosFromKVArgsAreCheckedAndPublished) {
  ManagerOptions o;
  o.is_mla = true;
  o.args.page_size = 16;
  o.args.kv_data_ptrs = {0x1000};
  o.args.kv_data_lens = {4096};
  o.args.kv_item_lens = {256};
  o.args.kv_head_num = o.args.total_kv_head_num = 1;
  o.args.mla_compression_ratios = {4, 0};
  auto l = LayoutFromOptions(o);
  ASSERT_TRUE(l.ok()) << l.status().ToString();
  EXPECT_EQ(l->mla_compression_ratios, (std::vector<int32_t>{4, 0}));
  o.args.mla_compression_ratios = {4, -1};
  l = LayoutFromOptions(o);
  ASSERT_FALSE(l.ok());
  EXPECT_NE(l.status().message().find("mla_compression_ratios"), std::string::npos)
      << l.status().ToString();
}

// State types and layer ids: they round-trip (-1: a buffer without), a
// layout without them reads as none, anything but one per state buffer in
// range is refused; KVArgs' list must be one per state buffer.
TEST(LayoutJsonTest, StateTypesAndLayerIdsRoundTripAndMalformedOnesAreRefusedByName) {
  RankLayout l = Sharded();
  ASSERT_EQ(l.state.size(), 2u);
  l.state_types = {0, 1};
  l.state_layer_ids = {-1, 9};
  auto back = LayoutFromJson(LayoutToJson(l));
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(back->state_types, l.state_types);
  EXPECT_EQ(back->state_layer_ids, l.state_layer_ids);
  nlohmann::json j = LayoutToJson(l);
  j.erase("state_types");
  j.erase("state_layer_ids");
  back = LayoutFromJson(j);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_TRUE(back->state_types.empty() && back->state_layer_ids.empty());
  for (auto [field, bad] : {std::pair{"state_types", R"([0, -1])"},
                            {"state_types", R"([0])"},
                            {"state_layer_ids", R"([-2, 3])"},
                            {"state_layer_ids", R"([1, 2, 3])"},
                            {"state_layer_ids", R"([1, 2147483648])"},
                            {"state_layer_ids", R"("x")"}}) {
    j = LayoutToJson(l);
    j[field] = nlohmann::json::parse(bad);
    back = LayoutFromJson(j);
    ASSERT_FALSE(back.ok()) << field << " " << bad;
    EXPECT_EQ(back.status().message(), std::string("layout field '") + field + "' malformed");
  }
  l.state_type_names = {"MAMBA", "SWA"};
  back = LayoutFromJson(LayoutToJson(l));
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(back->state_type_names, l.state_type_names);
  for (const char* bad : {R"(["A", "B", "C"])", R"(["A", 1])", R"("MAMBA")", R"({"a": 1})"}) {
    j = LayoutToJson(l);
    j["state_type_names"] = nlohmann::json::parse(bad);
    back = LayoutFromJson(j);
    ASSERT_FALSE(back.ok()) << bad;
    EXPECT_EQ(back.status().message(), "layout field 'state_type_names' malformed");
  }
  j = LayoutToJson(l);
  j["state_type_names"] = {"MAMBA", std::string(65, 'S')};
  EXPECT_FALSE(LayoutFromJson(j).ok());
  l.state_type_names.clear();
  KVArgs a;
  a.state_layer_ids = {4};
  EXPECT_EQ(StateLayoutFromArgs(a, l).message(),
            "KVArgs: state_layer_ids has 1 entries, state_data_ptrs 2");
}

}  // namespace
}  // namespace kvbridge::internal

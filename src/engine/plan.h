// Transfer planning: which bytes of which prefill buffer go where in decode.
//
// Pure functions, no I/O. The engine turns CopyRuns into transport WriteOps.
//
// Memory model (sglang's): every KV buffer holds pages of `item_len` bytes;
// page p of a buffer starts at p * item_len. Inside a page, tokens are major,
// then heads, then head dim: token t, head h starts at
//   (t * kv_heads + h) * head_bytes,   head_bytes = item_len / (page_size * kv_heads).
// MHA: kv buffers are K of layers [start_layer, end_layer) then V of the same
// layers (2 * num_layers buffers). MLA: one buffer per layer, heads are not
// split (kv_heads is 1 and every tp rank holds the same data).
// Aux buffers: one row of item_len per aux index. State buffers: one slot of
// item_len per state index.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "kvbridge/status.h"

namespace kvbridge::internal {

struct BufferSpan {
  uint64_t addr = 0;
  uint64_t length = 0;
  uint64_t item_len = 0;
};

// How one state buffer's slots split across the ranks of a tp group
// (sglang's state_dim_per_tensor and state_conv_shard_groups: mamba conv
// and temporal state are sharded by tp along one axis). A slot holds `outer`
// blocks; each block is this rank's `dim` elements of the sliced axis, all
// elements the same size (item_len / (outer * dim) bytes, the axes after the
// sliced one included). The full axis concatenates sub-blocks of `groups`
// elements each (GDN's conv [q | k | v]), and every sub-block is split
// across the ranks on its own: rank r of tp T holds elements
// [r * g / T, (r + 1) * g / T) of each, in sub-block order. No groups: one
// sub-block of dim * T elements. dim 0: the buffer is not sliced (every
// rank holds the whole slot).
inline constexpr uint32_t kMaxStateGroups = 64;
// The longest state type name (RankLayout::state_type_names).
inline constexpr uint32_t kMaxStateTypeName = 64;
struct StateSharding {
  uint32_t dim = 0;
  uint32_t outer = 1;
  std::vector<uint32_t> groups;

  friend bool operator==(const StateSharding&, const StateSharding&) = default;
};

// One rank's KV memory and shape, as exchanged in the handshake.
struct RankLayout {
  bool is_mla = false;
  int page_size = 1;
  std::string dtype;
  int tp_size = 1;
  int tp_rank = 0;
  int total_kv_heads = 1;  // of the model
  int kv_heads = 1;        // held by this rank (MLA: 1)
  int start_layer = 0;     // layers [start_layer, end_layer) are in `kv`
  int end_layer = 0;
  std::vector<BufferSpan> kv;
  // The model layer of each kv buffer (KVArgs::kv_layer_ids), or empty;
  // exchanged in the handshake. See PairKvBuffers.
  std::vector<int32_t> kv_layer_ids;
  // KVArgs::mla_compression_ratios: in the registry layout only (not in the
  // Hello); never read by the plan.
  std::vector<int32_t> mla_compression_ratios;
  std::vector<BufferSpan> aux;
  std::vector<BufferSpan> state;
  // The state type of each state buffer (sglang's state_types, e.g. mamba
  // and SWA, each with its own buffers: type t is sglang's t-th state
  // component); empty: one type. Exchanged in the handshake.
  std::vector<int32_t> state_types;
  // The name of each state type (sglang's StateType of each component, e.g.
  // "MAMBA", "SWA"), one per type, or empty: none. Exchanged in the
  // handshake. See PairStateBuffers.
  std::vector<std::string> state_type_names;
  // The model layer of each state buffer (sglang's state_layer_ids, one
  // list per state component), -1 for a buffer of a type that has none;
  // empty: none. A type's buffers have ids all or none. Exchanged in the
  // handshake. See PairStateBuffers.
  std::vector<int32_t> state_layer_ids;
  // Per state buffer (or empty: none is sliced); exchanged in the handshake.
  std::vector<StateSharding> state_sharding;
  // Decode context parallelism (ParallelLayout::dcp_size/dcp_rank): MLA
  // only; a prefill layout has 1. Exchanged in the handshake.
  int dcp_size = 1;
  int dcp_rank = 0;
  // Prefill context parallelism (ParallelLayout::cp_size, all_cp_ranks):
  // whether every cp rank sends its share must be set alike on both sides
  // when prefill's cp size is above 1 (CheckCompatible). Exchanged in the
  // handshake and the registry.
  int cp_size = 1;
  bool all_cp_ranks = false;
  // The last num_draft_entries kv buffers are a draft model's
  // (KVArgs::num_draft_entries). Exchanged in the handshake.
  int num_draft_entries = 0;
  // The rank's pipeline size (ParallelLayout::pp_size): which prefill stage
  // writes a decode rank's aux row and unpaired state (LastStageRead).
  // Exchanged in the handshake.
  int pp_size = 1;
};

// Whether kv buffer `b` of `l` is a draft model's (the last num_draft_entries).
bool IsDraftKv(const RankLayout& l, size_t b);

// Whether prefill's state buffer `p` moves as slices into decode's buffer
// `d` (its pair): their tp sizes differ and both shard it (dim > 0).
// Otherwise it moves whole.
bool SlicedStateBuffer(const RankLayout& prefill, const RankLayout& decode, size_t p, size_t d);

// Which decode state buffer each prefill state buffer moves into. Types
// pair as sglang's components do: by name and occurrence when both sides
// name them (prefill's k-th type named N takes decode's k-th type named N:
// sglang leaves out a component without buffers, so a pipeline stage may
// hold fewer), else by position (type t with type t, as many on both
// sides). FailedPrecondition naming the component decode lacks. Within a type whose buffers
// have layer ids on both sides, sglang's rule: each prefill buffer takes
// decode's earliest unused buffer of the same type and model layer, so a
// pipeline stage's buffers land in a decode that holds every layer's, and
// every stage sends its own (by_layer_id). Otherwise by position, and the
// type must have as many buffers on both sides. FailedPrecondition naming
// the type, the layer and prefill's buffer when decode lacks one.
struct StatePairs {
  std::vector<uint32_t> dst;      // per prefill state buffer
  std::vector<bool> by_layer_id;  // per prefill state buffer
  std::vector<int32_t> type_dst;  // per prefill state type: decode's type
};
Result<StatePairs> PairStateBuffers(const RankLayout& prefill, const RankLayout& decode);
// Whether any state buffer moves as slices between a prefill group of
// `prefill_tp` ranks and `decode` (decided on decode's layout, which both
// sides know: decode's own, prefill's from the Hello).
bool StateSlicedFor(const RankLayout& decode, int prefill_tp);

// Internal consistency of one layout: sizes positive, kv.size() equals
// num_layers (MLA) or 2 * num_layers (MHA) or, with kv_layer_ids, the number
// of ids (each >= 0), every kv item_len divisible by
// page_size * kv_heads, kv_heads equal to what tp_size/total_kv_heads give
// (HeadsOfRank), buffers at least one item long. FailedPrecondition naming the
// field and value.
Status CheckLayout(const RankLayout& layout);

// Which decode kv buffer each prefill kv buffer is written into (indexed
// like prefill.kv). With kv_layer_ids on both sides, sglang's rule: decode's
// earliest unused buffer of the same id; FailedPrecondition naming the
// layer when decode has none left. Otherwise by layer range: layer l's
// buffer (MHA: K and V) into layer l's; FailedPrecondition when decode does
// not hold every prefill layer or a side's buffer count does not fit its
// range. Buffers decode has beyond the pairs are never written.
Result<std::vector<uint32_t>> PairKvBuffers(const RankLayout& prefill, const RankLayout& decode);

// Whether prefill can write into decode: same is_mla, page_size, dtype,
// total_kv_heads, aux and state counts and item lengths (a sliced state
// buffer: the same full axis, outer blocks, element size and sub-blocks
// instead); every prefill kv buffer paired (PairKvBuffers) with a decode
// buffer of the same bytes per head per token.
// FailedPrecondition naming both values, e.g.
// "page size mismatch: prefill 16, decode 32".
Status CheckCompatible(const RankLayout& prefill, const RankLayout& decode);
// CheckCompatible, and when compatible the pairs it checked (PairKvBuffers).
Result<std::vector<uint32_t>> CompatiblePairs(const RankLayout& prefill, const RankLayout& decode);

// The heads [first, first + count) of the model that tp rank `rank` of
// `tp_size` holds. When tp_size > total_heads, heads are replicated: rank r
// holds the single head r * total_heads / tp_size. Otherwise rank r holds
// [r * total / tp, (r + 1) * total / tp): sglang's equal split when tp
// divides total, a balanced split when not. {0, 0} for out-of-range input.
struct HeadRange {
  int first = 0;
  int count = 0;

  friend bool operator==(const HeadRange&, const HeadRange&) = default;
};
HeadRange HeadsOfRank(int total_heads, int tp_size, int rank);

// One (prefill rank -> decode rank) flow: `num_heads` heads starting at
// `src_head` within the prefill rank's heads land at `dst_head` within the
// decode rank's heads. MLA flows always carry the whole page (num_heads 1).
struct HeadSlice {
  int prefill_rank = 0;
  int decode_rank = 0;
  int src_head = 0;
  int dst_head = 0;
  int num_heads = 0;

  friend bool operator==(const HeadSlice&, const HeadSlice&) = default;
};

// Every flow between a prefill instance of `prefill_tp` ranks and a decode
// instance of `decode_tp` ranks. Each head a decode rank holds comes from
// exactly one prefill rank (with replication, decode rank d picks among the
// candidates by d % candidates; MLA: decode rank d reads prefill rank
// d % prefill_tp). Adjacent heads from the same prefill rank form one slice.
// With `state_sliced` (StateSlicedFor), every pair of ranks whose shares of
// a sliced axis overlap ([p / prefill_tp, (p + 1) / prefill_tp) against
// [d / decode_tp, (d + 1) / decode_tp)) has a flow too: a pair with no head
// in common gets one of num_heads 0, which carries state slices only.
// InvalidArgument for sizes < 1 or total_heads < 1.
Result<std::vector<HeadSlice>> ComputeFlows(int prefill_tp, int decode_tp, int total_heads,
                                            bool is_mla, bool state_sliced = false);
// The flows into decode rank `decode_rank` / out of prefill rank
// `prefill_rank` (a prefill rank with none is a "dummy": it sends nothing and
// still concludes with Success).
std::vector<HeadSlice> FlowsToDecode(std::span<const HeadSlice> flows, int decode_rank);
std::vector<HeadSlice> FlowsFromPrefill(std::span<const HeadSlice> flows, int prefill_rank);

// The prefill pp stages that decode pp rank `decode_pp_rank` of `decode_pp`
// reads from (sglang's rule): every stage when decode_pp is 1 (decode holds
// every layer), only stage `decode_pp_rank` when decode_pp equals prefill_pp
// (stage to stage; the layer ranges are then checked like any layout).
// FailedPrecondition naming both sizes for any other pair, e.g.
// "pp size mismatch: prefill 2, decode 3 (...)"; InvalidArgument for a size
// < 1 or a rank out of range.
Result<std::vector<int>> PrefillStagesOfDecode(int prefill_pp, int decode_pp, int decode_pp_rank);

// Whether prefill stage `pp_rank` of `pp_size` is the last stage a decode
// rank of pipeline size `decode_pp` reads: that stage writes its aux row (the
// request's metadata row) and the state not paired by layer id. A decode of
// pp 1 reads every stage, the last one last; a decode stage (decode pp =
// prefill pp) reads only its own stage, which holds all the state that
// decode stage has, and sglang's decode waits for its row on every stage
// (docs/sglang.md, metadata gate). Decided by the pipeline shapes
// (PrefillStagesOfDecode), never by layer numbers, which sglang's two sides
// count differently.
bool LastStageRead(int pp_rank, int pp_size, int decode_pp);

enum class BufferClass : uint8_t { kKv = 0, kAux = 1, kState = 2 };

// One contiguous copy: `length` bytes at src buffer `src_buffer` + src_offset
// to dst buffer `dst_buffer` + dst_offset (indices into the layouts' lists of
// that class; offsets from the buffer base).
struct CopyRun {
  BufferClass cls = BufferClass::kKv;
  uint32_t src_buffer = 0;
  uint64_t src_offset = 0;
  uint32_t dst_buffer = 0;
  uint64_t dst_offset = 0;
  uint64_t length = 0;

  friend bool operator==(const CopyRun&, const CopyRun&) = default;
};

// The copies that move `src_pages[i]` of prefill into `dst_pages[i]` of decode
// for every layer both hold, restricted to `slice`. Runs of consecutive pages
// on both sides coalesce into one run per buffer when the slice covers whole
// pages on both sides; otherwise each (page, token) gives one run of
// num_heads * head_bytes (consecutive tokens still coalesce when contiguous on
// both sides). Errors: InvalidArgument when the lists differ in length or an
// index is negative or past the buffer (naming the index and the bound), or
// when `slice` is not for these two ranks (tp_rank), its heads are out of
// range, or it would put a model head under another model head;
// FailedPrecondition when the layouts are incompatible. Duplicate pages are
// not rejected here: the caller checks them once per request with
// CheckPageIndices(..., unique=true).
Result<std::vector<CopyRun>> PlanKvPages(const RankLayout& prefill, const RankLayout& decode,
                                         const HeadSlice& slice, std::span<const int32_t> src_pages,
                                         std::span<const int32_t> dst_pages);

// Decode context parallelism (decode.dcp_size > 1, MLA): `src_pages` are
// prefill's pages [first_page, first_page + n) of the request, counted
// after decode's prefix; `dst_pages` are all of decode's pages of the
// request (the same list on every rank of the dcp group, one per
// page_size * dcp_size tokens). Token p of the request (p from the first
// page after the prefix) belongs to dcp rank p % dcp_size and lands in row
// p / dcp_size, in page dst_pages[row / page_size] at row % page_size. One
// run per token this rank owns, per paired kv buffer (a token's rows are
// never contiguous on prefill). The draft entries (num_draft_entries) go to
// every rank whole: page q (from the first page after the prefix) into the
// (q % dcp_size)-th part of decode's page dst_pages[q / dcp_size], one run
// per page per buffer. InvalidArgument when decode has too few pages for a
// token or a draft page, or an index is out of range.
Result<std::vector<CopyRun>> PlanKvDcpTokens(const RankLayout& prefill, const RankLayout& decode,
                                             std::span<const int32_t> src_pages,
                                             std::span<const int32_t> dst_pages,
                                             int64_t first_page);
// sglang's share of prefill cp rank `cp_rank` of `cp_size` when every cp
// rank transfers: of `pages` pages (after decode's prefix), positions
// [first, first + count), base = pages / cp_size each and one more for the
// first pages % cp_size ranks, in rank order.
struct PageShare {
  int64_t first = 0;
  int64_t count = 0;

  friend bool operator==(const PageShare&, const PageShare&) = default;
};
PageShare CpPageShare(int64_t pages, int cp_size, int cp_rank);
// How many prefill cp ranks (0 .. n-1) send to each decode rank: every one
// of `prefill_cp_size` when each sends its share, else cp rank 0 alone (the
// others are sglang's dummy cp ranks). The one reading of the cp mode that
// decode's sources and witnesses share.
int SendingCpRanks(int prefill_cp_size, bool all_cp_ranks);

// How many destination pages decode gives for `src_pages` pages of prefill:
// one per page, or under decode context parallelism one per dcp_size.
int64_t DestinationPageCount(const RankLayout& decode, int64_t src_pages);

// Aux: row `src_index` of every aux buffer to row `dst_index`. InvalidArgument
// for an index outside either side's rows; no runs (and no index check) when
// the model has no aux buffers.
Result<std::vector<CopyRun>> PlanAux(const RankLayout& prefill, const RankLayout& decode,
                                     int64_t src_index, int64_t dst_index);

// Separates the sections of state indices of several state types.
inline constexpr int32_t kStateSectionEnd = -1;

// State indices as sections: without a kStateSectionEnd, one section that
// addresses every state buffer (one state type, or types that share rows);
// with them, exactly one section per state type (types.size() > 0, type t =
// section t) addressing only the buffers of its type. InvalidArgument for
// any other count.
Result<std::vector<std::span<const int32_t>>> StateSections(const std::vector<int32_t>& types,
                                                            std::span<const int32_t> slots);

// Every index of every section within the rows of the buffers it addresses.
// InvalidArgument naming `what`, the value, its position and its state type.
Status CheckStateSlots(const char* what, const std::vector<BufferSpan>& bufs,
                       const std::vector<int32_t>& types, std::span<const int32_t> slots);

// Which state a flow carries: the buffers that move whole (one flow per
// decode rank), and this pair's slices of the sliced ones (every flow). A
// prefill rank that is not on the last pipeline stage sends only the
// buffers paired by layer id (its own layers'); the last stage the decode
// rank reads (LastStageRead) sends the others too.
struct StateShare {
  bool whole = true;
  bool slices = true;
  bool last_stage = true;
};

// State: slot src_slots[i] of every state buffer (of its section's type) to
// dst_slots[i] of its pair (PairStateBuffers), consecutive slots coalesced. A sliced buffer
// (SlicedStateBuffer) moves only the elements both ranks hold, of each outer
// block and sub-block, placed where the decode rank keeps them.
// InvalidArgument for lists or sections of different lengths or a slot
// outside either side's slots; no runs when the model has no state buffers.
Result<std::vector<CopyRun>> PlanState(const RankLayout& prefill, const RankLayout& decode,
                                       std::span<const int32_t> src_slots,
                                       std::span<const int32_t> dst_slots, StateShare share = {});

// Validates page indices against a layout's kv buffers: each in
// [0, min over kv buffers of length / item_len), and (when `unique`) no
// duplicates. InvalidArgument naming the first bad value and its position.
Status CheckPageIndices(const RankLayout& layout, std::span<const int32_t> pages, bool unique);

}  // namespace kvbridge::internal

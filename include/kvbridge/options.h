// Options of a KVManager: the memory it moves (sglang's KVArgs), where the
// rank sits in its instance, and the knobs of bootstrap, liveness and
// deadlines. Plain structs with defaulted fields; validated by
// KVManager::Create (InvalidArgument naming the field).
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "kvbridge/export.h"
#include "kvbridge/memory.h"

namespace kvbridge {

enum class Role {
  kPrefill,
  kDecode,
  kBootstrap,  // the bootstrap registry (only as a failure origin)
};
KVB_EXPORT std::string_view RoleName(Role role);  // "prefill" / "decode" / "bootstrap"

// sglang's KVArgs. Pointers are integers because that is how frameworks pass
// them (tensor.data_ptr()). Each buffer is `len` bytes of `item_len`-byte
// slots: KV pages, aux rows, state slots.
struct KVArgs {
  int engine_rank = 0;
  // MHA: K buffers of layers [start, end) then V buffers of the same layers.
  // MLA: one buffer per layer.
  std::vector<uint64_t> kv_data_ptrs;
  std::vector<uint64_t> kv_data_lens;
  std::vector<uint64_t> kv_item_lens;
  // sglang's kv_layer_ids: the model layer of each kv buffer, in the order
  // of kv_data_ptrs (MHA: the K ids, then the same ids for V; draft layers
  // have ids of their own), or empty. When prefill and decode both give
  // them, each prefill buffer is written into decode's earliest unused
  // buffer of the same id, and a decode without one fails every room with
  // the layer named; buffers decode has beyond that (a draft model, other
  // stages) are not written. Otherwise buffers pair by layer range.
  std::vector<int32_t> kv_layer_ids;
  // sglang's mla_compression_ratios (DeepSeek V4): each model layer's
  // compression, or empty. The core does not use it: a prefill rank
  // publishes it in its registry layout, where a decode sglang adapter,
  // whose KVArgs lack it, reads it to number its buffers as the prefill
  // stages number theirs (python/kvbridge/_sglang_mla.py). Each >= 0, at
  // most 4096 entries.
  std::vector<int32_t> mla_compression_ratios;
  std::vector<uint64_t> aux_data_ptrs;
  std::vector<uint64_t> aux_data_lens;
  std::vector<uint64_t> aux_item_lens;
  std::vector<uint64_t> state_data_ptrs;
  std::vector<uint64_t> state_data_lens;
  std::vector<uint64_t> state_item_lens;
  // The state type of each state buffer (0, 1, ...; sglang's state_types,
  // whose buffers come as one list per type); empty: one type. With several
  // types, state indices hold one section per type separated by -1, each
  // addressing only its type's buffers.
  std::vector<int32_t> state_buffer_types;
  // sglang's state_layer_ids: the model layer of each state buffer, -1 for
  // the buffers of a type that has none (a type's buffers: all or none), or
  // empty. Types pair as state_type_names says; within a type that has ids on both
  // sides, each prefill buffer is written into decode's earliest unused
  // buffer of that type and id, so every pipeline stage sends its own
  // layers' state and a decode without the layer fails every room naming
  // it. Otherwise a type's buffers pair by position, from the last stage.
  std::vector<int32_t> state_layer_ids;
  // sglang's StateType of each state type (its state_types: one per
  // component, e.g. "MAMBA", "SWA"), each 1-64 printable characters, or
  // empty. When both sides give them, prefill's k-th type named N pairs
  // with decode's k-th type named N (sglang leaves out a component without
  // buffers, so one side may hold fewer); otherwise types pair by position.
  std::vector<std::string> state_type_names;
  // How each state buffer's slots are sharded across tp ranks, so that
  // prefill and decode of different tp sizes exchange the right slices
  // (sglang's state_dim_per_tensor and state_conv_shard_groups). Empty, or
  // one entry per state buffer:
  //  - state_slice_dims: this rank's elements of the sliced axis (0: the
  //    buffer is not sharded; every rank holds whole slots);
  //  - state_slice_outer: blocks of that axis per slot (empty: 1 each);
  //  - state_slice_groups: the full sizes of the sub-blocks the axis
  //    concatenates, each sharded on its own, e.g. GDN's conv [q | k | v]
  //    (empty, or an empty entry: one sub-block).
  // A slot is `outer` blocks of `dim` equal elements, each element
  // item_len / (outer * dim) bytes.
  std::vector<uint32_t> state_slice_dims;
  std::vector<uint32_t> state_slice_outer;
  std::vector<std::vector<uint32_t>> state_slice_groups;
  int page_size = 1;            // tokens per page
  int kv_head_num = 1;          // kv heads held by this rank (MLA: 1)
  int total_kv_head_num = 1;    // kv heads of the model
  int prefill_start_layer = 0;  // first layer in kv buffers
  int prefill_end_layer = -1;   // one past the last; -1 = derived from kv buffers
  // sglang's num_draft_entries: the last N kv buffers are a draft (MTP)
  // model's, after the target model's. Without kv_layer_ids they pair tail
  // to tail. Under decode context parallelism a decode rank holds every
  // draft token, in pages dcp_size times wider than prefill's (page i of
  // the request at 1/dcp_size of page dst[i / dcp_size]), so they move page
  // by page to every rank of the group, not token by token.
  int num_draft_entries = 0;
  MemoryKind memory_kind = MemoryKind::kDram;
  std::string dtype = "bfloat16";  // compared between prefill and decode
};

// Where this rank sits. tp is the attention tp of sglang.
struct ParallelLayout {
  int tp_size = 1;
  int tp_rank = 0;
  int dp_size = 1;
  int dp_rank = 0;
  int pp_size = 1;
  int pp_rank = 0;
  int cp_size = 1;
  int cp_rank = 0;
  // sglang's every-cp-rank transfer (SGLANG_DISAGGREGATION_ALL_CP_RANKS_TRANSFER,
  // or a hybrid MLA backend), with prefill cp_size > 1: each prefill cp rank
  // sends its share of every request's pages (cp rank r of C: the r-th of C
  // nearly equal runs of the pages after decode's prefix; whole state and aux
  // from cp rank 0 only) and a decode rank reads from every cp rank. Both
  // servers set it alike. Off: cp rank 0 sends everything, the others are
  // dummy senders.
  bool all_cp_ranks = false;
  // Decode context parallelism (sglang's KVArgs dcp_size/dcp_rank; decode
  // only, MLA only): the ranks of a dcp group hold the same latent cache,
  // each only the tokens at positions p with p % dcp_size == dcp_rank
  // (counted from the request's first token), at row p / dcp_size of the
  // request's pages.
  int dcp_size = 1;
  int dcp_rank = 0;
};

// Which wire carries bytes to peers on this host.
enum class SameHostPath {
  kAuto,  // shared segment when the pool came from AllocateSharedBuffer, else
          // cross-memory attach, else UCX (the choice is logged)
  kUcx,   // always UCX
};

struct ManagerOptions {
  Role role = Role::kPrefill;
  KVArgs args;
  ParallelLayout parallel;
  bool is_mla = false;
  // Which instance of its role this rank belongs to, when several decode
  // instances (or prefill instances, one bootstrap server each) share a
  // registry: a failure then reaches only the failed rank's own instance's
  // siblings, and the others keep serving. Every rank of an instance passes
  // the same id (sglang: e.g. the server's dist-init address). Empty: one
  // instance per role. Up to 64 of [A-Za-z0-9._:-].
  std::string instance_id;

  // Bootstrap server "host:port". Prefill rank 0 starts an embedded server on
  // that port when `start_bootstrap_server` and none answers there.
  std::string bootstrap_addr = "127.0.0.1:8998";
  // Prefill rank 0's embedded server listens on bootstrap_addr's host.
  bool start_bootstrap_server = true;
  // The cluster registry. "" or "bootstrap": the HTTP bootstrap server at
  // bootstrap_addr (sglang's; the one-machine default).
  // "etcd://HOST:PORT[,HOST:PORT...][/NAMESPACE]": an etcd cluster that every
  // rank talks to (liveness by lease, failure records by watch; no embedded
  // server). etcd authentication from $KVBRIDGE_ETCD_USER and
  // $KVBRIDGE_ETCD_PASSWORD. docs/registry.md.
  std::string registry;
  // The deployment's shared secret, shown on every write to the registry
  // (and required by the embedded server). Empty: $KVBRIDGE_AUTH_TOKEN, else
  // $SGLANG_DISAGGREGATION_BOOTSTRAP_AUTH_TOKEN; KVManager::Create fails
  // (FailedPrecondition, saying how to set one) without any.
  std::string auth_token;
  // Host other ranks use to reach this one (registered with bootstrap).
  std::string advertise_host = "127.0.0.1";
  // Prefill: whether requests reach the dp rank `room % dp_size` (sglang's
  // load_balance_method "follow_bootstrap_room"), registered so that decode
  // knows; when false, a decode rank asks the registry which dp rank took a
  // room (sglang's /query_dp_ranks) and each prefill sender says so
  // (/register_dp_rank).
  bool follow_bootstrap_room = true;
  // Prefill: the server's HTTP API port (sglang's prefill_http_port, 0 =
  // none), registered so that decode can ask it to recompute a retracted
  // request (sglang's submit_prefill_recompute).
  int prefill_http_port = 0;

  // Transport.
  std::string ucx_tls;  // "" = UCX default; "tcp" forces TCP
  SameHostPath same_host_path = SameHostPath::kAuto;
  // Decode: every prefill rank writes under a per-peer grant (a token of
  // its own) that decode revokes when it fails it (docs/protocol.md,
  // "Fencing a partitioned rank"). A same-host prefill rank takes decode's
  // memory under it (shared memory / cross-memory attach): the revoke stops
  // new mappings, and a failed one is fenced by its Quiesced or its exit.
  // True: same-host ranks write over UCX active messages, each admitted
  // (slower; a failed one is fenced without waiting for its exit).
  // Set it the same on prefill and decode: a prefill rank that rejoins
  // waits for its writes to same-host peers only when it is false.
  bool grant_same_host_peers = false;

  // Liveness: a peer silent for heartbeat_interval * heartbeat_misses is
  // unresponsive. Defaults detect a dead or stopped peer within 1 s.
  std::chrono::milliseconds heartbeat_interval{100};
  int heartbeat_misses = 5;

  // Phase deadlines (a request that sits longer in a phase fails, naming it).
  std::chrono::milliseconds bootstrap_timeout{30000};
  std::chrono::milliseconds waiting_timeout{30000};   // for metadata / input
  std::chrono::milliseconds transfer_timeout{10000};  // a posted chunk
  // KVReceiver::PollSettled() reports a failed request Failed once it is
  // quiesced, or this long after it failed (logged: a prefill rank that is
  // hung, not dead, may still write into its pages).
  std::chrono::milliseconds quiesce_timeout{10000};
  // Prefill: requests whose metadata (or decode's notice that it failed
  // them) came before this rank created their sender are held, each for
  // waiting_timeout. At most this many at once: metadata beyond it fails its
  // request at once (invalid_request naming this option), instead of
  // growing this rank's memory without bound.
  size_t max_pending_requests = 65536;
  // Keep the list of rooms whose Poll() answer changed, for
  // KVManager::TakeChangedRooms (one entry per changed room until taken).
  bool list_room_changes = false;

  // Prometheus metrics over HTTP (GET /metrics) on this port: 0 = off, -1 =
  // any free port (KVManager::metrics_port() tells which). docs/metrics.md.
  int metrics_port = 0;
};

}  // namespace kvbridge

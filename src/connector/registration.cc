// This rank's registry record: what it registers, and what its own
// endpoint serves with sglang's server.
#include "connector/layout_json.h"
#include "connector/manager_impl.h"
#include "connector/record_tag.h"

namespace kvbridge::internal {

RankRecord ManagerImpl::MakeRankRecord(uint64_t incarnation) const {
  const ParallelLayout& p = opts_.parallel;
  RankRecord rec;
  rec.role = ToRankRole(opts_.role);
  rec.attn_tp_size = p.tp_size;
  rec.attn_tp_rank = p.tp_rank;
  rec.attn_cp_size = p.cp_size;
  rec.attn_cp_rank = p.cp_rank;
  rec.attn_dp_size = p.dp_size;
  rec.attn_dp_rank = p.dp_rank;
  rec.pp_size = p.pp_size;
  rec.pp_rank = p.pp_rank;
  rec.rank_ip = opts_.advertise_host;
  rec.follow_bootstrap_room = opts_.follow_bootstrap_room;
  rec.prefill_http_port = opts_.prefill_http_port;
  rec.page_size = opts_.args.page_size;
  rec.kv_cache_dtype = opts_.args.dtype;
  rec.host = self_.host;
  rec.boot_id = self_.boot_id;
  rec.pid = self_.pid;
  rec.incarnation = incarnation != 0 ? incarnation : incarnation_.load();
  rec.instance = self_.instance;
  rec.transport_address = transport_->Address();
  rec.layout = LayoutToJson(layout_);
  rec.address_tag = RankAddressTag(*handshake_, rec);
  return rec;
}

}  // namespace kvbridge::internal

#include "connector/record_tag.h"

#include <fmt/format.h>

#include "common/wire.h"
#include "control/auth.h"

namespace kvbridge::internal {

std::string RankAddressTag(const HandshakeAuth& auth, const RankRecord& r) {
  WireWriter w;
  w.Bytes(RankRoleName(r.role));
  for (int v : {r.attn_dp_rank, r.attn_cp_rank, r.attn_tp_rank, r.pp_rank}) w.I64(v);
  w.U64(r.incarnation);
  w.Bytes(r.instance);
  w.Bytes(r.host);
  w.Bytes(r.boot_id);
  w.I64(r.pid);
  w.Bytes(r.transport_address);
  const Digest tag = auth.Tag("kvbridge rank record address v1", w.Finish());
  return std::string(reinterpret_cast<const char*>(tag.data()), tag.size());
}

Status CheckRankAddressTag(const HandshakeAuth& auth, const RankRecord& r,
                           std::string_view source) {
  const std::string expected = RankAddressTag(auth, r);
  if (r.address_tag.size() == expected.size() && ConstantTimeEquals(r.address_tag, expected))
    return Status();
  return UnauthenticatedError(fmt::format(
      "the record of {} looked up at {} {}: not connecting to its address ({})", r.Describe(),
      source,
      r.address_tag.empty() ? "carries no address tag" : "has an address tag that does not check",
      r.address_tag.empty()
          ? "a prefill rank, or a kvbridge bootstrap server, of an older build: upgrade them "
            "together with the ranks; or an answer made without the secret"
          : fmt::format("an answer made without the secret, or a rank of another deployment: "
                        "set {} (or {}) to the same secret on every rank",
                        kAuthTokenEnv, kSglangAuthTokenEnv)));
}

Result<RankRecord> LookUpTaggedRank(const RegistryClient& registry, const HandshakeAuth& auth,
                                    int dp, int cp, int tp, int pp, std::string* unanswered) {
  KVB_ASSIGN_OR_RETURN(RankRecord r, registry.LookUpRank(dp, cp, tp, pp, unanswered));
  KVB_RETURN_IF_ERROR(CheckRankAddressTag(auth, r, registry.address()));
  return r;
}

Status AnsweredWrongly(const Status& lookup) {
  const StatusCode c = lookup.code();
  if (lookup.ok() || c == StatusCode::kUnavailable || c == StatusCode::kNotFound ||
      c == StatusCode::kCancelled)
    return lookup;
  return Status(StatusCode::kDataLoss, lookup.message());
}

}  // namespace kvbridge::internal

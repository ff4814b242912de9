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
      "the record of {} read from {} {}: not connecting to its address (an answer made without "
      "the secret, a rank of another deployment, or of an older kvbridge build); set {} (or {}) "
      "to the same secret on every rank",
      r.Describe(), source,
      r.address_tag.empty() ? "carries no address tag" : "has an address tag that does not check",
      kAuthTokenEnv, kSglangAuthTokenEnv));
}

}  // namespace kvbridge::internal

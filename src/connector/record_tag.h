// A rank's tag over the transport address in its registry record.
//
// Decode connects to the address a registry answer names (LookUpRank), and
// registries are read without the secret: kvbridge's bootstrap server and
// sglang's answer GET requests to anyone, and with sglang's server the
// answer comes from the prefill rank's own endpoint, over plain HTTP. UCX's
// parser of a worker address trusts its input (a malformed one aborts the
// process: docs/security.md), so whoever could answer in a rank's place
// could abort every decode rank that looks it up. The registering rank tags
// what decode connects to, under the deployment's secret, and decode
// checks the tag before it connects.
//
// Thread safety: pure functions.
#pragma once

#include <string>
#include <string_view>

#include "connector/peer_auth.h"
#include "control/registry.h"
#include "control/registry_client.h"
#include "kvbridge/status.h"

namespace kvbridge::internal {

// The tag over `r`'s role, position (dp, cp, tp, pp), incarnation,
// instance, host, boot id, pid and transport address: all decode takes from
// the record about the process it meets (e.g. whether a new incarnation is
// the same process rejoined).
std::string RankAddressTag(const HandshakeAuth& auth, const RankRecord& r);

// Ok when `r.address_tag` is RankAddressTag's; Unauthenticated naming the
// rank, `source` (where the record was read) and the variables that hold
// the secret otherwise (a record with no tag: a rank of an older build).
Status CheckRankAddressTag(const HandshakeAuth& auth, const RankRecord& r, std::string_view source);

// The registry's record of the rank at (dp, cp, tp, pp), only when its tag
// checks: every lookup whose answer this rank acts on goes through here
// (`unanswered` as RegistryClient::LookUpRank).
Result<RankRecord> LookUpTaggedRank(const RegistryClient& registry, const HandshakeAuth& auth,
                                    int dp, int cp, int tp, int pp,
                                    std::string* unanswered = nullptr);

// A lookup's failure other than no answer (Unavailable) or no such rank
// (NotFound): the registry, or the rank endpoint it listed, answered what no
// registry would (an HTTP error status, a malformed answer). DataLoss, so
// that the request fails naming who answered, never as a caller bug of this
// rank (ManagerImpl::FailUnresolved); others as they are.
Status AnsweredWrongly(const Status& lookup);

}  // namespace kvbridge::internal

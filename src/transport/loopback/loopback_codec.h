// The loopback transport's address and remote-key blobs: what one
// in-process "rank" hands another so that it can connect and write. Both are
// CRC-checked; a garbled blob is InvalidArgument, never a crash.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "kvbridge/status.h"
#include "transport/region_token.h"
#include "transport/transport.h"

namespace kvbridge::internal::loopback_detail {

struct Address {
  uint64_t fabric_id = 0;
  std::string name;
  uint64_t incarnation = 0;
};

struct RemoteKey {
  uint64_t fabric_id = 0;
  uint64_t incarnation = 0;
  RegionId region = 0;
  uint64_t length = 0;
  // All zero: the region's own key (never revoked); else a grant's token.
  RegionToken token;
};

std::string EncodeAddress(const Address& a);
Result<Address> DecodeAddress(std::string_view blob);
// `addr` travels for logs only: writes resolve the region by id.
std::string EncodeKey(const RemoteKey& k, uint64_t addr, MemoryKind kind);
Result<RemoteKey> DecodeKey(std::string_view blob);

// Whether `token` may write a region with live `grants`: the region's own
// key (zero token) or a live grant's token (constant-time compares).
bool TokenAdmitted(const std::vector<std::pair<GrantId, RegionToken>>& grants,
                   const RegionToken& token);

}  // namespace kvbridge::internal::loopback_detail

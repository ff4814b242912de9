// The loopback transport's address and remote-key blobs: what one
// in-process "rank" hands another so that it can connect and write. Both are
// CRC-checked; a garbled blob is InvalidArgument, never a crash.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "kvbridge/status.h"
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
};

std::string EncodeAddress(const Address& a);
Result<Address> DecodeAddress(std::string_view blob);
// `addr` travels for logs only: writes resolve the region by id.
std::string EncodeKey(const RemoteKey& k, uint64_t addr, MemoryKind kind);
Result<RemoteKey> DecodeKey(std::string_view blob);

}  // namespace kvbridge::internal::loopback_detail

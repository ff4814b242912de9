// Blobs the UCX transport exchanges with peers: its address and the remote
// keys of registered regions. Both are WireWriter blobs with a magic, a
// version and a CRC-32 trailer, so a garbled or foreign blob is rejected with
// InvalidArgument before anything is trusted.
//
// Thread safety: pure functions.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "kvbridge/memory.h"
#include "kvbridge/status.h"
#include "transport/shm/shm.h"

namespace kvbridge::internal::ucx {

struct AddressBlob {
  HostIdentity host;
  std::string worker_address;  // ucp_worker_get_address bytes
};
std::string EncodeAddress(const AddressBlob& blob);
Result<AddressBlob> DecodeAddress(std::string_view bytes);

struct RemoteKeyBlob {
  HostIdentity owner;      // process that registered the region
  uint64_t region_id = 0;  // RegionId in the owner
  uint64_t base = 0;       // virtual address in the owner
  uint64_t length = 0;
  MemoryKind kind = MemoryKind::kDram;
  std::string packed_rkey;                  // ucp_rkey_pack bytes
  std::optional<SharedSegmentRef> segment;  // AllocateSharedBuffer memory
};
std::string EncodeRemoteKey(const RemoteKeyBlob& blob);
Result<RemoteKeyBlob> DecodeRemoteKey(std::string_view bytes);

// Header of a data active message: where the payload goes at the target.
struct DataHeader {
  uint64_t region_id = 0;  // target's RegionId
  uint64_t offset = 0;
  uint64_t length = 0;
};

}  // namespace kvbridge::internal::ucx

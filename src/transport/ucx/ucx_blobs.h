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
#include "transport/region_token.h"
#include "transport/shm/shm.h"

namespace kvbridge::internal::ucx {

struct AddressBlob {
  HostIdentity host;
  std::string worker_address;  // ucp_worker_get_address bytes
  // The same worker's address with its network devices only (no shared
  // memory): for UcxTransport::ConnectOverNetwork. Empty when it has none.
  std::string network_address;
};
std::string EncodeAddress(const AddressBlob& blob);
Result<AddressBlob> DecodeAddress(std::string_view bytes);

// The region descriptor a peer imports. Everything in it is a claim until
// checked: the owner's identity and the same-host socket only select a path
// (same_host.h checks them with the kernel), and `token` is the write
// capability every data message must carry.
struct RemoteKeyBlob {
  HostIdentity owner;      // process that registered the region (claimed)
  uint64_t region_id = 0;  // RegionId in the owner
  uint64_t base = 0;       // virtual address in the owner
  uint64_t length = 0;
  MemoryKind kind = MemoryKind::kDram;
  std::string packed_rkey;  // ucp_rkey_pack bytes
  RegionToken token;        // write capability (128 random bits)
  // Abstract unix socket of the owner's SameHostExporter ("" = none, <= 100
  // bytes) and whether the region is AllocateSharedBuffer memory.
  std::string same_host_socket;
  bool shareable = false;
};
std::string EncodeRemoteKey(const RemoteKeyBlob& blob);
Result<RemoteKeyBlob> DecodeRemoteKey(std::string_view bytes);

// Header of a data active message: where the payload goes at the target,
// the region's write capability, and which batch it belongs to. `connection` is a random token the
// sender picks per Connect; (connection, batch) names the batch at the target, which counts the
// batch's `blocks` AMs and acknowledges once all are placed.
struct DataHeader {
  uint64_t region_id = 0;  // target's RegionId
  uint64_t offset = 0;
  uint64_t length = 0;
  uint64_t connection = 0;
  uint64_t batch = 0;
  uint64_t blocks = 0;  // data AMs in the batch
  RegionToken token;    // the target region's token; checked on every AM
};
static_assert(sizeof(DataHeader) == 64, "DataHeader is sent as raw bytes");

// A data AM may gather pieces of one region: its header is the DataHeader
// (offset 0, length the pieces' total) followed by 1..kMaxGatherPieces
// pieces, and its payload is the pieces' bytes in that order. One message
// of scattered pages instead of one per page: over TCP each message costs a
// rendezvous round trip or an eager copy.
struct GatherPiece {
  uint64_t offset = 0;
  uint64_t length = 0;
};
static_assert(sizeof(GatherPiece) == 16, "GatherPiece is sent as raw bytes");
inline constexpr size_t kMaxGatherPieces = 64;

// Header of the acknowledgement the target sends back (on the reply
// endpoint) when every data AM of a batch has been placed or rejected. `code`
// is a kvbridge StatusCode (0 = OK); an error's message is the AM payload.
struct AckHeader {
  uint64_t connection = 0;
  uint64_t batch = 0;
  int32_t code = 0;
  uint32_t reserved = 0;
};

}  // namespace kvbridge::internal::ucx

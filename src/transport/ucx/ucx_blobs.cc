#include "transport/ucx/ucx_blobs.h"

#include <cstring>

#include "common/wire.h"

namespace kvbridge::internal::ucx {
namespace {

constexpr uint32_t kAddressMagic = 0x4b564241;  // "KVBA"
constexpr uint32_t kRkeyMagic = 0x4b564252;     // "KVBR"
constexpr size_t kMaxSocketName = 100;
constexpr uint32_t kVersion = 2;  // 2: token and same-host socket, no pid/fd
// Addresses: 3 adds the network-only worker address.
constexpr uint32_t kAddressVersion = 3;

void PutHost(WireWriter& w, const HostIdentity& h) {
  w.Bytes(h.host);
  w.Bytes(h.boot_id);
  w.I64(h.pid);
}

bool GetHost(WireReader& r, HostIdentity* h) {
  int64_t pid = 0;
  if (!r.Bytes(&h->host) || !r.Bytes(&h->boot_id) || !r.I64(&pid)) return false;
  h->pid = static_cast<int>(pid);
  return pid > 0;
}

bool Header(WireReader& r, uint32_t magic, uint32_t version = kVersion) {
  uint32_t m = 0, v = 0;
  return r.CheckCrc() && r.U32(&m) && m == magic && r.U32(&v) && v == version;
}

}  // namespace

std::string EncodeAddress(const AddressBlob& blob) {
  WireWriter w;
  w.U32(kAddressMagic);
  w.U32(kAddressVersion);
  PutHost(w, blob.host);
  w.Bytes(blob.worker_address);
  w.Bytes(blob.network_address);
  return w.FinishWithCrc();
}

Result<AddressBlob> DecodeAddress(std::string_view bytes) {
  WireReader r(bytes);
  AddressBlob out;
  if (!Header(r, kAddressMagic, kAddressVersion) || !GetHost(r, &out.host) ||
      !r.Bytes(&out.worker_address) || !r.Bytes(&out.network_address) || !r.AtEnd() ||
      out.worker_address.empty()) {
    return InvalidArgumentError("garbled UCX transport address (" + std::to_string(bytes.size()) +
                                " bytes): bad magic, version, CRC or length");
  }
  return out;
}

std::string EncodeRemoteKey(const RemoteKeyBlob& blob) {
  WireWriter w;
  w.U32(kRkeyMagic);
  w.U32(kVersion);
  PutHost(w, blob.owner);
  w.U64(blob.region_id);
  w.U64(blob.base);
  w.U64(blob.length);
  w.U8(static_cast<uint8_t>(blob.kind));
  w.Bytes(blob.packed_rkey);
  w.Bytes(std::string_view(reinterpret_cast<const char*>(blob.token.bytes.data()),
                           blob.token.bytes.size()));
  w.Bytes(blob.same_host_socket);
  w.U8(blob.shareable ? 1 : 0);
  return w.FinishWithCrc();
}

Result<RemoteKeyBlob> DecodeRemoteKey(std::string_view bytes) {
  WireReader r(bytes);
  RemoteKeyBlob out;
  uint8_t kind = 0, shareable = 0;
  std::string_view token;
  bool ok = Header(r, kRkeyMagic) && GetHost(r, &out.owner) && r.U64(&out.region_id) &&
            r.U64(&out.base) && r.U64(&out.length) && r.U8(&kind) && kind <= 1 &&
            r.Bytes(&out.packed_rkey) && r.BytesView(&token) &&
            token.size() == out.token.bytes.size() && r.Bytes(&out.same_host_socket) &&
            out.same_host_socket.size() <= kMaxSocketName && r.U8(&shareable) && shareable <= 1;
  ok = ok && r.AtEnd() && out.length > 0 && out.base != 0 && out.base + out.length > out.base;
  if (!ok) {
    return InvalidArgumentError("garbled remote key blob (" + std::to_string(bytes.size()) +
                                " bytes): bad magic, version, CRC or field");
  }
  std::memcpy(out.token.bytes.data(), token.data(), token.size());
  out.kind = static_cast<MemoryKind>(kind);
  out.shareable = shareable != 0;
  return out;
}

}  // namespace kvbridge::internal::ucx

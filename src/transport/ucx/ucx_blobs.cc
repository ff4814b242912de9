#include "transport/ucx/ucx_blobs.h"

#include "common/wire.h"

namespace kvbridge::internal::ucx {
namespace {

constexpr uint32_t kAddressMagic = 0x4b564241;  // "KVBA"
constexpr uint32_t kRkeyMagic = 0x4b564252;     // "KVBR"
constexpr uint32_t kVersion = 1;

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

bool Header(WireReader& r, uint32_t magic) {
  uint32_t m = 0, v = 0;
  return r.CheckCrc() && r.U32(&m) && m == magic && r.U32(&v) && v == kVersion;
}

}  // namespace

std::string EncodeAddress(const AddressBlob& blob) {
  WireWriter w;
  w.U32(kAddressMagic);
  w.U32(kVersion);
  PutHost(w, blob.host);
  w.Bytes(blob.worker_address);
  return w.FinishWithCrc();
}

Result<AddressBlob> DecodeAddress(std::string_view bytes) {
  WireReader r(bytes);
  AddressBlob out;
  if (!Header(r, kAddressMagic) || !GetHost(r, &out.host) || !r.Bytes(&out.worker_address) ||
      !r.AtEnd() || out.worker_address.empty()) {
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
  w.U8(blob.segment.has_value() ? 1 : 0);
  if (blob.segment) {
    w.I64(blob.segment->pid);
    w.I64(blob.segment->fd);
    w.U64(blob.segment->offset);
    w.U64(blob.segment->segment_size);
  }
  return w.FinishWithCrc();
}

Result<RemoteKeyBlob> DecodeRemoteKey(std::string_view bytes) {
  WireReader r(bytes);
  RemoteKeyBlob out;
  uint8_t kind = 0, has_segment = 0;
  bool ok = Header(r, kRkeyMagic) && GetHost(r, &out.owner) && r.U64(&out.region_id) &&
            r.U64(&out.base) && r.U64(&out.length) && r.U8(&kind) && kind <= 1 &&
            r.Bytes(&out.packed_rkey) && r.U8(&has_segment) && has_segment <= 1;
  if (ok && has_segment) {
    SharedSegmentRef seg;
    int64_t pid = 0, fd = 0;
    ok = r.I64(&pid) && r.I64(&fd) && r.U64(&seg.offset) && r.U64(&seg.segment_size);
    seg.pid = static_cast<int>(pid);
    seg.fd = static_cast<int>(fd);
    ok = ok && seg.offset <= seg.segment_size && out.length <= seg.segment_size - seg.offset;
    out.segment = seg;
  }
  ok = ok && r.AtEnd() && out.length > 0 && out.base != 0 && out.base + out.length > out.base;
  if (!ok) {
    return InvalidArgumentError("garbled remote key blob (" + std::to_string(bytes.size()) +
                                " bytes): bad magic, version, CRC or field");
  }
  out.kind = static_cast<MemoryKind>(kind);
  return out;
}

}  // namespace kvbridge::internal::ucx

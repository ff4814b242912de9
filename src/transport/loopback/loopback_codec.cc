#include "transport/loopback/loopback_codec.h"

#include <cstring>

#include "common/wire.h"

namespace kvbridge::internal::loopback_detail {
namespace {
constexpr uint32_t kAddressMagic = 0x4c42564b;  // "KVBL"
constexpr uint32_t kKeyMagic = 0x4b42564b;      // "KVBK"
}  // namespace

std::string EncodeAddress(const Address& a) {
  WireWriter w;
  w.U32(kAddressMagic);
  w.U64(a.fabric_id);
  w.Bytes(a.name);
  w.U64(a.incarnation);
  return w.FinishWithCrc();
}

Result<Address> DecodeAddress(std::string_view blob) {
  WireReader r(blob);
  Address a;
  uint32_t magic = 0;
  if (!r.CheckCrc() || !r.U32(&magic) || magic != kAddressMagic || !r.U64(&a.fabric_id) ||
      !r.Bytes(&a.name) || !r.U64(&a.incarnation) || !r.AtEnd()) {
    return InvalidArgumentError("garbled loopback address blob (" + std::to_string(blob.size()) +
                                " bytes)");
  }
  return a;
}

std::string EncodeKey(const RemoteKey& k, uint64_t addr, MemoryKind kind) {
  WireWriter w;
  w.U32(kKeyMagic);
  w.U64(k.fabric_id);
  w.U64(k.incarnation);
  w.U64(k.region);
  w.U64(addr);  // for logs and debugging; writes resolve the region by id
  w.U64(k.length);
  w.U8(static_cast<uint8_t>(kind));
  w.Bytes(
      std::string_view(reinterpret_cast<const char*>(k.token.bytes.data()), k.token.bytes.size()));
  return w.FinishWithCrc();
}

Result<RemoteKey> DecodeKey(std::string_view blob) {
  WireReader r(blob);
  RemoteKey k;
  uint32_t magic = 0;
  uint64_t addr = 0;
  uint8_t kind = 0;
  std::string_view token;
  if (!r.CheckCrc() || !r.U32(&magic) || magic != kKeyMagic || !r.U64(&k.fabric_id) ||
      !r.U64(&k.incarnation) || !r.U64(&k.region) || !r.U64(&addr) || !r.U64(&k.length) ||
      !r.U8(&kind) || !r.BytesView(&token) || token.size() != k.token.bytes.size() || !r.AtEnd()) {
    return InvalidArgumentError("garbled loopback remote key (" + std::to_string(blob.size()) +
                                " bytes)");
  }
  std::memcpy(k.token.bytes.data(), token.data(), token.size());
  return k;
}

bool TokenAdmitted(const std::vector<std::pair<GrantId, RegionToken>>& grants,
                   const RegionToken& token) {
  if (IsZeroToken(token)) return true;
  bool found = false;
  for (const auto& [grant, t] : grants) found |= TokensEqual(t, token);
  return found;
}

}  // namespace kvbridge::internal::loopback_detail

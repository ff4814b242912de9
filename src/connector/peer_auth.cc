#include "connector/peer_auth.h"

#include <fmt/format.h>
#include <openssl/crypto.h>

#include <cstring>

#include "common/wire.h"
#include "control/auth.h"
#include "transport/region_token.h"

namespace kvbridge::internal {
namespace {

constexpr uint32_t kSealMagic = 0x5342564b;  // "KVBS" as bytes on the wire
constexpr std::string_view kKeyLabel = "kvbridge peer handshake key v1";

std::string_view AsView(const Digest& d) {
  return {reinterpret_cast<const char*>(d.data()), d.size()};
}

std::string_view ProverLabel(Role prover) {
  return prover == Role::kPrefill ? "prefill proof" : "decode proof";
}

uint32_t LoadU32(std::string_view b) {
  uint32_t v;
  std::memcpy(&v, b.data(), sizeof(v));
  return v;
}

}  // namespace

Result<Nonce> NewNonce() {
  Nonce n{};
  KVB_RETURN_IF_ERROR(SecureRandomBytes(n.data(), n.size()));
  return n;
}

Result<ChallengeMaker> ChallengeMaker::Create() {
  std::array<uint8_t, 32> key{};
  KVB_RETURN_IF_ERROR(SecureRandomBytes(key.data(), key.size()));
  return ChallengeMaker(key);
}

Challenge ChallengeMaker::InWindow(const Digest& hello_digest, int64_t window) const {
  WireWriter w;
  w.Bytes("kvbridge challenge v1");
  w.Bytes(AsView(hello_digest));
  w.I64(window);
  const Digest d = HmacSha256(key_, w.Finish());
  Challenge c;
  std::memcpy(c.nonce.data(), d.data(), c.nonce.size());
  std::memcpy(&c.session, d.data() + c.nonce.size(), sizeof(c.session));
  if (c.session == 0) c.session = 1;  // 0 names no session
  return c;
}

namespace {
int64_t WindowOf(SteadyTime t) {
  // Rounded down, also before the clock's epoch (a scripted clock): every
  // window is kWindow long.
  const int64_t s = std::chrono::floor<std::chrono::seconds>(t.time_since_epoch()).count();
  const int64_t w = ChallengeMaker::kWindow.count();
  return s / w - (s % w < 0 ? 1 : 0);
}
}  // namespace

Challenge ChallengeMaker::For(const Digest& hello_digest, SteadyTime now) const {
  return InWindow(hello_digest, WindowOf(now));
}

std::optional<Challenge> ChallengeMaker::Find(const Digest& hello_digest, uint64_t session,
                                              SteadyTime now) const {
  for (int64_t w : {WindowOf(now), WindowOf(now) - 1}) {
    const Challenge c = InWindow(hello_digest, w);
    if (c.session == session) return c;
  }
  return std::nullopt;
}

HostIdentity HostOf(const RankId& id) { return {id.host, id.boot_id, id.pid}; }

bool SameProcess(const RankId& a, const RankId& b) {
  return a.SameRank(b) && SameProcess(HostOf(a), HostOf(b)) && a.incarnation == b.incarnation;
}

bool IsFailureNotice(const FailureRecord& r, const RankId& failed, const RankId& detector) {
  return IsRankFailure(r.cause) && r.origin.SameRank(failed) &&
         r.origin.incarnation == failed.incarnation && SameProcess(r.detected_by, detector);
}

HandshakeAuth::HandshakeAuth(std::string_view secret) : key_(DeriveKey(secret, kKeyLabel)) {}

std::string HandshakeAuth::Transcript(const Digest& hello_digest, const RankId& prefill,
                                      const Nonce& prefill_nonce, uint64_t prefill_session) {
  WireWriter w;
  w.Bytes("kvbridge handshake v1");
  w.Bytes(AsView(hello_digest));
  w.U8(static_cast<uint8_t>(prefill.role));
  for (int v : {prefill.dp, prefill.tp, prefill.pp, prefill.cp, prefill.pid}) w.I64(v);
  w.Bytes(prefill.host);
  w.Bytes(prefill.boot_id);
  w.U64(prefill.incarnation);
  w.Bytes(prefill.instance);
  w.Bytes(
      std::string_view(reinterpret_cast<const char*>(prefill_nonce.data()), prefill_nonce.size()));
  w.U64(prefill_session);
  return w.Finish();
}

Digest HandshakeAuth::Prove(Role prover, std::string_view transcript) const {
  std::string data(ProverLabel(prover));
  data.append(transcript);
  return HmacSha256(key_, data);
}

Status HandshakeAuth::Verify(Role prover, std::string_view transcript, const Digest& proof,
                             std::string_view who) const {
  if (DigestsEqual(Prove(prover, transcript), proof)) return Status();
  return UnauthenticatedError(fmt::format(
      "handshake with {}: its proof does not match this rank's secret (an old or forged "
      "handshake, or a rank of another deployment); set {} (or {}) to the same secret on every "
      "rank and on the bootstrap server",
      who, kAuthTokenEnv, kSglangAuthTokenEnv));
}

SessionKeys HandshakeAuth::Keys(std::string_view transcript) const {
  std::string data("session");
  data.append(transcript);
  const Digest master = HmacSha256(key_, data);
  SessionKeys k;
  k.decode_to_prefill = HmacSha256(master, "decode to prefill");
  k.prefill_to_decode = HmacSha256(master, "prefill to decode");
  return k;
}

Digest HandshakeAuth::Tag(std::string_view purpose, std::string_view data) const {
  WireWriter w;
  w.Bytes(purpose);
  w.Bytes(data);
  return HmacSha256(key_, w.Finish());
}

Digest HandshakeAuth::TagAddress(std::string_view address, uint64_t session,
                                 const Nonce& nonce) const {
  WireWriter w;
  w.Bytes(address);
  w.U64(session);
  w.Bytes(std::string_view(reinterpret_cast<const char*>(nonce.data()), nonce.size()));
  return Tag("kvbridge hello address v1", w.Finish());
}

Status HandshakeAuth::CheckAddressTag(std::string_view address, uint64_t session,
                                      const Nonce& nonce, const Digest& tag,
                                      std::string_view who) const {
  if (DigestsEqual(TagAddress(address, session, nonce), tag)) return Status();
  return UnauthenticatedError(fmt::format(
      "Hello from {}: its address is not tagged under this rank's secret (forged, or a rank of "
      "another deployment); not connecting back to it. Set {} (or {}) to the same secret on "
      "every rank",
      who, kAuthTokenEnv, kSglangAuthTokenEnv));
}

std::string Seal(const SessionKey& key, const SealedHeader& h, std::string_view payload) {
  WireWriter w;
  w.U32(kSealMagic);
  w.U8(static_cast<uint8_t>(h.lane));
  w.U64(h.session);
  w.U64(h.seq);
  std::string out = w.Finish();
  out.reserve(out.size() + payload.size() + kSealTagBytes);
  out.append(payload);
  const Digest tag = HmacSha256(key, out);
  out.append(reinterpret_cast<const char*>(tag.data()), kSealTagBytes);
  return out;
}

bool LooksSealed(std::string_view bytes) {
  return bytes.size() >= 4 && LoadU32(bytes) == kSealMagic;
}

Result<SealedHeader> ParseSealed(std::string_view bytes) {
  if (bytes.size() < kSealHeaderBytes + kSealTagBytes || !LooksSealed(bytes))
    return InvalidArgumentError(
        fmt::format("sealed message of {} bytes: shorter than its {} bytes of header and tag",
                    bytes.size(), kSealHeaderBytes + kSealTagBytes));
  WireReader r(bytes.substr(4, kSealHeaderBytes - 4));
  uint8_t lane = 0;
  SealedHeader h;
  if (!r.U8(&lane) || !r.U64(&h.session) || !r.U64(&h.seq))
    return InvalidArgumentError("sealed message: truncated header");
  if (lane >= kSealLanes)
    return InvalidArgumentError(fmt::format("sealed message: unknown lane {}", lane));
  h.lane = static_cast<SealLane>(lane);
  return h;
}

Result<std::string_view> OpenSealed(const SessionKey& key, std::string_view bytes) {
  KVB_RETURN_IF_ERROR(ParseSealed(bytes).status());
  const std::string_view body = bytes.substr(0, bytes.size() - kSealTagBytes);
  const Digest tag = HmacSha256(key, body);
  if (CRYPTO_memcmp(tag.data(), bytes.data() + body.size(), kSealTagBytes) != 0)
    return UnauthenticatedError(
        fmt::format("sealed message of {} bytes: its tag is not its session's", bytes.size()));
  return body.substr(kSealHeaderBytes);
}

bool ReplayWindow::Accept(uint64_t seq) {
  if (!any_) {
    any_ = true;
    highest_ = seq;
    seen_.reset();
    seen_.set(0);
    return true;
  }
  if (seq > highest_) {
    const uint64_t shift = seq - highest_;
    if (shift >= kReplayWindow) {
      seen_.reset();
    } else {
      seen_ <<= shift;
    }
    highest_ = seq;
    seen_.set(0);
    return true;
  }
  const uint64_t age = highest_ - seq;
  if (age >= kReplayWindow || seen_.test(age)) return false;
  seen_.set(age);
  return true;
}

}  // namespace kvbridge::internal

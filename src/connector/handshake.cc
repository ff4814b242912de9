// The authenticated handshake between a decode and a prefill rank
// (peer_auth.h; docs/protocol.md, "The handshake"), from decode's connect
// (EnsurePrefillPeer) to prefill's answer, and the rule every control
// message passes before it is applied (Admit).
#include <fmt/format.h>

#include "common/log.h"
#include "connector/hello_rule.h"
#include "connector/layout_json.h"
#include "connector/manager_impl.h"
#include "connector/record_tag.h"
#include "transport/region_token.h"

namespace kvbridge::internal {
namespace {

bool IsHandshake(const MessageBody& b) {
  return std::holds_alternative<HelloMsg>(b) || std::holds_alternative<HelloChallengeMsg>(b) ||
         std::holds_alternative<HelloProofMsg>(b);
}

}  // namespace

bool ManagerImpl::Admit(const Message& m, const RankId* proven) {
  const std::string_view type = MessageTypeName(m.body);
  if (proven == nullptr) {
    const bool prefill = opts_.role == Role::kPrefill;
    const bool takes =
        prefill
            ? m.from.role == Role::kDecode && (std::holds_alternative<HelloMsg>(m.body) ||
                                               std::holds_alternative<HelloProofMsg>(m.body))
            : m.from.role == Role::kPrefill && std::holds_alternative<HelloChallengeMsg>(m.body);
    if (takes) return true;
    DropUnauthenticated(
        fmt::format("plain {} claiming to be from {}: no handshake proved its sender", type,
                    m.from.ToString()));
    return false;
  }
  if (IsHandshake(m.body)) {
    DropUnauthenticated(fmt::format("{} inside the session of {}: handshakes travel plain", type,
                                    proven->ToString()));
    return false;
  }
  if (!SameProcess(m.from, *proven)) {
    DropUnauthenticated(fmt::format("{} naming {} under the session that proved {}", type,
                                    m.from.ToString(), proven->ToString()));
    return false;
  }
  if (const auto* failed = std::get_if<RankFailedMsg>(&m.body)) {
    const FailureRecord& r = failed->record;
    const bool own = r.origin.SameRank(m.from) && r.origin.incarnation == m.from.incarnation;
    // With sglang's server (no registry that keeps records) a peer that
    // failed this process tells it so (TellFailedPeerLocked): the record
    // names this process and the sender as its detector. That is the power
    // a peer has through kvbridge's registry (a record about a rank of the
    // other role), where this word is not taken: the registry tells.
    const bool about_me = sglang_registry_ && IsFailureNotice(r, Self(), m.from);
    if (!own && !about_me) {
      DropUnauthenticated(fmt::format(
          "RankFailed from {} about {}: a rank reports only its own failure, or that it failed "
          "the rank it tells (others come from the registry)",
          m.from.ToString(), r.origin.ToString()));
      return false;
    }
  }
  return true;
}

void ManagerImpl::DropUnauthenticated(const std::string& why) {
  const uint64_t n = ++unauth_dropped_;
  // Counted always, logged the first few times and then every 1000th: a
  // flood must not flood the log too.
  if (n <= 10 || n % 1000 == 0)
    KVB_LOG_WARN("dropping control message ({} dropped unauthenticated so far): {}", n, why);
  if (metrics_) metrics_->DroppedUnauthenticated();
}

Status ManagerImpl::SendHello(const std::string& key, PeerId tpeer) {
  HelloMsg hello = MakeHello();
  KVB_RETURN_IF_ERROR(GrantKeysFor(key, hello));
  {
    // A Hello sent again goes over the network (RetryHello) and gives the
    // address prefill connects back to, and opens its later endpoints to,
    // so that the whole session avoids shared memory (transport.h).
    MutexLock lock(mu_);
    Peer* p = FindPeerLocked(key);
    if (p != nullptr && p->over_network) hello.address = transport_->NetworkAddress();
  }
  KVB_ASSIGN_OR_RETURN(hello.session, SecureRandomU64());
  KVB_ASSIGN_OR_RETURN(hello.nonce, NewNonce());
  hello.address_tag = handshake_->TagAddress(hello.address, hello.session, hello.nonce);
  std::string bytes = EncodeMessage(Self(), hello);
  if (bytes.size() > kMaxHelloBytes) {
    return InvalidArgumentError(
        fmt::format("this rank's Hello to {} is {} bytes, over the {} a peer takes: too many "
                    "registered regions",
                    key, bytes.size(), kMaxHelloBytes));
  }
  const Digest digest = Sha256(bytes);
  {
    // Kept before the Hello leaves: the challenge can come at once.
    MutexLock lock(mu_);
    Peer* p = FindPeerLocked(key);
    if (p == nullptr || p->tpeer != tpeer)
      return UnavailableError(key + ": endpoint replaced before its Hello left");
    KeepHello(p->hellos, {hello.session, digest, bytes, hello.address});
  }
  return auth_->SendPlain(tpeer, std::move(bytes));
}

Status ManagerImpl::GrantKeysFor(const std::string& key, HelloMsg& hello) {
  GrantId grant = 0;
  bool mapping = false;
  {
    MutexLock lock(mu_);
    Peer* p = FindPeerLocked(key);
    if (p == nullptr) return UnavailableError(key + ": peer gone before its Hello left");
    if (p->notice) return Status();  // met only to be told: it writes nothing here
    if (p->grant == 0) {
      grant = next_grant_++;
      mapping = WritesByMapping(p->id);
    } else {
      hello.kv_keys = p->grant_keys[0];
      hello.aux_keys = p->grant_keys[1];
      hello.state_keys = p->grant_keys[2];
      return Status();
    }
  }
  // A transport without grants: the shared keys (and the older rule: a
  // silent rank on another host is taken to write nothing more).
  std::vector<std::string> keys[3];
  const std::vector<RegionId>* ids[3] = {&regions_.kv, &regions_.aux, &regions_.state};
  for (int i = 0; i < 3; ++i) {
    for (RegionId id : *ids[i]) {
      Result<std::string> k = transport_->GrantRegion(
          id, grant,
          mapping ? Transport::GrantReach::kSameHostMapping : Transport::GrantReach::kMediated);
      if (k.status().code() == StatusCode::kUnimplemented) return Status();
      if (!k.ok()) return k.status().WithContext("write grant for " + key);
      keys[i].push_back(std::move(*k));
    }
  }
  MutexLock lock(mu_);
  Peer* p = FindPeerLocked(key);
  if (p == nullptr) return UnavailableError(key + ": peer gone before its Hello left");
  if (p->grant == 0) {
    p->grant = grant;
    p->mapping = mapping;
    for (int i = 0; i < 3; ++i) p->grant_keys[i] = keys[i];
  }
  hello.kv_keys = p->grant_keys[0];
  hello.aux_keys = p->grant_keys[1];
  hello.state_keys = p->grant_keys[2];
  return Status();
}

void ManagerImpl::OnHello(const RankId& from, HelloMsg hello, std::string_view bytes) {
  // Nothing in the Hello is believed, nor kept: its sender gets a challenge
  // derived from it (ChallengeMaker), on an endpoint to the address it gave,
  // if a holder of the secret tagged that address (the transport's parser
  // of it may trust its input: peer_auth.h, TagAddress).
  Status tagged = handshake_->CheckAddressTag(hello.address, hello.session, hello.nonce,
                                              hello.address_tag, from.ToString());
  if (!tagged.ok()) {
    DropUnauthenticated(tagged.message());
    return;
  }
  Result<PeerId> conn = transport_->Connect(hello.address);
  if (!conn.ok()) {
    KVB_LOG_WARN("cannot connect back to {}: {}", from.ToString(), conn.status().ToString());
    return;
  }
  const SteadyTime now = Now();
  const Digest digest = Sha256(bytes);
  const RankId self = Self();
  const Challenge c = challenge_maker_->For(digest, now);
  ChallengeTable::Kept kept;
  {
    MutexLock lock(mu_);
    kept = challenges_.Keep(c.session, from, *conn, now);
  }
  if (kept.again_after_s) {  // our challenge or its proof was lost or late
    KVB_LOG_WARN(
        "{} sent its Hello again {:.2f} s after the last one, whose challenge got no proof; "
        "challenging it anew",
        from.ToString(), *kept.again_after_s);
  }
  for (PeerId p : kept.close_now) transport_->Disconnect(p);
  const std::string t = HandshakeAuth::Transcript(digest, self, c.nonce, c.session);
  const HelloChallengeMsg challenge{hello.session, c.session, c.nonce,
                                    handshake_->Prove(Role::kPrefill, t)};
  Status sent = auth_->SendPlain(*conn, EncodeMessage(self, challenge));
  if (!sent.ok()) KVB_LOG_WARN("challenge to {} not sent: {}", from.ToString(), sent.ToString());
}

void ManagerImpl::OnHelloChallenge(const RankId& from, const HelloChallengeMsg& c) {
  PeerId tpeer = 0;
  Digest proof{};
  std::string hello;     // what the proof answers, for prefill to find its challenge again
  bool earlier = false;  // it answers a Hello sent before the last
  AuthTransport::Binding b;
  {
    MutexLock lock(mu_);
    Peer* p = FindPeerLocked(PeerKey(from));
    SentHello* sent = p == nullptr ? nullptr : HelloAnswered(p->hellos, c.decode_session);
    if (sent == nullptr || p->acked || (p->failed && !p->notice) ||
        p->id->incarnation != from.incarnation) {
      // An answer to a Hello this rank no longer waits for (answered
      // already, or sent before a retry to another address), or a replay.
      ++stale_dropped_;
      if (p != nullptr) ++p->late_challenges;
      KVB_LOG_DEBUG("challenge from {} answers no Hello of this rank", from.ToString());
      return;
    }
    const std::string t = HandshakeAuth::Transcript(sent->digest, from, c.nonce, c.session);
    Status verified = handshake_->Verify(Role::kPrefill, t, c.proof, from.ToString());
    if (!verified.ok()) {
      // Not a failure of the peer: anyone can send this. The real answer
      // may still come; Tick names the refusals if none does.
      ++p->auth_refusals;
      DropUnauthenticated(verified.message());
      return;
    }
    const SessionKeys keys = handshake_->Keys(t);
    b = {keys.decode_to_prefill, c.session, keys.prefill_to_decode, c.decode_session, from};
    proof = handshake_->Prove(Role::kDecode, t);
    earlier = sent != &p->hellos.back();
    hello = std::move(sent->bytes);
    p->hellos.clear();  // one answer per handshake
    ++p->proofs_sent;
    // A sign of life (it proved the secret), and the proof gets a retry's
    // whole wait for its answer.
    p->hello_at = p->last_heard = Now();
    p->last_heard_wall = WallNow();
    tpeer = p->tpeer;
  }
  // Bound before the proof leaves: prefill's sealed answer can come at once.
  auth_->Bind(tpeer, b);
  bool swapped = false;
  {
    // A retry may have swapped and closed this endpoint meanwhile
    // (RetryHello), or the peer failed and it was closed: a binding made
    // after its close would stay for good.
    MutexLock lock(mu_);
    const Peer* p = FindPeerLocked(PeerKey(from));
    swapped = p == nullptr || p->tpeer != tpeer || (p->failed && !p->notice);
  }
  if (swapped) {
    transport_->Disconnect(tpeer);  // forgets the binding; the retry's Hello goes on
    return;
  }
  if (earlier)
    KVB_LOG_WARN(
        "{} answered an earlier handshake attempt, after this rank had sent its Hello again: "
        "its answers come slower than the retries; proving that one",
        from.ShortName());
  Status sent = auth_->SendPlain(
      tpeer, EncodeMessage(Self(), HelloProofMsg{c.session, proof, std::move(hello)}));
  if (!sent.ok())
    KVB_LOG_WARN("handshake with {}: proof not sent: {}", from.ShortName(), sent.ToString());
}

namespace {

// A proof that checked: the Hello it carries and the transcript it proves.
struct CheckedProof {
  HelloMsg hello;
  std::string transcript;
};

// The proof brings its Hello back and the challenge is derived again from
// it (ChallengeMaker): a flood of Hellos (no secret needed) has no table of
// pending ones to push the genuine one out of. Unauthenticated, saying
// why, for a proof that does not check.
Result<CheckedProof> CheckProof(const HandshakeAuth& auth, const ChallengeMaker& maker,
                                const RankId& self, const RankId& from, const HelloProofMsg& p,
                                SteadyTime now) {
  Result<Message> hello = DecodeMessage(p.hello);
  if (!hello.ok() || !std::holds_alternative<HelloMsg>(hello->body) ||
      !SameProcess(hello->from, from)) {
    return UnauthenticatedError(
        fmt::format("HelloProof from {} carries no Hello of its sender: {}", from.ToString(),
                    hello.ok() ? "another message" : hello.status().message()));
  }
  const Digest digest = Sha256(p.hello);
  const std::optional<Challenge> c = maker.Find(digest, p.session, now);
  if (!c) {
    return UnauthenticatedError(
        fmt::format("HelloProof from {} answers no challenge of this rank (replayed or too late)",
                    from.ToString()));
  }
  CheckedProof out{std::move(std::get<HelloMsg>(hello->body)),
                   HandshakeAuth::Transcript(digest, self, c->nonce, p.session)};
  KVB_RETURN_IF_ERROR(auth.Verify(Role::kDecode, out.transcript, p.proof, from.ToString()));
  return out;
}

}  // namespace

void ManagerImpl::OnHelloProof(const RankId& from, const HelloProofMsg& p) {
  const SteadyTime now = Now();
  const RankId self = Self();  // the incarnation the transcript names
  Result<CheckedProof> proof = CheckProof(*handshake_, *challenge_maker_, self, from, p, now);
  if (!proof.ok()) {
    DropUnauthenticated(proof.status().message());
    return;
  }
  bool replayed = false;
  std::optional<PeerId> tpeer;
  {
    MutexLock lock(mu_);
    replayed = !challenges_.FirstProof(p.session, now);
    if (!replayed) tpeer = challenges_.TakeEndpoint(p.session, from);
    // Tracked from here, in the same step: a failure the transport reports
    // on the endpoint while the peer is accepted is not lost between the
    // two (NoPeersEndpointFailedLocked).
    if (tpeer) accepting_[*tpeer] = false;
  }
  if (replayed) {
    DropUnauthenticated(fmt::format(
        "HelloProof from {} proves a handshake proven already (replayed)", from.ToString()));
    return;
  }
  if (!tpeer) {
    // Its challenge's endpoint was let go (more Hellos came meanwhile than
    // ChallengeTable::kMaxEndpoints, or it failed): one anew to the address.
    Result<PeerId> conn = transport_->Connect(proof->hello.address);
    if (!conn.ok()) {
      KVB_LOG_WARN("cannot connect back to {} after its proof: {}", from.ToString(),
                   conn.status().ToString());
      return;
    }
    MutexLock lock(mu_);
    accepting_[*conn] = false;
    tpeer = *conn;
  }
  const SessionKeys keys = handshake_->Keys(proof->transcript);
  const AuthTransport::Binding b{keys.prefill_to_decode, proof->hello.session,
                                 keys.decode_to_prefill, p.session, from};
  PendingAccept a{from, std::move(proof->hello), *tpeer, b, self.incarnation};
  if (!hooks_.manual_ticks) {
    MutexLock lock(mu_);
    accepts_.push_back(std::move(a));
  }
  if (hooks_.manual_ticks) {  // scripted tests: no acceptor thread
    AcceptHello(std::move(a));
    return;
  }
  Wake(&accept_wake_);
}

namespace {

// A prefill rank as its registry record describes it, not yet connected.
std::unique_ptr<Peer> PrefillPeerOf(const std::string& key, const RankRecord& rec,
                                    RankLayout layout) {
  auto peer = std::make_unique<Peer>();
  peer->key = key;
  peer->shared_key = SharedKey(key);
  peer->id = Shared<RankId>(RankIdOf(rec));
  peer->address = rec.transport_address;
  peer->layout = std::move(layout);
  peer->tp_size = rec.attn_tp_size;
  return peer;
}

}  // namespace

PeerId ManagerImpl::RetirePrefillPeerLocked(Peer& old, Peer& fresh, bool same, Outbox& out) {
  if (same) fresh.remeet = {old.remeet.at, old.remeet.waits, old.remeet.count + 1};
  // The same process rejoined (under a new incarnation, which it takes only
  // once its writes finished): which of its old incarnation's writes may
  // still land is the write rule's to say (write_rule.h). The same
  // incarnation met again (this rank rejoined, or the peer was retired) has
  // said nothing of its writes.
  old.rejoined = !same && old.id->incarnation != fresh.id->incarnation &&
                 SameProcess(HostOf(old.id), HostOf(fresh.id));
  if (!old.failed)
    FailPeerLocked(old, FailureCause::kPeerExited, NewIncarnationDetail(old.id, fresh.id),
                   "new incarnation", out);
  SettleSourcesOfLocked(old);
  by_tpeer_.erase(old.tpeer);
  DropBeatLocked(old, out);
  if (old.grant != 0 && !old.fenced)
    retired_grants_.push_back({old.key, old.id->incarnation, old.grant, old.mapping, old.session});
  return old.tpeer;
}

namespace {

// The registry's record of the rank at `pos` (named `key`), only when its
// tag checks. When the rank did not answer, or answered as no rank would
// (DataLoss, AnsweredWrongly), *registered is its position at the host the
// registry listed: the failure is about it. A 503 from its endpoint (its
// record not set yet) is neither.
Result<RankRecord> LookUpForPeer(const RegistryClient& registry, const HandshakeAuth& auth,
                                 const RankId& pos, const std::string& key, RankId* registered) {
  std::string unanswered, listed;  // with sglang's server: the rank's own endpoint
  Result<RankRecord> rec =
      registry.LookUpRank(pos.dp, pos.cp, pos.tp, pos.pp, &unanswered, &listed);
  if (!rec.ok()) {
    const Status s = AnsweredWrongly(rec.status());
    if (!unanswered.empty() || (!listed.empty() && s.code() == StatusCode::kDataLoss)) {
      *registered = pos;
      registered->host = unanswered.empty() ? listed : unanswered;
    }
    return s.WithContext(key);
  }
  // Registries answer anyone: nothing in the record is taken unless its
  // tag checks (record_tag.h), not even to name the rank.
  KVB_RETURN_IF_ERROR(CheckRankAddressTag(auth, *rec, registry.address()).WithContext(key));
  return rec;
}

}  // namespace

Result<std::string> ManagerImpl::EnsurePrefillPeer(const RankId& pos, RankId* registered,
                                                   const FailureRecord* notice) {
  const std::string key = PeerKey(pos);
  uint64_t failed_incarnation = 0;
  {
    MutexLock lock(mu_);
    Peer* p = FindPeerLocked(key);
    if (p != nullptr && p->ready && !p->failed) return key;
    // One retired by this rank's rejoin is connected again, whatever it is now.
    if (p != nullptr && p->failed && !p->retired) failed_incarnation = p->id->incarnation;
  }
  KVB_ASSIGN_OR_RETURN(const RankRecord rec,
                       LookUpForPeer(*registry_, *handshake_, pos, key, registered));
  *registered = RankIdOf(rec);
  const bool same = failed_incarnation != 0 && rec.incarnation == failed_incarnation;
  if (same && notice == nullptr) return UnavailableError(key + " failed and has not restarted");
  Result<RankLayout> read = LayoutFromJson(rec.layout);  // a rank of another build
  if (!read.ok()) return FailedPreconditionError(key + ": its layout: " + read.status().message());
  RankLayout layout = std::move(read).value();
  KVB_RETURN_IF_ERROR(CheckCompatible(layout, layout_));
  std::unique_ptr<Peer> peer = PrefillPeerOf(key, rec, std::move(layout));
  KVB_ASSIGN_OR_RETURN(peer->tpeer, transport_->Connect(rec.transport_address));
  const PeerId tpeer = peer->tpeer;
  Peer* const mine = peer.get();
  PeerId stale = 0;
  Outbox out;
  {
    // In the table before the Hello leaves: its answer can come at once.
    MutexLock lock(mu_);
    if (Peer* old = FindPeerLocked(key); old != nullptr)
      stale = RetirePrefillPeerLocked(*old, *peer, same, out);
    // Met again only to be told: failed from the start (its record keeps
    // blocking its rooms).
    peer->failed = peer->notice = same;
    if (same) peer->failure = *notice;
    if (!same) dead_ranks_.erase(key);
    peer->ready = true;
    peer->acked = false;
    peer->hello_attempts = 1;
    peer->hello_at = Now();
    peer->last_heard = Now();
    peer->last_heard_wall = WallNow();
    by_tpeer_[peer->tpeer] = peer.get();
    peers_[key] = std::move(peer);
  }
  Flush(out);
  if (stale != 0) transport_->Disconnect(stale);
  Status sent = SendHello(key, tpeer);
  if (!sent.ok()) {
    {
      MutexLock lock(mu_);
      auto it = peers_.find(key);
      if (it != peers_.end() && it->second.get() == mine) {
        by_tpeer_.erase(tpeer);
        if (mine->notice) {  // stays, failed: MeetPrefillAgain tries again
          mine->notice = false;
          mine->tpeer = 0;
        } else {
          peers_.erase(it);
        }
      }
    }
    transport_->Disconnect(tpeer);
    return sent.WithContext(key);
  }
  // "connected to ... via PATH" follows with the peer's HelloAck.
  KVB_LOG_DEBUG("handshake sent to {}", key);
  return key;
}

HelloMsg ManagerImpl::MakeHello() const {
  return HelloMsg{layout_,  layout_.tp_size, transport_->Address(),
                  kv_keys_, aux_keys_,       state_keys_};
}

void ManagerImpl::RetryHello(const std::string& key) {
  std::lock_guard<std::mutex> resolve(resolve_mu_);
  std::string address;
  PeerId old_tpeer = 0;
  {
    MutexLock lock(mu_);
    Peer* p = FindPeerLocked(key);
    if (p == nullptr || p->acked || p->failed) return;
    address = p->address;
    old_tpeer = p->tpeer;
  }
  // Not through shared memory: the peer's queue may be blocked (transport.h).
  Result<PeerId> conn = transport_->ConnectOverNetwork(address);
  bool swapped = false;
  int attempt = 0;
  int late = 0;
  {
    MutexLock lock(mu_);
    Peer* p = FindPeerLocked(key);
    if (p != nullptr && !p->acked && !p->failed && p->tpeer == old_tpeer) {
      // Counted even when no new endpoint could be opened: the next try
      // waits longer, and the rank is blamed once the budget is spent.
      attempt = ++p->hello_attempts;
      late = p->late_challenges;
      p->hello_at = Now();
      if (conn.ok()) {
        // Swapped before the Hello leaves: its answer flushes what is held
        // onto the new endpoint, never the stuck one.
        by_tpeer_.erase(old_tpeer);
        p->tpeer = *conn;
        p->over_network = true;
        by_tpeer_[p->tpeer] = p;
        swapped = true;
      }
    }
  }
  if (!conn.ok()) {
    KVB_LOG_WARN("handshake with {}: cannot open a new endpoint: {}", key,
                 conn.status().ToString());
    return;
  }
  if (!swapped) {  // answered (or failed) meanwhile
    transport_->Disconnect(*conn);
    return;
  }
  transport_->Disconnect(old_tpeer);
  Status sent = SendHello(key, *conn);
  if (!sent.ok()) {
    KVB_LOG_WARN("handshake with {}: cannot send it again: {}", key, sent.ToString());
    return;
  }
  KVB_LOG_WARN(
      "no answer from {} to the handshake; sent it again on a new endpoint (attempt {}; "
      "challenges that came for earlier attempts: {})",
      key, attempt, late);
}

}  // namespace kvbridge::internal

#include "connector/manager_impl.h"

#include <fmt/format.h>

#include <random>

#include "common/host_identity.h"
#include "common/log.h"
#include "common/process.h"
#include "connector/hello_rule.h"
#include "connector/layout_json.h"
#include "connector/relay_rule.h"
#include "connector/room_failure_rule.h"
#include "control/auth.h"
#include "control/record_json.h"
#include "transport/ucx/ucx_transport.h"

namespace kvbridge::internal {
uint64_t NewIncarnation() {
  std::random_device rd;
  uint64_t v = (static_cast<uint64_t>(rd()) << 32) ^ rd();
  return v == 0 ? 1 : v;
}

namespace {

Status CheckBuffers(const char* what, const std::vector<uint64_t>& ptrs,
                    const std::vector<uint64_t>& lens, const std::vector<uint64_t>& items) {
  if (ptrs.size() != lens.size() || ptrs.size() != items.size()) {
    return InvalidArgumentError(fmt::format("{}: {} pointers, {} lengths, {} item lengths", what,
                                            ptrs.size(), lens.size(), items.size()));
  }
  for (size_t i = 0; i < ptrs.size(); ++i) {
    if (ptrs[i] == 0 || lens[i] == 0 || items[i] == 0 || items[i] > lens[i]) {
      return InvalidArgumentError(fmt::format("{}[{}]: pointer {:#x}, length {}, item length {}",
                                              what, i, ptrs[i], lens[i], items[i]));
    }
  }
  return Status();
}

Status ValidateOptions(const ManagerOptions& o) {
  if (o.role == Role::kBootstrap) return InvalidArgumentError("role must be prefill or decode");
  const KVArgs& a = o.args;
  if (a.kv_data_ptrs.empty()) return InvalidArgumentError("kv_data_ptrs is empty");
  KVB_RETURN_IF_ERROR(CheckBuffers("kv", a.kv_data_ptrs, a.kv_data_lens, a.kv_item_lens));
  KVB_RETURN_IF_ERROR(CheckBuffers("aux", a.aux_data_ptrs, a.aux_data_lens, a.aux_item_lens));
  KVB_RETURN_IF_ERROR(
      CheckBuffers("state", a.state_data_ptrs, a.state_data_lens, a.state_item_lens));
  if (a.page_size < 1) return InvalidArgumentError(fmt::format("page_size {}", a.page_size));
  const ParallelLayout& p = o.parallel;
  for (auto [name, size, rank] : {std::tuple{"tp", p.tp_size, p.tp_rank},
                                  {"dp", p.dp_size, p.dp_rank},
                                  {"pp", p.pp_size, p.pp_rank},
                                  {"cp", p.cp_size, p.cp_rank}}) {
    if (size < 1 || rank < 0 || rank >= size)
      return InvalidArgumentError(fmt::format("{} rank {} of size {}", name, rank, size));
    if (size > kMaxParallelSize)  // what peers accept on the wire (protocol.h)
      return InvalidArgumentError(
          fmt::format("{} size {} exceeds the limit of {}", name, size, kMaxParallelSize));
  }
  if (o.role == Role::kDecode && p.cp_size > 1)  // as sglang's decode asserts
    return InvalidArgumentError(fmt::format(
        "cp size {} on a decode rank: decode takes no context parallelism (cp 1); it reads "
        "from prefill cp rank 0, or from every cp rank with all_cp_ranks",
        p.cp_size));
  if (o.heartbeat_interval.count() <= 0 || o.heartbeat_misses < 1)
    return InvalidArgumentError("heartbeat_interval and heartbeat_misses must be positive");
  if (o.max_pending_requests < 1)
    return InvalidArgumentError("max_pending_requests must be at least 1");
  KVB_RETURN_IF_ERROR(ValidateInstanceId("instance_id", o.instance_id));
  KVB_RETURN_IF_ERROR(CheckHostAddress("advertise_host", o.advertise_host));
  if (o.role == Role::kPrefill && !o.instance_id.empty())
    return InvalidArgumentError("instance_id '" + o.instance_id +
                                "' on a prefill rank: prefill instances are told apart by their "
                                "bootstrap server; leave it empty");
  return Status();
}

}  // namespace

ManagerImpl::ManagerImpl(const ManagerOptions& options, CoreHooks hooks)
    : opts_(options),
      hooks_(std::move(hooks)),
      clock_(hooks_.clock ? hooks_.clock.get() : &Clock::System()),
      next_generation_(NewIncarnation() & 0x0000ffffffffffffull) {}

Result<std::unique_ptr<ManagerImpl>> ManagerImpl::Create(const ManagerOptions& options,
                                                         std::unique_ptr<Transport> transport,
                                                         CoreHooks hooks) {
  KVB_RETURN_IF_ERROR(ValidateOptions(options));
  std::unique_ptr<ManagerImpl> m(new ManagerImpl(options, std::move(hooks)));
  m->transport_ = std::move(transport);
  KVB_RETURN_IF_ERROR(m->Start());
  return m;
}

Status ManagerImpl::Start() {
  SetIdentity();
  KVB_RETURN_IF_ERROR(SetLayout());
  // Every message from here on is sealed or a handshake (peer_auth.h).
  KVB_ASSIGN_OR_RETURN(std::string token, ResolveAuthToken(opts_.auth_token, self_.ShortName()));
  KVB_RETURN_IF_ERROR(StartTransport(token));
  KVB_RETURN_IF_ERROR(StartRegistry(token));
  KVB_RETURN_IF_ERROR(RegisterSelf());
  StartThreads();
  KVB_LOG_INFO("manager up: {} incarnation {:#x}, transport {}", self_.ToString(),
               incarnation_.load(), transport_->Name());
  return Status();
}

void ManagerImpl::SetIdentity() {
  const ParallelLayout& p = opts_.parallel;
  self_.role = opts_.role;
  self_.dp = p.dp_rank;
  self_.tp = p.tp_rank;
  self_.pp = p.pp_rank;
  self_.cp = p.cp_rank;
  self_.host = ThisHost().host;
  self_.boot_id = hooks_.boot_id ? *hooks_.boot_id : ThisHost().boot_id;
  self_.pid = ThisHost().pid;
  incarnation_.store(NewIncarnation());
  self_.instance = opts_.instance_id;
  SetLogIdentity(self_.ShortName());
}

Status ManagerImpl::SetLayout() {
  KVB_ASSIGN_OR_RETURN(layout_, LayoutFromOptions(opts_));
  return Status();
}

Status ManagerImpl::StartTransport(const std::string& token) {
  if (!transport_) {
    UcxTransportOptions t;
    t.tls = opts_.ucx_tls;
    t.same_host_paths = opts_.same_host_path == SameHostPath::kAuto;
    t.name = self_.ShortName();
    KVB_ASSIGN_OR_RETURN(transport_, CreateUcxTransport(t));
  }
  // Up before any handler can run: transport threads count into it.
  if (opts_.metrics_port != 0) {
    KVB_ASSIGN_OR_RETURN(metrics_, ManagerMetrics::Start(opts_.metrics_port, opts_.role,
                                                         [this] { return Stats(); }));
    KVB_LOG_INFO("metrics on port {}", metrics_->port());
  }
  handshake_ = std::make_unique<HandshakeAuth>(token);
  KVB_ASSIGN_OR_RETURN(challenge_maker_, ChallengeMaker::Create());
  auto auth = std::make_unique<AuthTransport>(std::move(transport_));
  auth_ = auth.get();
  transport_ = std::move(auth);
  auth_->SetAuthHandlers(
      [this](std::string_view bytes, const RankId* proven) {
        IfOpen([&] { OnMessage(bytes, proven); });
      },
      [this](const Status& why) { IfOpen([&] { DropUnauthenticated(why.message()); }); });
  transport_->SetPeerFailureHandler(
      [this](PeerId peer, const Status& why) { IfOpen([&] { OnPeerFailure(peer, why); }); });

  KVB_RETURN_IF_ERROR(RegisterSpans(layout_.kv, &regions_.kv, &kv_keys_));
  KVB_RETURN_IF_ERROR(RegisterSpans(layout_.aux, &regions_.aux, &aux_keys_));
  KVB_RETURN_IF_ERROR(RegisterSpans(layout_.state, &regions_.state, &state_keys_));
  engine_ = std::make_unique<TransferEngine>(*transport_, regions_);
  return Status();
}

Status ManagerImpl::RegisterSpans(const std::vector<BufferSpan>& spans, std::vector<RegionId>* ids,
                                  std::vector<std::string>* keys) {
  for (const BufferSpan& s : spans) {
    KVB_ASSIGN_OR_RETURN(RegisteredRegion r,
                         transport_->RegisterMemory(reinterpret_cast<void*>(s.addr), s.length,
                                                    opts_.args.memory_kind));
    ids->push_back(r.id);
    keys->push_back(std::move(r.remote_key));
  }
  return Status();
}

Status ManagerImpl::StartRegistry(const std::string& token) {
  const ParallelLayout& p = opts_.parallel;
  KVB_ASSIGN_OR_RETURN(
      registry_,
      CreateRegistryClient(opts_.registry, opts_.bootstrap_addr, std::chrono::milliseconds(2000),
                           token, opts_.heartbeat_interval * opts_.heartbeat_misses));
  bool first_prefill = opts_.role == Role::kPrefill && p.tp_rank == 0 && p.dp_rank == 0 &&
                       p.pp_rank == 0 && p.cp_rank == 0;
  if (!first_prefill || !opts_.start_bootstrap_server || IsEtcdRegistry(opts_.registry) ||
      registry_->Health().ok()) {
    return Status();
  }
  auto* bootstrap = static_cast<BootstrapClient*>(registry_.get());
  BootstrapServerOptions so;
  so.host = bootstrap->host();
  so.port = bootstrap->port();
  so.auth_token = token;
  so.unresponsive_after = opts_.heartbeat_interval * opts_.heartbeat_misses;
  so.dead_after = std::max(so.dead_after, so.unresponsive_after);
  auto server = BootstrapServer::Start(so);
  if (!server.ok()) return server.status().WithContext("embedded bootstrap server");
  embedded_server_ = std::move(server).value();
  KVB_LOG_INFO("embedded bootstrap server listening on {}", embedded_server_->address());
  return Status();
}

// Registers this rank (a decode rank not with sglang's server); prefill serves its record.
Status ManagerImpl::RegisterSelf() {
  if (!IsEtcdRegistry(opts_.registry)) {
    Result<bool> speaks = static_cast<BootstrapClient*>(registry_.get())->SpeaksKvbridge();
    sglang_registry_ = speaks.ok() && !*speaks;
    if (sglang_registry_)
      KVB_LOG_INFO(
          "bootstrap server {} is sglang's own (no /heartbeat, /failure, /failures): liveness "
          "from peers only, failure records travel between peers{}",
          registry_->address(), opts_.role == Role::kDecode ? "; decode ranks are not listed" : "");
  }
  int rank_port = 0;
  if (opts_.role == Role::kPrefill) {
    // sglang's server keeps rank_ip and rank_port only: the rest is served
    // there (RankEndpoint).
    auto endpoint = RankEndpoint::Start(opts_.advertise_host);
    if (endpoint.ok()) {
      rank_endpoint_ = std::move(endpoint).value();
      rank_port = rank_endpoint_->port();
    } else if (sglang_registry_) {
      return endpoint.status().WithContext("serving this rank's record for sglang's server");
    } else {
      KVB_LOG_WARN("rank record not served at {}: {}", opts_.advertise_host,
                   endpoint.status().ToString());
    }
  }
  RankRecord rec = MakeRankRecord();
  if (rank_port != 0) rec.rank_port = rank_port;
  if (rank_endpoint_) rank_endpoint_->SetRecord(rec.ToJson().dump());
  Status registered = ListRank(rec);
  if (registered.ok()) return Status();
  // A wrong secret is a deployment error that no retry mends.
  if (opts_.role == Role::kPrefill || registered.code() == StatusCode::kUnauthenticated) {
    return registered.WithContext("registering with bootstrap");
  }
  KVB_LOG_WARN("decode rank not listed in the bootstrap registry: {}", registered.ToString());
  return Status();
}

void ManagerImpl::Wake(bool* flag) {
  {
    std::lock_guard<std::mutex> lock(ticker_mu_);
    *flag = true;
  }
  ticker_cv_.notify_all();
}

void ManagerImpl::StartThreads() {
  // A registry that pushes changes (etcd's watch) wakes the registry thread.
  registry_->SetChangeCallback([this] { WakeRegistryRound(); });
  // Each thread is named for `top -H` and perf ("kvb-tick", ...).
  if (!hooks_.manual_ticks)
    ticker_ = std::thread([this] { EveryHeartbeat("kvb-tick", [this] { Tick(); }); });
  registry_thread_ = std::thread([this] {
    uint64_t round = 0;
    EveryHeartbeat(
        "kvb-registry", [&] { RegistryRound(round++); }, &registry_wake_);
  });
  beat_thread_ = std::thread([this] { EveryHeartbeat("kvb-beat", [this] { BeatRound(); }); });
  if (hooks_.manual_ticks) return;
  resolver_ = std::thread([this] {
    EveryHeartbeat(
        "kvb-resolve", [this] { ResolveRound(); }, &resolver_wake_);
  });
  fencer_ = std::thread([this] { EveryHeartbeat("kvb-fence", [this] { FenceRound(); }); });
  acceptor_ = std::thread([this] {
    EveryHeartbeat(
        "kvb-accept", [this] { AcceptRound(); }, &accept_wake_);
  });
}

ManagerImpl::~ManagerImpl() {
  {
    std::lock_guard<std::mutex> lock(ticker_mu_);
    stop_ = true;
  }
  ticker_cv_.notify_all();
  if (ticker_.joinable()) ticker_.join();
  if (registry_thread_.joinable()) registry_thread_.join();
  if (beat_thread_.joinable()) beat_thread_.join();
  if (resolver_.joinable()) resolver_.join();
  if (fencer_.joinable()) fencer_.join();
  if (acceptor_.joinable()) acceptor_.join();
  PublishBeforeGoing();
  if (registry_) registry_->SetChangeCallback(nullptr);
  // Transport threads may still deliver messages and completions that flush
  // work: from now none reaches engine or transport (gone once none flushes).
  closing_.store(true);
  while (flushing_.load() != 0) std::this_thread::yield();
  engine_.reset();  // queued chunks complete Aborted (OnChunkDone: metrics still up)
  if (transport_) {
    for (RegionId id : regions_.kv) transport_->DeregisterMemory(id).IgnoreError();
    for (RegionId id : regions_.aux) transport_->DeregisterMemory(id).IgnoreError();
    for (RegionId id : regions_.state) transport_->DeregisterMemory(id).IgnoreError();
  }
  transport_.reset();  // joins its threads: no callback runs after this
  metrics_.reset();
  embedded_server_.reset();
}

std::string ManagerImpl::PeerKey(const RankId& id) {
  return fmt::format("{}{}/dp{}/tp{}/pp{}/cp{}", RoleName(id.role),
                     id.instance.empty() ? "" : "[" + id.instance + "]", id.dp, id.tp, id.pp,
                     id.cp);
}

Peer* ManagerImpl::FindPeerLocked(const std::string& key) {
  auto it = peers_.find(key);
  return it == peers_.end() ? nullptr : it->second.get();
}

std::vector<PeerSnapshot> ManagerImpl::Peers() const {
  MutexLock lock(mu_);
  std::vector<PeerSnapshot> out;
  for (const auto& [key, p] : peers_)
    out.push_back({p->id, p->tpeer, p->ready, p->failed, p->last_heard, p->fenced, p->acked});
  return out;
}

Peer* ManagerImpl::PeerFromLocked(const RankId& from) {
  Peer* p = FindPeerLocked(PeerKey(from));
  if (p == nullptr || p->id->incarnation != from.incarnation) return nullptr;
  return p;
}

void ManagerImpl::Send(Outbox& out, Peer& peer, const MessageBody& body, Lane lane) {
  if (peer.tpeer == 0) return;
  if (!peer.acked) {
    peer.held.push_back(EncodeMessage(Self(), body));
    return;
  }
  if (lane == Lane::kUrgent) {
    out.urgent.emplace_back(peer.tpeer, EncodeMessage(Self(), body));
  } else {
    out.messages.emplace_back(peer.tpeer, EncodeMessage(Self(), body), lane == Lane::kOrdered);
  }
}

void ManagerImpl::Flush(Outbox& out) {
  flushing_.fetch_add(1);
  if (closing_.load()) {  // shutting down: the engine may be gone (~ManagerImpl)
    flushing_.fetch_sub(1);
    for (auto& post : out.posts) post.done(AbortedError("manager shut down"), 0, 0);
    out = Outbox();
    return;
  }
  for (auto& [peer, bytes] : out.urgent) {
    Status s = transport_->SendUrgentMessage(peer, std::move(bytes));
    if (!s.ok()) KVB_LOG_DEBUG("urgent message to peer {} not sent: {}", peer, s.ToString());
  }
  out.urgent.clear();
  for (OutMessage& m : out.messages) {
    Status s = m.fenced ? transport_->SendMessage(m.peer, std::move(m.bytes))
                        : transport_->SendMessageUnfenced(m.peer, std::move(m.bytes));
    if (!s.ok()) KVB_LOG_DEBUG("message to peer {} not sent: {}", m.peer, s.ToString());
  }
  out.messages.clear();
  for (auto& post : out.posts) {
    engine_->PostChunk(post.peer, std::move(post.remote), std::move(post.runs),
                       std::move(post.notify), std::move(post.done));
  }
  out.posts.clear();
  for (PeerId p : out.disconnect) transport_->Disconnect(p);
  out.disconnect.clear();
  if (std::exchange(out.wake_registry, false)) WakeRegistryRound();
  flushing_.fetch_sub(1);
}

FailureRecord ManagerImpl::MakeRecord(const RankId& origin, FailureCause cause, std::string detail,
                                      Phase phase, std::string mechanism) const {
  FailureRecord r;
  r.origin = origin;
  r.cause = cause;
  r.detail = ClipRecordText(std::move(detail));  // an application's reason may be long
  r.phase = phase;
  r.detected_by = Self();
  r.mechanism = std::move(mechanism);
  r.detected_at = WallNow();
  r.last_sign_of_life = r.detected_at;
  r.hint = std::string(FailureHint(cause));
  r.is_from_another_rank = IsFromAnotherRank(origin);
  return r;
}

bool ManagerImpl::IsFromAnotherRank(const RankId& origin) const {
  return !(origin.SameRank(Self()) && origin.pid == self_.pid);
}

template <typename Room>
bool ManagerImpl::MarkRoomFailedLocked(Room& room, FailureRecord& record) {
  std::optional<FailureRecord> kept =
      RoomFailure(room.poll(), room.failure.has_value(), room.room, room.phase, record);
  if (!kept) return false;
  record = std::move(*kept);
  record.is_from_another_rank = IsFromAnotherRank(record.origin);
  room.failure = record;
  changes_.Set(room, KVPoll::kFailed);
  ++failed_;
  if (metrics_) {
    metrics_->Failed(record.cause);
    metrics_->Finished(false, std::chrono::duration<double>(Now() - room.created).count());
  }
  KVB_LOG_WARN("{}", record.Message());
  if (PublishesRoomRecord(
          record, record.detected_by.SameRank(Self()) && record.detected_by.pid == self_.pid))
    PublishLocked(record);
  room_records_cv_.notify_all();
  return true;
}
template bool ManagerImpl::MarkRoomFailedLocked(SenderRoom&, FailureRecord&);
template bool ManagerImpl::MarkRoomFailedLocked(ReceiverRoom&, FailureRecord&);

void ManagerImpl::OnMessage(std::string_view bytes, const RankId* proven) {
  KVB_LOG_TRACE("control message of {} bytes", bytes.size());
  Result<Message> decoded = DecodeMessage(bytes);
  if (!decoded.ok()) {
    ++invalid_dropped_;
    KVB_LOG_WARN("dropping control message: {}", decoded.status().ToString());
    return;
  }
  Message m = std::move(decoded).value();
  if (!Admit(m, proven)) return;
  if (auto* hello = std::get_if<HelloMsg>(&m.body)) {
    OnHello(m.from, std::move(*hello), bytes);
    return;
  }
  if (auto* challenge = std::get_if<HelloChallengeMsg>(&m.body)) {
    OnHelloChallenge(m.from, *challenge);
    return;
  }
  if (auto* proof = std::get_if<HelloProofMsg>(&m.body)) {
    OnHelloProof(m.from, *proof);
    return;
  }
  Outbox out;
  {
    MutexLock lock(mu_);
    Peer* peer = PeerFromLocked(m.from);
    if (peer != nullptr) {
      peer->heard_since_ready = peer->heard_since_ready || peer->ready;
      peer->last_heard = Now();
      peer->last_heard_wall = WallNow();
    }
    std::visit(
        [&](auto& body) KVB_REQUIRES(mu_) {
          using T = std::decay_t<decltype(body)>;
          if constexpr (std::is_same_v<T, HelloAckMsg>) {
            if (peer != nullptr) OnHelloAckLocked(*peer, body, out);
          } else if constexpr (std::is_same_v<T, MetaMsg>) {
            OnMeta(m.from, std::move(body), out);
          } else if constexpr (std::is_same_v<T, NotifyMsg>) {
            OnNotify(m.from, body, out);
          } else if constexpr (std::is_same_v<T, RoomFailedMsg>) {
            body.record = AsTakenFromPeer(std::move(body.record), m.from, Self(), WallNow());
            if (opts_.role == Role::kPrefill) {
              OnDecodeRoomFailed(m.from, body, out);
            } else {
              OnPrefillRoomFailed(m.from, body, out);
            }
          } else if constexpr (std::is_same_v<T, QuiescedMsg>) {
            OnQuiesced(m.from, body, out);
          } else if constexpr (std::is_same_v<T, RankFailedMsg>) {
            ApplyRankFailureLocked(AsTakenFromPeer(body.record, m.from, Self(), WallNow()), out);
          }
        },
        m.body);
    // After it: a notice it carried fenced this rank, which tells nobody.
    if (Peer* again = PeerFromLocked(m.from)) TellFailedPeerLocked(*again, out);
  }
  Flush(out);
}

void ManagerImpl::OnHelloAckLocked(Peer& peer, const HelloAckMsg& ack, Outbox& out) {
  if (ack.code == kRefusedAsDeclaredFailed) {
    // Prefill holds a record that declared this process failed. Its answer is
    // a sign of life; the endpoint it closes is let go, the handshake tried
    // again, and the registry, asked now, tells this rank (which fences itself
    // and comes back as a new incarnation). One refusal per attempt, none
    // once answered (TakesRefusal, hello_rule.h).
    if (!TakesRefusal(peer.acked, peer.refused_attempt, peer.hello_attempts)) return;
    peer.refused_attempt = peer.hello_attempts;
    ++peer.refusals;
    peer.refusal = ack.message.substr(0, Peer::kMaxRefusalText);
    peer.notice = false;  // met again to tell it: that session is refused too
    KVB_LOG_WARN("{} refused this process's handshake: {}", peer.key, peer.refusal);
    by_tpeer_.erase(peer.tpeer);
    out.wake_registry = true;
    return;
  }
  if (peer.notice) {  // met again only to be told (MeetPrefillAgain); OnMessage tells it
    peer.notice = false;
    peer.acked = true;
    return;
  }
  // An answered session is not judged again (a Hello sent twice, a stream).
  if (peer.failed || peer.acked) return;
  if (ack.code != StatusCode::kOk) {
    FailPeerLocked(peer, FailureCause::kLayoutMismatch, ack.message, "handshake", out);
    return;
  }
  peer.acked = true;
  // The writer chose the path when it mapped this rank's regions; it says
  // which in the ack (this rank imports nothing of its own from a writer).
  const std::string wire = transport_->WireTo(peer.tpeer);
  KVB_LOG_INFO(
      "connected to {} via {}{}{}", peer.key,
      ack.path.empty() ? std::string_view("? (the peer did not say)") : std::string_view(ack.path),
      wire.empty() ? "" : " over ", wire);
  if (peer.hello_attempts > 1)
    KVB_LOG_INFO("{} answered handshake attempt {}", peer.key, peer.hello_attempts);
  for (std::string& bytes : peer.held) out.messages.emplace_back(peer.tpeer, std::move(bytes));
  peer.held.clear();
  OnPeerAckedLocked(peer, out);
}

void ManagerImpl::ReportFatal(const std::string& reason) {
  Outbox out;
  {
    MutexLock lock(mu_);
    fatal_ = MakeRecord(Self(), FailureCause::kLocalError, reason, Phase::kTransferring,
                        "application report");
    KVB_LOG_ERROR("fatal error reported: {}", reason);
    recent_rank_failure_ = fatal_;
    PublishLocked(*fatal_);
    for (auto& [key, peer] : peers_)
      if (!peer->failed) Send(out, *peer, RankFailedMsg{*fatal_});
    for (auto& [id, room] : senders_) {
      if (room->failure) continue;
      FailSenderLocked(*room, *fatal_, out);  // room and phase: MarkRoomFailedLocked
    }
    for (auto& [id, room] : receivers_) {
      if (room->failure) continue;
      FailReceiverLocked(*room, *fatal_, out);  // room, generation, phase: set there
    }
  }
  Flush(out);
}

ManagerStats ManagerImpl::Stats() const {
  ManagerStats s;
  MutexLock lock(mu_);
  auto count = [&](KVPoll p, uint64_t restart_check) {
    s.rooms_awaiting_restart_check += restart_check != 0;
    if (p == KVPoll::kBootstrapping) ++s.rooms_bootstrapping;
    if (p == KVPoll::kWaitingForInput) ++s.rooms_waiting;
    if (p == KVPoll::kTransferring) ++s.rooms_transferring;
  };
  for (auto& [id, r] : senders_) count(r->poll(), r->restart_check);
  for (auto& [id, r] : receivers_) count(r->poll(), r->restart_check);
  s.rooms_live = senders_.size() + receivers_.size();
  s.rooms_succeeded = succeeded_;
  s.rooms_failed = failed_;
  s.bytes_written = bytes_written_;
  s.write_ops = write_ops_;
  s.chunks_sent = chunks_sent_;
  s.stale_messages_dropped = stale_dropped_;
  s.rejoins = rejoins_;
  s.rejoin_waits = rejoin_waits_;
  s.invalid_messages_dropped = invalid_dropped_;
  s.unauthenticated_messages_dropped = unauth_dropped_;
  s.pending_metadata = inbox_.held_metadata();
  s.heartbeat_rounds = heartbeat_seq_.load();
  s.failure_records_unpublished = publish_queue_.size() + publishing_;
  for (auto& [key, p] : peers_) {
    s.peers_connected += (p->ready && !p->failed) ? 1 : 0;
    s.handshakes_refused_as_declared_failed += p->refusals;
  }
  return s;
}

}  // namespace kvbridge::internal

// ManagerImpl: the state machines behind KVManager, KVSender and KVReceiver.
//
// Lock discipline: one mutex (mu_) guards peers, rooms and pending metadata;
// clang's -Wthread-safety checks the annotations (the TSan build).
// Transport and engine calls are never made while holding it: handlers fill
// an Outbox under the lock and Flush() it after unlocking, so a transport
// thread that calls back into us can never deadlock against a caller.
//
// Threads: transport threads deliver messages (OnMessage) and peer failures
// (OnPeerFailure); the engine thread posts writes; the ticker thread sends
// heartbeats, checks liveness and phase deadlines; the acceptor thread
// takes proven Hellos (AcceptRound); the rest: StartThreads.
#pragma once

#include <atomic>
#include <condition_variable>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "common/process.h"
#include "common/thread_annotations.h"
#include "connector/auth_transport.h"
#include "connector/challenge_table.h"
#include "connector/core_hooks.h"
#include "connector/manager_metrics.h"
#include "connector/outbox.h"
#include "connector/peer_auth.h"
#include "connector/peer_state.h"
#include "connector/protocol.h"
#include "connector/rooms.h"
#include "connector/sender_inbox.h"
#include "connector/write_rule.h"
#include "control/bootstrap_client.h"
#include "control/rank_endpoint.h"
#include "control/registry_client.h"
#include "engine/engine.h"
#include "kvbridge/bootstrap.h"
#include "kvbridge/manager.h"
#include "kvbridge/options.h"
#include "transport/transport.h"

namespace kvbridge::internal {

// The registry's role for a rank, and the rank a registry record describes.
RankRole ToRankRole(Role r);
RankId RankIdOf(const RankRecord& record);
// A random non-zero incarnation, new for every process start and rejoin.
uint64_t NewIncarnation();

class ManagerImpl {
 public:
  // Tests: `transport` replaces UCX's; `hooks`: clock, ticking (core_hooks.h).
  static Result<std::unique_ptr<ManagerImpl>> Create(const ManagerOptions& options,
                                                     std::unique_ptr<Transport> transport = {},
                                                     CoreHooks hooks = {});
  ~ManagerImpl();

  RankId self() const { return Self(); }  // as peers know it now (a rejoin: new incarnation)
  // The core's time (CoreHooks::clock): deadlines, silences, records.
  SteadyTime Now() const { return clock_->Steady(); }
  WallTime WallNow() const { return clock_->Wall(); }
  // A liveness round (beats, silences, phase deadlines) at Now(), a fence
  // and a resolver round on the caller's thread: what the ticker, fence and
  // resolver threads run each interval (CoreHooks::manual_ticks tests).
  void TickNow() {
    Tick();
    FenceRound();
    ResolveRound();
  }
  const ManagerOptions& options() const { return opts_; }
  const std::string& bootstrap_addr() const { return opts_.bootstrap_addr; }
  const RankLayout& layout() const { return layout_; }
  int metrics_port() const { return metrics_ ? metrics_->port() : 0; }
  Transport& transport() { return *transport_; }

  // Prefill side (sender_side.cc).
  Result<std::shared_ptr<SenderRoom>> NewSender(uint64_t room);
  void ReleaseSender(const std::shared_ptr<SenderRoom>& room);
  Status SenderInit(SenderRoom& room, int64_t num_pages, int64_t aux_index);
  Status SenderSend(const std::shared_ptr<SenderRoom>& room, std::span<const int32_t> pages,
                    std::span<const int32_t> state);
  // Abort(): cause kAborted; Reject(reason): kInvalidRequest with `reason`.
  void SenderAbort(const std::shared_ptr<SenderRoom>& room,
                   FailureCause cause = FailureCause::kAborted,
                   std::string detail = "aborted by the application",
                   const char* mechanism = "Abort()");
  std::optional<FailureRecord> SenderFailure(const SenderRoom& room) const;

  // Decode side (receiver_side.cc).
  Result<std::shared_ptr<ReceiverRoom>> NewReceiver(uint64_t room);
  void ReleaseReceiver(const std::shared_ptr<ReceiverRoom>& room);
  // Checks; resolves the sources from facts held, else wakes the resolver.
  Status ReceiverInit(const std::shared_ptr<ReceiverRoom>& room, int prefill_dp_rank);
  Status ReceiverSendMetadata(const std::shared_ptr<ReceiverRoom>& room,
                              std::span<const int32_t> pages, int64_t aux_index,
                              std::span<const int32_t> state, int64_t decode_prefix_len);
  void ReceiverAbort(const std::shared_ptr<ReceiverRoom>& room,
                     FailureCause cause = FailureCause::kAborted,
                     std::string detail = "aborted by the application",
                     const char* mechanism = "Abort()");  // as SenderAbort
  // Waits (blocking) for Quiesced or `timeout`; returns Quiesced.
  bool WaitReceiverQuiesced(const ReceiverRoom& room, std::chrono::milliseconds timeout);
  FailureRecord ReceiverFailAsGroup(const std::shared_ptr<ReceiverRoom>& room);
  std::optional<FailureRecord> ReceiverFailure(const ReceiverRoom& room) const;

  void ReportFatal(const std::string& reason);
  ManagerStats Stats() const;
  // The latest rank failure known here: what a request that did not fail here blames.
  std::optional<FailureRecord> RecentRankFailure() const;
  std::vector<PeerSnapshot> Peers() const;
  // KVManager::TakeChangedRooms (FailedPrecondition unless list_room_changes).
  Result<std::vector<uint64_t>> TakeChangedRooms();
  // Tests: judge liveness as across machines (no /proc's ten-limit grace);
  // apply a record here as if the registry had said it (and publish it).
  void JudgeLivenessAsRemoteForTest() { liveness_as_remote_ = true; }
  void ApplyRecordForTest(const FailureRecord& record, bool publish);
  // Best effort from a dying process (fatal signal, std::terminate): tell
  // peers and the registry who died and why. Never blocks for long.
  void LastWords(const std::string& reason);

 private:
  ManagerImpl(const ManagerOptions& options, CoreHooks hooks);
  // Start() runs the steps below in this order; an error stops it.
  Status Start();
  void SetIdentity();
  Status SetLayout();  // from KVArgs; checked
  // The transport (UCX unless one was given) wrapped in AuthTransport, the
  // metrics server, this rank's registered memory, and the engine.
  Status StartTransport(const std::string& token);
  Status RegisterSpans(const std::vector<BufferSpan>& spans, std::vector<RegionId>* ids,
                       std::vector<std::string>* keys);
  // The registry client; prefill rank 0 embeds the bootstrap server when
  // none answers at the bootstrap address (and etcd is not the registry).
  Status StartRegistry(const std::string& token);
  // This rank's registry record, under `incarnation` (0: its own).
  RankRecord MakeRankRecord(uint64_t incarnation = 0) const;
  // Lists this rank and, on prefill, serves its record at its rank_port.
  Status RegisterSelf();
  Status ListRank(const RankRecord& rec);  // not a decode rank on sglang's server
  void StartThreads();                     // ticker, registry and resolver
  void Flush(Outbox& out);
  // Queues `body` for `peer`; held until the handshake with it is answered.
  void Send(Outbox& out, Peer& peer, const MessageBody& body, Lane lane = Lane::kOrdered)
      KVB_REQUIRES(mu_);

  // Messages and transport events (manager_impl.cc). `proven`: the rank
  // whose session the message opened under; null for a plain message.
  void OnMessage(std::string_view bytes, const RankId* proven);
  void OnPeerFailure(PeerId peer, const Status& why);

  // The authenticated handshake (handshake.cc, peer_auth.h).
  // Connects to the prefill rank at `position` unless already connected;
  // `registered` gets its registry record once read (the position at the
  // host of a rank endpoint that did not answer, with sglang's server). With
  // `notice`, a failed rank at the same incarnation is met again to be told.
  Result<std::string> EnsurePrefillPeer(const RankId& position, RankId* registered,
                                        const FailureRecord* notice = nullptr);
  // Decode: `old`, held at the position `fresh` (a new incarnation, or the
  // same one met again only to tell it, `same`) takes: failed unless it was,
  // its sources settled, its beat dropped, its grant left to revoke. Returns
  // its endpoint, to close once the lock is let go.
  PeerId RetirePrefillPeerLocked(Peer& old, Peer& fresh, bool same, Outbox& out) KVB_REQUIRES(mu_);
  HelloMsg MakeHello() const;
  // Sends the Hello to `key` again on a new endpoint; drops the unanswered one.
  void RetryHello(const std::string& key);
  // Whether a decoded message may be applied: a plain one only when it is a
  // handshake message this role takes; a sealed one only when it names the
  // rank its session proved (and a RankFailed only about that rank).
  bool Admit(const Message& m, const RankId* proven);
  // Counts and logs (the first few, then every 1000th) a dropped message.
  void DropUnauthenticated(const std::string& why);
  // Decode: sends a fresh Hello to the prefill rank at `key` on `tpeer`.
  Status SendHello(const std::string& key, PeerId tpeer);
  // Prefill: a Hello (not yet proven): connects back and challenges it.
  void OnHello(const RankId& from, HelloMsg hello, std::string_view bytes);
  // Decode: checks prefill's proof, binds the session, proves itself.
  void OnHelloChallenge(const RankId& from, const HelloChallengeMsg& c);
  // Prefill: checks decode's proof; then queues it for AcceptRound.
  void OnHelloProof(const RankId& from, const HelloProofMsg& p);
  // Prefill: a proven Hello: old peer's fate, regions imported, sealed answer.
  void AcceptHello(PendingAccept accept);
  // Outdated (no answer): a rejoin here since the proof, or its endpoint failed.
  bool StaleAcceptLocked(const PendingAccept& a) const KVB_REQUIRES(mu_);
  void NoPeersEndpointFailedLocked(PeerId tpeer, const Status& why, Outbox& out) KVB_REQUIRES(mu_);
  bool DeclaredFailedLocked(const RankId& id) const KVB_REQUIRES(mu_);  // a record applied here
  // Carries out what a proven Hello on `*fresh` does to the peer at its
  // position (hello_rule.h): true when the Hello makes no peer (the held one
  // stays; with sglang's server it may take `*fresh`, set to 0; a process
  // declared failed is told); else the held one is gone, `stale` its endpoint.
  bool KeepOldPeerLocked(const RankId& from, const AuthTransport::Binding& b, Outbox& out,
                         PeerId* fresh, PeerId* stale) KVB_REQUIRES(mu_);
  void RefuseDeclaredFailedLocked(const RankId& from, const AuthTransport::Binding& b, PeerId fresh,
                                  Outbox& out) KVB_REQUIRES(mu_);  // kToldItFailed
  void Tick();
  // Ticker: says once per step that the transport's delivery thread is stuck
  // in it (Tick's reading of Transport::DeliveryBusy, past half the limit).
  void WarnStuckDelivery(const std::optional<StepWatch::Busy>& stuck);
  // Runs `round` every heartbeat interval until the manager stops (each
  // thread's loop); with `wake` (ticker_mu_), also once it is set (cleared).
  void EveryHeartbeat(const char* name, const std::function<void()>& round, bool* wake = nullptr);
  // Runs now the round whose `flag` (ticker_mu_) is set: registry, resolver, acceptor.
  void Wake(bool* flag);
  void WakeRegistryRound() { Wake(&registry_wake_); }
  void WakeResolver() { Wake(&resolver_wake_); }
  // Acceptor thread: AcceptHello for each proven Hello queued (accept.cc).
  void AcceptRound();
  // Lookups, connects and handshake retries the ticker asks for: they wait on
  // the network, so they run on the resolver thread, never delaying a beat.
  void ResolveRound();
  void OpenBeatEndpoints();  // Peer::beat for each proven peer lacking one
  void MeetPrefillAgain();   // decode, sglang's server: retired, or failed across hosts
  // Opens `key`'s heartbeat endpoint and takes it if the peer still uses
  // `tpeer` and has none (blocks for the connect: no lock held).
  void OpenBeat(const std::string& key, const std::string& address, PeerId tpeer) KVB_EXCLUDES(mu_);
  // Revokes the grants of failed peers (fence_pending_), then counts their
  // rooms' sources quiesced. Its own thread (and a rejoin's): a revoke waits
  // for writes admitted under it to land, and a new request's lookups must not.
  void FenceRound();
  // The Hello's keys for `key`: its own grants when it gets them.
  Status GrantKeysFor(const std::string& key, HelloMsg& hello);
  // Forgets `peer`'s heartbeat endpoint and queues it for closing.
  void DropBeatLocked(Peer& peer, Outbox& out) KVB_REQUIRES(mu_);

  // Peers.
  static std::string PeerKey(const RankId& id);
  Peer* FindPeerLocked(const std::string& key) KVB_REQUIRES(mu_);
  Peer* PeerFromLocked(const RankId& from) KVB_REQUIRES(mu_);  // nullptr when unknown or stale
  // The one same-host test of the connector (SameHost), so /proc speaks for it.
  bool OnThisHost(const RankId& id) const;
  // The one rule for a writer no revoke stops: it maps our pages (peers.cc).
  bool WritesByMapping(const RankId& id) const;
  // What /proc says of a rank's process: kUnknown unless it is on this host.
  ProcessState LocalProcessState(const RankId& id) const;
  // The one reading of a transport error about `peer` (a failed endpoint or
  // write): exited when /proc on this host says so, else unreachable.
  std::pair<FailureCause, std::string> TransportErrorCause(const RankId& peer,
                                                           const Status& why) const;
  // Blames a silent peer: exited when /proc says so, unreachable when it is
  // on another host (nothing to read there), else unresponsive (naming a
  // stopped process); `silence` says what it failed to do.
  void FailSilentPeerLocked(Peer& peer, ProcessState ps, const std::string& silence,
                            const char* mechanism, Outbox& out) KVB_REQUIRES(mu_);
  // The detail of a silent rank on another host.
  std::string RemoteSilence(const RankId& id, const std::string& silence) const;
  // Marks `peer` failed and fails every room touching it.
  void FailPeerLocked(Peer& peer, FailureCause cause, std::string detail, std::string mechanism,
                      Outbox& out) KVB_REQUIRES(mu_);
  void FailPeerWithRecordLocked(Peer& peer, const FailureRecord& base, Outbox& out)
      KVB_REQUIRES(mu_);
  void TellFailedPeerLocked(Peer& peer, Outbox& out) KVB_REQUIRES(mu_);     // it spoke: peers.cc
  bool FailedItFirstLocked(const FailureRecord& notice) KVB_REQUIRES(mu_);  // propagation.cc
  // write_rule.h's facts for `src` of `room` (`p` at its key, or null).
  SourceWriteFacts WriteFactsLocked(const ReceiverRoom& room, const ReceiverSource& src,
                                    const Peer* p) const KVB_REQUIRES(mu_);
  // Marks `src` quiesced once the write rule says it cannot write; the only
  // place but FenceRound (its own facts) that sets that mark. Returns it.
  bool SettleSourceLocked(const ReceiverRoom& room, ReceiverSource& src, const Peer* peer)
      KVB_REQUIRES(mu_);
  bool CutOffLocked(const Peer& peer) const KVB_REQUIRES(mu_);  // unreachable, another host

  // Failure propagation (propagation.cc).
  void RegistryRound(uint64_t round);
  // Rejoin (rejoin.cc, its head comment): a rank declared failed by a record
  // naming its incarnation becomes a new incarnation of the same process;
  // steps not doable yet wait for the next round, still fenced. Registry thread.
  void MaybeRejoin();
  // Retires every peer; true once every grant given to one is revoked.
  bool RetirePeersLocked(const FailureRecord& why, Outbox& out) KVB_REQUIRES(mu_);
  // Lifts the fence and forgets what incarnation `from` gathered.
  void FinishRejoinLocked(uint64_t from) KVB_REQUIRES(mu_);
  // One heartbeat to the registry, on its own thread (RegistryRound's reads may be slow).
  void BeatRound();
  // Applies a failure of another rank learned from the registry or a peer:
  // fails the peer, sibling requests, or requests of the failed instance.
  // `live` (key -> incarnation the registry lists alive, fetched after the
  // record) tells a record about a process that was already replaced.
  void ApplyRankFailureLocked(const FailureRecord& record, Outbox& out,
                              const std::map<std::string, uint64_t>* live = nullptr)
      KVB_REQUIRES(mu_);
  // The record's origin is a process another live incarnation has replaced
  // at its position (by `live`, or by the peer this rank talks to there).
  bool ReplacedLocked(const RankId& origin, const std::map<std::string, uint64_t>* live)
      KVB_REQUIRES(mu_);
  // Queues a record for the registry: a rank failure, or a request's failure
  // this rank detected (a room record, for the request's other ranks).
  void PublishLocked(const FailureRecord& record) KVB_REQUIRES(mu_);
  // Room records (a request failed on another rank for a reason of its own:
  // bad input, abort, deadline, layout): kept for GroupFailure and applied to
  // this rank's use of the room id when it is the same request.
  void ApplyRoomFailureLocked(const FailureRecord& record, Outbox& out) KVB_REQUIRES(mu_);
  // The same request: the room id matches, this use began before the detection.
  template <typename Room>
  static bool SameRequest(const Room& room, const FailureRecord& record);
  // A room record from another rank about `room`'s request, if one came.
  template <typename Room>
  std::optional<FailureRecord> RoomRecordLocked(const Room& room) const KVB_REQUIRES(mu_);

 public:
  // Why `room`'s request failed on some rank of its group (sglang's MIN over
  // the group is Failed, its own state may not be): its own record; else a
  // room record from another rank, waking the registry thread's read and
  // waiting up to four heartbeat intervals for one; else the latest rank
  // failure known here; else a record saying no reason reached this rank.
  // Waits only when this rank holds no record, and never on the network.
  template <typename Room>
  FailureRecord GroupFailure(const Room& room);

 private:
  // Why a new request on this rank cannot succeed, if it cannot.
  std::optional<FailureRecord> NewRoomBlockerLocked() const KVB_REQUIRES(mu_);
  // Same role, dp and instance, another position (its failure fails ours).
  bool IsSibling(const RankId& id) const;
  // Prefill: whether every decode rank met (live or dead) is of `instance`.
  bool OnlyDecodeInstanceLocked(const std::string& instance) const KVB_REQUIRES(mu_);
  // Prefill: a dead rank of `decode`'s instance (same dp), if any.
  const FailureRecord* DeadRankOfInstanceLocked(const RankId& decode) const KVB_REQUIRES(mu_);
  // A new room that `blocker` would block: fails it at once, or, when the
  // blocker is a dead rank's record the registry can show outdated by a
  // restart, numbers it for the registry thread's next check. Returns
  // whether that check must be woken. Scripted tests (manual ticks) ask the
  // registry on the caller's thread first (ForgetRestartedRanks, mu_ not held).
  template <typename Room>
  bool BlockNewRoomLocked(Room& room, const FailureRecord& blocker, Outbox& out) KVB_REQUIRES(mu_);
  void ForgetRestartedRanks() KVB_EXCLUDES(mu_);
  // Registry thread: forgets the dead ranks `ranks` shows restarted (none
  // when the read failed), then fails each room of check <= `upto` that a
  // record still blocks, naming it (what is known when the registry is out).
  void SettleRestartChecks(uint64_t upto, const std::vector<RankStatus>* ranks) KVB_EXCLUDES(mu_);
  // A dead rank of the decode instance of a flow `room` adopted, if any.
  const FailureRecord* DeadFlowRankLocked(const SenderRoom& room) const KVB_REQUIRES(mu_);
  // Forgets dead ranks whose position `ranks` shows held by a new live one.
  void ForgetRestartedLocked(const std::vector<RankStatus>& ranks) KVB_REQUIRES(mu_);
  // Publishes the queued failure records (RegistryRound; `answered_before`:
  // the registry's answer the round before), and at ~ManagerImpl what is left.
  void PublishQueued(std::chrono::system_clock::time_point answered_before);
  void PublishBeforeGoing();
  // The registry refused this incarnation's heartbeat (HeartbeatRefusal).
  // Read after the round's records (a record that fenced it is applied as
  // such): when another process holds the position now this one stops for
  // good; otherwise it is fenced as if a record named it, and rejoins.
  void ApplyHeartbeatRefusalLocked(const HeartbeatRefusal& refusal,
                                   const std::vector<RankStatus>& ranks, Outbox& out)
      KVB_REQUIRES(mu_);
  void CheckSiblings(const std::vector<RankStatus>& ranks);
  FailureRecord MakeRecord(const RankId& origin, FailureCause cause, std::string detail,
                           Phase phase, std::string mechanism) const;
  // Whether a failure that started at `origin` comes from another rank or
  // process (FailureRecord::is_from_another_rank).
  bool IsFromAnotherRank(const RankId& origin) const;
  // What failing a request does on either side (SenderRoom, ReceiverRoom):
  // sets record.room and is_from_another_rank, keeps the record as the
  // room's failure, turns poll() to kFailed, counts, meters and logs it.
  // The one rule for final states: false, changing nothing, when the room
  // had already failed or succeeded (Success and Failed are final; a room
  // fails once, with its first record). The caller then tells the peers.
  template <typename Room>
  bool MarkRoomFailedLocked(Room& room, FailureRecord& record) KVB_REQUIRES(mu_);
  void OnMeta(const RankId& from, MetaMsg meta, Outbox& out) KVB_REQUIRES(mu_);  // sender_side.cc
  void HoldForNextSenderLocked(MetaMsg meta, Peer& peer, Outbox& out) KVB_REQUIRES(mu_);
  void AdoptMetaLocked(SenderRoom& room, const RankId& from, MetaMsg meta, Outbox& out)
      KVB_REQUIRES(mu_);
  // AdoptMetaLocked's steps: whether the request already failed (an abort
  // that overtook the metadata, a dead rank of decode's instance), in which
  // case decode is told and true returned; the flow's head slice and role
  // from both sides' tp sizes; decode's indices against its layout.
  bool RefuseMetaLocked(SenderRoom& room, const RankId& from, Peer& peer, const MetaMsg& meta,
                        Outbox& out) KVB_REQUIRES(mu_);
  Status ShapeFlowLocked(SenderRoom& room, const RankId& from, SenderFlow& flow) KVB_REQUIRES(mu_);
  Status CheckFlowMeta(const SenderRoom& room, const Peer& peer, const RankId& from,
                       const SenderFlow& flow) const;
  // SenderSend's steps: whether the chunk may go (state of the request,
  // page and state indices); the writes and notice of one decode rank's
  // share (Unavailable when that rank is not connected); counting the
  // posts in and queueing them.
  Status CheckSendLocked(const SenderRoom& room, std::span<const int32_t> pages,
                         std::span<const int32_t> state) const KVB_REQUIRES(mu_);
  Result<Outbox::Post> PlanFlowChunkLocked(const std::shared_ptr<SenderRoom>& sp, int rank,
                                           const SenderFlow& flow, std::span<const int32_t> pages,
                                           std::span<const int32_t> state, bool last)
      KVB_REQUIRES(mu_);
  void CommitChunkLocked(SenderRoom& room, std::vector<std::pair<int, Outbox::Post>> posts,
                         int64_t n, bool last, Outbox& out) KVB_REQUIRES(mu_);
  void OnDecodeRoomFailed(const RankId& from, const RoomFailedMsg& msg, Outbox& out)
      KVB_REQUIRES(mu_);
  void FailSenderLocked(SenderRoom& room, FailureRecord record, Outbox& out) KVB_REQUIRES(mu_);
  void UpdateSenderStateLocked(SenderRoom& room) KVB_REQUIRES(mu_);
  void OnChunkDone(const std::shared_ptr<SenderRoom>& room, int decode_rank, const Status& s,
                   uint64_t bytes, uint64_t ops);
  void DrainFlowLocked(SenderRoom& room, SenderFlow& flow, Outbox& out) KVB_REQUIRES(mu_);
  // The room's flow to `decode_tp` of `generation`, live or released with
  // writes left (released_writing_), and its *owner; null if none.
  SenderFlow* FlowOfLocked(uint64_t room, int decode_tp, uint64_t generation, SenderRoom** owner)
      KVB_REQUIRES(mu_);
  // Keeps a released room in released_writing_ while it has chunks posted.
  void KeepReleasedWritingLocked(const std::shared_ptr<SenderRoom>& room) KVB_REQUIRES(mu_);
  // Sends the flow's last notice once its writes completed, unless the
  // request failed first (SenderFlow::final_note).
  void SendFinalNoteLocked(SenderRoom& room, SenderFlow& flow, Outbox& out) KVB_REQUIRES(mu_);
  void TickSendersLocked(SteadyTime now, Outbox& out) KVB_REQUIRES(mu_);

  // Decode internals (receiver_side.cc).
  // Finds and connects the prefill ranks `room` reads from (the steps
  // below); an error that no retry mends fails the room (FailUnresolved).
  Status ResolveSources(const std::shared_ptr<ReceiverRoom>& room);
  // Prefill's parallel info, once read; Unavailable until all registered.
  Result<ParallelInfo> PrefillParallelInfo();
  // Fails `room` when a rank of its prefill instance is dead, not restarted.
  Status FailIfSourceInstanceDead(const std::shared_ptr<ReceiverRoom>& room);
  // The prefill positions `room` hears from, by the two sides' layouts.
  Result<std::vector<SourcePosition>> SourcePositions(const ReceiverRoom& room,
                                                      const ParallelInfo& info) const;
  // Takes the connected sources (unless the room failed or another
  // resolution won); sends the metadata if it came.
  void AdoptSources(ReceiverRoom& room, std::vector<ReceiverSource> sources);
  void AdoptSourcesLocked(ReceiverRoom& room, std::vector<ReceiverSource> sources, Outbox& out)
      KVB_REQUIRES(mu_);
  // Init's resolution from facts held (prefill's parallel info, every source
  // and with sglang's server every witness met, no dead rank to look up): no
  // lookup, no connect. False, changing nothing, else: the resolver's then.
  bool ResolveFromKnownLocked(ReceiverRoom& room, Outbox& out) KVB_REQUIRES(mu_);
  void FailUnresolved(ReceiverRoom& room, const Status& s, const std::optional<RankId>& about);
  void OnHelloAckLocked(Peer& peer, const HelloAckMsg& ack, Outbox& out) KVB_REQUIRES(mu_);
  void SendMetaLocked(ReceiverRoom& room, Outbox& out) KVB_REQUIRES(mu_);
  void OnNotify(const RankId& from, const NotifyMsg& msg, Outbox& out) KVB_REQUIRES(mu_);
  void SucceedReceiverLocked(ReceiverRoom& room) KVB_REQUIRES(mu_);
  void OnPrefillRoomFailed(const RankId& from, const RoomFailedMsg& msg, Outbox& out)
      KVB_REQUIRES(mu_);
  void OnQuiesced(const RankId& from, const QuiescedMsg& msg, Outbox& out) KVB_REQUIRES(mu_);
  void FailReceiverLocked(ReceiverRoom& room, FailureRecord record, Outbox& out) KVB_REQUIRES(mu_);
  void TellSourceLocked(ReceiverRoom& room, ReceiverSource& src, const FailureRecord& record,
                        Outbox& out) KVB_REQUIRES(mu_);
  // sglang's server keeps no records: decode connects and tells the prefill
  // ranks it reads nothing from, which relay (docs/sglang.md, B3). Met: all
  // are, none failed (EnsureWitnesses would look nothing up).
  void EnsureWitnesses(const ReceiverRoom& room, const ParallelInfo& info);
  bool WitnessesMetLocked(const ReceiverRoom& room, const ParallelInfo& info) KVB_REQUIRES(mu_);
  void TellWitnessesLocked(const ReceiverRoom& room, const FailureRecord& r, Outbox& out)
      KVB_REQUIRES(mu_);
  void RelayRoomFailureLocked(const RankId& from, const RoomFailedMsg& m, Outbox& out)
      KVB_REQUIRES(mu_);
  // A room that failed before its sources were resolved still tells the
  // prefill ranks it would have read from: the connected ones among its
  // positions (KnownSourcesLocked, no I/O), or those a resolve in flight
  // found (AdoptSources), else their senders wait for their deadline.
  std::vector<ReceiverSource> KnownSourcesLocked(const ReceiverRoom& room) KVB_REQUIRES(mu_);
  void AddFailedSourcesLocked(ReceiverRoom& room, std::vector<ReceiverSource> sources, Outbox& out)
      KVB_REQUIRES(mu_);
  void UpdateQuiescedLocked(ReceiverRoom& room) KVB_REQUIRES(mu_);
  // The sources of `peer`'s incarnation, settled by the write rule on what
  // is known of it now (decode, as a new incarnation replaces it: a rejoin
  // of the same process waited for the writes decode cannot revoke, also
  // those whose Quiesced never arrived, its sessions closed).
  void SettleSourcesOfLocked(const Peer& peer) KVB_REQUIRES(mu_);
  // WaitingForInput once the room's sources are resolved and every one of
  // them answered our handshake (sglang pre-allocates only then).
  void MaybeHandshakeDoneLocked(ReceiverRoom& room) KVB_REQUIRES(mu_);
  void OnPeerAckedLocked(Peer& peer, Outbox& out) KVB_REQUIRES(mu_);
  // Logs once when a failed room is still not quiesced quiesce_timeout after
  // it failed (PollSettled() says Failed from then on).
  void WarnUnsettledLocked(ReceiverRoom& room, SteadyTime now) KVB_REQUIRES(mu_);
  void TickReceiversLocked(SteadyTime now, Outbox& out) KVB_REQUIRES(mu_);
  // Resolves unresolved_ (also a failed, released one, once: to tell them).
  void RetryUnresolved();

  const ManagerOptions opts_;
  const CoreHooks hooks_;
  const Clock* const clock_;  // hooks_.clock, or the system's
  // Set once at start but for the incarnation, which a rejoin changes while
  // other threads read it: Self() adds incarnation_ to self_.
  RankId self_;
  std::atomic<uint64_t> incarnation_{0};
  RankId Self() const {
    RankId r = self_;
    r.incarnation = incarnation_.load();
    return r;
  }
  RankLayout layout_;
  std::unique_ptr<Transport> transport_;  // auth_ over the real transport
  AuthTransport* auth_ = nullptr;         // owned by transport_
  std::unique_ptr<HandshakeAuth> handshake_;
  std::optional<ChallengeMaker> challenge_maker_;  // prefill's; set before any handler runs
  RegionSet regions_;
  std::vector<std::string> kv_keys_, aux_keys_, state_keys_;
  std::unique_ptr<TransferEngine> engine_;
  std::unique_ptr<BootstrapServer> embedded_server_;
  std::unique_ptr<RegistryClient> registry_;  // the bootstrap server or etcd
  // sglang's own bootstrap server (no /heartbeat, /failure, /failures):
  // liveness comes from peers only and failure records travel between peers.
  std::atomic<bool> sglang_registry_{false};
  std::unique_ptr<RankEndpoint> rank_endpoint_;  // prefill: its record at its rank_port
  std::unique_ptr<ManagerMetrics> metrics_;      // null when metrics are off

  mutable Mutex mu_;
  std::map<std::string, std::unique_ptr<Peer>> peers_ KVB_GUARDED_BY(mu_);
  std::unordered_map<PeerId, Peer*> by_tpeer_ KVB_GUARDED_BY(mu_);
  std::unordered_map<uint64_t, std::shared_ptr<SenderRoom>> senders_ KVB_GUARDED_BY(mu_);
  // Released senders with chunks still posted (sender_settle.cc).
  std::unordered_multimap<uint64_t, std::shared_ptr<SenderRoom>> released_writing_
      KVB_GUARDED_BY(mu_);
  std::unordered_map<uint64_t, std::shared_ptr<ReceiverRoom>> receivers_ KVB_GUARDED_BY(mu_);
  RoomChanges changes_ KVB_GUARDED_BY(mu_){opts_.list_room_changes};  // every poll() change
  std::vector<std::shared_ptr<ReceiverRoom>> unresolved_ KVB_GUARDED_BY(mu_);  // RetryUnresolved
  // Metadata, notices, failures of requests no live sender has a flow for.
  SenderInbox inbox_ KVB_GUARDED_BY(mu_){opts_.max_pending_requests};
  std::optional<ParallelInfo> prefill_info_ KVB_GUARDED_BY(mu_);
  std::optional<FailureRecord> fatal_ KVB_GUARDED_BY(mu_);
  // Chunks posted and not completed whose writes decode cannot revoke
  // (SenderFlow::unrevocable), over every sender room, released ones too:
  // a rejoin waits for 0.
  int64_t unrevocable_chunks_ KVB_GUARDED_BY(mu_) = 0;
  // The record of another rank naming this incarnation failed, while the
  // rank is fenced by it and not yet rejoined (MaybeRejoin).
  std::optional<FailureRecord> declared_failed_ KVB_GUARDED_BY(mu_);
  // Registry thread: the incarnation a rejoin leaves (0: none), failed tries.
  uint64_t rejoin_from_ = 0, rejoin_register_failures_ = 0;
  std::atomic<uint64_t> rejoins_{0}, rejoin_waits_{0};
  uint64_t rejoin_waits_logged_ KVB_GUARDED_BY(mu_) = 0;                 // waits when last logged
  std::map<std::string, FailureRecord> dead_ranks_ KVB_GUARDED_BY(mu_);  // by peer key
  std::set<std::pair<std::string, uint64_t>> applied_ KVB_GUARDED_BY(mu_);    // (key, incarnation)
  std::set<std::pair<std::string, uint64_t>> published_ KVB_GUARDED_BY(mu_);  // registry holds
  std::optional<FailureRecord> registry_lost_ KVB_GUARDED_BY(mu_);
  std::optional<FailureRecord> recent_rank_failure_ KVB_GUARDED_BY(mu_);
  std::vector<FailureRecord> publish_queue_ KVB_GUARDED_BY(mu_);
  std::deque<FailureRecord> room_records_ KVB_GUARDED_BY(mu_);  // other ranks', latest first
  std::condition_variable_any room_records_cv_;            // a room record came or a room failed
  uint64_t failure_seq_ = 0, restart_checks_settled_ = 0;  // registry thread only
  uint64_t restart_checks_ KVB_GUARDED_BY(mu_) = 0;        // the last check a room was given
  size_t publishing_ KVB_GUARDED_BY(mu_) = 0;              // records PublishQueued has taken
  SteadyTime last_tick_ KVB_GUARDED_BY(mu_) = Now();
  int64_t stuck_step_logged_ = 0;                  // ticker thread only (WarnStuckDelivery)
  std::optional<SteadyTime> registry_down_since_;  // beat thread only
  // Why the registry last refused this incarnation's heartbeat (till one is taken).
  std::optional<HeartbeatRefusal> heartbeat_refused_ KVB_GUARDED_BY(mu_);
  bool registry_reached_ = false;  // beat thread only: a heartbeat answered
  std::chrono::system_clock::time_point registry_answered_ KVB_GUARDED_BY(mu_){};  // beat answered
  // registry_answered_ as the previous RegistryRound found it (registry
  // thread only): blame gathered after it is judged against it.
  std::chrono::system_clock::time_point answered_seen_{};
  std::mutex resolve_mu_;  // serializes bootstrap lookups and connects

  // Shutdown: once closing_ is set no Flush reaches the engine or the
  // transport, and no transport callback starts (IfOpen); the destructor
  // waits for those under way (flushing_) before it destroys them.
  std::atomic<bool> closing_{false};
  std::atomic<bool> liveness_as_remote_{false};
  std::atomic<int> flushing_{0};
  // Runs `f`, a transport callback, unless the manager is closing (one once ran while the
  // destructor took the transport down under it: SIGSEGV, PpTest.LayoutMismatch*).
  template <class F>
  void IfOpen(F&& f) {
    flushing_.fetch_add(1);
    if (!closing_.load()) f();
    flushing_.fetch_sub(1);
  }

  std::atomic<uint64_t> next_generation_;
  std::atomic<uint64_t> heartbeat_seq_{0};
  std::atomic<uint64_t> bytes_written_{0}, write_ops_{0}, chunks_sent_{0};
  std::atomic<uint64_t> stale_dropped_{0}, succeeded_{0}, failed_{0};
  std::atomic<uint64_t> invalid_dropped_{0};

  std::mutex ticker_mu_;
  std::condition_variable ticker_cv_;
  std::atomic<bool> stop_{false};  // set under ticker_mu_; a long round reads it too
  bool registry_wake_ = false;     // guarded by ticker_mu_: etcd's watch saw a change
  bool resolver_wake_ = false;     // guarded by ticker_mu_: a receiver to resolve
  bool accept_wake_ = false;       // guarded by ticker_mu_: a Hello to accept
  std::thread ticker_;
  std::thread registry_thread_;
  std::thread beat_thread_;  // BeatRound: heartbeats never wait for the registry reads
  std::thread resolver_;
  std::thread fencer_;    // FenceRound
  std::thread acceptor_;  // AcceptRound
  std::vector<PendingAccept> accepts_ KVB_GUARDED_BY(mu_);
  // Endpoints of proven Hellos from the proof to the peer's installation:
  // true once the transport reported one failed (no peer holds it yet).
  std::map<PeerId, bool> accepting_ KVB_GUARDED_BY(mu_);
  ChallengeTable challenges_ KVB_GUARDED_BY(mu_);  // prefill's handshakes in progress
  std::atomic<uint64_t> unauth_dropped_{0};
  // Peers whose Hello the ticker found unanswered.
  std::set<std::string> hello_retries_ KVB_GUARDED_BY(mu_);
  // Failed peers whose grant is still to be revoked; the next grant id.
  std::set<std::string> fence_pending_ KVB_GUARDED_BY(mu_);
  // Unrevoked grants of peers replaced at their position before FenceRound got
  // to them: revoked there, then that incarnation's sources count as quiesced.
  std::vector<RetiredGrant> retired_grants_ KVB_GUARDED_BY(mu_);
  GrantId next_grant_ KVB_GUARDED_BY(mu_) = 1;
};

}  // namespace kvbridge::internal

// The state a manager keeps for each rank it exchanges messages with (a
// Peer), guarded by ManagerImpl::mu_, what it shows of it, and the small
// records its handshake and registry rounds pass along.
#pragma once

#include <atomic>
#include <chrono>
#include <optional>
#include <string>
#include <vector>

#include "connector/auth_transport.h"
#include "connector/hello_rule.h"
#include "connector/peer_auth.h"
#include "connector/protocol.h"
#include "connector/rooms.h"
#include "engine/engine.h"
#include "engine/plan.h"
#include "kvbridge/errors.h"
#include "transport/transport.h"

namespace kvbridge::internal {

// A Hello whose proof checked, for the acceptor thread (AcceptRound).
struct PendingAccept {
  RankId from;
  HelloMsg hello;
  PeerId tpeer = 0;
  AuthTransport::Binding binding;
  uint64_t own_incarnation = 0;  // this rank's, which the proof's transcript named
};

// Why the registry refused this incarnation's heartbeat (FailedPrecondition:
// e.g. etcd expired its record lease while this rank could not reach it, so
// every rank counts it dead, with no failure record naming it).
struct HeartbeatRefusal {
  uint64_t incarnation = 0;  // the incarnation the refused heartbeat was of
  std::string why;
};

// A prefill position a decode room hears from (SourcePositions).
struct SourcePosition {
  RankId position;     // role, dp, tp, pp; process filled when connected
  bool dummy = false;  // sends no pages to this rank, only its notices
};

// The unrevoked grant of a peer replaced at its position before the fence
// round got to it (ManagerImpl::retired_grants_).
struct RetiredGrant {
  std::string key;
  uint64_t incarnation = 0;
  GrantId grant = 0;
  bool mapping = false;  // Peer::mapping
  uint64_t session = 0;  // Peer::session of the peer that held it
};

// Numbers every Peer object: one session with a process, under one grant
// (the same process met again is a new session). What a room's pages were
// given under (ReceiverSource::session).
inline uint64_t NextPeerSession() {
  static std::atomic<uint64_t> next{0};
  return ++next;
}

// A rank on the other side (or a sibling) that we exchange messages with.
struct Peer {
  uint64_t session = NextPeerSession();
  std::string key;
  SharedKey shared_key;  // `key`, for the rooms that read from this peer
  Shared<RankId> id;     // set once; the rooms that read from it share it
  PeerId tpeer = 0;
  // A second endpoint to the peer that carries only heartbeats (0 until the
  // resolver opened it, ResolveRound): over TCP between hosts, tpeer's
  // connection can hold hundreds of MiB of writes queued ahead of a
  // heartbeat, which would then arrive long after it was sent and make a
  // busy peer look silent. Its own connection is behind no bulk data.
  PeerId beat = 0;
  std::string address;
  RankLayout layout;
  RemoteRegionSet remote;  // prefill side: decode's imported regions
  int tp_size = 0;
  bool ready = false;
  // Decode side: the prefill rank answered our Hello. Until it does, what
  // we send it waits in `held`: a Hello that gets no answer is sent again on
  // a new endpoint (the old one may be stuck in wire-up), and anything that
  // went over the old endpoint would be lost with it.
  bool acked = true;
  // Endpoints to the peer are opened with ConnectOverNetwork: a handshake
  // on a shared-memory endpoint got no answer (transport.h says why).
  bool over_network = false;
  int hello_attempts = 0;
  SteadyTime hello_at{};
  // Encoded messages, sent in this order (all as ordered messages: nothing
  // was written to the peer before it answered, so none needs to overtake).
  std::vector<std::string> held;
  // Decode side, while the handshake runs (peer_auth.h): the Hellos sent
  // and not answered yet, any of which a challenge may answer (KeepHello,
  // hello_rule.h).
  std::vector<SentHello> hellos;
  int auth_refusals = 0;  // challenges claiming this rank that failed their proof
  // Challenges that came for a Hello of ours no longer kept (or one
  // answered already): the peer hears us but its answers come late.
  int late_challenges = 0;
  // Handshakes prefill refused because a record it holds declared this
  // process failed (kRefusedAsDeclaredFailed), and the attempt refused last
  // (one refusal per attempt is taken; later ones are dropped).
  int refusals = 0;
  int refused_attempt = 0;
  std::string refusal;  // the last one's words (at most kMaxRefusalText bytes)
  static constexpr size_t kMaxRefusalText = 400;
  // Prefill side: a write to this peer completes only when the peer's
  // process acknowledged it (UCX active messages), so its completion counts
  // as hearing from the peer. Not on the same-host paths, where a write
  // completes without the peer taking part.
  bool acks_prove_life = false;
  // Something came from the peer since the handshake made it ready (on
  // decode, the HelloAck itself). Until then the peer may not have our
  // answer yet (it was lost, or came after the peer gave up and sent its
  // Hello again), so it cannot be expected to beat: Tick gives it the
  // handshake's patience instead of the silence limit.
  bool heard_since_ready = false;
  // Silence limits a handshake may take, retries included, before either
  // side blames the other for it.
  static constexpr int kHandshakeBudget = 10;
  // Hellos a handshake may send before the rank is blamed however recently
  // it was heard: a challenge that checked is a sign of life, and a peer
  // that keeps answering challenges but never a proof must still be named.
  static constexpr int kMaxHelloAttempts = 5;
  int proofs_sent = 0;  // decode: proofs of this handshake (none answered yet)
  bool failed = false;
  std::optional<FailureRecord> failure;  // why it failed (room 0)
  // Decode side: the per-peer write grant in our Hello (0: the regions'
  // shared keys, a transport without grants) and its keys (kv, aux, state);
  // `fenced` once the grant is revoked. A mediated grant's writes then land
  // no more; a `mapping` grant (WritesByMapping) stops only new mappings
  // and mediated writes, so its sources still wait for the peer's Quiesced,
  // its exit or its rejoin.
  GrantId grant = 0;
  bool mapping = false;
  std::vector<std::string> grant_keys[3];
  bool fenced = false;
  // Decode side: its process (same host, same pid) came back under a new
  // incarnation, which replaces this peer (write_rule.h, `rejoined`).
  bool rejoined = false;
  // Failed by an earlier incarnation of this rank, retired when it rejoined
  // (MaybeRejoin): the peer itself may be healthy, so a new handshake
  // replaces it, with a new session and (decode) a new grant.
  bool retired = false;
  // Decode side, with sglang's server: when this failed peer was last looked
  // up again as a room's witness (EnsureWitnesses), or this retired one to
  // meet it again (MeetPrefillAgain, at most kReconnectTries times,
  // once a silence limit, and only if it was healthy until the rejoin).
  SteadyTime witness_lookup_at{};
  static constexpr int kReconnectTries = 5;
  int reconnect_tries = 0;
  // When this rank last told the failed peer that it failed it
  // (TellFailedPeerLocked): once a heartbeat interval at most.
  SteadyTime told_failed_at{};
  // Decode side, with sglang's server: a prefill rank this rank failed as
  // unreachable on another host (its session closed) is met again at the
  // same incarnation only to tell it so (MeetPrefillAgain). That peer is
  // failed from the start, with the same record; `notice` while its
  // handshake runs (it gets no write grant). Tried when its rank endpoint
  // answers, at most once per `remeet.waits` silence limits (doubling to
  // kMaxRemeetWaits) and kMaxRemeets times, carried over from the failed
  // peer it replaces.
  bool notice = false;
  struct Remeet {
    SteadyTime at{};
    int waits = 1;  // silence limits
    int count = 0;  // handshakes made
  } remeet;
  static constexpr int kMaxRemeetWaits = 4;
  static constexpr int kMaxRemeets = 8;
  // When something last came from the peer, on the manager's Clock (set
  // when the peer is made).
  SteadyTime last_heard{};
  WallTime last_heard_wall{};
};

// Decode: `peer` (a prefill rank) as a source of a room; `dummy` when it
// sends that room no pages, only its notices.
inline ReceiverSource SourceOf(const Peer& peer, bool dummy) {
  ReceiverSource src;
  src.peer_key = peer.shared_key;
  src.prefill = peer.id;
  src.dummy = dummy;
  return src;
}

// A peer as this rank knows it now: the process (pid, incarnation) it talks
// to at that position and the transport endpoint it uses (the worker's
// report; restart tests check a restarted rank got a new one).
struct PeerSnapshot {
  RankId id;
  PeerId endpoint = 0;
  bool ready = false;
  bool failed = false;
  SteadyTime last_heard{};  // on the manager's Clock
  bool fenced = false;      // its write grant is revoked
  bool answered = false;    // decode: the peer answered its handshake (acked)
};

struct PendingMeta {
  MetaMsg meta;
  RankId from;
  SteadyTime at;
};

}  // namespace kvbridge::internal

// Which prefill rank may still write into a decode request's pages. Decode
// reports a failed request settled (PollSettled, WaitQuiesced), and sglang
// frees its pages, only once no source may write; this rule decides it for
// one source from facts alone. ManagerImpl gathers the facts when something
// changes (a failed or fenced peer, a notice, a rejoin) and marks the source
// quiesced once the rule says it cannot write; that mark is never undone.
// One rule, kept apart from the manager so that it is tested alone.
#pragma once

#include "kvbridge/errors.h"

namespace kvbridge::internal {

// What decode knows about one source of one request.
struct SourceWriteFacts {
  bool dummy = false;          // a dummy source: never given pages
  bool pages_sent = false;     // the request's page list went (or is held) for it
  bool request_done = false;   // every source's last chunk arrived
  bool said_quiesced = false;  // it said nothing more is in flight for the request
  // The process that held this source's incarnation (same host, same pid)
  // came back under a new one: it is alive, and its rejoin waited only for
  // the writes decode cannot revoke, those through a mapping of the pages or
  // without a grant on this host (ManagerImpl::MaybeRejoin); the others end
  // with the revoke of its grant.
  bool rejoined = false;
  bool peer_known = true;  // still in the peer table
  bool peer_failed = false;
  // The rest matter only for a failed peer.
  bool acked = false;  // it answered our Hello: held messages (the page list) went out
  FailureCause cause = FailureCause::kPeerExited;  // why it failed
  bool grant_revoked = false;  // its write grant on our pages is revoked (fenced)
  bool maps_pages = false;     // it writes through a mapping a revoke does not stop
  bool has_grant = false;      // it was given a write grant at all
  bool on_this_host = false;
};

// Why a source can write nothing more into the request's pages, or
// kMayStillWrite.
enum class WriteEnd {
  kMayStillWrite,
  kDummy,             // never given pages
  kDone,              // the request succeeded: every write landed
  kNeverGivenPages,   // the page list never went
  kSaidQuiesced,      // it said so itself
  kRejoined,          // its process rejoined, which waited for its unrevocable writes
  kForgotten,         // no longer connected to this rank at all
  kNeverAnswered,     // failed before answering our Hello: the page list stayed here
  kFenced,            // the grant is revoked: nothing it sends lands
  kExited,            // its process is gone
  kConnectionClosed,  // cut off on another host, no grant: its connection closed
};

WriteEnd NoMoreWrites(const SourceWriteFacts& f);
const char* WriteEndName(WriteEnd e);

}  // namespace kvbridge::internal

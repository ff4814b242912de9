#include "connector/write_rule.h"

namespace kvbridge::internal {

WriteEnd NoMoreWrites(const SourceWriteFacts& f) {
  if (f.dummy) return WriteEnd::kDummy;
  if (f.request_done) return WriteEnd::kDone;
  if (!f.pages_sent) return WriteEnd::kNeverGivenPages;
  if (f.said_quiesced) return WriteEnd::kSaidQuiesced;
  if (f.rejoined && f.on_this_host && (f.maps_pages || !f.has_grant)) return WriteEnd::kRejoined;
  if (!f.peer_known) return WriteEnd::kForgotten;
  // A live peer holding the page list may write until it says it is done.
  if (!f.peer_failed) return WriteEnd::kMayStillWrite;
  if (!f.acked) return WriteEnd::kNeverAnswered;
  // A mapping stays writable after the revoke: only its Quiesced, its exit
  // or its rejoin ends it.
  if (f.grant_revoked && !f.maps_pages) return WriteEnd::kFenced;
  // A rejoined process is alive whatever its record says.
  if (f.cause == FailureCause::kPeerExited && !f.rejoined) return WriteEnd::kExited;
  // A silent rank on another host may be alive behind a partition, its
  // writes queued in the network: with a grant, only the revoke says none
  // lands. Without grants (a transport that has none) its connection was
  // closed when it was cut off, taken to carry nothing more.
  const bool cut_off = f.cause == FailureCause::kPeerUnreachable && !f.on_this_host;
  if (cut_off && !f.has_grant) return WriteEnd::kConnectionClosed;
  return WriteEnd::kMayStillWrite;
}

const char* WriteEndName(WriteEnd e) {
  switch (e) {
    case WriteEnd::kMayStillWrite:
      return "may still write";
    case WriteEnd::kDummy:
      return "dummy source";
    case WriteEnd::kDone:
      return "request done";
    case WriteEnd::kNeverGivenPages:
      return "never given the pages";
    case WriteEnd::kSaidQuiesced:
      return "said quiesced";
    case WriteEnd::kRejoined:
      return "its process rejoined";
    case WriteEnd::kForgotten:
      return "no longer connected";
    case WriteEnd::kNeverAnswered:
      return "failed before answering the handshake";
    case WriteEnd::kFenced:
      return "write grant revoked";
    case WriteEnd::kExited:
      return "process exited";
    case WriteEnd::kConnectionClosed:
      return "cut off, connection closed";
  }
  return "?";
}

}  // namespace kvbridge::internal

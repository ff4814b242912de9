// What a manager's handlers decide under its mutex and do after releasing
// it (ManagerImpl::Flush): messages to send, writes to post, endpoints to
// close. No transport or engine call is made with the mutex held.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "engine/engine.h"
#include "engine/plan.h"
#include "transport/transport.h"

namespace kvbridge::internal {

// How a message travels (Transport): in order behind earlier writes; at
// once (failure notices that say writes may still be in flight); or in
// order with other messages but behind no write (a notice about writes
// that already completed, which must not wait for later requests' writes).
enum class Lane { kOrdered, kUrgent, kUnfenced };
struct OutMessage {
  OutMessage(PeerId p, std::string b, bool f = true) : peer(p), bytes(std::move(b)), fenced(f) {}
  PeerId peer;
  std::string bytes;
  bool fenced;
};
struct Outbox {
  std::vector<OutMessage> messages;  // ordered; unfenced ones behind no write
  // Not ordered behind earlier writes: failure notices that say writes may
  // still be in flight, so they must not wait for those writes.
  std::vector<std::pair<PeerId, std::string>> urgent;
  struct Post {
    PeerId peer;
    RemoteRegionSet remote;
    std::vector<CopyRun> runs;
    std::string notify;
    ChunkCallback done;
  };
  std::vector<Post> posts;
  // Endpoints to close after the rest (a cut-off peer's connection).
  std::vector<PeerId> disconnect;
  // The registry thread is woken once the rest is done (a round now).
  bool wake_registry = false;
};

}  // namespace kvbridge::internal

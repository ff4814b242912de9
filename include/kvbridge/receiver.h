// KVReceiver: the decode side of one request (sglang's KVReceiver).
//
// Call order (sglang's): Create -> Init(prefill_dp_rank) -> Poll() until
// WaitingForInput -> allocate pages -> SendMetadata(pages, aux, state,
// prefix) -> Poll() until Success or Failed. Init looks the prefill instance
// up in the bootstrap registry, connects to the prefill ranks this rank
// reads from and checks that their layout matches (FailedPrecondition naming
// both values otherwise). Poll() reports Bootstrapping until those ranks are
// resolved and answered the handshake, WaitingForInput (before and after
// SendMetadata) until the first chunk lands, Transferring, then Success when
// every source's last chunk is visible. SendMetadata may also come earlier,
// while Bootstrapping: it is sent once the sources are resolved.
//
// Quiescence: after Abort() or a failure, writes of prefill may still be in
// flight. Quiesced() turns true once no write of this request can land any
// more (every source prefill rank confirmed, or is known dead). Only then may
// the pages go back to the allocator. Success implies Quiesced().
//
// Thread safety: Poll(), Quiesced() and Failure() may be called from any
// thread; the other calls from one thread at a time. Poll() never blocks.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>

#include "kvbridge/errors.h"
#include "kvbridge/export.h"
#include "kvbridge/kv_poll.h"
#include "kvbridge/manager.h"
#include "kvbridge/status.h"

namespace kvbridge {

namespace internal {
struct ReceiverRoom;
}

class KVB_EXPORT KVReceiver {
 public:
  // FailedPrecondition when `room` already has a live receiver on this rank.
  static Result<std::unique_ptr<KVReceiver>> Create(KVManager& manager, uint64_t room);
  ~KVReceiver();  // aborts an unfinished request, releases the room

  uint64_t room() const;
  uint64_t generation() const;
  // Starts finding and meeting the prefill ranks of the request and never
  // waits on the network: lookups and connects run on the manager's
  // resolver thread. An error is returned only for the call itself (a
  // second Init, a negative dp rank) or a request failed already; what the
  // lookup finds wrong (a layout mismatch, a dead rank) fails the request:
  // Poll() says Failed, Failure() says why. WaitingForInput once every
  // source answered the handshake.
  Status Init(int prefill_dp_rank = 0);
  Status SendMetadata(std::span<const int32_t> page_indices, int64_t aux_index,
                      std::span<const int32_t> state_indices = {}, int64_t decode_prefix_len = 0);
  KVPoll Poll() const;
  std::optional<FailureRecord> Failure() const;
  // Why the request failed on some rank of its group, for a rank whose
  // group state (sglang's MIN over the group's Poll) is Failed while its own
  // Poll may not be: this rank's record, else the record another rank of
  // either side published for the request (waiting at most four heartbeat
  // intervals for it), else the latest rank failure known here, else a
  // record saying no reason reached this rank. Never empty.
  FailureRecord GroupFailure() const;
  void Abort();
  // Fails the request with cause kInvalidRequest and `reason` as its detail
  // (origin: this rank) and tells prefill, as Abort() does: for a request
  // this rank cannot serve as asked (e.g. a destination kvbridge does not
  // write to).
  void Reject(std::string reason);
  bool Quiesced() const;
  // Poll() for a scheduler that frees a request's pages as soon as it sees
  // Failed and never asks Quiesced() (sglang): the same states, except that
  // a failed request keeps reporting the state it had when it failed until
  // it is quiesced (or ManagerOptions::quiesce_timeout after the failure,
  // which is logged). Never blocks.
  KVPoll PollSettled() const;
  // Blocks until Quiesced() or `timeout`; returns Quiesced().
  bool WaitQuiesced(std::chrono::milliseconds timeout) const;
  // For a rank whose group failed elsewhere and is about to free its pages
  // (sglang): fails this rank's request with GroupFailure()'s record, so its
  // prefill ranks stop writing and learn the real origin (not an abort by
  // this rank), and returns that record. Then WaitQuiesced(). A request that
  // already failed or succeeded here keeps its state.
  FailureRecord FailAsGroup();

 private:
  KVReceiver(KVManager& manager, std::shared_ptr<internal::ReceiverRoom> room);
  KVManager& manager_;
  std::shared_ptr<internal::ReceiverRoom> room_;
};

}  // namespace kvbridge

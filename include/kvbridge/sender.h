// KVSender: the prefill side of one request (sglang's KVSender).
//
// Call order: Create -> Init(num_pages, aux_index) -> Send(chunk) ... the
// chunk that completes num_pages is the last (a last chunk may be empty and
// still sends aux and state). Poll() reports Bootstrapping until metadata
// from every decode rank this rank serves arrived, then WaitingForInput,
// Transferring after the first Send, and Success once every write of the last
// chunk is visible at decode. On Failed, Failure() says why.
//
// Bad input (indices out of range, duplicates, wrong count, Send after the
// last chunk, ...) returns InvalidArgument or FailedPrecondition naming the
// value, writes nothing, and fails this request (decode learns why).
//
// Thread safety: Poll() and Failure() may be called from any thread; the
// other calls from one thread at a time. Poll() never blocks.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>

#include "kvbridge/errors.h"
#include "kvbridge/export.h"
#include "kvbridge/kv_poll.h"
#include "kvbridge/manager.h"
#include "kvbridge/status.h"

namespace kvbridge {

namespace internal {
struct SenderRoom;
}

// Where a request's time went, in seconds (sglang's KVTransferMetric). Each
// is empty until its end point is reached.
struct TransferTiming {
  // From Create until metadata from every decode rank arrived: the wait for
  // decode to allocate the request's pages (sglang's alloc_latency_s).
  std::optional<double> alloc_seconds;
  // From the first write posted until the last one completed (Success):
  // the span of the actual writes, as sglang's mooncake backend measures
  // transfer_latency_s. Empty when nothing was written (a dummy rank).
  std::optional<double> transfer_seconds;
};

class KVB_EXPORT KVSender {
 public:
  // FailedPrecondition when `room` already has a live sender on this rank.
  static Result<std::unique_ptr<KVSender>> Create(KVManager& manager, uint64_t room);
  ~KVSender();  // releases the room; an unfinished request is aborted first

  uint64_t room() const;
  Status Init(int64_t num_pages, int64_t aux_index);
  Status Send(std::span<const int32_t> page_indices, std::span<const int32_t> state_indices = {});
  KVPoll Poll() const;
  std::optional<FailureRecord> Failure() const;
  // Why the request failed on some rank of its group, for a rank whose
  // group state (sglang's MIN over the group's Poll) is Failed while its own
  // Poll may not be: this rank's record, else the record another rank of
  // either side published for the request (waiting at most four heartbeat
  // intervals for it), else the latest rank failure known here, else a
  // record saying no reason reached this rank. Never empty.
  FailureRecord GroupFailure() const;
  // Fails the request with cause kAborted (origin: this rank) and tells
  // decode once nothing of it is in flight.
  void Abort();
  // Fails the request with cause kInvalidRequest and `reason` as its detail
  // (origin: this rank) and tells decode, as Abort() does: for a request this
  // rank must not serve (e.g. sglang dispatched it to a dp rank other than
  // the one its room implies).
  void Reject(std::string reason);
  // Pages at the start of the request that decode already holds (its
  // SendMetadata decode_prefix_len / page_size; sglang's
  // pop_decode_prefix_len): Init's num_pages counts them and Send skips them.
  // -1 until metadata arrived (Poll() past Bootstrapping).
  int64_t DecodePrefixPages() const;
  // Lock-free; see TransferTiming.
  TransferTiming Timing() const;

 private:
  KVSender(KVManager& manager, std::shared_ptr<internal::SenderRoom> room);
  KVManager& manager_;
  std::shared_ptr<internal::SenderRoom> room_;
};

}  // namespace kvbridge

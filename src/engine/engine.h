// TransferEngine: turns planned copies into transport write batches.
//
// One engine per manager. Runs of a chunk (already planned and validated by
// the caller, see plan.h) are mapped onto the registered regions, split into
// batches of at most `max_batch_ops` writes, posted on the transport from the
// engine's own thread, and followed by a notification message that the
// transport delivers only after the writes are visible. `done` runs once per
// chunk, on a transport thread, with the first error of any batch (or on the
// posting thread when the transport refuses the batch at once).
//
// Small chunks (at most `inline_max_runs` runs) are posted on the caller's
// thread when the engine is idle: a one-page request does not wait for the
// engine thread to wake. Chunks are posted in the order PostChunk was called
// either way (a chunk never overtakes one queued before it).
//
// Bytes in flight are bounded: the engine thread posts no further batch while
// `window_bytes` or more of earlier batches are posted and not complete (one
// batch always goes). Without a bound, a burst of large requests queues
// gigabytes in the transport, and across hosts the messages that share its
// connections and progress thread (heartbeats, notices) wait behind them
// long enough for healthy peers to be taken for dead. Inline posts (small
// chunks on the caller's thread) are not held: they are small by definition.
//
// Thread safety: all methods are thread-safe.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "engine/plan.h"
#include "transport/transport.h"

namespace kvbridge::internal {

struct RegionSet {
  std::vector<RegionId> kv, aux, state;
};
struct RemoteRegionSet {
  std::vector<RemoteRegionId> kv, aux, state;
};

// Status of a chunk and the payload bytes it carried.
using ChunkCallback = std::function<void(const Status&, uint64_t bytes, uint64_t ops)>;

class TransferEngine {
 public:
  static constexpr uint64_t kDefaultWindowBytes = uint64_t{64} << 20;
  TransferEngine(Transport& transport, RegionSet local, size_t max_batch_ops = 1024,
                 size_t inline_max_runs = 256, uint64_t window_bytes = kDefaultWindowBytes);
  ~TransferEngine();  // drains queued jobs (their callbacks get Aborted), joins
  TransferEngine(const TransferEngine&) = delete;
  TransferEngine& operator=(const TransferEngine&) = delete;

  // Queues a chunk for `peer`. `runs` index the buffers of the local and
  // remote region sets; `notify` (may be empty) is sent after the writes.
  // `done` is always called exactly once.
  void PostChunk(PeerId peer, RemoteRegionSet remote, std::vector<CopyRun> runs, std::string notify,
                 ChunkCallback done);

  // Maps runs to write ops. InvalidArgument when a run names a buffer the
  // sets do not have. Exposed for tests.
  static Result<std::vector<WriteOp>> ToWriteOps(const RegionSet& local,
                                                 const RemoteRegionSet& remote,
                                                 const std::vector<CopyRun>& runs);

 private:
  struct Job {
    PeerId peer;
    RemoteRegionSet remote;
    std::vector<CopyRun> runs;
    std::string notify;
    ChunkCallback done;
  };
  void Loop();
  // `windowed`: waits for room in the window before each batch (the engine
  // thread); an inline post does not.
  void Run(Job job, bool windowed);
  // Bytes posted and not complete. Shared with the completions, which may
  // run on a transport thread after the engine is gone.
  struct Window {
    explicit Window(uint64_t l) : limit(l) {}
    const uint64_t limit;
    std::mutex mu;
    std::condition_variable cv;
    uint64_t inflight = 0;
    bool stop = false;
    // Engine thread: blocks until fewer than `limit` bytes are in flight (or
    // the engine stops), then counts `bytes` in.
    void Enter(uint64_t bytes);
    void Leave(uint64_t bytes);  // a batch completed (any thread)
  };

  Transport& transport_;
  const RegionSet local_;
  const size_t max_batch_ops_;
  const size_t inline_max_runs_;
  const std::shared_ptr<Window> window_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Job> queue_;
  bool stop_ = false;
  bool running_ = false;  // a job is being posted (engine thread or inline)
  std::thread thread_;
};

}  // namespace kvbridge::internal

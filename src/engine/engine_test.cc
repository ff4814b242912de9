#include "engine/engine.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <thread>

namespace kvbridge::internal {
namespace {

TEST(TransferEngineTest, MapsRunsOntoRegionsPerClass) {
  RegionSet local{{11, 12}, {21}, {31}};
  RemoteRegionSet remote{{111, 112}, {121}, {131}};
  std::vector<CopyRun> runs = {
      {BufferClass::kKv, 1, 64, 0, 128, 32},
      {BufferClass::kAux, 0, 8, 0, 16, 4},
      {BufferClass::kState, 0, 0, 0, 2, 1},
  };
  auto ops = TransferEngine::ToWriteOps(local, remote, runs);
  ASSERT_TRUE(ops.ok());
  ASSERT_EQ(ops->size(), 3u);
  EXPECT_EQ((*ops)[0].local_region, 12u);
  EXPECT_EQ((*ops)[0].remote_region, 111u);
  EXPECT_EQ((*ops)[0].local_offset, 64u);
  EXPECT_EQ((*ops)[0].remote_offset, 128u);
  EXPECT_EQ((*ops)[0].length, 32u);
  EXPECT_EQ((*ops)[1].local_region, 21u);
  EXPECT_EQ((*ops)[1].remote_region, 121u);
  EXPECT_EQ((*ops)[2].local_region, 31u);
  EXPECT_EQ((*ops)[2].remote_region, 131u);
}

TEST(TransferEngineTest, UnknownBufferIsInvalidArgument) {
  RegionSet local{{11}, {}, {}};
  RemoteRegionSet remote{{111}, {}, {}};
  auto ops = TransferEngine::ToWriteOps(local, remote, {{BufferClass::kKv, 0, 0, 3, 0, 8}});
  EXPECT_EQ(ops.status().code(), StatusCode::kInvalidArgument);
  ops = TransferEngine::ToWriteOps(local, remote, {{BufferClass::kAux, 0, 0, 0, 0, 8}});
  EXPECT_EQ(ops.status().code(), StatusCode::kInvalidArgument);
}

// Records what the engine posts, and on which thread; can hold the first
// PostWrites call until the test releases it.
class RecordingTransport : public Transport {
 public:
  std::string_view Name() const override { return "recording"; }
  const std::string& Address() const override { return address_; }
  void SetMessageHandler(MessageHandler) override {}
  void SetPeerFailureHandler(PeerFailureHandler) override {}
  Result<RegisteredRegion> RegisterMemory(void*, size_t, MemoryKind) override {
    return UnimplementedError("not used");
  }
  Status DeregisterMemory(RegionId) override { return Status(); }
  Result<PeerId> Connect(std::string_view) override { return PeerId{1}; }
  Result<RemoteRegionId> ImportRegion(PeerId, std::string_view) override { return 1; }
  Result<DataPath> PathTo(PeerId) const override { return DataPath::kSharedMemory; }
  Status PostWrites(PeerId, std::vector<WriteOp> ops, WriteCallback done) override {
    std::unique_lock<std::mutex> lock(mu);
    log.push_back("writes " + std::to_string(ops.size()));
    threads.push_back(std::this_thread::get_id());
    if (hold_first && !held) {
      held = true;
      cv.notify_all();
      cv.wait(lock, [&] { return released; });
    }
    lock.unlock();
    done(Status());
    return Status();
  }
  Status SendMessage(PeerId, std::string payload) override {
    std::lock_guard<std::mutex> lock(mu);
    log.push_back("notify " + payload);
    cv.notify_all();
    return Status();
  }
  void Disconnect(PeerId) override {}

  std::mutex mu;
  std::condition_variable cv;
  std::vector<std::string> log;
  std::vector<std::thread::id> threads;
  bool hold_first = false, held = false, released = false;

 private:
  std::string address_ = "recording";
};

std::vector<CopyRun> Runs(size_t n) {
  return std::vector<CopyRun>(n, CopyRun{BufferClass::kKv, 0, 0, 0, 0, 8});
}

TEST(TransferEngineTest, SmallChunkOnAnIdleEngineIsPostedOnTheCallersThread) {
  RecordingTransport t;
  TransferEngine engine(t, RegionSet{{11}, {}, {}}, /*max_batch_ops=*/1024, /*inline_max_runs=*/4);
  bool done = false;
  engine.PostChunk(1, RemoteRegionSet{{111}, {}, {}}, Runs(3), "a",
                   [&](const Status& s, uint64_t bytes, uint64_t ops) {
                     EXPECT_TRUE(s.ok());
                     EXPECT_EQ(bytes, 24u);
                     EXPECT_EQ(ops, 3u);
                     done = true;
                   });
  // Posted (and, with this transport, completed) before PostChunk returned.
  EXPECT_TRUE(done);
  std::lock_guard<std::mutex> lock(t.mu);
  EXPECT_EQ(t.log, (std::vector<std::string>{"writes 3", "notify a"}));
  EXPECT_EQ(t.threads.at(0), std::this_thread::get_id());
}

TEST(TransferEngineTest, SmallChunkNeverOvertakesABigOneQueuedBeforeIt) {
  RecordingTransport t;
  t.hold_first = true;
  TransferEngine engine(t, RegionSet{{11}, {}, {}}, 1024, /*inline_max_runs=*/4);
  std::mutex mu;
  std::condition_variable cv;
  int finished = 0;
  auto count = [&](const Status& s, uint64_t, uint64_t) {
    EXPECT_TRUE(s.ok());
    std::lock_guard<std::mutex> lock(mu);
    ++finished;
    cv.notify_all();
  };
  engine.PostChunk(1, RemoteRegionSet{{111}, {}, {}}, Runs(10), "big", count);
  {
    // The engine thread is inside PostWrites of the big chunk, held there.
    std::unique_lock<std::mutex> lock(t.mu);
    t.cv.wait(lock, [&] { return t.held; });
    EXPECT_NE(t.threads.at(0), std::this_thread::get_id());
  }
  engine.PostChunk(1, RemoteRegionSet{{111}, {}, {}}, Runs(2), "small", count);
  {
    std::lock_guard<std::mutex> lock(t.mu);
    EXPECT_EQ(t.log, (std::vector<std::string>{"writes 10"}));  // small one queued
    t.released = true;
    t.cv.notify_all();
  }
  {
    std::unique_lock<std::mutex> lock(mu);
    cv.wait(lock, [&] { return finished == 2; });
  }
  // The fake completes writes inside PostWrites: the last notify follows.
  std::unique_lock<std::mutex> tl(t.mu);
  t.cv.wait(tl, [&] { return t.log.size() == 4; });
  EXPECT_EQ(t.log,
            (std::vector<std::string>{"writes 10", "notify big", "writes 2", "notify small"}));
}

// Completes nothing by itself: keeps each batch's callback until the test
// completes it, and records the most bytes posted and not complete.
class DeferringTransport : public RecordingTransport {
 public:
  Status PostWrites(PeerId, std::vector<WriteOp> ops, WriteCallback done) override {
    std::lock_guard<std::mutex> lock(mu);
    uint64_t bytes = 0;
    for (const WriteOp& op : ops) bytes += op.length;
    outstanding += bytes;
    most_outstanding = std::max(most_outstanding, outstanding);
    pending.push_back({bytes, std::move(done)});
    ++posted;
    cv.notify_all();
    return Status();
  }
  // Completes the oldest pending batch, off the lock as a transport would.
  void CompleteOne() {
    std::pair<uint64_t, WriteCallback> batch;
    {
      std::lock_guard<std::mutex> lock(mu);
      batch = std::move(pending.front());
      pending.pop_front();
      outstanding -= batch.first;
    }
    batch.second(Status());
  }

  std::deque<std::pair<uint64_t, WriteCallback>> pending;
  uint64_t outstanding = 0, most_outstanding = 0;
  int posted = 0;
};

TEST(TransferEngineTest, BytesInFlightStayWithinTheWindow) {
  DeferringTransport t;
  // One 8-byte write per batch, nothing inline, a window of two batches.
  TransferEngine engine(t, RegionSet{{11}, {}, {}}, /*max_batch_ops=*/1, /*inline_max_runs=*/0,
                        /*window_bytes=*/16);
  std::mutex mu;
  std::condition_variable cv;
  std::vector<std::pair<Status, uint64_t>> finished;
  engine.PostChunk(1, RemoteRegionSet{{111}, {}, {}}, Runs(10), "end",
                   [&](const Status& s, uint64_t bytes, uint64_t) {
                     std::lock_guard<std::mutex> lock(mu);
                     finished.emplace_back(s, bytes);
                     cv.notify_all();
                   });
  for (int completed = 0; completed < 10; ++completed) {
    {
      // Two batches out (the window is full) or every batch posted.
      std::unique_lock<std::mutex> lock(t.mu);
      ASSERT_TRUE(t.cv.wait_for(lock, std::chrono::seconds(30),
                                [&] { return t.posted - completed == 2 || t.posted == 10; }))
          << "posted " << t.posted << " completed " << completed;
    }
    t.CompleteOne();
  }
  std::unique_lock<std::mutex> lock(mu);
  ASSERT_TRUE(cv.wait_for(lock, std::chrono::seconds(30), [&] { return !finished.empty(); }));
  EXPECT_TRUE(finished[0].first.ok()) << finished[0].first.ToString();
  EXPECT_EQ(finished[0].second, 80u);
  std::lock_guard<std::mutex> tl(t.mu);
  EXPECT_EQ(t.posted, 10);
  // Without the window the engine posts all ten at once (80 bytes out).
  EXPECT_EQ(t.most_outstanding, 16u);
}

}  // namespace
}  // namespace kvbridge::internal

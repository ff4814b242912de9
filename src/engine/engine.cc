#include "engine/engine.h"

#include <atomic>
#include <memory>

#include "common/log.h"
#include "common/process.h"

namespace kvbridge::internal {

TransferEngine::TransferEngine(Transport& transport, RegionSet local, size_t max_batch_ops,
                               size_t inline_max_runs, uint64_t window_bytes)
    : transport_(transport),
      local_(std::move(local)),
      max_batch_ops_(max_batch_ops == 0 ? 1 : max_batch_ops),
      inline_max_runs_(inline_max_runs),
      window_(std::make_shared<Window>(window_bytes == 0 ? 1 : window_bytes)),
      thread_([this] { Loop(); }) {}

TransferEngine::~TransferEngine() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  {
    std::lock_guard<std::mutex> lock(window_->mu);
    window_->stop = true;
  }
  window_->cv.notify_all();
  thread_.join();
  for (Job& job : queue_) job.done(AbortedError("transfer engine shut down"), 0, 0);
}

void TransferEngine::PostChunk(PeerId peer, RemoteRegionSet remote, std::vector<CopyRun> runs,
                               std::string notify, ChunkCallback done) {
  Job job{peer, std::move(remote), std::move(runs), std::move(notify), std::move(done)};
  bool stopped = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stop_) {
      stopped = true;
    } else if (running_ || !queue_.empty() || job.runs.size() > inline_max_runs_) {
      queue_.push_back(std::move(job));
      cv_.notify_one();
      return;
    } else {
      running_ = true;  // the engine thread waits until this one is posted
    }
  }
  if (stopped) {
    // Never under mu_: `done` takes the caller's own locks.
    job.done(AbortedError("transfer engine shut down"), 0, 0);
    return;
  }
  Run(std::move(job), /*windowed=*/false);
  {
    std::lock_guard<std::mutex> lock(mu_);
    running_ = false;
  }
  cv_.notify_one();
}

void TransferEngine::Loop() {
  NameThisThread("kvb-engine");
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    cv_.wait(lock, [this] { return stop_ || (!queue_.empty() && !running_); });
    if (stop_) return;
    Job job = std::move(queue_.front());
    queue_.pop_front();
    running_ = true;
    lock.unlock();
    Run(std::move(job), /*windowed=*/true);
    lock.lock();
    running_ = false;
  }
}

Result<std::vector<WriteOp>> TransferEngine::ToWriteOps(const RegionSet& local,
                                                        const RemoteRegionSet& remote,
                                                        const std::vector<CopyRun>& runs) {
  std::vector<WriteOp> ops;
  ops.reserve(runs.size());
  for (const CopyRun& r : runs) {
    const std::vector<RegionId>* l = &local.kv;
    const std::vector<RemoteRegionId>* d = &remote.kv;
    if (r.cls == BufferClass::kAux) {
      l = &local.aux;
      d = &remote.aux;
    } else if (r.cls == BufferClass::kState) {
      l = &local.state;
      d = &remote.state;
    }
    if (r.src_buffer >= l->size() || r.dst_buffer >= d->size()) {
      return InvalidArgumentError("copy names buffer " + std::to_string(r.src_buffer) + " -> " +
                                  std::to_string(r.dst_buffer) + " beyond the registered " +
                                  std::to_string(l->size()) + " / " + std::to_string(d->size()));
    }
    ops.push_back(
        WriteOp{(*l)[r.src_buffer], r.src_offset, (*d)[r.dst_buffer], r.dst_offset, r.length});
  }
  return ops;
}

void TransferEngine::Window::Enter(uint64_t bytes) {
  std::unique_lock<std::mutex> lock(mu);
  cv.wait(lock, [&] { return stop || inflight < limit; });
  inflight += bytes;
}

void TransferEngine::Window::Leave(uint64_t bytes) {
  {
    std::lock_guard<std::mutex> lock(mu);
    inflight -= bytes;
  }
  cv.notify_all();
}

void TransferEngine::Run(Job job, bool windowed) {
  Result<std::vector<WriteOp>> ops = ToWriteOps(local_, job.remote, job.runs);
  if (!ops.ok()) {
    job.done(ops.status(), 0, 0);
    return;
  }
  uint64_t bytes = 0;
  for (const WriteOp& op : *ops) bytes += op.length;
  const uint64_t num_ops = ops->size();
  if (ops->empty()) {
    Status s = job.notify.empty() ? Status() : transport_.SendMessage(job.peer, job.notify);
    job.done(s, 0, 0);
    return;
  }
  // One completion for the whole chunk: the last batch to finish reports the
  // first error seen.
  struct Pending {
    std::atomic<size_t> left;
    std::mutex mu;
    Status first_error;
    ChunkCallback done;
    uint64_t bytes;
    uint64_t ops;
  };
  size_t batches = (ops->size() + max_batch_ops_ - 1) / max_batch_ops_;
  auto pending = std::make_shared<Pending>();
  pending->left = batches;
  pending->done = std::move(job.done);
  pending->bytes = bytes;
  pending->ops = num_ops;
  auto finish_one = [pending](const Status& s) {
    if (!s.ok()) {
      std::lock_guard<std::mutex> lock(pending->mu);
      if (pending->first_error.ok()) pending->first_error = s;
    }
    if (pending->left.fetch_sub(1) == 1) {
      Status result;
      {
        std::lock_guard<std::mutex> lock(pending->mu);
        result = pending->first_error;
      }
      pending->done(result, result.ok() ? pending->bytes : 0, pending->ops);
    }
  };
  for (size_t b = 0; b < batches; ++b) {
    size_t begin = b * max_batch_ops_;
    size_t end = std::min(ops->size(), begin + max_batch_ops_);
    std::vector<WriteOp> batch(ops->begin() + begin, ops->begin() + end);
    uint64_t batch_bytes = 0;
    for (const WriteOp& op : batch) batch_bytes += op.length;
    WriteCallback done = finish_one;
    if (windowed) {
      window_->Enter(batch_bytes);
      done = [window = window_, batch_bytes, finish_one](const Status& s) {
        window->Leave(batch_bytes);
        finish_one(s);
      };
    }
    Status s = transport_.PostWrites(job.peer, std::move(batch), done);
    if (!s.ok()) {
      if (windowed) window_->Leave(batch_bytes);  // refused: `done` is never called
      // This batch and the ones never posted count as failed now.
      for (size_t rest = b; rest < batches; ++rest) finish_one(s);
      return;
    }
  }
  if (!job.notify.empty()) {
    Status s = transport_.SendMessage(job.peer, std::move(job.notify));
    if (!s.ok()) KVB_LOG_WARN("notification to peer {} not sent: {}", job.peer, s.ToString());
  }
}

}  // namespace kvbridge::internal

// Test helpers shared by the transport unit tests (loopback_transport_test.cc,
// fault_transport_test.cc): callbacks that record what a transport reported,
// and a latch. Header-only: a .cc under src/ that is not *_test.cc would be
// built into the library.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include "kvbridge/status.h"
#include "transport/transport.h"

namespace kvbridge::internal::testing {

// Collects WriteCallback results and the threads they ran on; Wait blocks
// until n have arrived.
class Completions {
 public:
  WriteCallback Callback() {
    return [this](const Status& s) {
      std::lock_guard<std::mutex> lock(mu_);
      statuses_.push_back(s);
      threads_.push_back(std::this_thread::get_id());
      cv_.notify_all();
    };
  }
  std::vector<Status> Wait(size_t n) {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return statuses_.size() >= n; });
    return statuses_;
  }
  size_t Count() {
    std::lock_guard<std::mutex> lock(mu_);
    return statuses_.size();
  }
  std::thread::id Thread(size_t i) {
    std::lock_guard<std::mutex> lock(mu_);
    return threads_.at(i);
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<Status> statuses_;
  std::vector<std::thread::id> threads_;
};

// A one-shot latch: Wait blocks until Open.
class Gate {
 public:
  void Open() {
    std::lock_guard<std::mutex> lock(mu_);
    open_ = true;
    cv_.notify_all();
  }
  void Wait() {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return open_; });
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool open_ = false;
};

// Records PeerFailureHandler calls; Wait blocks until n have arrived.
class Failures {
 public:
  PeerFailureHandler Handler() {
    return [this](PeerId peer, const Status& why) {
      std::lock_guard<std::mutex> lock(mu_);
      calls_.emplace_back(peer, why);
      cv_.notify_all();
    };
  }
  std::vector<std::pair<PeerId, Status>> Wait(size_t n) {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return calls_.size() >= n; });
    return calls_;
  }
  size_t Count() {
    std::lock_guard<std::mutex> lock(mu_);
    return calls_.size();
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::pair<PeerId, Status>> calls_;
};

}  // namespace kvbridge::internal::testing

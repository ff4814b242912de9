// The inside of EtcdRegistryClient, shared by etcd_registry.cc (reads, the
// watch thread) and etcd_registry_writes.cc (registration, keep-alive,
// failure records).
#pragma once

#include <atomic>
#include <condition_variable>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "common/thread_annotations.h"
#include "control/etcd_gateway.h"
#include "control/etcd_registry.h"
#include "control/etcd_view.h"

namespace kvbridge::internal {

struct EtcdRegistryClient::State {
  using Clock = std::chrono::steady_clock;

  EtcdRegistryOptions options;
  std::unique_ptr<EtcdGateway> gateway;
  std::string prefix;
  std::string address;
  EtcdSeal seal;  // of options.auth_token

  mutable Mutex mu;
  mutable std::condition_variable_any changed;  // a watch batch applied (or stopping)
  EtcdView view KVB_GUARDED_BY(mu);
  int64_t revision KVB_GUARDED_BY(mu) = 0;  // the newest revision the view holds
  uint64_t changes KVB_GUARDED_BY(mu) = 0;
  bool stopping KVB_GUARDED_BY(mu) = false;
  bool watch_done KVB_GUARDED_BY(mu) = false;

  // This process's registration.
  struct Own {
    bool registered = false;
    RankRole role = RankRole::kPrefill;
    RankKey key;
    uint64_t incarnation = 0;
    std::string path;
    int64_t alive_lease = 0;
    int64_t record_lease = 0;
    std::chrono::milliseconds alive_ttl{0};
    std::chrono::milliseconds record_ttl{0};
    Clock::time_point last_ok{};   // the last keep-alive etcd answered
    Clock::time_point last_try{};  // the last keep-alive sent
  };
  Own own KVB_GUARDED_BY(mu);

  Mutex callback_mu;
  std::function<void()> on_change KVB_GUARDED_BY(callback_mu);

  std::thread watcher;

  explicit State(EtcdRegistryOptions o);
  std::string Key(const std::string& rest) const { return prefix + rest; }
  // Reads every key of the deployment into the view.
  Status Resync();
  void WatchLoop();
  // Waits (bounded by the call timeout) until the view holds `revision`.
  // True when it does.
  bool AwaitRevision(int64_t revision);
  // A transaction of puts/deletes without compares; the answer's revision.
  Result<int64_t> Txn(const nlohmann::json& compare, const nlohmann::json& success,
                      bool* succeeded) const;
  Status GrantLeases(Own* own);
};

}  // namespace kvbridge::internal

#include "control/etcd_registry.h"

#include <cstdlib>

#include "common/log.h"
#include "common/process.h"
#include "control/auth.h"
#include "control/etcd_registry_state.h"
#include "control/json_fields.h"

namespace kvbridge::internal {
namespace {

using nlohmann::json;

Status ValidateNamespace(const std::string& ns) {
  bool ok = !ns.empty() && ns.size() <= 64;
  for (char c : ns)
    ok = ok && (std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' || c == '-');
  if (ok) return Status::Ok();
  return InvalidArgumentError("etcd namespace '" + Clip(ns, 80) +
                              "' must be 1 to 64 of [A-Za-z0-9._-]");
}

}  // namespace

Result<EtcdRegistryOptions> ParseEtcdRegistryUrl(std::string_view url) {
  constexpr std::string_view kScheme = "etcd://";
  if (url.substr(0, kScheme.size()) != kScheme) {
    return InvalidArgumentError("registry '" + Clip(url, 120) +
                                "' does not start with etcd:// (etcd://HOST:PORT[,HOST:PORT...]"
                                "[/NAMESPACE])");
  }
  std::string_view rest = url.substr(kScheme.size());
  EtcdRegistryOptions o;
  size_t slash = rest.find('/');
  if (slash != std::string_view::npos) {
    o.ns = std::string(rest.substr(slash + 1));
    rest = rest.substr(0, slash);
  }
  KVB_RETURN_IF_ERROR(ValidateNamespace(o.ns).WithContext("registry '" + Clip(url, 120) + "'"));
  KVB_ASSIGN_OR_RETURN(o.gateway.endpoints, ParseEtcdEndpoints(rest));
  if (const char* user = std::getenv("KVBRIDGE_ETCD_USER"); user != nullptr && *user != '\0') {
    o.gateway.user = user;
    const char* password = std::getenv("KVBRIDGE_ETCD_PASSWORD");
    o.gateway.password = password != nullptr ? password : "";
  }
  o.url = std::string(url);
  return o;
}

EtcdRegistryClient::State::State(EtcdRegistryOptions o)
    : options(std::move(o)),
      prefix("/kvbridge/" + options.ns + "/"),
      seal(options.auth_token),
      view(prefix, seal) {
  address = options.url;
  if (address.empty()) {
    address = "etcd://";
    for (size_t i = 0; i < options.gateway.endpoints.size(); ++i)
      address += (i ? "," : "") + options.gateway.endpoints[i].ToString();
    address += "/" + options.ns;
  }
}

Status EtcdRegistryClient::State::Resync() {
  std::vector<EtcdKv> kvs;
  int64_t rev = 0;
  KVB_RETURN_IF_ERROR(gateway->RangePrefix(prefix, &kvs, &rev));
  MutexLock lock(mu);
  view.Reset(kvs, Clock::now());
  revision = rev;
  ++changes;
  changed.notify_all();
  return Status::Ok();
}

void EtcdRegistryClient::State::WatchLoop() {
  NameThisThread("kvb-etcd-watch");
  bool warned = false;
  auto apply = [&](const std::vector<EtcdEvent>& events, int64_t) {
    {
      MutexLock lock(mu);
      const auto now = Clock::now();
      for (const EtcdEvent& ev : events) {
        view.Apply(ev, now);
        revision = std::max(revision, ev.kv.mod_revision);
      }
      ++changes;
      changed.notify_all();
      if (stopping) return false;
    }
    warned = false;
    MutexLock lock(callback_mu);
    if (on_change) on_change();
    return true;
  };
  for (;;) {
    int64_t from;
    {
      MutexLock lock(mu);
      if (stopping) break;
      from = revision + 1;
    }
    int64_t compacted = 0;
    Status s = gateway->Watch(prefix, from, apply, &compacted);
    if (s.code() == StatusCode::kCancelled) break;
    if (compacted > 0) {
      KVB_LOG_WARN("etcd registry: {}; reading every key again", s.message());
      s = Resync();
      if (s.ok()) continue;
    }
    if (!warned) KVB_LOG_WARN("etcd registry watch: {}; reconnecting", s.message());
    warned = true;
    MutexLock lock(mu);
    // A pause before the next member (a backoff; Stop() ends it at once).
    lock.WaitFor(changed, std::chrono::milliseconds(200),
                 [&]() KVB_REQUIRES(mu) { return stopping; });
  }
  MutexLock lock(mu);
  watch_done = true;
  changed.notify_all();
}

bool EtcdRegistryClient::State::AwaitRevision(int64_t rev) {
  MutexLock lock(mu);
  lock.WaitFor(changed, options.gateway.timeout,
               [&]() KVB_REQUIRES(mu) { return revision >= rev || stopping; });
  return revision >= rev;
}

Result<std::unique_ptr<EtcdRegistryClient>> EtcdRegistryClient::Create(
    EtcdRegistryOptions options) {
  if (options.unresponsive_after.count() <= 0 || options.dead_after < options.unresponsive_after ||
      options.max_failure_records == 0) {
    return InvalidArgumentError(
        "etcd registry: need unresponsive_after > 0, dead_after >= unresponsive_after and "
        "max_failure_records > 0");
  }
  KVB_RETURN_IF_ERROR(ValidateNamespace(options.ns));
  if (options.auth_token.empty()) {
    return FailedPreconditionError(
        std::string("etcd registry: no deployment secret to seal its values with; set ") +
        kAuthTokenEnv + " (or " + kSglangAuthTokenEnv + ") on every rank");
  }
  auto state = std::make_unique<State>(std::move(options));
  KVB_ASSIGN_OR_RETURN(state->gateway, EtcdGateway::Create(state->options.gateway));
  KVB_RETURN_IF_ERROR(state->Resync().WithContext("etcd registry " + state->address));
  State* s = state.get();
  state->watcher = std::thread([s] { s->WatchLoop(); });
  KVB_LOG_INFO("etcd registry {}: keys under {}", s->address, s->prefix);
  return std::unique_ptr<EtcdRegistryClient>(new EtcdRegistryClient(std::move(state)));
}

EtcdRegistryClient::EtcdRegistryClient(std::unique_ptr<State> state) : s_(std::move(state)) {}

EtcdRegistryClient::~EtcdRegistryClient() {
  {
    MutexLock lock(s_->mu);
    s_->stopping = true;
  }
  s_->changed.notify_all();
  // StopWatches ends a stream in flight; one that was only being opened is
  // stopped by the next call (each call also bars new streams).
  for (;;) {
    s_->gateway->StopWatches();
    MutexLock lock(s_->mu);
    if (lock.WaitFor(s_->changed, std::chrono::milliseconds(20),
                     [&]() KVB_REQUIRES(s_->mu) { return s_->watch_done; }))
      break;
  }
  if (s_->watcher.joinable()) s_->watcher.join();
  State::Own own;
  {
    MutexLock lock(s_->mu);
    own = s_->own;
  }
  // Best effort: the keys go now rather than when the leases expire.
  for (int64_t lease : {own.alive_lease, own.record_lease})
    if (lease != 0) s_->gateway->LeaseRevoke(lease).IgnoreError();
}

const std::string& EtcdRegistryClient::address() const { return s_->address; }
const std::string& EtcdRegistryClient::prefix() const { return s_->prefix; }

Result<RankRecord> EtcdRegistryClient::GetRank(int dp, int cp, int tp, int pp) const {
  MutexLock lock(s_->mu);
  return s_->view.GetRank(dp, cp, tp, pp);
}

Status EtcdRegistryClient::CatchUp() const {
  // The newest write under this namespace, not the store's revision: the
  // watch sees only this namespace, so a store revision moved by another
  // writer of the same etcd would never be reached (review finding).
  KVB_ASSIGN_OR_RETURN(const int64_t rev, s_->gateway->NewestUnder(s_->prefix));
  if (s_->AwaitRevision(rev)) return Status();
  return UnavailableError(
      fmt::format("etcd registry: the watch did not reach revision {} within {} ms", rev,
                  s_->options.gateway.timeout.count()));
}

Result<ParallelInfo> EtcdRegistryClient::GetParallelInfo() const {
  MutexLock lock(s_->mu);
  return s_->view.GetParallelInfo();
}

Result<std::vector<RankStatus>> EtcdRegistryClient::ListRanks() const {
  MutexLock lock(s_->mu);
  return s_->view.ListRanks(State::Clock::now());
}

Result<FailureBatch> EtcdRegistryClient::FailuresSince(uint64_t since) const {
  MutexLock lock(s_->mu);
  return s_->view.FailuresSince(since);
}

Status EtcdRegistryClient::Health() const {
  return s_->gateway->Call("/v3/maintenance/status", json::object(), /*retry=*/false).status();
}

void EtcdRegistryClient::SetChangeCallback(std::function<void()> on_change) const {
  MutexLock lock(s_->callback_mu);
  s_->on_change = std::move(on_change);
}

std::map<std::string, std::string> EtcdRegistryClient::Problems() const {
  MutexLock lock(s_->mu);
  return s_->view.problems();
}

void EtcdRegistryClient::AbandonLeases() const {
  MutexLock lock(s_->mu);
  s_->own = State::Own{};
}

uint64_t EtcdRegistryClient::changes() const {
  MutexLock lock(s_->mu);
  return s_->changes;
}

bool EtcdRegistryClient::AwaitChange(uint64_t seen, std::chrono::milliseconds timeout) const {
  MutexLock lock(s_->mu);
  return lock.WaitFor(s_->changed, timeout,
                      [&]() KVB_REQUIRES(s_->mu) { return s_->changes > seen; });
}

}  // namespace kvbridge::internal

#include "control/etcd_gateway.h"

#include <httplib.h>

#include <algorithm>
#include <charconv>
#include <thread>

#include "common/base64.h"
#include "common/log.h"
#include "control/bootstrap_client.h"
#include "control/json_fields.h"

namespace kvbridge::internal {
namespace {

using nlohmann::json;
using Clock = std::chrono::steady_clock;

// Bounds on what a member may send: one answer (a range of every record of
// a deployment is well under this), and one line of a watch stream.
constexpr size_t kMaxAnswerBytes = size_t{64} << 20;

std::string Why(httplib::Error err) {
  switch (err) {
    case httplib::Error::Connection:
      return "connection refused or failed";
    case httplib::Error::ConnectionTimeout:
      return "connect timed out";
    case httplib::Error::Read:
      return "no complete answer (read failed or timed out)";
    case httplib::Error::Write:
      return "sending the request failed";
    case httplib::Error::Canceled:
      return "stopped";
    default:
      return httplib::to_string(err);
  }
}

// The Status of an etcd error answer ({"error", "message", "code"}: the
// gRPC code, which kvbridge's codes share). Sets *retry for the ones another
// member (or a later try) may not give: no leader, timeouts.
Status EtcdError(int http_status, const std::string& body, const std::string& where, bool* retry) {
  Result<json> j = ParseJson(body, "etcd error answer", size_t{1} << 20);
  int64_t code = 0;
  std::string message = Clip(body, 200);
  if (j.ok() && j->is_object()) {
    JsonFields f(*j, "etcd error");
    if (f.Has("code")) f.Int("code", int64_t{0}, int64_t{16}, &code).IgnoreError();
    if (f.Has("message")) f.String("message", &message).IgnoreError();
    message = Clip(message, 400);
  }
  if (code == 0) code = http_status >= 500 ? 14 : 13;
  const std::string text = where + ": " + message;
  *retry = code == 14 || code == 4 || code == 1 || code == 10;
  switch (code) {
    case 3:
      return InvalidArgumentError(text);
    case 5:
      return NotFoundError(text);
    case 7:
      return Status(StatusCode::kPermissionDenied, text);
    case 8:
      return ResourceExhaustedError(text);
    case 9:
      return FailedPreconditionError(text);
    case 16:
      return UnauthenticatedError(text);
    case 4:
    case 14:
      return UnavailableError(text);
    default:
      return InternalError(text);
  }
}

bool InvalidToken(const Status& s) {
  return s.message().find("invalid auth token") != std::string::npos;
}

Result<EtcdKv> ReadKv(const json& j) {
  if (!j.is_object()) return InternalError("etcd key-value is not an object");
  EtcdKv kv;
  std::string key64, value64;
  JsonFields f(j, "etcd key-value");
  KVB_RETURN_IF_ERROR(f.String("key", &key64));
  if (f.Has("value")) KVB_RETURN_IF_ERROR(f.String("value", &value64));
  KVB_ASSIGN_OR_RETURN(kv.key, Base64Decode(key64));
  KVB_ASSIGN_OR_RETURN(kv.value, Base64Decode(value64));
  if (!EtcdGateway::Int64Field(j, "create_revision", &kv.create_revision) ||
      !EtcdGateway::Int64Field(j, "mod_revision", &kv.mod_revision) ||
      !EtcdGateway::Int64Field(j, "version", &kv.version) ||
      !EtcdGateway::Int64Field(j, "lease", &kv.lease)) {
    return InternalError("etcd key-value has a field that is not an integer");
  }
  return kv;
}

Status HeaderRevision(const json& answer, int64_t* revision) {
  const json* header =
      answer.is_object() && answer.contains("header") ? &answer["header"] : nullptr;
  if (header == nullptr || !header->is_object() ||
      !EtcdGateway::Int64Field(*header, "revision", revision)) {
    return InternalError("etcd answer without a header revision");
  }
  return Status::Ok();
}

// A client for one call to member `e`: every wait bounded by `timeout`, no
// keep-alive, and the member's auth token when there is one.
std::unique_ptr<httplib::Client> CallClient(const EtcdEndpoint& e,
                                            std::chrono::milliseconds timeout,
                                            const std::string& token) {
  auto cli = std::make_unique<httplib::Client>(e.host, e.port);
  cli->set_connection_timeout(timeout);
  cli->set_read_timeout(timeout);
  cli->set_write_timeout(timeout);
  cli->set_keep_alive(false);
  if (!token.empty()) cli->set_default_headers({{"Authorization", token}});
  return cli;
}

}  // namespace

std::string EtcdEndpoint::ToString() const {
  return (host.find(':') != std::string::npos ? "[" + host + "]" : host) + ":" +
         std::to_string(port);
}

Result<std::vector<EtcdEndpoint>> ParseEtcdEndpoints(std::string_view list) {
  std::vector<EtcdEndpoint> out;
  size_t start = 0;
  while (start <= list.size()) {
    size_t comma = list.find(',', start);
    std::string_view one =
        list.substr(start, comma == std::string_view::npos ? list.npos : comma - start);
    EtcdEndpoint e;
    Status s = ParseHostPort(one, &e.host, &e.port);
    if (!s.ok()) {
      return InvalidArgumentError("etcd endpoint '" + Clip(one, 80) + "' in '" + Clip(list, 200) +
                                  "': " + s.message());
    }
    out.push_back(std::move(e));
    if (comma == std::string_view::npos) break;
    start = comma + 1;
  }
  if (out.size() > 64) return InvalidArgumentError("more than 64 etcd endpoints");
  return out;
}

std::string EtcdPrefixEnd(std::string_view prefix) {
  std::string end(prefix);
  while (!end.empty()) {
    if (static_cast<unsigned char>(end.back()) < 0xff) {
      end.back() = static_cast<char>(static_cast<unsigned char>(end.back()) + 1);
      return end;
    }
    end.pop_back();
  }
  return std::string(1, '\0');  // every key
}

std::string EtcdGateway::B64(std::string_view bytes) { return Base64Encode(bytes); }

bool EtcdGateway::BoolField(const json& j, const char* name, bool* out) {
  *out = false;
  auto it = j.find(name);
  if (it == j.end()) return true;
  if (!it->is_boolean()) return false;
  *out = it->get<bool>();
  return true;
}

bool EtcdGateway::Int64Field(const json& j, const char* name, int64_t* out) {
  *out = 0;
  auto it = j.find(name);
  if (it == j.end() || it->is_null()) return true;
  if (it->is_number_integer()) {
    *out = it->get<int64_t>();
    return true;
  }
  if (!it->is_string()) return false;
  const std::string& s = it->get_ref<const std::string&>();
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), *out);
  return !s.empty() && ec == std::errc() && end == s.data() + s.size();
}

Result<std::unique_ptr<EtcdGateway>> EtcdGateway::Create(EtcdGatewayOptions options) {
  if (options.endpoints.empty()) return InvalidArgumentError("etcd: no endpoint given");
  if (options.timeout.count() <= 0 || options.retry_for.count() < 0) {
    return InvalidArgumentError("etcd: timeout must be > 0 and retry_for >= 0");
  }
  return std::unique_ptr<EtcdGateway>(new EtcdGateway(std::move(options)));
}

EtcdGateway::EtcdGateway(EtcdGatewayOptions options) : options_(std::move(options)) {
  name_ = "etcd ";
  for (size_t i = 0; i < options_.endpoints.size(); ++i)
    name_ += (i ? "," : "") + options_.endpoints[i].ToString();
  tokens_.resize(options_.endpoints.size());
}

EtcdGateway::~EtcdGateway() = default;

Result<std::string> EtcdGateway::Token(size_t index, bool refresh) const {
  if (options_.user.empty()) return std::string();
  {
    MutexLock lock(mu_);
    if (!refresh && !tokens_[index].empty()) return tokens_[index];
  }
  const EtcdEndpoint& e = options_.endpoints[index];
  auto cli = CallClient(e, options_.timeout, std::string());
  const std::string body = DumpJson(json{{"name", options_.user}, {"password", options_.password}});
  httplib::Result res = cli->Post("/v3/auth/authenticate", body, "application/json");
  const std::string where = "etcd " + e.ToString() + " authenticate as '" + options_.user + "'";
  if (!res) return UnavailableError(where + ": " + Why(res.error()));
  if (res->status != 200) {
    bool retry = false;
    return EtcdError(res->status, res->body, where, &retry);
  }
  Result<json> j = ParseJson(res->body, where, size_t{1} << 20);
  std::string token;
  if (!j.ok() || !JsonFields(*j, where).String("token", &token).ok() || token.empty()) {
    return InternalError(where + ": the answer carries no token");
  }
  MutexLock lock(mu_);
  tokens_[index] = token;
  return token;
}

Status EtcdGateway::CallOne(size_t index, const std::string& path, const std::string& body,
                            json* answer, bool* try_next) const {
  const EtcdEndpoint& e = options_.endpoints[index];
  const std::string where = "etcd " + e.ToString() + " " + path;
  *try_next = true;
  for (int attempt = 0; attempt < 2; ++attempt) {
    Result<std::string> token = Token(index, attempt > 0);
    if (!token.ok()) {
      *try_next = token.status().code() == StatusCode::kUnavailable;
      return token.status();
    }
    auto cli = CallClient(e, options_.timeout, *token);
    httplib::Result res = cli->Post(path, body, "application/json");
    if (!res) return UnavailableError(where + ": " + Why(res.error()));
    if (res->status != 200) {
      Status s = EtcdError(res->status, res->body, where, try_next);
      if (InvalidToken(s) && attempt == 0) continue;  // the member forgot it: ask again
      return s;
    }
    Result<json> j = ParseJson(res->body, where + " answer", kMaxAnswerBytes);
    if (!j.ok() || !j->is_object()) {
      *try_next = false;
      return InternalError(
          where + " answered something that is not a JSON object: " + Clip(res->body, 120));
    }
    *answer = std::move(j).value();
    *try_next = false;
    return Status::Ok();
  }
  return UnauthenticatedError(where + ": etcd refused a fresh token");
}

Result<json> EtcdGateway::Call(const std::string& path, const json& body, bool retry) const {
  const std::string text = DumpJson(body);
  const Clock::time_point deadline =
      Clock::now() + (retry ? options_.retry_for : Clock::duration(0));
  size_t start;
  {
    MutexLock lock(mu_);
    start = current_;
  }
  const size_t n = options_.endpoints.size();
  Status last;
  for (int round = 0;; ++round) {
    for (size_t k = 0; k < n; ++k) {
      const size_t index = (start + k) % n;
      json answer;
      bool try_next = false;
      last = CallOne(index, path, text, &answer, &try_next);
      if (last.ok()) {
        MutexLock lock(mu_);
        current_ = index;
        return answer;
      }
      if (!try_next) return last;
      KVB_LOG_DEBUG("{}", last.message());
    }
    if (Clock::now() >= deadline) break;
    // Every member failed: an election or a restart is under way. A short
    // pause between rounds (a backoff, not a synchronisation).
    std::this_thread::sleep_for(std::chrono::milliseconds(std::min(50 * (round + 1), 250)));
  }
  if (last.code() == StatusCode::kUnavailable) {
    return UnavailableError(name_ + " unreachable: " + last.message());
  }
  return last;
}

Status EtcdGateway::RangePrefix(const std::string& prefix, std::vector<EtcdKv>* kvs,
                                int64_t* revision) const {
  KVB_ASSIGN_OR_RETURN(
      json a,
      Call("/v3/kv/range", json{{"key", B64(prefix)}, {"range_end", B64(EtcdPrefixEnd(prefix))}}));
  KVB_RETURN_IF_ERROR(HeaderRevision(a, revision).WithContext(name_ + " range"));
  kvs->clear();
  if (a.contains("kvs")) {
    if (!a["kvs"].is_array()) return InternalError(name_ + " range: 'kvs' is not an array");
    for (const json& j : a["kvs"]) {
      Result<EtcdKv> kv = ReadKv(j);
      if (!kv.ok()) return kv.status().WithContext(name_ + " range");
      kvs->push_back(std::move(kv).value());
    }
  }
  return Status::Ok();
}

Result<int64_t> EtcdGateway::NewestUnder(const std::string& prefix) const {
  KVB_ASSIGN_OR_RETURN(json a, Call("/v3/kv/range", json{{"key", B64(prefix)},
                                                         {"range_end", B64(EtcdPrefixEnd(prefix))},
                                                         {"sort_order", "DESCEND"},
                                                         {"sort_target", "MOD"},
                                                         {"limit", 1},
                                                         {"keys_only", true}}));
  if (!a.contains("kvs")) return int64_t{0};
  if (!a["kvs"].is_array()) return InternalError(name_ + " range: 'kvs' is not an array");
  if (a["kvs"].empty()) return int64_t{0};
  Result<EtcdKv> kv = ReadKv(a["kvs"][0]);
  if (!kv.ok()) return kv.status().WithContext(name_ + " range");
  return kv->mod_revision;
}

Status EtcdGateway::Get(const std::string& key, EtcdKv* kv, bool* found) const {
  KVB_ASSIGN_OR_RETURN(json a, Call("/v3/kv/range", json{{"key", B64(key)}}));
  *found = false;
  if (!a.contains("kvs")) return Status::Ok();
  if (!a["kvs"].is_array()) return InternalError(name_ + " range: 'kvs' is not an array");
  if (a["kvs"].empty()) return Status::Ok();
  Result<EtcdKv> r = ReadKv(a["kvs"][0]);
  if (!r.ok()) return r.status().WithContext(name_ + " range");
  *kv = std::move(r).value();
  *found = true;
  return Status::Ok();
}

Result<int64_t> EtcdGateway::LeaseGrant(int64_t ttl_s, int64_t* granted_s) const {
  KVB_ASSIGN_OR_RETURN(json a, Call("/v3/lease/grant", json{{"TTL", std::to_string(ttl_s)}}));
  int64_t id = 0;
  if (!Int64Field(a, "ID", &id) || !Int64Field(a, "TTL", granted_s) || id == 0 || *granted_s <= 0) {
    return InternalError(name_ +
                         " lease grant answered without a lease: " + Clip(DumpJson(a), 200));
  }
  return id;
}

Result<std::vector<int64_t>> EtcdGateway::LeaseKeepAlive(
    const std::vector<int64_t>& leases, std::chrono::milliseconds per_member) const {
  // The keep-alive route is a stream: one request per line, one result each.
  std::string body;
  for (int64_t id : leases) body += DumpJson(json{{"ID", std::to_string(id)}}) + "\n";
  const size_t n = options_.endpoints.size();
  size_t start;
  {
    MutexLock lock(mu_);
    start = current_;
  }
  Status last;
  for (size_t k = 0; k < n; ++k) {
    const size_t index = (start + k) % n;
    const EtcdEndpoint& e = options_.endpoints[index];
    Result<std::string> token = Token(index, false);
    if (!token.ok()) {
      last = token.status();
      continue;
    }
    auto cli = CallClient(e, std::clamp(per_member, std::chrono::milliseconds(1), options_.timeout),
                          *token);
    const std::string where = "etcd " + e.ToString() + " lease keep-alive";
    httplib::Result res = cli->Post("/v3/lease/keepalive", body, "application/json");
    if (!res) {
      last = UnavailableError(where + ": " + Why(res.error()));
      continue;
    }
    if (res->status != 200) {
      bool retry = false;
      last = EtcdError(res->status, res->body, where, &retry);
      if (InvalidToken(last)) Token(index, true).status().IgnoreError();
      continue;
    }
    std::vector<int64_t> ttls;
    size_t pos = 0;
    while (pos < res->body.size() && ttls.size() < leases.size()) {
      size_t nl = res->body.find('\n', pos);
      std::string_view line(res->body.data() + pos,
                            (nl == std::string::npos ? res->body.size() : nl) - pos);
      pos = nl == std::string::npos ? res->body.size() : nl + 1;
      if (line.find_first_not_of(" \r\t") == std::string_view::npos) continue;
      Result<json> j = ParseJson(line, where, size_t{1} << 20);
      int64_t ttl = 0;
      if (!j.ok() || !j->is_object() || !j->contains("result") || !(*j)["result"].is_object() ||
          !Int64Field((*j)["result"], "TTL", &ttl)) {
        last = UnavailableError(where + ": unexpected answer " + Clip(line, 160));
        break;
      }
      ttls.push_back(ttl);
    }
    if (ttls.size() == leases.size()) {
      MutexLock lock(mu_);
      current_ = index;
      return ttls;
    }
    if (last.ok()) last = UnavailableError(where + ": fewer results than leases");
  }
  return UnavailableError(name_ + " unreachable: " + last.message());
}

Status EtcdGateway::LeaseRevoke(int64_t lease) const {
  return Call("/v3/lease/revoke", json{{"ID", std::to_string(lease)}}, /*retry=*/false).status();
}

bool EtcdGateway::StopWatches() const {
  MutexLock lock(mu_);
  stopping_ = true;
  for (httplib::Client* c : watching_) c->stop();
  return !watching_.empty();
}

Status EtcdGateway::Watch(
    const std::string& prefix, int64_t start_revision,
    const std::function<bool(const std::vector<EtcdEvent>&, int64_t)>& on_events,
    int64_t* compacted) const {
  const json create{{"create_request",
                     {{"key", B64(prefix)},
                      {"range_end", B64(EtcdPrefixEnd(prefix))},
                      {"start_revision", std::to_string(start_revision)}}}};
  size_t index;
  {
    MutexLock lock(mu_);
    if (stopping_) return Status(StatusCode::kCancelled, name_ + " watch stopped");
    index = current_;
  }
  Status s = WatchOne(index, DumpJson(create), on_events, compacted);
  if (s.code() == StatusCode::kUnavailable) {
    // Next time, another member: this one may be gone.
    MutexLock lock(mu_);
    if (current_ == index) current_ = (index + 1) % options_.endpoints.size();
  }
  return s;
}

}  // namespace kvbridge::internal

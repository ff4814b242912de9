#include "control/bootstrap_client.h"

#include <fmt/format.h>
#include <httplib.h>

#include <algorithm>
#include <charconv>

#include "common/host_identity.h"
#include "common/log.h"
#include "control/auth.h"
#include "control/http_client.h"
#include "control/http_server.h"
#include "control/http_status.h"
#include "control/json_fields.h"
#include "control/rank_endpoint.h"

namespace kvbridge::internal {
namespace {

using nlohmann::json;

// How long one connect may take before it is abandoned for a new one: a few
// round trips of a slow link, well under TCP's 1 s SYN retransmission.
constexpr std::chrono::milliseconds kConnectAttempt{250};

std::string Why(httplib::Error err, std::chrono::milliseconds timeout) {
  switch (err) {
    case httplib::Error::Connection:
      return "connection refused or failed";
    case httplib::Error::ConnectionTimeout:
      return "connect timed out after " + std::to_string(timeout.count()) + " ms";
    case httplib::Error::Read:
      return "no complete answer within " + std::to_string(timeout.count()) +
             " ms (read failed or timed out)";
    case httplib::Error::Write:
      return "sending the request failed";
    case httplib::Error::BindIPAddress:
      return "cannot bind the local address";
    default:
      return httplib::to_string(err);
  }
}

std::string Why(HttpCallFailure failure, std::chrono::milliseconds timeout) {
  switch (failure) {
    case HttpCallFailure::kConnectFailed:
      return "connection refused or failed";
    case HttpCallFailure::kConnectTimeout:
      return "connect timed out after " + std::to_string(timeout.count()) + " ms";
    case HttpCallFailure::kSendFailed:
      return "sending the request failed";
    default:
      return "no complete answer within " + std::to_string(timeout.count()) +
             " ms (read failed or timed out)";
  }
}

}  // namespace

Status ParseHostPort(std::string_view address, std::string* host, int* port) {
  auto bad = [&](std::string_view why) {
    return InvalidArgumentError("bootstrap address '" + std::string(address) +
                                "': " + std::string(why) + " (expected host:port)");
  };
  std::string_view h;
  std::string_view p;
  if (!address.empty() && address.front() == '[') {
    size_t close = address.find(']');
    if (close == std::string_view::npos) return bad("unterminated '['");
    h = address.substr(1, close - 1);
    if (close + 1 >= address.size() || address[close + 1] != ':') return bad("missing ':port'");
    p = address.substr(close + 2);
  } else {
    size_t colon = address.rfind(':');
    if (colon == std::string_view::npos) return bad("missing ':port'");
    h = address.substr(0, colon);
    p = address.substr(colon + 1);
    if (h.find(':') != std::string_view::npos) return bad("an IPv6 host must be in brackets");
  }
  if (h.empty()) return bad("empty host");
  for (char c : h) {
    if (c <= ' ' || c == '/' || c == '[' || c == ']' || c == '@') return bad("invalid host");
  }
  int value = 0;
  auto [end, ec] = std::from_chars(p.data(), p.data() + p.size(), value);
  if (p.empty() || ec != std::errc() || end != p.data() + p.size() || p.front() == '+' ||
      value < 1 || value > 65535) {
    return bad("port must be a number in 1..65535");
  }
  *host = std::string(h);
  *port = value;
  return Status::Ok();
}

Result<std::unique_ptr<BootstrapClient>> BootstrapClient::Create(std::string_view address,
                                                                 std::chrono::milliseconds timeout,
                                                                 std::string auth_token) {
  std::string host;
  int port = 0;
  KVB_RETURN_IF_ERROR(ParseHostPort(address, &host, &port));
  if (timeout.count() <= 0) {
    return InvalidArgumentError("bootstrap client timeout must be > 0 ms, got " +
                                std::to_string(timeout.count()));
  }
  return std::unique_ptr<BootstrapClient>(new BootstrapClient(
      std::string(address), std::move(host), port, timeout, std::move(auth_token)));
}

BootstrapClient::BootstrapClient(std::string address, std::string host, int port,
                                 std::chrono::milliseconds timeout, std::string auth_token)
    : address_(std::move(address)),
      host_(std::move(host)),
      port_(port),
      timeout_(timeout),
      auth_token_(std::move(auth_token)) {}

BootstrapClient::~BootstrapClient() = default;

std::unique_ptr<httplib::Client> BootstrapClient::NewClient(const std::string& host, int port,
                                                            bool keep_alive) const {
  auto cli = std::make_unique<httplib::Client>(host, port);
  cli->set_read_timeout(timeout_);
  cli->set_write_timeout(timeout_);
  cli->set_keep_alive(keep_alive);
  return cli;
}

Result<std::string> BootstrapClient::Call(const char* method, const std::string& path,
                                          const std::string& body, const std::string& credential,
                                          std::string* answered_credential,
                                          Session* session) const {
  return CallAt(host_, port_, "bootstrap server " + address_, method, path, body, /*auth=*/true,
                credential, answered_credential, session, nullptr, kMaxRegistryAnswer);
}

Result<std::string> BootstrapClient::CallAt(const std::string& host, int port,
                                            const std::string& who, const char* method,
                                            const std::string& path, const std::string& body,
                                            bool auth, const std::string& credential,
                                            std::string* answered_credential, Session* session,
                                            bool* no_answer, size_t max_body) const {
  if (session == nullptr) {
    return CallOnce(host, port, who, method, path, body, auth, credential, answered_credential,
                    no_answer, max_body);
  }
  // The calls of every heartbeat interval (`session`) keep a connection: on
  // a lossy link every new connection risks a lost SYN or SYN-ACK. The
  // server still closes it after a few requests (httplib's keep-alive count)
  // or 1 s idle, so no rank pins a server thread for good; a request that
  // fails on a reused connection is sent once more on a new one. These go to
  // the bootstrap server only (never to an address the registry names),
  // through httplib's client: its reads are not bounded (see CallOnce).
  //
  // A new connection's SYN is retransmitted only after TCP's 1 s initial
  // RTO: one lost packet would hold a heartbeat back for as long as the
  // registry's whole silence limit. So each connect gets kConnectAttempt
  // and, when it times out, is tried again on a new socket until `timeout_`
  // is spent: safe for every method, nothing was sent on a connection that
  // never came up. A refused connection is not retried (the server is down).
  // Headers per request: a kept connection outlives a credential.
  httplib::Headers headers;
  if (auth && !auth_token_.empty()) headers.emplace("Authorization", BearerValue(auth_token_));
  if (auth && !credential.empty()) headers.emplace(kRankCredentialHeader, credential);
  std::lock_guard<std::mutex> lock(session->mu);
  const std::string method_name(method);
  const auto deadline = std::chrono::steady_clock::now() + timeout_;
  httplib::Result res{nullptr, httplib::Error::Unknown};
  bool resent = false;
  for (;;) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (session->client == nullptr) {
      session->client = NewClient(host, port, /*keep_alive=*/true);
      session->used = false;
    }
    httplib::Client& cli = *session->client;
    cli.set_connection_timeout(std::clamp(left, std::chrono::milliseconds(1), kConnectAttempt));
    res = method_name == "GET"   ? cli.Get(path, headers)
          : method_name == "PUT" ? cli.Put(path, headers, body, "application/json")
                                 : cli.Post(path, headers, body, "application/json");
    if (res) {
      session->used = true;
      break;
    }
    const bool reused = session->used;
    session->client.reset();  // a failed connection is not used again
    if (std::chrono::steady_clock::now() >= deadline) break;
    if (res.error() == httplib::Error::ConnectionTimeout) {
      KVB_LOG_DEBUG("{}: connect timed out after {} ms; trying again", who,
                    kConnectAttempt.count());
      continue;
    }
    // The server may have closed a kept connection just as it was reused.
    if (!reused || resent ||
        (res.error() != httplib::Error::Read && res.error() != httplib::Error::Write))
      break;
    resent = true;
  }
  const std::string context = who + " " + method_name + " " + path;
  if (no_answer != nullptr) *no_answer = !res;
  if (!res) {
    Status s = UnavailableError(who + " unreachable: " + Why(res.error(), timeout_));
    KVB_LOG_DEBUG("{} failed: {}", context, s.ToString());
    return s;
  }
  if (res->status >= 200 && res->status < 300) {
    if (answered_credential != nullptr) {
      *answered_credential = res->get_header_value(kRankCredentialHeader);
    }
    return std::move(res->body);
  }
  Status s = StatusFromResponse(res->status, res->body, who);
  KVB_LOG_DEBUG("{} answered {}: {}", context, res->status, s.ToString());
  return s;
}

Result<std::string> BootstrapClient::CallOnce(const std::string& host, int port,
                                              const std::string& who, const char* method,
                                              const std::string& path, const std::string& body,
                                              bool auth, const std::string& credential,
                                              std::string* answered_credential, bool* no_answer,
                                              size_t max_body) const {
  // A connection of its own (Connection: close): a fresh connection notices
  // a restarted server at once, and the server holds a thread for each open
  // one. Read with HttpCall, which stops at the first byte past its bounds
  // (head, header count, `max_body`, the call's deadline): httplib's client
  // read a header line or a chunked body without end, and the rank endpoint
  // read here is at an address anyone who can write to the registry names.
  // A connect that times out is tried again, as in CallAt, until `timeout_`.
  HttpCallRequest req{host, port, method, path, {}, body};
  if (auth && !auth_token_.empty())
    req.headers.emplace_back("Authorization", BearerValue(auth_token_));
  if (auth && !credential.empty()) req.headers.emplace_back(kRankCredentialHeader, credential);
  req.wanted_headers.push_back(kRankCredentialHeader);
  // Connected within `timeout_` (as httplib's connect), and the whole call
  // within twice it: the exchange gets at least one `timeout_` of its own
  // (httplib gave each read one), and a server that trickles holds it no
  // longer.
  const auto start = std::chrono::steady_clock::now();
  const auto connect_deadline = start + timeout_;
  HttpCallOptions opts;
  opts.deadline = start + 2 * timeout_;
  opts.max_body = max_body;
  HttpCallFailure failure = HttpCallFailure::kNone;
  Result<HttpAnswer> res = UnavailableError("not called");
  for (;;) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        connect_deadline - std::chrono::steady_clock::now());
    opts.connect_timeout = std::clamp(left, std::chrono::milliseconds(1), kConnectAttempt);
    res = HttpCall(req, opts, &failure);
    if (failure != HttpCallFailure::kConnectTimeout ||
        std::chrono::steady_clock::now() >= connect_deadline)
      break;
    KVB_LOG_DEBUG("{}: connect timed out after {} ms; trying again", who, kConnectAttempt.count());
  }
  const std::string context = who + " " + method + " " + path;
  if (no_answer != nullptr) *no_answer = IsNoAnswer(failure);
  if (!res.ok()) {
    Status s = IsNoAnswer(failure)
                   ? UnavailableError(who + " unreachable: " + Why(failure, timeout_))
                   : Status(res.status().code(), who + " " + res.status().message());
    KVB_LOG_DEBUG("{} failed: {} ({})", context, s.ToString(), res.status().message());
    return s;
  }
  if (res->status >= 200 && res->status < 300) {
    if (answered_credential != nullptr) *answered_credential = res->Header(kRankCredentialHeader);
    return std::move(res->body);
  }
  Status s = StatusFromResponse(res->status, res->body, who);
  KVB_LOG_DEBUG("{} answered {}: {}", context, res->status, s.ToString());
  return s;
}

Status BootstrapClient::Malformed(const std::string& what, const Status& parse_error) const {
  Status s = InternalError("bootstrap server " + address_ + " sent a malformed answer to " + what +
                           ": " + parse_error.message());
  KVB_LOG_WARN("{}", s.message());
  return s;
}

Result<json> BootstrapClient::CallJson(const char* method, const std::string& path,
                                       const std::string& body, const std::string& credential,
                                       Session* session) const {
  KVB_ASSIGN_OR_RETURN(std::string text, Call(method, path, body, credential, nullptr, session));
  // The server is a stranger too: its answer is bounded like a request.
  Result<json> j = ParseJson(text, "the answer (" + Clip(text, 80) + ")", kMaxRegistryAnswer);
  if (!j.ok()) return Malformed(std::string(method) + " " + path, j.status());
  return j;
}

std::string BootstrapClient::Credential() const {
  std::lock_guard<std::mutex> lock(mu_);
  return credential_;
}

Status BootstrapClient::RegisterRank(const RankRecord& record) const {
  KVB_RETURN_IF_ERROR(record.Validate());
  auto same = [&record](const std::optional<RankRecord>& r) {
    return r && r->role == record.role && r->key() == record.key() &&
           r->incarnation == record.incarnation;
  };
  std::string shown;
  {
    // The same rank again (same position and incarnation) shows the
    // credential it was given. A new registration proposes one, and a
    // retry of it proposes the same: when the registry took the first try
    // but its answer was lost, the retry proves it is the registrant
    // (a fresh proposal would be refused, the position held for good).
    std::lock_guard<std::mutex> lock(mu_);
    if (same(registered_) && !credential_.empty()) {
      shown = credential_;
    } else {
      if (!same(proposed_)) {
        proposed_ = record;
        proposal_ = NewAuthToken();
      }
      shown = proposal_;
    }
  }
  std::string answered;
  KVB_RETURN_IF_ERROR(Call("PUT", "/route", DumpJson(record.ToJson()), shown, &answered).status());
  std::lock_guard<std::mutex> lock(mu_);
  registered_ = record;
  // sglang's own server answers no credential (and checks none).
  credential_ = answered.empty() ? shown : std::move(answered);
  if (same(proposed_)) proposed_.reset();
  return Status::Ok();
}

Result<RankRecord> BootstrapClient::GetRank(int dp, int cp, int tp, int pp) const {
  return LookUpRank(dp, cp, tp, pp, nullptr);
}

Result<RankRecord> BootstrapClient::LookUpRank(int dp, int cp, int tp, int pp,
                                               std::string* unanswered, std::string* listed) const {
  if (dp < 0 || cp < 0 || tp < 0 || pp < 0) {
    return InvalidArgumentError("GetRank: ranks must be >= 0, got " +
                                RankKey{dp, cp, tp, pp}.ToString());
  }
  const std::string path =
      "/route?prefill_dp_rank=" + std::to_string(dp) + "&prefill_cp_rank=" + std::to_string(cp) +
      "&target_tp_rank=" + std::to_string(tp) + "&target_pp_rank=" + std::to_string(pp);
  KVB_ASSIGN_OR_RETURN(json j, CallJson("GET", path, ""));
  // sglang's own server keeps only where the rank is; the rank itself
  // serves the rest of its record there (RankEndpoint).
  if (j.is_object() && !j.contains("attn_tp_size") && j.contains("rank_ip"))
    return RecordFromRank(j, RankKey{dp, cp, tp, pp}, unanswered, listed);
  Result<RankRecord> r = RankRecord::FromJson(j);
  if (!r.ok()) return Malformed("GET " + path, r.status());
  return r;
}

Result<RankRecord> BootstrapClient::RecordFromRank(const json& where, const RankKey& key,
                                                   std::string* unanswered,
                                                   std::string* listed) const {
  JsonFields f(where, "rank location");
  std::string ip;
  int port = 0;
  Status s = f.String("rank_ip", &ip);
  if (s.ok()) s = CheckHostAddress("rank_ip", ip);
  if (s.ok()) s = f.Int("rank_port", 1, 65535, &port);
  if (!s.ok()) return Malformed("GET /route for rank " + key.ToString(), s);
  const std::string at = JoinHostPort(ip, port);
  if (listed != nullptr) *listed = ip;
  bool no_answer = false;
  Result<std::string> text =
      CallAt(ip, port, "rank " + at, "GET", kRankEndpointPath, "", /*auth=*/false, "", nullptr,
             nullptr, &no_answer, kMaxRankAnswer);  // the secret: to the registry only
  if (!text.ok()) {
    // Not a rank that answered (e.g. 503, its record not set yet): it is up.
    if (unanswered != nullptr && no_answer) *unanswered = ip;
    return text.status().WithContext("prefill rank " + key.ToString() + " (listed by " + address_ +
                                     " without kvbridge's fields)");
  }
  Result<json> j = ParseJson(*text, "the rank record (" + Clip(*text, 80) + ")", kMaxRankAnswer);
  Result<RankRecord> r = j.ok() ? RankRecord::FromJson(*j) : Result<RankRecord>(j.status());
  if (!r.ok()) {  // the rank's answer, not the registry's
    Status s = InternalError("prefill rank " + key.ToString() + " at " + at + " (listed by " +
                             address_ + ") sent a malformed answer to GET " + kRankEndpointPath +
                             ": " + r.status().message());
    KVB_LOG_WARN("{}", s.message());
    return s;
  }
  if (r->role != RankRole::kPrefill || !(r->key() == key))
    return FailedPreconditionError(
        fmt::format("{} listed {} as prefill rank {}, but the rank there is {} rank {}", address_,
                    at, key.ToString(), RankRoleName(r->role), r->key().ToString()));
  return r;
}

Result<bool> BootstrapClient::SpeaksKvbridge() const {
  Result<std::string> r = Call("GET", "/failures?since=0", "");
  if (r.ok()) return true;
  switch (r.status().code()) {
    case StatusCode::kNotFound:
      return false;  // sglang's own server: no such route
    case StatusCode::kUnauthenticated:
    case StatusCode::kPermissionDenied:
      return true;  // the route is there, for other credentials
    default:
      return r.status();
  }
}

Result<ParallelInfo> BootstrapClient::GetParallelInfo() const {
  const std::string path =
      "/route?prefill_dp_rank=-1&prefill_cp_rank=-1&target_tp_rank=-1&target_pp_rank=-1";
  KVB_ASSIGN_OR_RETURN(json j, CallJson("GET", path, ""));
  Result<ParallelInfo> info = ParallelInfo::FromJson(j);
  if (!info.ok()) return Malformed("GET " + path, info.status());
  return info;
}

Status BootstrapClient::Health() const { return Call("GET", "/health", "").status(); }

Status BootstrapClient::Heartbeat(RankRole role, int dp, int cp, int tp, int pp,
                                  uint64_t incarnation) const {
  json body{{"role", RankRoleName(role)}, {"dp", dp}, {"cp", cp}, {"tp", tp}, {"pp", pp},
            {"incarnation", incarnation}};
  Status beat = CallJson("PUT", "/heartbeat", DumpJson(body), Credential(), &beats_).status();
  if (beat.code() != StatusCode::kNotFound) return beat;
  // The server does not know the rank: it restarted (its table is in
  // memory) or forgot a long-silent decode rank. Register it again.
  std::optional<RankRecord> again;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (registered_ && registered_->role == role && registered_->key() == RankKey{dp, cp, tp, pp} &&
        registered_->incarnation == incarnation) {
      again = registered_;
      credential_.clear();  // that registration is gone
    }
  }
  if (!again) return beat;
  KVB_LOG_INFO("bootstrap server {} does not know {} ({}); registering it again", address_,
               again->Describe(), beat.message());
  KVB_RETURN_IF_ERROR(RegisterRank(*again));
  return CallJson("PUT", "/heartbeat", DumpJson(body), Credential(), &beats_).status();
}

Result<std::vector<RankStatus>> BootstrapClient::ListRanks() const {
  KVB_ASSIGN_OR_RETURN(json j, CallJson("GET", "/ranks", "", "", &reads_));
  JsonFields f(j, "rank table");
  const json* ranks = nullptr;
  Status s = f.Array("ranks", &ranks);
  if (!s.ok()) return Malformed("GET /ranks", s);
  std::vector<RankStatus> out;
  for (const json& r : *ranks) {
    Result<RankStatus> parsed = RankStatus::FromJson(r);
    if (!parsed.ok()) return Malformed("GET /ranks", parsed.status());
    out.push_back(std::move(parsed).value());
  }
  return out;
}

Result<uint64_t> BootstrapClient::PublishFailure(const json& record) const {
  if (!record.is_object()) {
    return InvalidArgumentError(std::string("failure record: expected a JSON object, got ") +
                                record.type_name());
  }
  KVB_ASSIGN_OR_RETURN(json j, CallJson("POST", "/failure", DumpJson(record), Credential()));
  uint64_t seq = 0;
  Status s = JsonFields(j, "publish answer").Uint64("seq", &seq);
  if (!s.ok()) return Malformed("POST /failure", s);
  return seq;
}

Status BootstrapClient::RegisterDpRank(uint64_t room, int dp_rank) const {
  json body{{"bootstrap_room", room}, {"dp_rank", dp_rank}};
  return Call("POST", "/register_dp_rank", DumpJson(body)).status();
}

Result<std::map<uint64_t, int>> BootstrapClient::QueryDpRanks(
    const std::vector<uint64_t>& rooms) const {
  KVB_ASSIGN_OR_RETURN(
      json j, CallJson("POST", "/query_dp_ranks", DumpJson(json{{"bootstrap_rooms", rooms}})));
  if (!j.is_object())
    return Malformed("POST /query_dp_ranks", InvalidArgumentError("not an object"));
  std::map<uint64_t, int> out;
  for (const auto& [key, value] : j.items()) {
    uint64_t room = 0;
    auto [end, ec] = std::from_chars(key.data(), key.data() + key.size(), room);
    if (ec != std::errc() || end != key.data() + key.size() || !value.is_number_integer()) {
      return Malformed("POST /query_dp_ranks",
                       InvalidArgumentError("entry '" + Clip(key, 40) + "' is not room: dp_rank"));
    }
    // get<int>() truncated: 4294967297 read as dp rank 1, a valid-looking
    // wrong rank (hostile-input audit 2).
    const int64_t dp_rank =
        value.is_number_unsigned() && value.get<uint64_t>() > INT64_MAX ? -1 : value.get<int64_t>();
    if (dp_rank < 0 || dp_rank > INT32_MAX) {
      return Malformed("POST /query_dp_ranks",
                       InvalidArgumentError("room " + std::to_string(room) + ": dp rank " +
                                            DumpJson(value) + " is out of range"));
    }
    out[room] = static_cast<int>(dp_rank);
  }
  return out;
}

Result<FailureBatch> BootstrapClient::FailuresSince(uint64_t since) const {
  const std::string path = "/failures?since=" + std::to_string(since);
  KVB_ASSIGN_OR_RETURN(json j, CallJson("GET", path, "", "", &reads_));
  Result<FailureBatch> batch = FailureBatch::FromJson(j);
  if (!batch.ok()) return Malformed("GET " + path, batch.status());
  return batch;
}

}  // namespace kvbridge::internal

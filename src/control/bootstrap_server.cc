// BootstrapServer: the HTTP face of the in-memory Registry (registry.h).
// Handlers translate requests to registry calls and Status to HTTP; every
// decision about ranks lives in the registry.
#include <httplib.h>

#include <algorithm>
#include <charconv>
#include <cstring>
#include <limits>

#include "common/log.h"
#include "control/auth.h"
#include "control/bootstrap_dispatch.h"
#include "control/http_server.h"
#include "control/http_status.h"
#include "control/json_fields.h"
#include "control/metrics.h"
#include "control/registry.h"
#include "kvbridge/bootstrap.h"
#include "kvbridge/errors.h"

namespace kvbridge {
namespace {

using internal::DumpJson;
using internal::JsonFields;
using nlohmann::json;

// Large enough that every rank of a big instance can connect at once.
constexpr int kListenBacklog = 512;
// A rank record with its layout is a few KiB; a failure record less.
constexpr size_t kMaxBodyBytes = size_t{1} << 20;
constexpr size_t kMaxFailureBodyBytes = size_t{64} << 10;
constexpr size_t kMaxHeaders = 64;
// Seconds a connection may wait for its next request, and a request's
// client for each read or write.
constexpr time_t kKeepAliveSeconds = 1;
constexpr time_t kIoTimeoutSeconds = 2;

void ReplyJson(httplib::Response& res, const json& body) {
  res.status = 200;
  res.set_content(DumpJson(body), "application/json");
}

void ReplyError(const httplib::Request& req, httplib::Response& res, const Status& s) {
  res.status = internal::HttpStatusFor(s.code());
  res.set_content(DumpJson(internal::ErrorBody(s)), "application/json");
  // Lookups are polled until the instance is complete; only log them when
  // debugging. Rejected writes are worth an operator's attention.
  if (req.method == "GET") {
    KVB_LOG_DEBUG("bootstrap: {} {} -> {}", req.method, req.path, s.ToString());
  } else {
    KVB_LOG_WARN("bootstrap: {} {} rejected: {}", req.method, req.path, s.ToString());
  }
}

Result<json> ParseBody(const httplib::Request& req, size_t max_bytes = kMaxBodyBytes) {
  return internal::ParseJson(req.body, req.method + " " + req.path + ": request body", max_bytes);
}

// Whether a request needs the shared secret: every write, and the tables
// that name processes and their failures. GET /route and /health stay open
// (any rank must be able to rendezvous, as with sglang's server).
bool NeedsToken(const httplib::Request& req) {
  if (req.method == "GET" || req.method == "HEAD") {
    return req.path == "/ranks" || req.path == "/failures";
  }
  return !(req.method == "POST" && req.path == "/query_dp_ranks");
}

// The one gate in front of every route.
Status Admit(const httplib::Request& req, const std::string& token) {
  if (req.headers.size() > kMaxHeaders) {
    return ResourceExhaustedError(
        req.method + " " + req.path + ": " + std::to_string(req.headers.size()) +
        " header fields, more than the limit of " + std::to_string(kMaxHeaders));
  }
  if (!NeedsToken(req)) return Status::Ok();
  return internal::CheckBearer(req.get_header_value("Authorization"), token)
      .WithContext(req.method + " " + req.path);
}

// An integer query parameter; `fallback` when absent and optional.
Result<int64_t> QueryInt(const httplib::Request& req, const char* name, int64_t min, int64_t max,
                         const int64_t* fallback) {
  if (!req.has_param(name)) {
    if (fallback != nullptr) return *fallback;
    return InvalidArgumentError(std::string("missing query parameter '") + name + "'");
  }
  const std::string text = req.get_param_value(name);
  int64_t value = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (text.empty() || ec != std::errc() || end != text.data() + text.size()) {
    return InvalidArgumentError(std::string("query parameter '") + name + "' = '" + text +
                                "' is not an integer");
  }
  if (value < min || value > max) {
    return InvalidArgumentError(std::string("query parameter '") + name + "' = " + text +
                                " out of range [" + std::to_string(min) + ", " +
                                std::to_string(max) + "]");
  }
  return value;
}

Status GetRoute(internal::Registry& registry, const httplib::Request& req, json* out) {
  const char* const names[] = {"prefill_dp_rank", "prefill_cp_rank", "target_tp_rank",
                               "target_pp_rank"};
  int v[4];
  int minus_ones = 0;
  for (int i = 0; i < 4; ++i) {
    KVB_ASSIGN_OR_RETURN(int64_t value,
                         QueryInt(req, names[i], -1, internal::kMaxRanksPerInstance, nullptr));
    v[i] = static_cast<int>(value);
    if (v[i] == -1) ++minus_ones;
  }
  if (minus_ones == 4) {
    KVB_ASSIGN_OR_RETURN(internal::ParallelInfo info, registry.GetParallelInfo());
    *out = info.ToJson();
    return Status::Ok();
  }
  if (minus_ones != 0) {
    return InvalidArgumentError(
        "query parameters must be all -1 (parallel info) or all >= 0 (one rank)");
  }
  KVB_ASSIGN_OR_RETURN(internal::RankRecord record, registry.GetRank(v[0], v[1], v[2], v[3]));
  *out = record.ToJson();
  return Status::Ok();
}

// POST /register_dp_rank {"bootstrap_room", "dp_rank"} (sglang).
Status PostDpRank(internal::Registry& registry, const json& body) {
  JsonFields f(body, "register_dp_rank");
  uint64_t room = 0;
  int dp_rank = 0;
  KVB_RETURN_IF_ERROR(f.Uint64("bootstrap_room", &room));
  KVB_RETURN_IF_ERROR(
      f.Int("dp_rank", 0, static_cast<int>(internal::kMaxRanksPerInstance), &dp_rank));
  return registry.RegisterDpRank(room, dp_rank);
}

// POST /query_dp_ranks {"bootstrap_rooms": [...]} -> {"<room>": dp_rank}.
constexpr size_t kMaxQueriedRooms = 65536;
Status QueryDpRanks(const internal::Registry& registry, const json& body, json* out) {
  JsonFields f(body, "query_dp_ranks");
  const json* rooms = nullptr;
  KVB_RETURN_IF_ERROR(f.Array("bootstrap_rooms", &rooms));
  if (rooms->size() > kMaxQueriedRooms) {
    return f.Error("'bootstrap_rooms' has " + std::to_string(rooms->size()) +
                   " entries, more than the limit of " + std::to_string(kMaxQueriedRooms));
  }
  std::vector<uint64_t> ids;
  for (const json& r : *rooms) {
    if (!r.is_number_unsigned()) return f.Error("every entry of 'bootstrap_rooms' must be >= 0");
    ids.push_back(r.get<uint64_t>());
  }
  *out = json::object();
  for (const auto& [room, dp] : registry.QueryDpRanks(ids)) (*out)[std::to_string(room)] = dp;
  return Status::Ok();
}

// The rank credential a request shows (internal::kRankCredentialHeader).
std::string CredentialOf(const httplib::Request& req) {
  return req.get_header_value(internal::kRankCredentialHeader);
}

Status PutHeartbeat(internal::Registry& registry, const httplib::Request& req, const json& body) {
  JsonFields f(body, "heartbeat");
  std::string role_name;
  KVB_RETURN_IF_ERROR(f.String("role", &role_name));
  Result<internal::RankRole> role = internal::ParseRankRole(role_name);
  if (!role.ok()) return role.status().WithContext("heartbeat: field 'role'");
  int dp = 0, cp = 0, tp = 0, pp = 0;
  const int max = static_cast<int>(internal::kMaxRanksPerInstance);
  KVB_RETURN_IF_ERROR(f.Int("dp", 0, max, &dp));
  KVB_RETURN_IF_ERROR(f.Int("cp", 0, max, &cp));
  KVB_RETURN_IF_ERROR(f.Int("tp", 0, max, &tp));
  KVB_RETURN_IF_ERROR(f.Int("pp", 0, max, &pp));
  uint64_t incarnation = 0;
  KVB_RETURN_IF_ERROR(f.Uint64("incarnation", &incarnation));
  return registry.Heartbeat(*role, dp, cp, tp, pp, incarnation, CredentialOf(req));
}

}  // namespace

// Hidden although nested in an exported class: the pimpl is not public API.
struct [[gnu::visibility("hidden")]] BootstrapServer::Impl {
  BootstrapServerOptions options;
  std::string token;
  std::unique_ptr<internal::Registry> registry;
  std::shared_ptr<internal::MetricsRegistry> metrics;
  httplib::Server http;
  internal::HttpServerThread serving;  // after `http`: stops serving before it goes

  // The routes: sglang's (registration, parallel info, dp ranks, health),
  // then kvbridge's own (heartbeats, ranks, failure records), then the
  // admission, error and exception handlers.
  void AddRoutes();
  void AddSglangRoutes();
  void AddKvbridgeRoutes();
  void AddHandlers();
  void AddMetrics();
};

// GET /metrics: ranks by state (computed at scrape time), failure records
// by cause and requests by route, counted as each reply is written (httplib's
// post-routing hook) so that the handlers above stay free of metrics code. Names are
// listed in docs/metrics.md.
void BootstrapServer::Impl::AddMetrics() {
  metrics = std::make_shared<internal::MetricsRegistry>();
  internal::MetricsRegistry* m = metrics.get();
  internal::Registry* reg = registry.get();
  m->AddCollector([m, reg] {
    Result<std::vector<internal::RankStatus>> ranks = reg->ListRanks();
    if (!ranks.ok()) return;
    for (internal::RankRole role : {internal::RankRole::kPrefill, internal::RankRole::kDecode}) {
      for (internal::Liveness state :
           {internal::Liveness::kAlive, internal::Liveness::kUnresponsive,
            internal::Liveness::kDead}) {
        int n = 0;
        for (const internal::RankStatus& r : *ranks) n += r.record.role == role && r.state == state;
        Result<internal::Gauge*> g =
            m->GetGauge("kvbridge_bootstrap_ranks", "Registered ranks by role and liveness state",
                        {{"role", std::string(internal::RankRoleName(role))},
                         {"state", std::string(internal::LivenessName(state))}});
        if (g.ok()) (*g)->Set(n);
      }
    }
  });
  http.Get("/metrics", [m](const httplib::Request&, httplib::Response& res) {
    res.set_content(m->Render(), internal::kMetricsContentType);
  });
  // Runs for every answer, error replies included, just before it is
  // written: a client that got its answer finds it counted.
  http.set_post_routing_handler([m](const httplib::Request& req, httplib::Response& res) {
    static const char* const kRoutes[] = {"/route",   "/health",           "/heartbeat",
                                          "/ranks",   "/failure",          "/failures",
                                          "/metrics", "/register_dp_rank", "/query_dp_ranks"};
    std::string route = "other";  // unknown paths must not grow the label set
    for (const char* r : kRoutes) {
      if (req.path == r) route = r;
    }
    Result<internal::Counter*> c = m->GetCounter(
        "kvbridge_bootstrap_requests_total", "HTTP requests answered, by route, method and status",
        {{"route", route},
         {"method", std::string(internal::HttpMethodLabel(req.method))},  // a client's choice
         {"code", internal::HttpCodeLabel(res.status)}});
    if (c.ok()) (*c)->Increment();
    if (route != "/failure" || req.method != "POST" || res.status != 200) return;
    json body = json::parse(req.body, nullptr, /*allow_exceptions=*/false);
    std::string cause = "unknown";
    if (body.is_object() && body.contains("cause") && body["cause"].is_string()) {
      FailureCause parsed;
      if (ParseFailureCause(body["cause"].get<std::string>(), &parsed)) {
        cause = std::string(FailureCauseName(parsed));
      }
    }
    Result<internal::Counter*> f =
        m->GetCounter("kvbridge_bootstrap_failure_records_total",
                      "Failure records published, by cause", {{"cause", cause}});
    if (f.ok()) (*f)->Increment();
  });
}

namespace {

// Each handler turns a Status into the reply; a handler never throws past
// httplib (the exception handler is the backstop).
using Req = const httplib::Request&;
using Res = httplib::Response&;

void Reply(Req req, Res res, const Status& s, const json& ok_body) {
  if (s.ok()) {
    ReplyJson(res, ok_body);
  } else {
    ReplyError(req, res, s);
  }
}

// sglang answers its writes with a plain "OK".
void ReplyOk(Req req, Res res, const Status& s) {
  if (s.ok()) {
    res.set_content("OK", "text/plain");
  } else {
    ReplyError(req, res, s);
  }
}

}  // namespace

void BootstrapServer::Impl::AddRoutes() {
  AddSglangRoutes();
  AddKvbridgeRoutes();
  AddHandlers();
}

void BootstrapServer::Impl::AddSglangRoutes() {
  internal::Registry& reg = *registry;
  const auto reply = Reply;
  const auto reply_ok = ReplyOk;
  // The registrant alone learns its credential, in a header: the body
  // stays sglang's "OK".
  http.Put("/route", [&reg, reply_ok](Req req, Res res) {
    Result<std::string> credential = [&]() -> Result<std::string> {
      KVB_ASSIGN_OR_RETURN(json body, ParseBody(req));
      KVB_ASSIGN_OR_RETURN(internal::RankRecord record, internal::RankRecord::FromJson(body));
      return reg.Register(record, CredentialOf(req));
    }();
    if (credential.ok()) res.set_header(internal::kRankCredentialHeader, *credential);
    reply_ok(req, res, credential.status());
  });
  for (const char* method : {"POST", "DELETE", "PATCH"}) {
    auto not_allowed = [method](Req req, Res res) {
      ReplyError(req, res,
                 Status(StatusCode::kInvalidArgument,
                        std::string("method ") + method + " not allowed on /route (PUT or GET)"));
      res.status = 405;
    };
    if (std::string(method) == "POST") http.Post("/route", not_allowed);
    if (std::string(method) == "DELETE") http.Delete("/route", not_allowed);
    if (std::string(method) == "PATCH") http.Patch("/route", not_allowed);
  }
  http.Post("/register_dp_rank", [&reg, reply_ok](Req req, Res res) {
    Status s = [&]() -> Status {
      KVB_ASSIGN_OR_RETURN(json body, ParseBody(req, kMaxFailureBodyBytes));
      return PostDpRank(reg, body);
    }();
    reply_ok(req, res, s);
  });
  http.Post("/query_dp_ranks", [&reg, reply](Req req, Res res) {
    json out;
    Status s = [&]() -> Status {
      KVB_ASSIGN_OR_RETURN(json body, ParseBody(req));
      return QueryDpRanks(reg, body, &out);
    }();
    reply(req, res, s, out);
  });
  http.Get("/route", [&reg, reply](Req req, Res res) {
    json out;
    Status s = GetRoute(reg, req, &out);
    reply(req, res, s, out);
  });
  http.Get("/health", [](Req, Res res) { res.set_content("OK", "text/plain"); });
}

void BootstrapServer::Impl::AddKvbridgeRoutes() {
  internal::Registry& reg = *registry;
  const auto reply = Reply;
  http.Put("/heartbeat", [&reg, reply](Req req, Res res) {
    Status s = [&]() -> Status {
      KVB_ASSIGN_OR_RETURN(json body, ParseBody(req));
      return PutHeartbeat(reg, req, body);
    }();
    reply(req, res, s, json{{"ok", true}});
  });
  http.Get("/ranks", [&reg, reply](Req req, Res res) {
    Result<std::vector<internal::RankStatus>> ranks = reg.ListRanks();
    json out{{"ranks", json::array()}};
    if (ranks.ok()) {
      for (const internal::RankStatus& r : *ranks) out["ranks"].push_back(r.ToJson());
    }
    reply(req, res, ranks.status(), out);
  });
  http.Post("/failure", [&reg, reply](Req req, Res res) {
    Result<json> body = ParseBody(req, kMaxFailureBodyBytes);
    Result<uint64_t> seq = body.ok() ? reg.Publish(std::move(body).value(), CredentialOf(req))
                                     : Result<uint64_t>(body.status());
    reply(req, res, seq.status(), seq.ok() ? json{{"seq", *seq}} : json());
  });
  http.Get("/failures", [&reg, reply](Req req, Res res) {
    const int64_t zero = 0;
    Result<int64_t> since = QueryInt(req, "since", 0, std::numeric_limits<int64_t>::max(), &zero);
    Result<internal::FailureBatch> batch = since.ok()
                                               ? reg.FailuresSince(static_cast<uint64_t>(*since))
                                               : Result<internal::FailureBatch>(since.status());
    reply(req, res, batch.status(), batch.ok() ? batch->ToJson() : json());
  });
}

void BootstrapServer::Impl::AddHandlers() {
  http.set_pre_routing_handler([this](Req req, Res res) {
    Status s = Admit(req, token);
    if (s.ok()) return httplib::Server::HandlerResponse::Unhandled;
    ReplyError(req, res, s);
    if (s.code() == StatusCode::kResourceExhausted) res.status = 431;
    return httplib::Server::HandlerResponse::Handled;
  });
  http.set_error_handler([](Req req, Res res) {
    if (!res.body.empty()) return;  // a handler's own error reply
    StatusCode code = res.status == 404 ? StatusCode::kNotFound : StatusCode::kInvalidArgument;
    if (res.status >= 500) code = StatusCode::kInternal;
    const bool no_route = res.status == 404 || res.status == 405;
    std::string why;
    // No handler ran: httplib refused the request while reading it.
    if (res.status == 400)
      why = ": its request line or headers could not be read (a header line may have at most " +
            std::to_string(CPPHTTPLIB_HEADER_MAX_LENGTH) + " bytes, a request at most " +
            std::to_string(kMaxHeaders) + " header fields)";
    if (res.status == 414)
      why = ": its request line is longer than " +
            std::to_string(CPPHTTPLIB_REQUEST_URI_MAX_LENGTH) + " bytes";
    Status s(code, std::string(no_route ? "no route " : "request rejected: ") + req.method + " " +
                       req.path + " (HTTP " + std::to_string(res.status) + ")" + why);
    res.set_content(DumpJson(internal::ErrorBody(s)), "application/json");
  });
  http.set_exception_handler([](Req req, Res res, std::exception_ptr ep) {
    std::string what = "unknown exception";
    try {
      std::rethrow_exception(ep);
    } catch (const std::exception& e) {
      what = e.what();
    } catch (...) {
    }
    Status s = InternalError(req.method + " " + req.path + ": " + what);
    KVB_LOG_ERROR("bootstrap: {}", s.ToString());
    res.status = 500;
    res.set_content(DumpJson(internal::ErrorBody(s)), "application/json");
  });
}

Result<std::unique_ptr<BootstrapServer>> BootstrapServer::Start(
    const BootstrapServerOptions& options) {
  internal::RegistryOptions ro;
  ro.unresponsive_after = options.unresponsive_after;
  ro.dead_after = options.dead_after;
  ro.forget_decode_after = options.forget_decode_after;
  ro.max_failure_records = options.max_failure_records;
  ro.clock = options.clock;
  KVB_RETURN_IF_ERROR(
      internal::ValidateRegistryOptions(ro).WithContext("bootstrap server options"));
  if (options.host.empty()) return InvalidArgumentError("bootstrap server options: empty host");
  if (options.port < 0 || options.port > 65535) {
    return InvalidArgumentError("bootstrap server options: port " + std::to_string(options.port) +
                                " out of range [0, 65535]");
  }
  if (options.threads < 1) {
    return InvalidArgumentError("bootstrap server options: threads must be >= 1");
  }

  auto impl = std::make_unique<Impl>();
  KVB_ASSIGN_OR_RETURN(impl->token,
                       internal::ResolveAuthToken(options.auth_token, "bootstrap server"));
  impl->options = options;
  impl->registry = internal::CreateMemoryRegistry(std::move(ro));
  const size_t threads = static_cast<size_t>(options.threads);
  impl->http.set_payload_max_length(kMaxBodyBytes);
  // An idle connection is closed after this (it also bounds how long Stop()
  // waits for idle clients); a client that stalls a read or write, after the
  // I/O timeout.
  impl->http.set_keep_alive_timeout(kKeepAliveSeconds);
  impl->http.set_read_timeout(kIoTimeoutSeconds, 0);
  impl->http.set_write_timeout(kIoTimeoutSeconds, 0);
  impl->AddRoutes();
  impl->AddMetrics();

  // Not SO_REUSEPORT (see HttpServerThread): a second server on the port
  // would split the ranks between two registries. Ranks of a large instance
  // register at the same moment, hence the wide backlog.
  // The front (HttpServerThread) refuses a body over kMaxBodyBytes before
  // reading it, and a chunked one at all; connections beyond the threads
  // wait in the backlog.
  internal::HttpServeOptions serve;
  serve.backlog = kListenBacklog;
  serve.limits.max_body_bytes = kMaxBodyBytes;
  serve.max_connections = threads;
  KVB_RETURN_IF_ERROR(
      impl->serving.Start(impl->http, options.host, options.port, "bootstrap server", serve));
  KVB_LOG_INFO("bootstrap server listening on {}", impl->serving.address());
  return std::unique_ptr<BootstrapServer>(new BootstrapServer(std::move(impl)));
}

BootstrapServer::BootstrapServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

BootstrapServer::~BootstrapServer() { Stop(); }

int BootstrapServer::port() const { return impl_->serving.port(); }

std::string BootstrapServer::address() const { return impl_->serving.address(); }

std::string internal::BootstrapServerAccess::Answer(BootstrapServer& server,
                                                    std::string_view raw_request) {
  return internal::AnswerFromMemory(server.impl_->http, raw_request);
}

void BootstrapServer::Stop() {
  if (impl_->serving.Stop()) KVB_LOG_INFO("bootstrap server on {} stopped", address());
}

}  // namespace kvbridge

// EtcdGateway::WatchOne: one watch stream to one member. The gateway sends
// newline-delimited JSON, one {"result": WatchResponse} per line: first
// "created", then "events" (type absent = PUT), or "canceled" with a
// "compact_revision" when the start revision was compacted away.
#include <httplib.h>

#include <algorithm>

#include "common/base64.h"
#include "common/log.h"
#include "control/etcd_gateway.h"
#include "control/json_fields.h"

namespace kvbridge::internal {
namespace {

using nlohmann::json;

// A watch that stays silent this long is ended (Unavailable) and resumed by
// the caller from its last revision; etcd never closes an idle one itself.
constexpr std::chrono::seconds kWatchIdle{60};
// The longest line of a watch stream (one WatchResponse) taken.
constexpr size_t kMaxLineBytes = size_t{64} << 20;

Result<EtcdEvent> ReadEvent(const json& j) {
  if (!j.is_object()) return InternalError("watch event is not an object");
  EtcdEvent ev;
  if (j.contains("type")) {
    if (!j["type"].is_string()) return InternalError("watch event type is not a string");
    const std::string& t = j["type"].get_ref<const std::string&>();
    if (t == "DELETE") {
      ev.is_delete = true;
    } else if (t != "PUT") {
      return InternalError("watch event type '" + Clip(t, 40) + "' is not PUT or DELETE");
    }
  }
  if (!j.contains("kv") || !j["kv"].is_object()) return InternalError("watch event without kv");
  const json& kv = j["kv"];
  std::string key64, value64;
  JsonFields f(kv, "watch event kv");
  KVB_RETURN_IF_ERROR(f.String("key", &key64));
  if (f.Has("value")) KVB_RETURN_IF_ERROR(f.String("value", &value64));
  KVB_ASSIGN_OR_RETURN(ev.kv.key, Base64Decode(key64));
  KVB_ASSIGN_OR_RETURN(ev.kv.value, Base64Decode(value64));
  if (!EtcdGateway::Int64Field(kv, "mod_revision", &ev.kv.mod_revision) ||
      !EtcdGateway::Int64Field(kv, "create_revision", &ev.kv.create_revision) ||
      !EtcdGateway::Int64Field(kv, "version", &ev.kv.version) ||
      !EtcdGateway::Int64Field(kv, "lease", &ev.kv.lease)) {
    return InternalError("watch event kv has a field that is not an integer");
  }
  return ev;
}

// One watch stream's lines, as they arrive.
struct WatchLines {
  const std::string& where;
  const std::function<bool(const std::vector<EtcdEvent>&, int64_t)>& on_events;
  int64_t* compacted;
  Status failure;
  bool handler_done = false;

  // False once the stream should end (failure or handler_done says why).
  bool Handle(std::string_view line) {
    if (line.find_first_not_of(" \r\t") == std::string_view::npos) return true;
    Result<json> j = ParseJson(line, where, kMaxLineBytes);
    if (!j.ok() || !j->is_object()) {
      failure = InternalError(where + " sent a line that is not a JSON object: " + Clip(line, 160));
      return false;
    }
    if (j->contains("error") || !j->contains("result") || !(*j)["result"].is_object()) {
      failure = UnavailableError(where + " ended with: " + Clip(line, 300));
      return false;
    }
    const json& r = (*j)["result"];
    bool canceled = false;
    if (!EtcdGateway::BoolField(r, "canceled", &canceled)) {
      failure = InternalError(where + ": 'canceled' is not a bool: " + Clip(line, 160));
      return false;
    }
    if (canceled) {
      int64_t compact = 0;
      EtcdGateway::Int64Field(r, "compact_revision", &compact);
      if (compact > 0) {
        *compacted = compact;
        failure = FailedPreconditionError(where + ": revisions before " + std::to_string(compact) +
                                          " were compacted");
      } else {
        auto why = r.find("cancel_reason");
        failure = UnavailableError(where + " canceled: " +
                                   Clip(why == r.end()     ? ""
                                        : why->is_string() ? why->get<std::string>()
                                                           : DumpJson(*why),
                                        200));
      }
      return false;
    }
    if (!r.contains("events")) return true;  // "created", or a progress notice
    if (!r["events"].is_array()) {
      failure = InternalError(where + ": 'events' is not an array");
      return false;
    }
    std::vector<EtcdEvent> events;
    for (const json& ev : r["events"]) {
      Result<EtcdEvent> parsed = ReadEvent(ev);
      if (!parsed.ok()) {
        failure = parsed.status().WithContext(where);
        return false;
      }
      events.push_back(std::move(parsed).value());
    }
    int64_t revision = 0;
    if (r.contains("header") && r["header"].is_object())
      EtcdGateway::Int64Field(r["header"], "revision", &revision);
    if (!on_events(events, revision)) {
      handler_done = true;
      return false;
    }
    return true;
  }
};

}  // namespace

Status EtcdGateway::WatchOne(
    size_t index, const std::string& body,
    const std::function<bool(const std::vector<EtcdEvent>&, int64_t)>& on_events,
    int64_t* compacted) const {
  const EtcdEndpoint& e = options_.endpoints[index];
  const std::string where = "etcd " + e.ToString() + " watch";
  KVB_ASSIGN_OR_RETURN(std::string token, Token(index, false));
  httplib::Client cli(e.host, e.port);
  cli.set_connection_timeout(options_.timeout);
  cli.set_read_timeout(kWatchIdle);
  cli.set_write_timeout(options_.timeout);
  {
    MutexLock lock(mu_);
    if (stopping_) return Status(StatusCode::kCancelled, name_ + " watch stopped");
    watching_.push_back(&cli);
  }
  std::string buffer;
  WatchLines lines{where, on_events, compacted};
  httplib::Request req;
  req.method = "POST";
  req.path = "/v3/watch";
  req.body = body;
  req.set_header("Content-Type", "application/json");
  if (!token.empty()) req.set_header("Authorization", token);
  req.content_receiver = [&](const char* data, size_t len, uint64_t, uint64_t) {
    buffer.append(data, len);
    size_t start = 0;
    for (size_t nl; (nl = buffer.find('\n', start)) != std::string::npos; start = nl + 1) {
      if (!lines.Handle(std::string_view(buffer).substr(start, nl - start))) return false;
    }
    buffer.erase(0, start);
    if (buffer.size() > kMaxLineBytes) {
      lines.failure =
          InternalError(where + ": a line longer than " + std::to_string(kMaxLineBytes) + " bytes");
      return false;
    }
    return true;
  };
  httplib::Response res;
  httplib::Error err = httplib::Error::Success;
  const bool sent = cli.send(req, res, err);
  bool stopping;
  {
    MutexLock lock(mu_);
    watching_.erase(std::remove(watching_.begin(), watching_.end(), &cli), watching_.end());
    stopping = stopping_;
  }
  if (stopping) return Status(StatusCode::kCancelled, name_ + " watch stopped");
  if (lines.handler_done) return Status::Ok();
  if (!lines.failure.ok()) return lines.failure;
  if (!sent) return UnavailableError(where + ": " + httplib::to_string(err));
  if (res.status != 200) {
    return UnavailableError(where + " answered HTTP " + std::to_string(res.status));
  }
  return UnavailableError(where + ": the stream ended");
}

}  // namespace kvbridge::internal

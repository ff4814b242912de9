#include "tools/status_cmd.h"

#include <fmt/format.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "control/bootstrap_client.h"
#include "control/json_fields.h"
#include "control/registry.h"
#include "tools/auth_flag.h"

namespace kvbridge::tools {
namespace {

using nlohmann::json;

struct StatusFlags {
  std::string bootstrap;
  bool watch = false;
  double interval_s = 2.0;
  bool json = false;
  int failures = 10;
  int timeout_ms = 2000;
  std::string auth_token_file;
};

// What one query of the server returned.
struct Snapshot {
  std::vector<internal::RankStatus> ranks;
  internal::FailureBatch failures;
};

Result<Snapshot> Query(const internal::BootstrapClient& client) {
  Snapshot s;
  KVB_ASSIGN_OR_RETURN(s.ranks, client.ListRanks());
  KVB_ASSIGN_OR_RETURN(s.failures, client.FailuresSince(0));
  return s;
}

std::string Age(std::chrono::milliseconds age) {
  double s = age.count() / 1000.0;
  if (s < 60) return fmt::format("{:.1f} s", s);
  int64_t whole = static_cast<int64_t>(s);
  if (whole < 3600) return fmt::format("{}m{:02}s", whole / 60, whole % 60);
  return fmt::format("{}h{:02}m", whole / 3600, whole % 3600 / 60);
}

std::string Address(const internal::RankRecord& r) {
  bool v6 = r.rank_ip.find(':') != std::string::npos;
  return (v6 ? "[" + r.rank_ip + "]" : r.rank_ip) + ":" + std::to_string(r.rank_port);
}

// A string field of a record the server sent, else `fallback`: the server
// is a stranger, and a field of another type must not throw (a numeric
// "cause" aborted `kvbridge status`).
std::string StringField(const json& record, const char* name, const std::string& fallback) {
  if (!record.is_object()) return fallback;
  auto it = record.find(name);
  return it != record.end() && it->is_string() ? it->get<std::string>() : fallback;
}

// A failure record's line: its message when it has one (records published
// by kvbridge ranks do), else what can be said from its fields.
std::string FailureLine(const json& record) {
  const std::string message = StringField(record, "message", "");
  if (!message.empty()) return message;
  return fmt::format("{} (no message): {}", StringField(record, "cause", "unknown cause"),
                     internal::DumpJson(record));
}

uint64_t Seq(const json& record) {
  return record.contains("seq") && record["seq"].is_number_unsigned()
             ? record["seq"].get<uint64_t>()
             : 0;
}

json ToJson(const std::string& address, const Snapshot& s, int max_failures) {
  json ranks = json::array();
  json counts = {{"alive", 0}, {"unresponsive", 0}, {"dead", 0}};
  for (const internal::RankStatus& r : s.ranks) {
    const internal::RankRecord& rec = r.record;
    const std::string state(internal::LivenessName(r.state));
    counts[state] = counts[state].get<int>() + 1;
    ranks.push_back({{"role", internal::RankRoleName(rec.role)},
                     {"dp", rec.attn_dp_rank},
                     {"tp", rec.attn_tp_rank},
                     {"pp", rec.pp_rank},
                     {"cp", rec.attn_cp_rank},
                     {"host", rec.host},
                     {"pid", rec.pid},
                     {"address", Address(rec)},
                     {"incarnation", rec.incarnation},
                     {"heartbeat_age_ms", r.age.count()},
                     {"state", state},
                     {"restarts", r.restarts},
                     {"dead_by_seq", r.dead_by_seq}});
  }
  json failures = json::array();
  const auto& records = s.failures.records;
  size_t first = records.size() > static_cast<size_t>(max_failures)
                     ? records.size() - static_cast<size_t>(max_failures)
                     : 0;
  for (size_t i = first; i < records.size(); ++i) {
    failures.push_back({{"seq", Seq(records[i])},
                        {"cause", StringField(records[i], "cause", "unknown")},
                        {"message", FailureLine(records[i])},
                        {"record", records[i]}});
  }
  return {{"bootstrap", address},
          {"ranks", ranks},
          {"counts", counts},
          {"failures", failures},
          {"failures_total", s.failures.latest_seq},
          {"truncated", s.failures.truncated}};
}

std::string Table(const std::string& address, const Snapshot& s, int max_failures) {
  json j = ToJson(address, s, max_failures);
  std::string out = fmt::format(
      "bootstrap server {}: {} ranks ({} alive, {} unresponsive, {} dead), {} failure records\n",
      address, s.ranks.size(), j["counts"]["alive"].get<int>(),
      j["counts"]["unresponsive"].get<int>(), j["counts"]["dead"].get<int>(),
      s.failures.latest_seq);
  std::vector<std::vector<std::string>> rows = {
      {"ROLE", "DP", "TP", "PP", "HOST", "PID", "ADDRESS", "HEARTBEAT", "STATE"}};
  for (const internal::RankStatus& r : s.ranks) {
    const internal::RankRecord& rec = r.record;
    std::string state(internal::LivenessName(r.state));
    if (r.restarts > 0) state += fmt::format(" (restarts {})", r.restarts);
    rows.push_back({std::string(internal::RankRoleName(rec.role)), std::to_string(rec.attn_dp_rank),
                    std::to_string(rec.attn_tp_rank), std::to_string(rec.pp_rank), rec.host,
                    std::to_string(rec.pid), Address(rec), Age(r.age) + " ago", state});
  }
  if (!s.ranks.empty()) {
    std::vector<size_t> width(rows[0].size(), 0);
    for (const auto& row : rows) {
      for (size_t c = 0; c < row.size(); ++c) width[c] = std::max(width[c], row[c].size());
    }
    for (const auto& row : rows) {
      std::string line;
      for (size_t c = 0; c < row.size(); ++c) {
        const bool numeric = c >= 1 && c <= 3;
        line += numeric ? fmt::format("{:>{}}", row[c], width[c])
                        : fmt::format("{:<{}}", row[c], width[c]);
        if (c + 1 < row.size()) line += "  ";
      }
      while (!line.empty() && line.back() == ' ') line.pop_back();
      out += line + "\n";
    }
  } else {
    out += "no ranks registered\n";
  }
  const json& failures = j["failures"];
  if (failures.empty()) {
    out += "no failure records\n";
  } else {
    out += fmt::format("recent failures (latest {} of {}{}):\n", failures.size(),
                       s.failures.latest_seq, s.failures.truncated ? ", older ones dropped" : "");
    for (const json& f : failures) {
      out += fmt::format("  #{} {}\n", f["seq"].get<uint64_t>(), f["message"].get<std::string>());
    }
  }
  return out;
}

void Print(const std::string& text, FILE* to) {
  std::fputs(text.c_str(), to);
  std::fflush(to);
}

// One query and its output; false when the server could not be asked.
bool Show(const internal::BootstrapClient& client, const StatusFlags& f, bool clear) {
  Result<Snapshot> s = Query(client);
  std::string frame;
  if (clear) frame += "\033[H\033[2J";
  if (f.watch && !f.json) {
    std::time_t now = std::time(nullptr);
    char when[32];
    std::strftime(when, sizeof(when), "%H:%M:%S", std::localtime(&now));
    frame += fmt::format("{}  (every {} s; Ctrl-C to stop)\n", when, f.interval_s);
  }
  if (!s.ok()) {
    if (f.json && f.watch) {
      Print(internal::DumpJson(
                json{{"bootstrap", client.address()}, {"error", s.status().message()}}) +
                "\n",
            stdout);
    } else {
      if (!frame.empty()) Print(frame, stdout);
    }
    Print("kvbridge status: " + s.status().message() + "\n", stderr);
    return false;
  }
  if (f.json) {
    Print(ToJson(client.address(), *s, f.failures).dump(f.watch ? -1 : 2) + "\n", stdout);
  } else {
    Print(frame + Table(client.address(), *s, f.failures), stdout);
  }
  return true;
}

int RunStatus(const StatusFlags& f) {
  // The rank table names processes: the server shows it only to holders of
  // the deployment's secret.
  Result<std::string> token = CommandAuthToken(f.auth_token_file, "kvbridge status");
  if (!token.ok()) {
    // The message begins with "kvbridge status: " already.
    Print(token.status().message() + "\n", stderr);
    return 2;
  }
  Result<std::unique_ptr<internal::BootstrapClient>> client = internal::BootstrapClient::Create(
      f.bootstrap, std::chrono::milliseconds(f.timeout_ms), *token);
  if (!client.ok()) {
    Print("kvbridge status: --bootstrap: " + client.status().message() + "\n", stderr);
    return 2;
  }
  if (!f.watch) return Show(**client, f, /*clear=*/false) ? 0 : 1;

  // --watch: sleep in sigtimedwait so that SIGINT/SIGTERM end the loop
  // cleanly, without a handler.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGTERM);
  signal(SIGINT, SIG_DFL);
  signal(SIGTERM, SIG_DFL);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);
  const bool clear = !f.json && isatty(STDOUT_FILENO);
  const double secs = std::max(0.05, f.interval_s);
  while (true) {
    Show(**client, f, clear);
    timespec wait;
    wait.tv_sec = static_cast<time_t>(secs);
    wait.tv_nsec = static_cast<long>((secs - std::floor(secs)) * 1e9);
    int sig = sigtimedwait(&stop_signals, nullptr, &wait);
    if (sig == SIGINT || sig == SIGTERM) return 0;
  }
}

}  // namespace

void AddStatusCommand(CLI::App& app, std::function<int()>& run) {
  auto f = std::make_shared<StatusFlags>();
  CLI::App* cmd = app.add_subcommand(
      "status", "Registered ranks, their liveness and recent failures, from a bootstrap server");
  cmd->add_option("--bootstrap", f->bootstrap, "The bootstrap server, HOST:PORT")->required();
  AddAuthTokenFileOption(cmd, &f->auth_token_file);
  CLI::Option* watch = cmd->add_flag("--watch", f->watch, "Refresh until Ctrl-C");
  cmd->add_option("--interval", f->interval_s, "Seconds between refreshes with --watch")
      ->needs(watch)
      ->check(CLI::Range(0.05, 3600.0))
      ->capture_default_str();
  cmd->add_flag("--json", f->json, "One JSON object (one per line with --watch)");
  cmd->add_option("--failures", f->failures, "How many recent failure records to show")
      ->check(CLI::Range(0, 100000))
      ->capture_default_str();
  cmd->add_option("--timeout-ms", f->timeout_ms, "Connect/read timeout per request")
      ->check(CLI::Range(1, 600000))
      ->capture_default_str();
  cmd->callback([&run, f] { run = [f] { return RunStatus(*f); }; });
}

}  // namespace kvbridge::tools

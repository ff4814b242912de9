#include "tools/demo_summary.h"

#include <fmt/format.h>

#include <algorithm>
#include <deque>
#include <fstream>
#include <regex>
#include <set>

#include "control/json_fields.h"

namespace kvbridge::tools {
namespace {

using nlohmann::json;

// Which data paths the ranks logged ("connected to X via shm").
std::string DataPaths(const Cluster& c, const std::string& log_dir) {
  std::set<std::string> paths, wired;
  // "via ucx-rndv over tcp": the network transport is the path that matters
  // across hosts; "via shm" on one host. Prefill's line goes on with ": mapped
  // N regions"; decode's names no wire ("via ucx-rndv"), so a path that
  // some rank named with its wire counts as that wire.
  static const std::regex kVia(R"(\] connected to .* via ([^\s:]+)(?: over ([^\s:]+))?)");
  for (const ProcessInfo& p : c.processes()) {
    std::string name = p.name;
    std::replace(name.begin(), name.end(), ' ', '-');
    std::ifstream in(log_dir + "/" + name + ".log");
    std::string line;
    std::smatch m;
    while (std::getline(in, line))
      if (std::regex_search(line, m, kVia) && m[1] != "?") {
        paths.insert(m[2].matched ? m[2].str() : m[1].str());
        if (m[2].matched) wired.insert(m[1].str());
      }
  }
  std::string out;
  for (const auto& p : paths)
    if (!wired.count(p)) out += (out.empty() ? "" : ",") + p;
  return out.empty() ? "unknown" : out;
}

bool NamesVictim(const json& failure, const ProcessInfo& victim) {
  if (!failure.contains("origin") || !failure["origin"].is_object()) return false;
  const json& o = failure["origin"];
  if (victim.role == Role::kBootstrap)
    return o.value("role", "") == "bootstrap" || failure.value("cause", "") == "registry_lost";
  return o.value("role", "") == RoleName(victim.role) && o.value("tp", -1) == victim.tp;
}

// A failure whose origin or cause is unknown: the one thing kvbridge
// promises never to produce.
bool Unattributed(const json& failure) {
  if (failure.value("cause", "unknown") == "unknown") return true;
  if (!failure.contains("origin") || !failure["origin"].is_object()) return true;
  const json& o = failure["origin"];
  if (o.value("role", "") != "bootstrap" && o.value("pid", 0) == 0) return true;
  return false;
}

}  // namespace

// What a process's log says about how it ended (demo_summary.h).
std::string LogExcerpt(const std::string& log_dir, const std::string& process) {
  constexpr size_t kReportLines = 20, kTailLines = 3, kMaxBytes = 3000;
  std::string name = process;
  std::replace(name.begin(), name.end(), ' ', '-');
  std::ifstream in(log_dir + "/" + name + ".log");
  // Read once, keeping only what is quoted: the last lines, or a report's.
  std::deque<std::string> tail;
  std::vector<std::string> report;  // from a sanitizer's first line
  std::string line;
  while (report.size() < kReportLines && std::getline(in, line)) {
    if (report.empty() && line.find("Sanitizer") == std::string::npos &&
        line.find("runtime error:") == std::string::npos) {
      tail.push_back(std::move(line));
      if (tail.size() > kTailLines) tail.pop_front();
      continue;
    }
    report.push_back(std::move(line));
  }
  std::string out;
  const auto append = [&](const std::vector<std::string>& lines) {
    for (size_t i = 0; i < lines.size(); ++i) out += (i == 0 ? "" : " | ") + lines[i];
  };
  append(report.empty() ? std::vector<std::string>(tail.begin(), tail.end()) : report);
  // A log's bytes need not be UTF-8, and the summary is JSON: printable
  // ASCII only (a cut multi-byte character or a stray byte would make
  // dump() throw, ending the demo exactly when a rank had crashed).
  for (char& c : out)
    if (static_cast<unsigned char>(c) < 0x20 || static_cast<unsigned char>(c) > 0x7e) c = '?';
  if (out.size() > kMaxBytes) out = out.substr(0, kMaxBytes) + "...";
  return out;
}

std::string DescribeLayout(const DemoFlags& f, const std::string& log_dir) {
  std::string model =
      f.mla ? fmt::format("MLA, {} layers x {} dim", f.layers, f.head_dim)
            : fmt::format("{} layers, {} kv heads x {} dim x 2 B", f.layers, f.heads, f.head_dim);
  return fmt::format(
      "kvbridge demo: bootstrap + prefill tp={} + decode tp={} processes; {}, {}-token pages; {} "
      "requests of {}..{} tokens ({}-token chunks), {} in flight{}; logs in {}",
      f.prefill_tp, f.decode_tp, model, f.page_size, f.requests, f.min_tokens, f.max_tokens,
      f.chunk_tokens, f.concurrency, f.fault.empty() ? "" : "; fault " + f.fault, log_dir);
}

json Summarize(const Cluster& c, const DemoRun& run) {
  json s;
  std::vector<std::string> problems = run.problems;
  const bool faulted = !run.fault.kind.empty();
  const ProcessInfo* victim = run.victim >= 0 ? &c.process(run.victim) : nullptr;

  int64_t requests = 0;
  uint64_t bytes = 0, verified = 0, corrupt = 0, nonterminal = 0;
  double p50 = 0, p99 = 0;
  double window_s = 0, fill_s = 0, verify_s = 0;
  std::set<uint64_t> failed_rooms;
  json ranks = json::array(), reports = json::array();
  int64_t oom_at_us = 0;
  if (victim != nullptr && run.fault.kind == "oom" && victim->report) {
    for (const json& f : (*victim->report)["failures"]) {
      int64_t t = f.value("detected_at_us", int64_t{0});
      if (t > 0 && (oom_at_us == 0 || t < oom_at_us)) oom_at_us = t;
    }
  }
  const int64_t fault_at = run.fault_at_us != 0 ? run.fault_at_us : oom_at_us;
  bool victim_named = false;

  for (int i = 0; i < static_cast<int>(c.processes().size()); ++i) {
    const ProcessInfo& p = c.process(i);
    const bool is_victim = i == run.victim;
    ranks.push_back(
        {{"name", p.name}, {"pid", p.pid}, {"exit", p.exit.ToString()}, {"victim", is_victim}});
    if (p.role == Role::kBootstrap) {
      if (!is_victim && p.exit.reaped && !(p.exit.exited && p.exit.code == 0)) {
        const std::string said = LogExcerpt(run.log_dir, p.name);
        problems.push_back(p.name + " ended with " + p.exit.ToString() +
                           (said.empty() ? "" : "; its log ends: " + said));
      }
      continue;
    }
    if (!p.report) {
      if (!is_victim || run.fault.kind == "stop-prefill" || run.fault.kind == "oom" ||
          run.fault.kind.starts_with("partition-"))
        problems.push_back(p.name + " (pid " + std::to_string(p.pid) + ") sent no report (" +
                           p.exit.ToString() + ")");
      continue;
    }
    const json& r = *p.report;
    if (p.role == Role::kDecode) {
      requests = std::max<int64_t>(requests, r.value("requests", 0));
      bytes += r.value("bytes", uint64_t{0});
      verified += r.value("verified_pages", uint64_t{0});
      p50 = std::max(p50, r.value("p50_us", 0.0));
      p99 = std::max(p99, r.value("p99_us", 0.0));
      window_s = std::max(window_s, r.value("window_seconds", 0.0));
      verify_s = std::max(verify_s, r.value("verify_seconds", 0.0));
    } else {
      fill_s = std::max(fill_s, r.value("fill_seconds", 0.0));
    }
    corrupt += r.value("corrupt_pages", uint64_t{0});
    nonterminal = std::max(nonterminal, r.value("nonterminal", uint64_t{0}));
    if (r.value("nonterminal", 0) != 0)
      problems.push_back(
          fmt::format("{}: {} requests never finished", p.name, r.value("nonterminal", 0)));
    if (r.value("unquiesced", 0) != 0)
      problems.push_back(
          fmt::format("{}: {} failed requests never quiesced", p.name, r.value("unquiesced", 0)));
    if (r.value("corrupt_pages", 0) != 0)
      problems.push_back(fmt::format("{}: {} corrupt pages", p.name, r.value("corrupt_pages", 0)));
    if (r["stats_after"].value("rooms_live", 0) != 0)
      problems.push_back(fmt::format("{}: {} rooms still live after release", p.name,
                                     r["stats_after"].value("rooms_live", 0)));
    if (!is_victim && p.exit.reaped && !(p.exit.exited && p.exit.code == 0)) {
      const std::string said = LogExcerpt(run.log_dir, p.name);
      problems.push_back(p.name + " ended with " + p.exit.ToString() +
                         (said.empty() ? "" : "; its log ends: " + said));
    }

    // This rank's failures: the first one naming the victim (else the first).
    const json* shown = nullptr;
    int64_t first_at = 0;
    for (const json& f : r["failures"]) {
      failed_rooms.insert(f.value("room", uint64_t{0}));
      if (Unattributed(f))
        problems.push_back(p.name + " reported a failure without origin or cause: " +
                           f.value("message", internal::DumpJson(f)));
      if (victim != nullptr && NamesVictim(f, *victim)) {
        int64_t t = f.value("detected_at_us", int64_t{0});
        if (shown == nullptr || !NamesVictim(*shown, *victim) || t < first_at) {
          shown = &f;
          first_at = t;
        }
      } else if (shown == nullptr) {
        shown = &f;
        first_at = f.value("detected_at_us", int64_t{0});
      }
    }
    // A rank whose own rooms did not fail may still know who failed (its
    // sibling's record: sglang's exception from another rank).
    const char* source = "room";
    if (victim != nullptr && (shown == nullptr || !NamesVictim(*shown, *victim)) &&
        r.contains("rank_failure") && NamesVictim(r["rank_failure"], *victim)) {
      shown = &r["rank_failure"];
      first_at = shown->value("detected_at_us", int64_t{0});
      source = "rank";
    }
    if (!faulted) continue;
    json e = {{"rank", p.name},
              {"source", source},
              {"pid", p.pid},
              {"victim", is_victim},
              {"succeeded", r.value("succeeded", 0)},
              {"failed", r.value("failed", 0)},
              {"fatal_reported", r.value("fatal_reported", false)}};
    if (shown != nullptr) {
      const json& f = *shown;
      const bool named = victim != nullptr && NamesVictim(f, *victim);
      if (named && !is_victim) victim_named = true;
      // A partitioned rank lives on: survivors must say it is unreachable.
      if (named && !is_victim && run.fault.kind.starts_with("partition-") &&
          f.value("cause", "") != "peer_unreachable")
        problems.push_back(p.name + " named " + victim->name + " as " + f.value("cause", "?") +
                           ", not unreachable");
      e["names_victim"] = named;
      e["room"] = f.value("room", uint64_t{0});
      e["origin"] = f.contains("origin") ? f["origin"].value("name", "") : "";
      e["origin_pid"] = f.contains("origin") ? f["origin"].value("pid", 0) : 0;
      e["cause"] = f.value("cause", "unknown");
      e["detail"] = f.value("detail", "");
      e["phase"] = f.value("phase", "");
      e["mechanism"] = f.value("mechanism", "");
      e["hint"] = f.value("hint", "");
      e["message"] = f.value("message", "");
      e["detected_at_us"] = first_at;
      if (named && fault_at > 0 && first_at > 0)
        e["detection_ms"] = (first_at - fault_at) / 1000.0;
      else
        e["detection_ms"] = nullptr;
    } else {
      e["names_victim"] = false;
      e["cause"] = nullptr;
      e["detection_ms"] = nullptr;
    }
    reports.push_back(e);
  }
  if (requests == 0) requests = run.flags.requests;
  const int64_t failed = static_cast<int64_t>(failed_rooms.size());
  const int64_t succeeded = std::max<int64_t>(0, requests - failed - nonterminal);
  if (!faulted && failed != 0)
    problems.push_back(fmt::format("{} requests failed in a run without a fault", failed));
  if (verified == 0 && succeeded > 0) problems.push_back("no page was verified");
  if (faulted && !run.fault_fired)
    problems.push_back("the fault never fired: the run ended before " +
                       (run.fault.after_requests >= 0
                            ? std::to_string(run.fault.after_requests) + " requests finished"
                            : std::to_string(run.fault.after_ms) + " ms"));
  const bool etcd_fault = run.fault.kind == "kill-etcd-leader";
  const bool lossy = run.fault.kind == "lossy-link";
  // An etcd member is not a rank: nothing may fail because it died. A lossy,
  // slow link is no failure either.
  if (etcd_fault && failed != 0)
    problems.push_back(fmt::format("{} requests failed after an etcd member died", failed));
  if (lossy && failed != 0)
    problems.push_back(fmt::format("{} requests failed over a lossy, slow link", failed));
  if (faulted && run.fault_fired && run.fault.kind != "kill-bootstrap" && !etcd_fault && !lossy &&
      !victim_named)
    problems.push_back("no surviving rank named the victim " + (victim ? victim->name : ""));

  s["requests"] = requests;
  s["succeeded"] = succeeded;
  s["failed"] = failed;
  s["nonterminal"] = nonterminal;
  s["bytes"] = bytes;
  s["seconds"] = run.seconds;
  s["gbps"] = run.seconds > 0 ? bytes / run.seconds / 1e9 : 0.0;
  s["start_seconds"] = run.start_seconds;
  s["decode_window_seconds"] = window_s;
  s["window_gbps"] = window_s > 0 ? bytes / window_s / 1e9 : 0.0;
  s["fill_seconds"] = fill_s;
  s["verify_seconds"] = verify_s;
  const double memcpy_gbps = (run.memcpy_gbps_before + run.memcpy_gbps_after) / 2;
  s["memcpy_gbps"] = memcpy_gbps;
  s["memcpy_gbps_before"] = run.memcpy_gbps_before;
  s["memcpy_gbps_after"] = run.memcpy_gbps_after;
  s["ratio_to_memcpy"] = memcpy_gbps > 0 ? s["gbps"].get<double>() / memcpy_gbps : 0.0;
  s["p50_us"] = p50;
  s["p99_us"] = p99;
  s["verified_pages"] = verified;
  s["corrupt_pages"] = corrupt;
  s["data_path"] = DataPaths(c, run.log_dir);
  s["prefill_tp"] = run.flags.prefill_tp;
  s["decode_tp"] = run.flags.decode_tp;
  s["layout"] = {{"layers", run.flags.layers},
                 {"heads", run.flags.heads},
                 {"head_dim", run.flags.head_dim},
                 {"page_size", run.flags.page_size},
                 {"mla", run.flags.mla}};
  s["ranks"] = ranks;
  s["log_dir"] = run.log_dir;
  s["registry"] = run.registry.empty() ? "bootstrap" : run.registry;
  if (faulted) {
    s["fault"] = {{"kind", run.fault.kind},
                  {"fired", run.fault_fired},
                  {"victim", victim  ? victim->name
                             : lossy ? "link of " + run.fault_host
                                     : run.etcd_victim},
                  {"host", run.fault_host},
                  {"role", victim ? std::string(RoleName(victim->role)) : ""},
                  {"tp", victim ? victim->tp : -1},
                  {"pid", victim ? victim->pid : run.etcd_victim_pid},
                  {"at_us", fault_at}};
    s["reports"] = reports;
  }
  s["problems"] = problems;
  s["ok"] = problems.empty();
  return s;
}

void PrintSummary(std::ostream& out, const json& s) {
  auto gib = [](uint64_t b) { return b / double(1ull << 30); };
  out << "\nSummary\n";
  out << fmt::format("  requests        {}  (succeeded {}, failed {}, unfinished {})\n",
                     s["requests"].get<int64_t>(), s["succeeded"].get<int64_t>(),
                     s["failed"].get<int64_t>(), s["nonterminal"].get<uint64_t>());
  out << fmt::format("  moved           {:.2f} GiB in {:.1f} s = {:.2f} GB/s end to end",
                     gib(s["bytes"].get<uint64_t>()), s["seconds"].get<double>(),
                     s["gbps"].get<double>());
  const double memcpy_gbps = s.value("memcpy_gbps", 0.0);
  if (memcpy_gbps > 0)
    out << fmt::format(" = {:.2f} x single-thread memcpy ({:.2f} GB/s, this box, this run)",
                       s["ratio_to_memcpy"].get<double>(), memcpy_gbps);
  out << "\n";
  const double window = s.value("decode_window_seconds", 0.0);
  if (window > 0) {
    out << fmt::format(
        "  transfer        {:.2f} GB/s over decode's window ({:.2f} s, first SendMetadata to last "
        "Success); processes started in {:.1f} s before it\n",
        s["window_gbps"].get<double>(), window, s.value("start_seconds", 0.0));
    const double fill = s.value("fill_seconds", 0.0), verify = s.value("verify_seconds", 0.0);
    out << fmt::format(
        "  time            per rank thread: prefill filling {:.2f} s ({:.0f}%), decode verifying "
        "{:.2f} s ({:.0f}%), the rest polling and waiting on transfers (2 cores: copies, fills and "
        "checks share them)\n",
        fill, 100 * fill / window, verify, 100 * verify / window);
  }
  out << fmt::format(
      "  latency         p50 {:.1f} ms, p99 {:.1f} ms (SendMetadata to Success, "
      "slowest decode rank)\n",
      s["p50_us"].get<double>() / 1000, s["p99_us"].get<double>() / 1000);
  out << fmt::format("  verified        {} pages (page x layer buffer, every byte), {} corrupt\n",
                     s["verified_pages"].get<uint64_t>(), s["corrupt_pages"].get<uint64_t>());
  out << fmt::format("  data path       {}\n", s["data_path"].get<std::string>());
  if (s.contains("registry") && s["registry"] != "bootstrap")
    out << fmt::format("  registry        {}\n", s["registry"].get<std::string>());
  if (s.contains("fault")) {
    const json& f = s["fault"];
    out << fmt::format("\nFault: {} on {} (pid {}){}\n", f["kind"].get<std::string>(),
                       f["victim"].get<std::string>(), f["pid"].get<int>(),
                       f["fired"].get<bool>() ? "" : " - never fired");
    for (const json& r : s["reports"]) {
      out << fmt::format("  {} (pid {}){}: {} succeeded, {} failed\n", r["rank"].get<std::string>(),
                         r["pid"].get<int>(), r["victim"].get<bool>() ? " [victim]" : "",
                         r["succeeded"].get<int>(), r["failed"].get<int>());
      if (r["cause"].is_null()) continue;
      std::string took = r["detection_ms"].is_null()
                             ? std::string("-")
                             : fmt::format("{:.0f} ms", r["detection_ms"].get<double>());
      out << fmt::format("      origin {} (pid {}), cause {}, phase {}, detected in {}\n",
                         r["origin"].get<std::string>(), r["origin_pid"].get<int>(),
                         r["cause"].get<std::string>(), r["phase"].get<std::string>(), took);
      out << "      " << r["message"].get<std::string>() << "\n";
    }
  }
  out << "\n";
  if (s["ok"].get<bool>()) {
    out << "Result: OK\n";
  } else {
    out << "Result: FAILED\n";
    for (const json& p : s["problems"]) out << "  - " << p.get<std::string>() << "\n";
  }
  out << "Logs: " << s["log_dir"].get<std::string>() << "\n";
}

}  // namespace kvbridge::tools

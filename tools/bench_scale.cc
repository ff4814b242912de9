#include "tools/bench_scale.h"

#include <stdlib.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "tools/cluster.h"

namespace kvbridge::tools {
namespace {

using std::chrono::milliseconds;

struct ScaleFlags {
  std::vector<int> rooms = {100, 10000};
  int rounds = 3;  // requests = rounds x rooms: the stream keeps `rooms` in flight
  int prefill_tp = 1, decode_tp = 4;
  int layers = 2, heads = 4, head_dim = 64, page_size = 16;
  int deadline_ms = 10000;
  int step_us = 100;
  // "changed": each worker step polls the rooms KVManager::TakeChangedRooms
  // lists; "all": every room in flight, as sglang's scheduler does.
  std::string poll = "changed";
  int timeout_s = 300;
  bool json = false;
  std::string binary = "/proc/self/exe";
};

struct ScalePoint {
  int rooms = 0;
  int requests = 0;
  uint64_t succeeded = 0, failed = 0, corrupt = 0, nonterminal = 0;
  double seconds = 0;  // the slowest decode rank's window
  double p50_us = 0, p99_us = 0, max_us = 0;
  uint64_t peak_live = 0;     // fewest rooms live at once on any rank's peak
  double bytes_per_room = 0;  // worst rank: RssAnon growth / its peak rooms live
  std::string worst_rank;
  std::string error;
  double rps() const { return seconds > 0 ? succeeded / seconds : 0; }
};

double LoadAverage() {
  std::ifstream in("/proc/loadavg");
  double l = 0;
  in >> l;
  return l;
}

ScalePoint RunPoint(const ScaleFlags& f, int rooms) {
  ScalePoint p;
  p.rooms = rooms;
  p.requests = rooms * std::max(f.rounds, 1);
  char dir_template[] = "/tmp/kvbridge-scale-XXXXXX";
  std::string log_dir = mkdtemp(dir_template) ? dir_template : "";
  ClusterOptions co;
  co.binary = f.binary;
  co.prefill_tp = f.prefill_tp;
  co.decode_tp = f.decode_tp;
  co.bootstrap = BootstrapMode::kEmbedded;
  co.log_dir = log_dir;
  co.worker_args = {"--requests",     std::to_string(p.requests),
                    "--concurrency",  std::to_string(rooms),
                    "--min-tokens",   std::to_string(f.page_size),
                    "--max-tokens",   std::to_string(f.page_size),
                    "--chunk-tokens", std::to_string(f.page_size),
                    "--layers",       std::to_string(f.layers),
                    "--heads",        std::to_string(f.heads),
                    "--head-dim",     std::to_string(f.head_dim),
                    "--page-size",    std::to_string(f.page_size),
                    "--pool-pages",   std::to_string(rooms + 64),
                    "--deadline-s",   std::to_string(std::max(5, f.timeout_s - 10)),
                    "--step-us",      std::to_string(f.step_us),
                    "--shm"};
  if (f.poll == "changed") co.worker_args.push_back("--poll-changed");
  auto started = Cluster::Start(co);
  if (!started.ok()) {
    p.error = started.status().ToString() + " (logs in " + log_dir + ")";
    return p;
  }
  Cluster& c = **started;
  Status st = c.CollectReports(std::chrono::seconds(f.timeout_s));
  if (!st.ok()) p.error = st.ToString() + " (logs in " + log_dir + ")";
  bool first_decode = true;
  for (int i = 0; i < c.num_ranks(); ++i) {
    const ProcessInfo& r = c.process(i);
    if (r.role == Role::kBootstrap) continue;
    if (!r.report) {
      if (p.error.empty()) p.error = r.name + " sent no report (logs in " + log_dir + ")";
      continue;
    }
    const nlohmann::json& j = *r.report;
    const uint64_t live = j.value("peak_live", uint64_t{0});
    const double grown =
        1024.0 * (j.value("rss_anon_peak_kb", 0.0) - j.value("rss_anon_base_kb", 0.0));
    if (live > 0 && grown / live > p.bytes_per_room) {
      p.bytes_per_room = grown / live;
      p.worst_rank = r.name;
    }
    p.peak_live = p.peak_live == 0 ? live : std::min<uint64_t>(p.peak_live, live);
    p.corrupt += j.value("corrupt_pages", uint64_t{0});
    p.nonterminal += j.value("nonterminal", uint64_t{0});
    if (r.role != Role::kDecode) continue;
    // Every decode rank finishes every request: count them once.
    const uint64_t ok = j.value("succeeded", uint64_t{0});
    p.succeeded = first_decode ? ok : std::min(p.succeeded, ok);
    first_decode = false;
    p.failed = std::max(p.failed, j.value("failed", uint64_t{0}));
    p.seconds = std::max(p.seconds, j.value("window_seconds", 0.0));
    p.p50_us = std::max(p.p50_us, j.value("p50_us", 0.0));
    p.p99_us = std::max(p.p99_us, j.value("p99_us", 0.0));
    p.max_us = std::max(p.max_us, j.value("max_us", 0.0));
  }
  c.Shutdown(milliseconds(15000));
  if (p.error.empty() && (p.failed > 0 || p.corrupt > 0 || p.nonterminal > 0))
    p.error = std::to_string(p.failed) + " failed, " + std::to_string(p.corrupt) +
              " corrupt pages, " + std::to_string(p.nonterminal) + " unfinished (logs in " +
              log_dir + ")";
  return p;
}

int RunBenchScale(const ScaleFlags& f) {
  FILE* note = f.json ? stderr : stdout;
  std::fprintf(note,
               "[bench] scale over shm: prefill tp%d -> decode tp%d, %d layers x %d kv heads x %d "
               "x 2 B, 1-page requests of %d tokens, every byte verified; %d x rooms requests per "
               "point, the stream keeping that many rooms in flight; each worker step polls %s; "
               "load average %.2f\n",
               f.prefill_tp, f.decode_tp, f.layers, f.heads, f.head_dim, f.page_size, f.rounds,
               f.poll == "changed" ? "the rooms whose answer changed (KVManager::TakeChangedRooms)"
                                   : "every room in flight",
               LoadAverage());
  std::fflush(note);
  std::vector<ScalePoint> points;
  for (int rooms : f.rooms) points.push_back(RunPoint(f, rooms));
  const double base_rps = points.empty() ? 0 : points.front().rps();
  bool ok = true, deadline_met = true, memory_met = true, throughput_met = true;
  for (const ScalePoint& p : points) {
    ok = ok && p.error.empty();
    deadline_met = deadline_met && p.error.empty() && p.max_us <= f.deadline_ms * 1000.0;
  }
  // Per-room memory is judged where rooms dominate it: at the most rooms (a
  // process's fixed growth spread over 100 rooms reads as kilobytes each).
  if (!points.empty()) {
    const auto most =
        std::max_element(points.begin(), points.end(),
                         [](const auto& a, const auto& b) { return a.rooms < b.rooms; });
    memory_met = most->error.empty() && most->bytes_per_room <= 1024;
    // No loss of throughput at the most rooms against the first point.
    throughput_met = most->error.empty() && base_rps > 0 && most->rps() >= base_rps;
  }
  if (f.json) {
    nlohmann::json results = nlohmann::json::array();
    for (const ScalePoint& p : points) {
      nlohmann::json e = {{"rooms", p.rooms},
                          {"requests", p.requests},
                          {"succeeded", p.succeeded},
                          {"failed", p.failed},
                          {"seconds", p.seconds},
                          {"requests_per_s", p.rps()},
                          {"ratio_to_first", base_rps > 0 ? p.rps() / base_rps : 0.0},
                          {"p50_us", p.p50_us},
                          {"p99_us", p.p99_us},
                          {"max_us", p.max_us},
                          {"peak_live", p.peak_live},
                          {"bytes_per_room", p.bytes_per_room},
                          {"worst_rank", p.worst_rank}};
      if (!p.error.empty()) e["error"] = p.error;
      results.push_back(e);
    }
    std::cout << nlohmann::json{{"bench", "scale"},
                                {"prefill_tp", f.prefill_tp},
                                {"decode_tp", f.decode_tp},
                                {"deadline_ms", f.deadline_ms},
                                {"poll", f.poll},
                                {"loadavg", LoadAverage()},
                                {"results", results},
                                {"deadline_met", deadline_met},
                                {"memory_met", memory_met},
                                {"throughput_met", throughput_met},
                                {"ok", ok}}
                     .dump()
              << std::endl;
    return ok ? 0 : 1;
  }
  std::printf("%8s %9s %9s %8s %10s %10s %10s %9s %12s\n", "rooms", "requests", "req/s", "vs first",
              "p50 us", "p99 us", "max us", "peak live", "B/room");
  for (const ScalePoint& p : points) {
    std::printf("%8d %9llu %9.0f %8.2f %10.0f %10.0f %10.0f %9llu %12.0f%s%s\n", p.rooms,
                static_cast<unsigned long long>(p.succeeded), p.rps(),
                base_rps > 0 ? p.rps() / base_rps : 0.0, p.p50_us, p.p99_us, p.max_us,
                static_cast<unsigned long long>(p.peak_live), p.bytes_per_room,
                p.error.empty() ? "" : "  ERROR: ", p.error.c_str());
  }
  std::printf(
      "B/room: the worst rank's resident anonymous memory (RssAnon, not the shared page "
      "pools) at its most rooms live, minus before the first, over those rooms\n");
  std::printf(
      "target: no request slower than the %d ms deadline: %s; <= 1 KiB per room in flight at "
      "the most rooms: %s; no loss of throughput at the most rooms against the first point: "
      "%s; load average now %.2f\n",
      f.deadline_ms, deadline_met ? "met" : "NOT met", memory_met ? "met" : "NOT met",
      throughput_met ? "met" : "NOT met", LoadAverage());
  return ok ? 0 : 1;
}

}  // namespace

void AddBenchScaleCommand(CLI::App& bench, std::function<int()>& run) {
  auto f = std::make_shared<ScaleFlags>();
  CLI::App* cmd = bench.add_subcommand(
      "scale",
      "Many rooms in flight at once between worker processes on this host: throughput, latency "
      "against the deadline and memory per room, at each --rooms");
  cmd->add_option("--rooms", f->rooms, "Rooms in flight at each point (the first is the baseline)")
      ->delimiter(',')
      ->check(CLI::Range(1, 100000))
      ->capture_default_str();
  cmd->add_option("--rounds", f->rounds, "Requests per point = rounds x rooms")
      ->check(CLI::Range(1, 1000))
      ->capture_default_str();
  cmd->add_option("--prefill-tp", f->prefill_tp)->check(CLI::Range(1, 16))->capture_default_str();
  cmd->add_option("--decode-tp", f->decode_tp)->check(CLI::Range(1, 16))->capture_default_str();
  cmd->add_option("--layers", f->layers)->check(CLI::Range(1, 1024))->capture_default_str();
  cmd->add_option("--heads", f->heads)->check(CLI::Range(1, 1024))->capture_default_str();
  cmd->add_option("--head-dim", f->head_dim)->check(CLI::Range(1, 65536))->capture_default_str();
  cmd->add_option("--page-size", f->page_size)->check(CLI::Range(1, 65536))->capture_default_str();
  cmd->add_option("--deadline-ms", f->deadline_ms, "No request may take longer than this")
      ->check(CLI::Range(1, 3600000))
      ->capture_default_str();
  cmd->add_option("--step-us", f->step_us, "Workers' scheduler step")
      ->check(CLI::Range(0, 1000000))
      ->capture_default_str();
  cmd->add_option("--poll", f->poll,
                  "What a worker step polls: the rooms whose answer changed "
                  "(KVManager::TakeChangedRooms), or all rooms in flight (as sglang does)")
      ->check(CLI::IsMember({"changed", "all"}))
      ->capture_default_str();
  cmd->add_option("--timeout", f->timeout_s, "Give up on a point after this many seconds")
      ->check(CLI::Range(10, 86400))
      ->capture_default_str();
  cmd->add_flag("--json", f->json, "Print one JSON object on stdout");
  cmd->add_option("--binary", f->binary, "kvbridge executable for the workers")->group("");
  cmd->callback([f, &run] { run = [f] { return RunBenchScale(*f); }; });
}

}  // namespace kvbridge::tools

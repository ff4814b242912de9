// `kvbridge bench failures` (issue 4): detection latency of a killed rank.
//
// Each repeat starts prefill tp2 + decode tp2 as worker processes (small
// layout, paced with --rate), waits until decode has finished a few
// requests, SIGKILLs prefill tp1 and collects every survivor's REPORT. A
// survivor's detection latency is the earliest detected_at_us among its
// failures (and its rank_failure) that name the victim, minus the wall time
// of the kill (the same clock: FailureRecord::detected_at).
#include "tools/bench_failures.h"

#include <signal.h>
#include <stdlib.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "control/json_fields.h"
#include "tools/cluster.h"

namespace kvbridge::tools {
namespace {

using std::chrono::milliseconds;

struct FailuresFlags {
  int repeats = 5;
  int heartbeat_ms = 100;
  int heartbeat_misses = 5;
  double rate = 40;
  int requests = 80;
  int kill_after = 5;  // decode requests finished before the kill
  bool shm = true;
  bool json = false;
  int timeout_s = 60;
  std::string binary = "/proc/self/exe";
};

bool NamesVictim(const nlohmann::json& failure, int victim_tp) {
  if (!failure.is_object() || !failure.contains("origin")) return false;
  const nlohmann::json& o = failure["origin"];
  return o.value("role", std::string()) == "prefill" && o.value("tp", -1) == victim_tp;
}

struct Survivor {
  int repeat = 0;
  std::string name;
  std::optional<double> latency_ms;  // none: never named the victim
  std::string mechanism;
};

double Percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(p * v.size()))];
}

int RunBenchFailures(const FailuresFlags& f) {
  FILE* note = f.json ? stderr : stdout;
  constexpr int kVictimTp = 1;
  std::vector<Survivor> survivors;
  std::vector<std::string> errors;
  for (int rep = 0; rep < f.repeats; ++rep) {
    char dir_template[] = "/tmp/kvbridge-benchfail-XXXXXX";
    std::string log_dir = mkdtemp(dir_template) ? dir_template : "";
    ClusterOptions co;
    co.binary = f.binary;
    co.prefill_tp = 2;
    co.decode_tp = 2;
    co.bootstrap = BootstrapMode::kEmbedded;  // on prefill tp0, which survives
    co.log_dir = log_dir;
    co.worker_args = {"--requests",
                      std::to_string(f.requests),
                      "--concurrency",
                      "4",
                      "--rate",
                      std::to_string(f.rate),
                      "--seed",
                      std::to_string(rep + 1),
                      "--min-tokens",
                      "32",
                      "--max-tokens",
                      "256",
                      "--chunk-tokens",
                      "64",
                      "--layers",
                      "2",
                      "--heads",
                      "4",
                      "--head-dim",
                      "64",
                      "--page-size",
                      "16",
                      "--pool-pages",
                      "512",
                      "--progress-ms",
                      "50",
                      "--heartbeat-ms",
                      std::to_string(f.heartbeat_ms),
                      "--heartbeat-misses",
                      std::to_string(f.heartbeat_misses),
                      "--bootstrap-timeout-ms",
                      "3000",
                      "--waiting-timeout-ms",
                      "3000",
                      "--deadline-s",
                      std::to_string(std::max(5, f.timeout_s - 10))};
    if (f.shm) co.worker_args.push_back("--shm");
    auto started = Cluster::Start(co);
    if (!started.ok()) {
      errors.push_back("repeat " + std::to_string(rep + 1) + ": " + started.status().ToString() +
                       " (logs in " + log_dir + ")");
      continue;
    }
    Cluster& c = **started;
    auto progressed = [&] {
      for (int d = 0; d < 2; ++d) {
        const ProcessInfo& p = c.process(c.RankIndex(Role::kDecode, d));
        const nlohmann::json* j = p.report ? &*p.report : p.progress ? &*p.progress : nullptr;
        if (j == nullptr || j->value("finished", 0) < f.kill_after) return false;
      }
      return true;
    };
    Status st = c.PumpUntil(progressed, std::chrono::seconds(f.timeout_s));
    if (!st.ok()) {
      errors.push_back("repeat " + std::to_string(rep + 1) + ": no progress: " + st.ToString() +
                       " (logs in " + log_dir + ")");
      continue;
    }
    const int victim = c.RankIndex(Role::kPrefill, kVictimTp);
    c.Signal(victim, SIGKILL).IgnoreError();
    const int64_t kill_us = c.process(victim).signalled_at_us;
    st = c.CollectReports(std::chrono::seconds(f.timeout_s), {victim});
    if (!st.ok())
      errors.push_back("repeat " + std::to_string(rep + 1) + ": " + st.ToString() + " (logs in " +
                       log_dir + ")");
    for (int i = 0; i < c.num_ranks(); ++i) {
      if (i == victim) continue;
      const ProcessInfo& p = c.process(i);
      Survivor s;
      s.repeat = rep + 1;
      s.name = p.name;
      if (p.report) {
        std::optional<int64_t> first;
        auto consider = [&](const nlohmann::json& fj) {
          if (!NamesVictim(fj, kVictimTp)) return;
          int64_t at = fj.value("detected_at_us", int64_t{0});
          if (at <= 0) return;
          if (!first || at < *first) {
            first = at;
            s.mechanism = fj.value("mechanism", std::string());
          }
        };
        if (p.report->contains("failures"))
          for (const auto& fj : (*p.report)["failures"]) consider(fj);
        if (p.report->contains("rank_failure")) consider((*p.report)["rank_failure"]);
        if (first) s.latency_ms = (*first - kill_us) / 1000.0;
      }
      survivors.push_back(s);
    }
    c.Shutdown(milliseconds(10000));
    std::fprintf(note, "[bench] repeat %d/%d done\n", rep + 1, f.repeats);
    std::fflush(note);
  }
  std::vector<double> lat;
  int missed = 0;
  for (const Survivor& s : survivors) {
    if (s.latency_ms) {
      lat.push_back(*s.latency_ms);
    } else {
      ++missed;
    }
  }
  const double p50 = Percentile(lat, 0.5);
  const double max = lat.empty() ? 0 : *std::max_element(lat.begin(), lat.end());
  const double budget_ms = f.heartbeat_ms * f.heartbeat_misses;
  const bool ok = errors.empty() && missed == 0 && !lat.empty();
  if (f.json) {
    nlohmann::json per = nlohmann::json::array();
    for (const Survivor& s : survivors) {
      nlohmann::json e = {{"repeat", s.repeat}, {"rank", s.name}};
      if (s.latency_ms) {
        e["detection_ms"] = *s.latency_ms;
        e["mechanism"] = s.mechanism;
      } else {
        e["detection_ms"] = nullptr;
      }
      per.push_back(e);
    }
    nlohmann::json out = {{"bench", "failures"},
                          {"victim", "prefill tp1"},
                          {"layout", "prefill tp2 + decode tp2"},
                          {"repeats", f.repeats},
                          {"heartbeat_ms", f.heartbeat_ms},
                          {"heartbeat_misses", f.heartbeat_misses},
                          {"heartbeat_budget_ms", budget_ms},
                          {"samples", lat.size()},
                          {"missed", missed},
                          {"p50_ms", p50},
                          {"max_ms", max},
                          {"results", per},
                          {"errors", errors},
                          {"ok", ok}};
    std::cout << internal::DumpJson(out) << std::endl;
  } else {
    std::printf("%-7s %-12s %14s  %s\n", "repeat", "survivor", "detection ms", "mechanism");
    for (const Survivor& s : survivors) {
      if (s.latency_ms) {
        std::printf("%-7d %-12s %14.1f  %s\n", s.repeat, s.name.c_str(), *s.latency_ms,
                    s.mechanism.c_str());
      } else {
        std::printf("%-7d %-12s %14s  never named prefill tp1\n", s.repeat, s.name.c_str(), "-");
      }
    }
    std::printf(
        "detection after SIGKILL of prefill tp1: p50 %.1f ms, max %.1f ms over %zu "
        "survivor samples (%d missed); heartbeat %d ms x %d misses = %.0f ms\n",
        p50, max, lat.size(), missed, f.heartbeat_ms, f.heartbeat_misses, budget_ms);
    for (const std::string& e : errors) std::printf("ERROR: %s\n", e.c_str());
  }
  return ok ? 0 : 1;
}

}  // namespace

void AddBenchFailuresCommand(CLI::App& bench, std::function<int()>& run) {
  auto f = std::make_shared<FailuresFlags>();
  CLI::App* cmd = bench.add_subcommand(
      "failures",
      "Detection latency of a SIGKILLed rank: prefill tp2 + decode tp2 worker processes, kill "
      "prefill tp1, time until each survivor names it");
  cmd->add_option("--repeats", f->repeats)->check(CLI::Range(1, 1000))->capture_default_str();
  cmd->add_option("--heartbeat-ms", f->heartbeat_ms)
      ->check(CLI::Range(1, 60000))
      ->capture_default_str();
  cmd->add_option("--heartbeat-misses", f->heartbeat_misses)
      ->check(CLI::Range(1, 1000))
      ->capture_default_str();
  cmd->add_option("--rate", f->rate, "Requests per second each rank admits")
      ->check(CLI::Range(1.0, 100000.0))
      ->capture_default_str();
  cmd->add_option("--requests", f->requests, "Requests per repeat")
      ->check(CLI::Range(1, 1000000))
      ->capture_default_str();
  cmd->add_option("--kill-after", f->kill_after, "Decode requests finished before the kill")
      ->check(CLI::Range(0, 1000000))
      ->capture_default_str();
  cmd->add_option("--timeout", f->timeout_s, "Give up on a repeat after this many seconds")
      ->check(CLI::Range(5, 86400))
      ->capture_default_str();
  cmd->add_flag("--json", f->json, "Print one JSON object on stdout");
  cmd->add_option("--binary", f->binary, "kvbridge executable for the workers")->group("");
  cmd->callback([f, &run] {
    if (f->kill_after >= f->requests)
      throw CLI::ValidationError("--kill-after", "must be below --requests");
    run = [f] { return RunBenchFailures(*f); };
  });
}

}  // namespace kvbridge::tools

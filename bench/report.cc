// Output of `kvbridge bench transport`: a table for people, one JSON object
// for scripts.
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "bench/bench_util.h"
#include "bench/transport_bench.h"

namespace kvbridge::bench {
namespace {

std::string LoadAverage() {
  std::ifstream in("/proc/loadavg");
  std::string one, five, fifteen;
  in >> one >> five >> fifteen;
  return one + " " + five + " " + fifteen;
}

// "MET", "UNMET" or "-" (no target for this path and size).
std::string Verdict(const BenchResult& r) {
  if (!r.target) return "-";
  if (!r.error.empty()) return "UNMET";
  return r.ratio >= *r.target ? "MET" : "UNMET";
}

}  // namespace

void PrintTable(FILE* out, const TransportBenchOptions& o,
                const std::vector<BenchResult>& results) {
  std::fprintf(out,
               "kvbridge bench transport: %s region, %s per block size, batch %llu, depth %llu, "
               "best of up to %llu rounds\n",
               FormatSize(o.region_size).c_str(), FormatSize(o.bytes).c_str(),
               static_cast<unsigned long long>(o.batch), static_cast<unsigned long long>(o.depth),
               static_cast<unsigned long long>(o.repeat));
  std::fprintf(out, "host: %ld CPUs, load average %s (GB/s = 10^9 bytes/s)\n\n",
               sysconf(_SC_NPROCESSORS_ONLN), LoadAverage().c_str());
  std::fprintf(out, "%-8s %-8s %-8s %8s %9s  %-10s %8s %6s  %-14s %s\n", "path", "chosen", "block",
               "GB/s", "blocks/s", "reference", "ref GB/s", "ratio", "target", "check");
  for (const auto& r : results) {
    std::string target = r.target ? ">=" + std::to_string(*r.target).substr(0, 4) + " " + Verdict(r)
                                  : std::string("-");
    std::string check = r.error.empty() ? (r.verified ? "verified" : "NOT VERIFIED") : r.error;
    std::fprintf(out, "%-8s %-8s %-8s %8.2f %9s  %-10s %8.2f %6.2f  %-14s %s\n", r.path.c_str(),
                 r.chosen_path.empty() ? "?" : r.chosen_path.c_str(),
                 FormatSize(r.block_size).c_str(), r.gbps, FormatRate(r.msg_rate).c_str(),
                 r.reference.c_str(), r.reference_gbps, r.ratio, target.c_str(), check.c_str());
  }
  std::fprintf(out, "\n");
  for (const auto& r : results) {
    if (r.path_mismatch) {
      std::fprintf(out, "!!! %s: the transport chose '%s', not the requested path\n",
                   r.path.c_str(), r.chosen_path.c_str());
      break;
    }
  }
  struct Goal {
    const char* text;
    bool same_host;
  };
  for (Goal g : {Goal{"same-host >= 0.9 x memcpy at >= 64 KiB", true},
                 Goal{"TCP >= 0.8 x loopback socket at >= 1 MiB", false}}) {
    std::string unmet;
    int checked = 0;
    for (const auto& r : results) {
      if (!r.target || (r.reference == "memcpy") != g.same_host) continue;
      ++checked;
      if (Verdict(r) != "MET") unmet += " " + r.path + "@" + FormatSize(r.block_size);
    }
    if (checked == 0) continue;
    std::fprintf(out, "target %-42s %s%s\n", g.text,
                 unmet.empty() ? "MET" : "UNMET:", unmet.c_str());
  }
}

void PrintJson(FILE* out_file, const TransportBenchOptions& o,
               const std::vector<BenchResult>& results) {
  nlohmann::json out;
  out["bench"] = "transport";
  out["config"] = {{"paths", o.paths},          {"block_sizes", o.block_sizes},
                   {"bytes", o.bytes},          {"region_size", o.region_size},
                   {"batch", o.batch},          {"depth", o.depth},
                   {"repeat", o.repeat},        {"warmup", o.warmup},
                   {"gbps_unit", "1e9 bytes/s"}};
  out["host"] = {{"cpus", sysconf(_SC_NPROCESSORS_ONLN)}, {"loadavg", LoadAverage()}};
  nlohmann::json rows = nlohmann::json::array();
  bool all_met = true;
  for (const auto& r : results) {
    nlohmann::json j = {{"path", r.path},
                        {"chosen_path", r.chosen_path},
                        {"path_mismatch", r.path_mismatch},
                        {"block_size", r.block_size},
                        {"bytes", r.bytes},
                        {"blocks", r.blocks},
                        {"seconds", r.seconds},
                        {"rounds", r.rounds},
                        {"gbps", r.gbps},
                        {"msg_rate", r.msg_rate},
                        {"reference", r.reference},
                        {"reference_gbps", r.reference_gbps},
                        {"ratio", r.ratio},
                        {"verified", r.verified}};
    j["target_ratio"] = r.target ? nlohmann::json(*r.target) : nlohmann::json(nullptr);
    j["target_met"] = r.target ? nlohmann::json(Verdict(r) == "MET") : nlohmann::json(nullptr);
    j["error"] = r.error.empty() ? nlohmann::json(nullptr) : nlohmann::json(r.error);
    if (r.target && Verdict(r) != "MET") all_met = false;
    rows.push_back(std::move(j));
  }
  out["results"] = std::move(rows);
  out["targets_met"] = all_met;
  std::fprintf(out_file, "%s\n", out.dump(2).c_str());
}

}  // namespace kvbridge::bench

#include "tools/bench_requests_report.h"

#include <cstdio>
#include <iostream>
#include <nlohmann/json.hpp>

#include "control/json_fields.h"

namespace kvbridge::tools::bench_requests {
namespace {

// Each round's two figures, in the order they ran.
nlohmann::json RoundsJson(const std::vector<Round>& rounds) {
  nlohmann::json out = nlohmann::json::array();
  for (const Round& r : rounds)
    out.push_back({{"raw_transport_gbps", r.raw},
                   {"raw_transport_piece_gbps", r.raw_piece},
                   {"ratio_to_raw_piece", r.raw_piece > 0 ? r.big.gbps() / r.raw_piece : 0},
                   {"gbps", r.big.gbps()},
                   {"ratio_to_raw", r.raw > 0 ? r.big.gbps() / r.raw : 0},
                   {"verified_pages", r.big.verified_pages},
                   {"corrupt_pages", r.big.corrupt_pages}});
  return out;
}

}  // namespace

void PrintJson(const RequestsFlags& f, const Figures& m) {
  nlohmann::json results = nlohmann::json::array();
  for (const SweepResult* s : {&m.big, &m.small}) {
    nlohmann::json e = {{"sweep", s->name},
                        {"tokens", s->tokens},
                        {"requests", s->requests},
                        {"warmup_requests", s->warmup},
                        {"succeeded", s->succeeded},
                        {"failed", s->failed},
                        {"bytes", s->bytes},
                        {"seconds", s->seconds},
                        {"gbps", s->gbps()},
                        {"requests_per_s", s->rps()},
                        {"p50_us", s->p50_us},
                        {"p99_us", s->p99_us},
                        {"verified_pages", s->verified_pages},
                        {"prefill_cpus", s->prefill_cpus},
                        {"decode_cpus", s->decode_cpus},
                        {"corrupt_pages", s->corrupt_pages}};
    if (!s->error.empty()) e["error"] = s->error;
    results.push_back(e);
  }
  nlohmann::json out = {
      {"bench", "requests"},
      {"path", f.path},
      {"hosts", f.hosts},
      // Both measurements ran between the same two places.
      {"requests_where", m.where},
      {"raw_where", m.where},
      {"prefill_tp", f.prefill_tp},
      {"decode_tp", f.decode_tp},
      {"layout",
       {{"layers", f.layers},
        {"kv_heads", f.heads},
        {"head_dim", f.head_dim},
        {"dtype_bytes", 2},
        {"page_size", f.page_size}}},
      {"check_stride", f.check_stride},
      {"check_outside_window", f.check_outside_window},
      {"cpus", f.pin ? nlohmann::json{{"prefill", f.pin->first}, {"decode", f.pin->second}}
                     : nlohmann::json(nullptr)},
      {"raw_transport_gbps", m.raw},
      // The same transport writing pieces of the requests' write size
      // (0: not measured): what UCX gives for such writes, not the wire.
      {"raw_transport_piece_bytes", m.raw_piece_bytes},
      {"raw_transport_piece_gbps", m.raw_piece},
      {"ratio_to_raw_piece", m.raw_piece > 0 ? m.big.gbps() / m.raw_piece : 0},
      {"step_us", BandwidthStepUs(f)},
      {"ratio_to_raw", m.ratio},
      {"rounds", RoundsJson(m.rounds)},
      {"targets",
       {{"bandwidth_ratio_min", 0.8},
        {"bandwidth_met", m.bw_met},
        {"one_page_p50_us_max", 100},
        {"one_page_latency_met", m.lat_met}}},
      {"one_page_bytes", m.page_bytes},
      {"one_page_copy_floor_us", m.floor_us},
      {"one_page_memcpy_us", m.memcpy_us},
      {"one_page_memcpy_p99_us", m.one_page_memcpy.p99},
      {"one_page_added_p50_us", m.added_p50},
      {"one_page_added_p99_us", m.added_p99},
      {"memcpy_gbps", m.memcpy_gbps},
      {"memcpy_gbps_before", m.memcpy_before},
      {"memcpy_gbps_after", m.memcpy_after},
      {"ratio_to_memcpy", m.memcpy_ratio},
      {"memcpy_piece_bytes", m.big_piece},
      {"run_bytes", m.run_bytes},
      {"memcpy_runs_gbps", m.memcpy_runs_gbps},
      {"ratio_to_memcpy_runs", m.memcpy_runs_ratio},
      {"results", results},
      {"ok", m.ok}};
  if (!m.raw_error.empty()) out["raw_error"] = m.raw_error;
  std::cout << internal::DumpJson(out) << std::endl;
}

void PrintText(const RequestsFlags& f, const Figures& m) {
  std::printf("%-12s %8s %9s %8s %10s %10s %10s\n", "sweep", "requests", "GB/s", "req/s", "p50 us",
              "p99 us", "seconds");
  for (const SweepResult* s : {&m.big, &m.small}) {
    std::printf("%-12s %8llu %9.2f %8.1f %10.1f %10.1f %10.2f%s%s\n", s->name.c_str(),
                static_cast<unsigned long long>(s->succeeded), s->gbps(), s->rps(), s->p50_us,
                s->p99_us, s->seconds, s->error.empty() ? "" : "  ERROR: ", s->error.c_str());
  }
  if (m.rounds.size() > 1) {
    std::printf("%zu rounds, each the raw transport then the %s sweep in fresh processes:",
                m.rounds.size(), m.big.name.c_str());
    for (const Round& r : m.rounds)
      std::printf(" %.2f / %.2f GB/s (%.2f);", r.raw, r.big.gbps(),
                  r.raw > 0 ? r.big.gbps() / r.raw : 0);
    std::printf(" the figures below are the medians\n");
  }
  if (m.raw > 0) {
    std::printf(
        "raw transport (%s, 1 MiB writes, same run, %s): %.2f GB/s; %s requests (%s) reach "
        "%.2f of it\n",
        f.path.c_str(), m.where.c_str(), m.raw, m.big.name.c_str(), m.where.c_str(), m.ratio);
    if (m.raw_piece > 0)
      std::printf(
          "raw transport writing %zu-byte pieces, as the requests do (same run, same processes): "
          "%.2f GB/s; the requests reach %.2f of it\n",
          m.raw_piece_bytes, m.raw_piece, m.big.gbps() / m.raw_piece);
  } else {
    std::printf("raw transport: not measured%s%s\n", m.raw_error.empty() ? "" : ": ",
                m.raw_error.c_str());
  }
  std::printf(
      "single-thread memcpy of the same bytes (%zu-byte pieces, scattered), before / after the "
      "sweep: %.2f / %.2f GB/s; %s requests reach %.2f x memcpy (target >= 1.0: %s)\n",
      m.big_piece, m.memcpy_before, m.memcpy_after, m.big.name.c_str(), m.memcpy_ratio,
      m.memcpy_ratio >= 1.0 ? "met" : "NOT met");
  if (m.run_bytes != m.big_piece)
    std::printf(
        "the engine copies %zu-byte runs here (each token's head slice: the tp sizes differ); "
        "memcpy of the same runs at the same offsets in the pages, after the sweep: %.2f GB/s; "
        "requests reach %.2f x that\n",
        m.run_bytes, m.memcpy_runs_gbps, m.memcpy_runs_ratio);
  std::printf("pattern checked in 1 page of %d%s%s\n", f.check_stride,
              f.check_stride == 1 ? " (every byte of every page)" : "",
              f.check_outside_window
                  ? "; the bandwidth sweep filled it before and checked it after its window"
                  : "");
  std::printf("target >= 0.8 x raw for %s requests: %s\n", m.big.name.c_str(),
              m.raw <= 0 ? "unknown"
              : m.bw_met ? "met"
                         : "NOT met");
  std::printf("target 1-page p50 <= 100 us: %s (%.1f us)\n", m.lat_met ? "met" : "NOT met",
              m.small.p50_us);
  if (m.floor_us > 0)
    std::printf(
        "a 1-page request carries %.0f KiB (one page of every layer); copying that alone at the "
        "raw rate takes %.1f us, so kvbridge adds %.1f us at p50\n",
        m.page_bytes / 1024, m.floor_us, m.small.p50_us - m.floor_us);
  if (m.memcpy_us > 0)
    std::printf(
        "memcpy of those %zu pieces on one thread into pages not in the cache: p50 %.1f us, p99 "
        "%.1f us; kvbridge adds p50 %.1f us (target <= 25: %s), p99 %.1f us above the p50 copy "
        "(target <= 100: %s)\n",
        m.pieces, m.memcpy_us, m.one_page_memcpy.p99, m.added_p50,
        m.added_p50 <= 25 ? "met" : "NOT met", m.added_p99, m.added_p99 <= 100 ? "met" : "NOT met");
}

}  // namespace kvbridge::tools::bench_requests

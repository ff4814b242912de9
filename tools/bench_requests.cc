// `kvbridge bench requests`: end-to-end request figures over real prefill and
// decode worker processes (issue 3, "Benchmark"), next to the raw transport
// limit measured in the same run by `kvbridge bench transport`.
//
// Two sweeps, each a fresh Cluster:
//   4k     fixed 4096-token requests: GB/s (decode bytes / wall time of the
//          stream), requests/s, p50/p99 latency (decode SendMetadata ->
//          Success, from the decode reports)
//   1page  one-page requests (page-size tokens), one in flight: p50/p99
//
// --hosts 2 (tcp only, root): prefill on host 0, decode on host 1, hosts in
// network namespaces joined over veth (tools/hosts.h, placed as `demo
// --hosts` places them); the raw reference then crosses the same two hosts
// (its initiator on host 0, its target on host 1).
#include "tools/bench_requests.h"

#include <fmt/format.h>
#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "engine/plan.h"
#include "tools/bench_requests_report.h"
#include "tools/cluster.h"
#include "tools/cpu_sides.h"
#include "tools/demo_hosts.h"
#include "tools/hosts.h"
#include "tools/memcpy_reference.h"

namespace kvbridge::tools {
namespace {

using bench_requests::Figures;
using bench_requests::Percentiles;
using bench_requests::RequestsFlags;
using bench_requests::Round;
using bench_requests::StepUs;
using bench_requests::SweepResult;

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

// Every sweep first runs warm-up requests that are not measured: enough to
// take every page of the pool once (the workers hand pages out first in,
// first out), so each page has been written through the peer's mapping
// before the measured requests, as in a server that has run for a while.
int Warmup(int pages, int pool_pages, int concurrency) {
  return std::max(concurrency, (pool_pages + std::max(pages, 1) - 1) / std::max(pages, 1));
}

// `*warmup`: the warm-up requests added before the measured ones.
std::vector<std::string> WorkerArgs(const RequestsFlags& f, int tokens, int requests,
                                    int concurrency, int* warmup_out) {
  int pages = (tokens + f.page_size - 1) / f.page_size;
  // Checking outside the window keeps every measured request's pages to the
  // end (decode) or from the start (prefill): the pool holds them all.
  const bool outside = f.check_outside_window && concurrency > 1;
  int pool_pages = (concurrency + (outside ? requests : 0)) * (pages + 1) + 16;
  const int warmup = Warmup(pages, pool_pages, concurrency);
  *warmup_out = warmup;
  requests += warmup;
  std::vector<std::string> a = {"--requests",     std::to_string(requests),
                                "--concurrency",  std::to_string(concurrency),
                                "--min-tokens",   std::to_string(tokens),
                                "--max-tokens",   std::to_string(tokens),
                                "--chunk-tokens", std::to_string(std::max(tokens, 1)),
                                "--layers",       std::to_string(f.layers),
                                "--heads",        std::to_string(f.heads),
                                "--head-dim",     std::to_string(f.head_dim),
                                "--page-size",    std::to_string(f.page_size),
                                "--pool-pages",   std::to_string(pool_pages),
                                "--deadline-s",   std::to_string(std::max(5, f.timeout_s - 10)),
                                "--progress-ms",  "0",
                                "--warmup",       std::to_string(warmup),
                                "--check-stride", std::to_string(f.check_stride)};
  // Such pools take tens of seconds to create (ready_timeout below), and
  // prefill's warm-up requests wait for decode's metadata meanwhile.
  if (outside) a.insert(a.end(), {"--check-outside-window", "--waiting-timeout-ms", "300000"});
  // 1 request in flight: poll as fast as a busy scheduler can (latency);
  // more: poll once per step (1 ms) and leave the cores to the copy, as a
  // scheduler running forward passes does.
  a.insert(a.end(), {"--step-us", std::to_string(StepUs(f, concurrency))});
  if (f.path == "tcp") {
    a.insert(a.end(), {"--ucx-only", "--ucx-tls", "tcp"});
  } else {
    a.push_back("--shm");
  }
  return a;
}

// Where a measurement ran: "hosts kvb-h0 -> kvb-h1 over veth", or
// "loopback" (tcp) / "this host" (shm) without hosts.
std::string WhereRan(const RequestsFlags& f, const HostNet* net) {
  if (net != nullptr) return "hosts " + net->hostname(0) + " -> " + net->hostname(1) + " over veth";
  return f.path == "tcp" ? "loopback" : "this host";
}

// Every prefill rank's command starts on `pin.first`'s CPUs, every decode
// rank's on `pin.second`'s (inside its host's namespaces, with hosts).
void PinSides(const CpuSides& pin, ClusterOptions& co) {
  co.binary = ResolvedBinary(co.binary);
  const size_t ranks = static_cast<size_t>(co.prefill_tp + co.decode_tp);
  co.rank_wrap.resize(std::max(co.rank_wrap.size(), ranks));
  for (size_t i = 0; i < ranks; ++i) {
    std::vector<std::string> wrap =
        PinCommand(i < static_cast<size_t>(co.prefill_tp) ? pin.first : pin.second);
    wrap.insert(wrap.end(), co.rank_wrap[i].begin(), co.rank_wrap[i].end());
    co.rank_wrap[i] = std::move(wrap);
  }
}

// ": <message>" of a failure record `f` from a worker's report: a bench
// run on a box whose logs are gone (CI) still says why; empty when `f` is
// none.
std::string Why(const nlohmann::json& f) {
  if (!f.is_object()) return "";
  const auto m = f.find("message");
  return m != f.end() && m->is_string() ? ": " + m->get<std::string>() : "";
}

SweepResult RunSweep(const RequestsFlags& f, const HostNet* net, const std::string& name,
                     int tokens, int requests, int concurrency) {
  SweepResult r;
  r.name = name;
  r.tokens = tokens;
  r.requests = requests;
  char dir_template[] = "/tmp/kvbridge-bench-XXXXXX";
  std::string log_dir = mkdtemp(dir_template) ? dir_template : "";
  ClusterOptions co;
  co.binary = f.binary;
  co.prefill_tp = f.prefill_tp;
  co.decode_tp = f.decode_tp;
  co.bootstrap = BootstrapMode::kEmbedded;
  co.worker_args = WorkerArgs(f, tokens, requests, concurrency, &r.warmup);
  // Pools that hold every measured request (--check-outside-window) take
  // ~3 s per GiB to create and touch on this box.
  if (f.check_outside_window) co.ready_timeout = std::chrono::seconds(300);
  co.log_dir = log_dir;
  if (net != nullptr) PlaceRanks(*net, /*prefill_hosts=*/1, /*decode_hosts=*/1, co);
  if (f.pin) PinSides(*f.pin, co);
  auto started = Cluster::Start(co);
  if (!started.ok()) {
    r.error = started.status().ToString() + " (logs in " + log_dir + ")";
    return r;
  }
  Cluster& c = **started;
  const auto t0 = Clock::now();
  Status st = c.CollectReports(std::chrono::seconds(f.timeout_s));
  const double wall = std::chrono::duration<double>(Clock::now() - t0).count();
  if (!st.ok()) r.error = st.ToString() + " (logs in " + log_dir + ")";
  for (Role role : {Role::kPrefill, Role::kDecode}) {
    const int tp = role == Role::kPrefill ? c.prefill_tp() : c.decode_tp();
    std::set<int>& seen = role == Role::kPrefill ? r.prefill_cpus : r.decode_cpus;
    for (int t = 0; t < tp; ++t) {
      const ProcessInfo& p = c.process(c.RankIndex(role, t));
      if (!p.report || !p.report->contains("cpus") || !(*p.report)["cpus"].is_array()) continue;
      for (const auto& cpu : (*p.report)["cpus"])
        if (cpu.is_number_integer()) seen.insert(cpu.get<int>());
    }
  }
  std::string first_failure;  // ": <record>" of the first failed request a rank reported
  // Latency: the decode ranks' percentiles (the worst rank's, for tp > 1).
  for (int d = 0; d < c.decode_tp(); ++d) {
    const ProcessInfo& p = c.process(c.RankIndex(Role::kDecode, d));
    if (!p.report) {
      if (r.error.empty()) r.error = p.name + " sent no report (logs in " + log_dir + ")";
      continue;
    }
    const nlohmann::json& j = *p.report;
    r.bytes += j.value("bytes", uint64_t{0});
    r.verified_pages += j.value("verified_pages", uint64_t{0});
    r.corrupt_pages += j.value("corrupt_pages", uint64_t{0});
    // Every decode rank finishes every request; count them once.
    r.succeeded = d == 0 ? j.value("succeeded", uint64_t{0})
                         : std::min(r.succeeded, j.value("succeeded", uint64_t{0}));
    r.failed = std::max(r.failed, j.value("failed", uint64_t{0}));
    if (first_failure.empty() && j.contains("failures") && j["failures"].is_array() &&
        !j["failures"].empty())
      first_failure = Why(j["failures"][0]);
    r.p50_us = std::max(r.p50_us, j.value("p50_us", 0.0));
    r.p99_us = std::max(r.p99_us, j.value("p99_us", 0.0));
    // The measured window: first measured SendMetadata to last Success.
    r.seconds = std::max(r.seconds, j.value("window_seconds", 0.0));
    if (j.value("warmup_failed", uint64_t{0}) > 0 && r.error.empty())
      r.error = p.name + " failed warm-up requests" +
                Why(j.value("warmup_failure", nlohmann::json())) + " (logs in " + log_dir + ")";
    if (j.value("corrupt_pages", uint64_t{0}) > 0 && r.error.empty())
      r.error = p.name + " saw corrupt pages";
  }
  if (r.seconds <= 0) r.seconds = wall;
  if (r.failed > 0 && r.error.empty())
    r.error = std::to_string(r.failed) + " requests failed" + first_failure + " (logs in " +
              log_dir + ")";
  c.Shutdown(milliseconds(10000));
  return r;
}

// The transport bench's GB/s for writes of `block_size` bytes: its
// "results" entry of that size, verified and without an error (0 when it
// has none).
double GbpsAt(const nlohmann::json& j, size_t block_size) {
  if (!j.is_object() || !j.contains("results") || !j["results"].is_array()) return 0;
  double best = 0;
  for (const auto& e : j["results"]) {
    if (!e.is_object()) continue;
    const auto size = e.find("block_size"), gbps = e.find("gbps"), verified = e.find("verified");
    const auto error = e.find("error");
    if (size == e.end() || !size->is_number_unsigned() || size->get<size_t>() != block_size ||
        gbps == e.end() || !gbps->is_number() || verified == e.end() || *verified != true ||
        (error != e.end() && !error->is_null()))
      continue;
    best = std::max(best, gbps->get<double>());
  }
  return best;
}

// `word` quoted for sh.
std::string ShellQuote(const std::string& word) {
  std::string q = "'";
  for (char c : word) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

// The argv prefix, as sh words, that runs the raw measurement's initiator
// in host 0's network namespace with the hosts' environment, and its
// --target-wrap flag that puts the target on host 1 ("" without hosts).
// The initiator joins only host 0's network (HostNet::NetCommand): from
// inside host 0's PID and mount namespaces it could not start the target
// on host 1. Its bytes take the way prefill's take: host 0's eth0, the
// veth pair, the bridge, host 1's eth0. With `pin`, the initiator runs on
// prefill's CPUs and the target on decode's, as the request sweeps do.
std::string RawHostsPrefix(const HostNet* net, const std::optional<CpuSides>& pin,
                           std::string* target_flag) {
  target_flag->clear();
  std::string initiator_pin, wrap;
  if (pin) {
    for (const std::string& w : PinCommand(pin->first)) initiator_pin += ShellQuote(w) + " ";
    for (const std::string& w : PinCommand(pin->second)) wrap += (wrap.empty() ? "" : " ") + w;
  }
  if (net == nullptr) {
    if (!wrap.empty()) *target_flag = " --target-wrap " + ShellQuote(wrap);
    return initiator_pin;
  }
  // UCX warns on stdout at exit that the hosts' error-handling variables
  // went unused (the initiator restores stdout first): not on the report.
  std::string prefix = "UCX_WARN_UNUSED_ENV_VARS=n ";
  for (const std::string& e : HostNet::Env()) prefix += e + " ";  // NAME=value, no quoting needed
  for (const std::string& w : net->NetCommand(0)) prefix += ShellQuote(w) + " ";
  for (const std::string& w : net->Command(1)) wrap += (wrap.empty() ? "" : " ") + w;
  *target_flag = " --target-wrap " + ShellQuote(wrap);
  return prefix + initiator_pin;
}

// Runs `kvbridge bench transport` for the same path as a child process
// (across the hosts with `net`): GB/s of 1 MiB writes in `round->raw` and,
// with `piece` (0: not measured), of `piece`-byte writes in
// `round->raw_piece`, one after the other in the same processes (1 MiB
// first: the bench stops at a size that fails, and the piece figure must
// not cost the reference).
void RawTransport(const RequestsFlags& f, const HostNet* net, size_t piece, Round* round,
                  std::string* error) {
  constexpr size_t kMiB = size_t{1} << 20;
  std::string path = f.path == "tcp" ? "tcp" : "shm";
  const std::string binary = ResolvedBinary(f.binary);
  std::string target_flag;
  const std::string prefix = RawHostsPrefix(net, f.pin, &target_flag);
  std::string cmd = prefix + ShellQuote(binary) + " bench transport --paths " + path +
                    " --block-sizes 1M" + (piece > 0 ? "," + std::to_string(piece) : "") +
                    " --bytes " + ShellQuote(f.raw_bytes) + " --region-size " +
                    ShellQuote(f.raw_region) + target_flag + " --json";
  char dir_template[] = "/tmp/kvbridge-bench-raw-XXXXXX";
  const std::string log = mkdtemp(dir_template) ? std::string(dir_template) + "/transport.log" : "";
  cmd += log.empty() ? " 2>/dev/null" : " 2>" + ShellQuote(log);
  FILE* p = popen(cmd.c_str(), "r");
  if (p == nullptr) {
    *error = "cannot run: " + cmd;
    return;
  }
  std::string out;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), p)) > 0) out.append(buf, n);
  int rc = pclose(p);
  auto j = nlohmann::json::parse(out, nullptr, false);
  // A size that failed gives no figure; the others still count.
  if (!j.is_discarded()) {
    round->raw = GbpsAt(j, kMiB);
    if (piece > 0) round->raw_piece = GbpsAt(j, piece);
  }
  if (rc != 0 || j.is_discarded()) {
    *error = "bench transport failed (status " + std::to_string(rc) + "; its log: " + log +
             (j.is_discarded() ? "; stdout is not one JSON object: " + out.substr(0, 300) : "") +
             ")";
    return;
  }
  if (!log.empty()) {  // kept only when it explains a failure
    unlink(log.c_str());
    rmdir(dir_template);
  }
}

// p50 of copying one page of every layer (`pieces` pieces of `piece` bytes,
// each at its own buffer like the K and V buffers of each layer) with
// memcpy on this thread, from pages in the cache (prefill just wrote them)
// into pages that are not (a page the decode allocator handed out): the
// part of a 1-page request's latency that is the memory system's, whatever
// carries the bytes.
Percentiles OnePageMemcpyUs(size_t pieces, size_t piece) {
  if (pieces == 0 || piece == 0) return {};
  constexpr int kIterations = 200;
  const size_t slots = std::max<size_t>(kIterations, (512ull << 20) / (pieces * piece));
  std::vector<char> src(pieces * piece, 1);
  std::vector<char> dst(pieces * slots * piece, 0);  // touched: no page faults timed
  std::vector<double> us;
  for (int i = 0; i < kIterations; ++i) {
    const size_t slot = static_cast<size_t>(i) * 7 % slots;
    const auto t0 = std::chrono::steady_clock::now();
    for (size_t k = 0; k < pieces; ++k)
      std::memcpy(dst.data() + (k * slots + slot) * piece, src.data() + k * piece, piece);
    us.push_back(
        std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(us.begin(), us.end());
  return {us[us.size() / 2], us[us.size() * 99 / 100]};
}

// One layer of tp rank `rank` of `tp` of this model, as the workers lay it
// out (engine/plan.h); buffer addresses and lengths are placeholders.
internal::RankLayout OneLayer(const RequestsFlags& f, int tp, int rank) {
  internal::RankLayout l;
  l.page_size = f.page_size;
  l.dtype = "bfloat16";
  l.tp_size = tp;
  l.tp_rank = rank;
  l.total_kv_heads = f.heads;
  l.kv_heads = internal::HeadsOfRank(f.heads, tp, rank).count;
  l.end_layer = 1;
  const uint64_t item = static_cast<uint64_t>(f.page_size) * l.kv_heads * f.head_dim * 2;
  l.kv.assign(2, internal::BufferSpan{4096, item, item});
  return l;
}

// The copies the engine plans into decode rank 0: the size of one
// contiguous run (a whole page of the rank's heads when both sides hold the
// same heads, otherwise one token's head slice: 256 B per head of the
// default model), and memcpy of `bytes` in those runs at their offsets
// (PlannedMemcpyGbps). {0, 0} when it cannot plan.
struct PlannedRuns {
  size_t run_bytes = 0;
  double memcpy_gbps = 0;
};
PlannedRuns MeasurePlannedRuns(const RequestsFlags& f, size_t bytes, bool measure) {
  auto flows = internal::ComputeFlows(f.prefill_tp, f.decode_tp, f.heads, /*is_mla=*/false);
  if (!flows.ok()) return {};
  const std::vector<internal::HeadSlice> in = internal::FlowsToDecode(*flows, 0);
  if (in.empty()) return {};
  const internal::RankLayout p = OneLayer(f, f.prefill_tp, in.front().prefill_rank);
  const internal::RankLayout d = OneLayer(f, f.decode_tp, 0);
  const int32_t page = 0;
  auto runs = internal::PlanKvPages(p, d, in.front(), {&page, 1}, {&page, 1});
  if (!runs.ok() || runs->empty()) return {};
  PlannedRuns r;
  r.run_bytes = runs->front().length;
  if (measure) r.memcpy_gbps = PlannedMemcpyGbps(p, d, in.front(), bytes);
  return r;
}

// The lower median of the rounds' raw figures `field` (0 when none was
// measured).
double MedianRaw(const std::vector<Round>& rounds, double Round::*field) {
  std::vector<double> raws;
  for (const Round& r : rounds)
    if (r.*field > 0) raws.push_back(r.*field);
  if (raws.empty()) return 0;
  std::sort(raws.begin(), raws.end());
  return raws[(raws.size() - 1) / 2];
}

// The sweep the report stands on: a failed one if any failed (its error is
// the report's), else the round whose GB/s is the lower median.
SweepResult MedianSweep(const std::vector<Round>& rounds) {
  std::vector<const SweepResult*> sweeps;
  for (const Round& r : rounds) {
    if (!r.big.error.empty()) return r.big;
    sweeps.push_back(&r.big);
  }
  std::sort(sweeps.begin(), sweeps.end(),
            [](const SweepResult* a, const SweepResult* b) { return a->gbps() < b->gbps(); });
  return *sweeps[(sweeps.size() - 1) / 2];
}

// Where the two sides ran, for the report.
std::string PinText(const RequestsFlags& f) {
  if (!f.pin) return "processes left to the scheduler (not pinned)";
  return "prefill's workers and the raw initiator on CPUs " + f.pin->first +
         ", decode's workers and the raw target on CPUs " + f.pin->second;
}

Figures Measure(const RequestsFlags& f, const HostNet* net) {
  FILE* note = f.json ? stderr : stdout;
  const std::string where = WhereRan(f, net);
  std::fprintf(note,
               "[bench] requests over %s (%s): prefill tp%d -> decode tp%d, %d layers x %d kv "
               "heads x %d x 2 B, page %d; pattern checked in 1 page of %d; each sweep starts with "
               "unmeasured warm-up requests that use every pool page once; the bandwidth sweep's "
               "workers poll every %d us; %s\n",
               f.path.c_str(), where.c_str(), f.prefill_tp, f.decode_tp, f.layers, f.heads,
               f.head_dim, f.page_size, f.check_stride, BandwidthStepUs(f), PinText(f).c_str());
  std::fflush(note);
  std::string raw_error;
  // Single-thread memcpy of a request's bytes in the pieces it moves in (one
  // page of one layer on one decode rank), before and after the sweep.
  const size_t big_piece = static_cast<size_t>(f.page_size) * f.head_dim * 2 *
                           std::max(1, f.heads / std::max(f.decode_tp, 1));
  const size_t big_bytes = std::min<size_t>(
      size_t{1} << 30, static_cast<size_t>((f.big_tokens + f.page_size - 1) / f.page_size) *
                           big_piece * 2 * f.layers);
  const double memcpy_before = ScatteredMemcpyGbps(big_piece, big_bytes);
  // The raw transport also writes pieces of the requests' size when the
  // engine writes whole pages (the same heads on both sides) of 4 KiB to
  // under 1 MiB (smaller ones would take millions of writes per round).
  PlannedRuns planned = MeasurePlannedRuns(f, big_bytes, /*measure=*/false);
  const size_t raw_piece_bytes = planned.run_bytes == big_piece && big_piece >= (size_t{4} << 10) &&
                                         big_piece < (size_t{1} << 20)
                                     ? big_piece
                                     : 0;
  std::vector<Round> rounds;
  for (int i = 0; i < f.rounds; ++i) {
    Round r;
    if (!f.no_raw) RawTransport(f, net, raw_piece_bytes, &r, &raw_error);
    r.big = RunSweep(f, net, std::to_string(f.big_tokens) + "-token", f.big_tokens, f.big_requests,
                     f.big_concurrency);
    if (f.rounds > 1)
      std::fprintf(
          note, "[bench] round %d of %d: raw %.2f GB/s%s, %s requests %.2f GB/s%s%s\n", i + 1,
          f.rounds, r.raw,
          raw_piece_bytes == 0
              ? ""
              : fmt::format(" ({}-byte writes {:.2f})", raw_piece_bytes, r.raw_piece).c_str(),
          r.big.name.c_str(), r.big.gbps(),
          r.big.error.empty() ? "" : ", error: ", r.big.error.c_str());
    rounds.push_back(std::move(r));
  }
  const double raw = MedianRaw(rounds, &Round::raw);
  SweepResult big = MedianSweep(rounds);
  const double memcpy_after = ScatteredMemcpyGbps(big_piece, big_bytes);
  const double memcpy_gbps = (memcpy_before + memcpy_after) / 2;
  const double memcpy_ratio = memcpy_gbps > 0 ? big.gbps() / memcpy_gbps : 0;
  // Measured only when the runs are not the pages the reference above copied.
  const bool own_runs = planned.run_bytes != 0 && planned.run_bytes != big_piece;
  if (own_runs) planned = MeasurePlannedRuns(f, big_bytes, /*measure=*/true);
  const size_t run_bytes = planned.run_bytes;
  const double memcpy_runs_gbps = own_runs ? planned.memcpy_gbps : memcpy_gbps;
  SweepResult small = RunSweep(f, net, "1-page", f.page_size, f.small_requests, 1);

  const double ratio = raw > 0 ? big.gbps() / raw : 0;
  const bool bw_met = raw > 0 && ratio >= 0.8;
  const bool lat_met = small.error.empty() && small.p50_us > 0 && small.p50_us <= 100;
  const bool ok = big.error.empty() && small.error.empty();
  // What one page of every layer weighs, and how long copying it alone
  // takes at the raw rate: the part of the 1-page latency no protocol can
  // remove (2 MiB for the default model: ~200 us at 10 GB/s).
  const double page_bytes = small.succeeded > 0 ? double(small.bytes) / small.succeeded : 0;
  const double floor_us = raw > 0 ? page_bytes / (raw * 1e9) * 1e6 : 0;
  const size_t pieces = 2 * static_cast<size_t>(f.layers);
  const Percentiles one_page_memcpy =
      page_bytes > 0 ? OnePageMemcpyUs(pieces, static_cast<size_t>(page_bytes) / pieces)
                     : Percentiles{};
  const double memcpy_us = one_page_memcpy.p50;
  const double added_p50 = memcpy_us > 0 ? small.p50_us - memcpy_us : 0;
  // Against the floor (memcpy's p50): the reference's own p99 is the box's
  // preemption noise, not a cost every request pays.
  const double added_p99 = memcpy_us > 0 ? small.p99_us - memcpy_us : 0;
  Figures m;
  m.where = where;
  m.rounds = std::move(rounds);
  m.raw = raw;
  m.raw_piece = MedianRaw(m.rounds, &Round::raw_piece);
  m.raw_piece_bytes = raw_piece_bytes;
  m.raw_error = raw_error;
  m.big_piece = big_piece;
  m.memcpy_before = memcpy_before;
  m.memcpy_after = memcpy_after;
  m.memcpy_gbps = memcpy_gbps;
  m.memcpy_ratio = memcpy_ratio;
  m.run_bytes = run_bytes;
  m.memcpy_runs_gbps = memcpy_runs_gbps;
  m.memcpy_runs_ratio = memcpy_runs_gbps > 0 ? big.gbps() / memcpy_runs_gbps : 0;
  m.ratio = ratio;
  m.bw_met = bw_met;
  m.lat_met = lat_met;
  m.ok = ok;
  m.page_bytes = page_bytes;
  m.floor_us = floor_us;
  m.pieces = pieces;
  m.one_page_memcpy = one_page_memcpy;
  m.memcpy_us = memcpy_us;
  m.added_p50 = added_p50;
  m.added_p99 = added_p99;
  m.big = std::move(big);
  m.small = std::move(small);
  return m;
}

int RunOn(const RequestsFlags& f, const HostNet* net) {
  const Figures m = Measure(f, net);
  if (f.json) {
    PrintJson(f, m);
  } else {
    PrintText(f, m);
  }
  return m.ok ? 0 : 1;
}

// --hosts: checks it can work, makes the hosts, runs on them.
int RunBenchRequests(RequestsFlags f) {
  if (!f.no_pin) f.pin = SplitCpus(AllowedCpus());
  if (f.hosts == 0) return RunOn(f, nullptr);
  if (f.path != "tcp") {
    std::cerr << "kvbridge bench requests: --hosts needs --path tcp: shared memory cannot cross "
                 "hosts (each host has its own /dev/shm)\n";
    return 2;
  }
  if (std::string why = HostNet::Unsupported(); !why.empty()) {
    std::cerr << "kvbridge bench requests: --hosts: hosts in network namespaces need root and "
                 "iproute2: "
              << why << "\n";
    return 2;
  }
  auto net = HostNet::Create(f.hosts);
  if (!net.ok()) {
    std::cerr << "kvbridge bench requests: --hosts: " << net.status().ToString() << "\n";
    return 2;
  }
  return RunOn(f, net->get());  // the clusters are gone before the hosts
}

}  // namespace

void AddBenchRequestsCommand(CLI::App& bench, std::function<int()>& run) {
  auto f = std::make_shared<RequestsFlags>();
  CLI::App* cmd = bench.add_subcommand(
      "requests",
      "Requests end to end between prefill and decode worker processes (on this host, or on two "
      "hosts in network namespaces): GB/s and "
      "latency of 4096-token and 1-page requests, beside the raw transport limit");
  cmd->add_option("--path", f->path, "shm (same-host shared memory) or tcp (UCX over TCP)")
      ->check(CLI::IsMember({"shm", "tcp"}))
      ->capture_default_str();
  cmd->add_option("--hosts", f->hosts,
                  "2: prefill on one host, decode on another, hosts in network namespaces over "
                  "veth (root; --path tcp); the raw reference crosses the same hosts")
      ->check([](const std::string& v) {
        return v == "2" ? std::string()
                        : std::string("only --hosts 2 (prefill on host 0, decode on host 1)");
      });
  cmd->add_option("--prefill-tp", f->prefill_tp)->check(CLI::Range(1, 16))->capture_default_str();
  cmd->add_option("--decode-tp", f->decode_tp)->check(CLI::Range(1, 16))->capture_default_str();
  cmd->add_option("--layers", f->layers)->check(CLI::Range(1, 1024))->capture_default_str();
  cmd->add_option("--heads", f->heads, "KV heads of the model")
      ->check(CLI::Range(1, 1024))
      ->capture_default_str();
  cmd->add_option("--head-dim", f->head_dim)->check(CLI::Range(1, 65536))->capture_default_str();
  cmd->add_option("--page-size", f->page_size, "Tokens per page (and per 1-page request)")
      ->check(CLI::Range(1, 65536))
      ->capture_default_str();
  cmd->add_option("--tokens", f->big_tokens, "Tokens per request of the bandwidth sweep")
      ->check(CLI::Range(1, 1 << 20))
      ->capture_default_str();
  cmd->add_option("--requests", f->big_requests, "Requests of the bandwidth sweep")
      ->check(CLI::Range(1, 1000000))
      ->capture_default_str();
  cmd->add_option("--concurrency", f->big_concurrency, "Requests in flight (bandwidth sweep)")
      ->check(CLI::Range(1, 1024))
      ->capture_default_str();
  cmd->add_option("--small-requests", f->small_requests, "Requests of the 1-page sweep")
      ->check(CLI::Range(1, 1000000))
      ->capture_default_str();
  cmd->add_option("--step-us", f->big_step_us,
                  "Workers' scheduler step (sleep between polls) in the bandwidth sweep (with "
                  "--concurrency 1 it is a latency sweep: --latency-step-us)")
      ->check(CLI::Range(0, 100000))
      ->capture_default_str();
  cmd->add_option("--latency-step-us", f->small_step_us,
                  "Workers' scheduler step (sleep between polls) in sweeps with one request in "
                  "flight; 0 = poll without sleeping")
      ->check(CLI::Range(0, 100000))
      ->capture_default_str();
  cmd->add_option("--raw-bytes", f->raw_bytes, "Bytes the raw transport measurement writes")
      ->capture_default_str();
  cmd->add_option("--raw-region", f->raw_region, "Region size of the raw transport measurement")
      ->capture_default_str();
  cmd->add_flag("--no-raw", f->no_raw, "Skip the raw transport measurement");
  cmd->add_option("--rounds", f->rounds,
                  "Rounds of (raw transport, bandwidth sweep), each in fresh processes, one "
                  "after the other; the report gives each round and takes the medians (this "
                  "machine's TCP figures vary from one process pair to the next)")
      ->check(CLI::Range(1, 9))
      ->capture_default_str();
  cmd->add_flag("--no-pin", f->no_pin,
                "Leave every process to the scheduler; by default prefill's workers and the raw "
                "initiator run on one half of this process's CPUs and decode's workers and the "
                "raw target on the other, as on two machines (two busy threads the scheduler "
                "puts on one CPU halve both figures at random)");
  cmd->add_flag("--check-outside-window", f->check_outside_window,
                "Bandwidth sweep: prefill fills every measured request's pattern before the first "
                "one and decode checks every page after the last, outside the measured window "
                "(on a 2-core box the fill and check otherwise take the copy's cores); the pools "
                "then hold every measured request at once");
  cmd->add_option("--check-stride", f->check_stride,
                  "Workers fill and check the pattern in 1 page of N (every page still moves); "
                  "1 = every byte, as the tests and the demo do")
      ->check(CLI::Range(1, 1 << 20))
      ->capture_default_str();
  cmd->add_option("--timeout", f->timeout_s, "Give up on a sweep after this many seconds")
      ->check(CLI::Range(5, 86400))
      ->capture_default_str();
  cmd->add_flag("--json", f->json, "Print one JSON object on stdout");
  cmd->add_option("--binary", f->binary, "kvbridge executable for the workers")->group("");
  cmd->callback([f, &run] { run = [f] { return RunBenchRequests(*f); }; });
}

}  // namespace kvbridge::tools

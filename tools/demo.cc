#include "tools/demo.h"

#include <signal.h>
#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <iostream>
#include <memory>
#include <string>

#include "connector/sglang_standin.h"
#include "control/json_fields.h"
#include "kvbridge/bootstrap.h"
#include "tools/cluster.h"
#include "tools/demo_hosts.h"
#include "tools/demo_rejoin.h"
#include "tools/demo_summary.h"
#include "tools/etcd_cluster.h"
#include "tools/hosts.h"
#include "tools/memcpy_reference.h"

namespace kvbridge::tools {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

// Wall-clock µs since the epoch (the clock of failure records).
int64_t WallMicros() {
  return std::chrono::duration_cast<std::chrono::microseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// kvbridge's bootstrap server, or with `sglang` a stand-in for sglang's own
// (internal::SglangStandinServer: no liveness, no failure records), so that
// the process tests run the ranks against what sglang deployments have.
int RunBootstrap(const std::string& host, bool sglang) {
  BootstrapServerOptions o;
  o.host = host;
  o.port = 0;
  std::unique_ptr<BootstrapServer> kvbridge;
  std::unique_ptr<internal::SglangStandinServer> standin;
  Status started;
  if (sglang) {
    auto s = internal::SglangStandinServer::Start(host);
    started = s.status();
    if (s.ok()) standin = std::move(*s);
  } else {
    auto s = BootstrapServer::Start(o);
    started = s.status();
    if (s.ok()) kvbridge = std::move(*s);
  }
  if (!started.ok()) {
    std::cout << "ERROR " << internal::DumpJson(nlohmann::json{{"error", started.ToString()}})
              << std::endl;
    return 3;
  }
  const int port = standin ? standin->port() : kvbridge->port();
  std::cout << "READY "
            << nlohmann::json{{"role", "bootstrap"},
                              {"pid", getpid()},
                              {"port", port},
                              {"address", host + ":" + std::to_string(port)}}
                   .dump()
            << std::endl;
  std::string line;
  while (std::getline(std::cin, line) && line != "quit") {
  }
  if (kvbridge) kvbridge->Stop();
  return 0;
}

// Progress shown while the run goes: a bar on a terminal, a plain line every
// two seconds otherwise.
class ProgressView {
 public:
  ProgressView(FILE* out, bool enabled) : out_(out), enabled_(enabled), tty_(isatty(fileno(out))) {}
  void Update(int64_t done, int64_t total, uint64_t bytes, double seconds, bool force = false) {
    if (!enabled_) return;
    auto now = Clock::now();
    if (!force && now - last_ < (tty_ ? milliseconds(100) : milliseconds(2000))) return;
    last_ = now;
    double gbps = seconds > 0 ? bytes / seconds / 1e9 : 0;
    if (tty_) {
      int width = 30;
      int fill = total > 0 ? static_cast<int>(width * std::min<int64_t>(done, total) / total) : 0;
      std::string bar(fill, '#');
      bar += std::string(width - fill, '.');
      std::fprintf(out_, "\r\033[K[%s] %lld/%lld requests  %.2f GB  %.2f GB/s  %.1f s", bar.c_str(),
                   static_cast<long long>(done), static_cast<long long>(total), bytes / 1e9, gbps,
                   seconds);
      drawn_ = true;
    } else {
      std::fprintf(out_, "progress: %lld/%lld requests, %.2f GB, %.2f GB/s, %.1f s\n",
                   static_cast<long long>(done), static_cast<long long>(total), bytes / 1e9, gbps,
                   seconds);
    }
    std::fflush(out_);
  }
  void Note(const std::string& text) {
    if (!enabled_) return;
    if (drawn_) std::fputs("\r\033[K", out_);
    std::fprintf(out_, "%s\n", text.c_str());
    drawn_ = false;
    std::fflush(out_);
  }
  void Finish() {
    if (drawn_) std::fputs("\n", out_);
    drawn_ = false;
  }

 private:
  FILE* out_;
  bool enabled_;
  bool tty_;
  bool drawn_ = false;
  Clock::time_point last_{};
};

std::vector<std::string> WorkerArgs(const DemoFlags& f) {
  std::vector<std::string> a = {"--requests",
                                std::to_string(f.requests),
                                "--concurrency",
                                std::to_string(f.concurrency),
                                "--seed",
                                std::to_string(f.seed),
                                "--min-tokens",
                                std::to_string(f.min_tokens),
                                "--max-tokens",
                                std::to_string(f.max_tokens),
                                "--chunk-tokens",
                                std::to_string(f.chunk_tokens),
                                "--layers",
                                std::to_string(f.layers),
                                "--heads",
                                std::to_string(f.heads),
                                "--head-dim",
                                std::to_string(f.head_dim),
                                "--page-size",
                                std::to_string(f.page_size),
                                "--pool-pages",
                                std::to_string(f.pool_pages),
                                "--progress-ms",
                                "100",
                                "--deadline-s",
                                std::to_string(std::max(5, f.timeout_s - 15)),
                                "--waiting-timeout-ms",
                                std::to_string(f.phase_timeout_ms),
                                "--bootstrap-timeout-ms",
                                std::to_string(f.phase_timeout_ms),
                                "--heartbeat-ms",
                                std::to_string(f.heartbeat_ms),
                                "--heartbeat-misses",
                                std::to_string(f.heartbeat_misses > 0 ? f.heartbeat_misses
                                               : f.hosts > 0          ? 10
                                                                      : 5)};
  if (f.mla) a.push_back("--mla");
  if (!f.ucx_only) a.push_back("--shm");
  if (f.ucx_only) a.push_back("--ucx-only");
  if (!f.ucx_tls.empty()) a.insert(a.end(), {"--ucx-tls", f.ucx_tls});
  a.insert(a.end(), f.worker_args.begin(), f.worker_args.end());
  return a;
}

// The rank a fault hits: the last rank of the instance (never prefill tp0,
// so that the embedded-bootstrap case stays a prefill fault only).
int VictimIndex(const Cluster& c, const std::string& kind) {
  if (kind == "kill-bootstrap") return c.bootstrap_index();
  if (kind == "kill-decode" || kind == "partition-decode")
    return c.RankIndex(Role::kDecode, c.decode_tp() - 1);
  return c.RankIndex(Role::kPrefill, c.prefill_tp() - 1);
}

int RunDemo(const DemoFlags& flags) {
  DemoFlags f = flags;
  FaultSpec fault;
  std::string error;
  if (!ParseFaultSpec(f.fault, &fault, &error)) {
    std::cerr << "kvbridge demo: --fault: " << error << "\n";
    return 2;
  }
  if (fault.kind == "oom" && fault.after_requests < 0) {
    if (fault.after_ms >= 0) {
      std::cerr << "kvbridge demo: --fault oom takes a request count (oom@N), not a time\n";
      return 2;
    }
  }
  if (!fault.kind.empty() && fault.after_requests < 0 && fault.after_ms < 0)
    fault.after_requests = std::max(1, f.requests / 4);
  if (IsNetworkFault(fault.kind) && f.hosts == 0) {
    std::cerr << "kvbridge demo: --fault " << fault.kind << " needs --hosts N\n";
    return 2;
  }
  if (f.mla && !f.head_dim_set) f.head_dim = 576;
  if (f.pool_pages <= 0)
    f.pool_pages = f.concurrency * ((f.max_tokens + f.page_size - 1) / f.page_size + 1) + 64;

  char dir_template[] = "/tmp/kvbridge-demo-XXXXXX";
  std::string log_dir = f.log_dir;
  if (log_dir.empty()) {
    if (mkdtemp(dir_template) == nullptr) {
      std::perror("kvbridge demo: mkdtemp");
      return 1;
    }
    log_dir = dir_template;
  }
  FILE* view_out = f.json ? stderr : stdout;
  ProgressView view(view_out, !f.json || isatty(fileno(stderr)));

  std::string registry = f.registry;
  if (fault.kind == "kill-etcd-leader" && registry != "etcd") {
    std::cerr << "kvbridge demo: --fault kill-etcd-leader needs --registry etcd (the demo's own "
                 "3-member etcd)\n";
    return 2;
  }
  if (!registry.empty() && registry != "etcd" && !registry.starts_with("etcd://")) {
    std::cerr << "kvbridge demo: --registry must be etcd or etcd://HOST:PORT[,...][/NAMESPACE]\n";
    return 2;
  }

  ClusterOptions co;
  co.binary = f.binary;
  co.prefill_tp = f.prefill_tp;
  co.decode_tp = f.decode_tp;
  co.bootstrap = BootstrapMode::kStandalone;
  co.worker_args = WorkerArgs(f);
  co.log_dir = log_dir;
  if (getenv("KVBRIDGE_LOG_LEVEL") == nullptr) co.env.push_back("KVBRIDGE_LOG_LEVEL=info");
  const int fault_victim_rank = fault.kind == "kill-decode" || fault.kind == "partition-decode"
                                    ? f.prefill_tp + f.decode_tp - 1
                                    : f.prefill_tp - 1;
  if (fault.kind == "oom") {
    co.rank_args.resize(f.prefill_tp + f.decode_tp);
    co.rank_args[fault_victim_rank] = {"--fatal-after", std::to_string(fault.after_requests)};
  }
  DemoHosts hosts;  // outlives the cluster and etcd (declared first)
  if (f.hosts > 0) {
    auto made = PlaceOnHosts(f, fault.kind, fault_victim_rank, log_dir, co);
    if (!made.ok()) {
      std::cerr << "kvbridge demo: --hosts: " << made.status().ToString() << "\n";
      return 2;
    }
    hosts = std::move(made).value();
  }
  // --registry etcd: an etcd of our own (3 members when one is to be
  // killed; with --hosts, member i on host i); etcd://...: the given one.
  std::unique_ptr<EtcdCluster> etcd;
  if (registry == "etcd") {
    EtcdClusterOptions eo;
    eo.members = fault.kind == "kill-etcd-leader" ? 3 : 1;
    eo.log_dir = log_dir;
    if (hosts.net) {
      eo.net = hosts.net.get();
      for (int i = 0; i < eo.members; ++i) eo.member_hosts.push_back(i % f.hosts);
    }
    auto e = EtcdCluster::Start(eo);
    if (!e.ok()) {
      std::cerr << "kvbridge demo: starting etcd: " << e.status().ToString() << "\n";
      return 1;
    }
    etcd = std::move(e).value();
    registry = etcd->Url("demo");
    view.Note("etcd: " + std::to_string(eo.members) + " member(s) at " + etcd->Endpoints());
  }
  if (!registry.empty()) {
    co.bootstrap = BootstrapMode::kEmbedded;  // none is started: the ranks use etcd
    co.worker_args.insert(co.worker_args.end(), {"--registry", registry});
  }
  view.Note(DescribeLayout(f, log_dir));
  // The reference: memcpy of pieces the size of one page of one layer on
  // one rank, before and after the run (the figure sits between them).
  const size_t piece = static_cast<size_t>(f.page_size) * f.head_dim * 2 *
                       (f.mla ? 1 : std::max(1, f.heads / std::max(f.prefill_tp, 1)));
  constexpr size_t kReferenceBytes = size_t{256} << 20;
  const double memcpy_before = ScatteredMemcpyGbps(piece, kReferenceBytes);
  const auto start_t0 = Clock::now();
  auto started = Cluster::Start(co);
  if (!started.ok()) {
    std::cerr << "kvbridge demo: " << started.status().ToString() << " (logs in " << log_dir
              << ")\n";
    return 1;
  }
  Cluster& c = **started;
  const auto t0 = Clock::now();
  const double start_seconds = std::chrono::duration<double>(t0 - start_t0).count();
  const auto deadline = t0 + std::chrono::seconds(f.timeout_s);
  auto seconds = [&] { return std::chrono::duration<double>(Clock::now() - t0).count(); };

  int victim = -1;
  std::string etcd_victim;
  int etcd_victim_pid = -1;
  bool fault_fired = false;
  bool resumed = false;      // stop-prefill: SIGCONT sent
  double fault_seconds = 0;  // when the fault fired
  int64_t fault_at_us = 0;
  int64_t total = f.requests;
  bool paused = false;
  auto decode_progress = [&](int64_t* done, uint64_t* bytes) {
    *done = -1;
    *bytes = 0;
    for (int d = 0; d < c.decode_tp(); ++d) {
      const ProcessInfo& p = c.process(c.RankIndex(Role::kDecode, d));
      if (p.stdout_closed && !p.report) continue;  // gone
      const nlohmann::json* j = p.report ? &*p.report : p.progress ? &*p.progress : nullptr;
      int64_t finished = j ? j->value("finished", int64_t{0}) : 0;
      *done = *done < 0 ? finished : std::min(*done, finished);
      *bytes += j ? j->value("bytes", uint64_t{0}) : 0;
    }
    if (*done < 0) *done = 0;
  };
  std::vector<int> skip;
  auto all_reported = [&] {
    for (int i = 0; i < c.num_ranks(); ++i) {
      if (std::find(skip.begin(), skip.end(), i) != skip.end()) continue;
      if (!c.process(i).report && !c.process(i).stdout_closed) return false;
    }
    return true;
  };
  std::vector<std::string> problems;
  if (fault.kind == "lossy-link") {  // on from the start (PlaceOnHosts)
    fault_fired = true;
    fault_at_us = WallMicros();
    view.Note("fault: lossy-link: " + hosts.net->hostname(hosts.fault_host) + "'s link drops " +
              std::to_string(kLossyLinkPercent) + "% of packets both ways and holds each " +
              std::to_string(kLossyLinkDelayMs) + " ms each way");
  }
  std::vector<int> paused_replies;
  RejoinStep rejoin;  // stop-prefill, partition-*: the victim back in the stream
  c.on_line = [&](int i, const std::string& line) {
    rejoin.OnLine(i, line);
    if (line.starts_with("PAUSED ")) {
      auto j = nlohmann::json::parse(line.substr(7), nullptr, false);
      if (!j.is_discarded()) paused_replies[i] = j.value("admitted", 0);
    }
  };
  paused_replies.assign(c.processes().size(), -1);

  while (!all_reported() && Clock::now() < deadline) {
    c.Pump(milliseconds(100));
    int64_t done;
    uint64_t bytes;
    decode_progress(&done, &bytes);
    view.Update(done, total, bytes, seconds());
    // Fault trigger.
    if (!fault.kind.empty() && !fault_fired) {
      bool due = fault.after_requests >= 0 ? done >= fault.after_requests
                                           : seconds() * 1000 >= fault.after_ms;
      if (fault.kind == "oom") {
        // The victim reports by itself (--fatal-after); note when it did.
        victim = fault_victim_rank;
        const ProcessInfo& p = c.process(victim);
        const nlohmann::json* j = p.report ? &*p.report : p.progress ? &*p.progress : nullptr;
        due = j != nullptr && j->value("finished", int64_t{0}) >= fault.after_requests;
      }
      if (due) {
        victim = VictimIndex(c, fault.kind);
        fault_fired = true;
        if (fault.kind == "kill-etcd-leader") {
          victim = -1;
          Result<int> leader = etcd->Leader(milliseconds(5000));
          if (leader.ok()) {
            etcd_victim = "etcd member " + std::to_string(*leader);
            etcd_victim_pid = etcd->pid(*leader);
            etcd->Kill(*leader).IgnoreError();
          } else {
            etcd_victim = "no etcd leader: " + leader.status().message();
          }
          fault_at_us = std::chrono::duration_cast<std::chrono::microseconds>(
                            std::chrono::system_clock::now().time_since_epoch())
                            .count();
          view.Note("fault: kill-etcd-leader on " + etcd_victim + " (pid " +
                    std::to_string(etcd_victim_pid) + ") at " + std::to_string(done) +
                    " finished requests, " + std::to_string(seconds()).substr(0, 4) + " s");
          continue;
        }
        const ProcessInfo& v = c.process(victim);
        if (fault.kind.starts_with("partition-")) {
          // The victim's host is cut off both ways; every process lives on.
          Status cut = hosts.net->Partition(hosts.fault_host, Direction::kBoth);
          if (!cut.ok()) problems.push_back("partition: " + cut.ToString());
          fault_at_us = WallMicros();
          fault_seconds = seconds();
          view.Note("fault: " + fault.kind + ": " + hosts.net->hostname(hosts.fault_host) + " (" +
                    v.name + ", pid " + std::to_string(v.pid) + ") cut off at " +
                    std::to_string(done) + " finished requests, " +
                    std::to_string(seconds()).substr(0, 4) + " s");
          continue;
        }
        if (fault.kind == "oom") {
          fault_at_us = 0;  // taken from the victim's own records afterwards
        } else {
          int sig = fault.kind == "stop-prefill" ? SIGSTOP : SIGKILL;
          c.Signal(victim, sig).IgnoreError();
          fault_at_us = c.process(victim).signalled_at_us;
          fault_seconds = seconds();
          if (fault.kind != "kill-bootstrap") skip.push_back(victim);
        }
        view.Note("fault: " + fault.kind + " on " + v.name + " (pid " + std::to_string(v.pid) +
                  ") at " + std::to_string(done) + " finished requests, " +
                  std::to_string(seconds()).substr(0, 4) + " s");
      }
    }
    // stop-prefill: resume the stopped rank once survivors had time to
    // detect it; it then learns it was declared failed, fails what it held,
    // answers the quiescence its peers wait for and rejoins the stream under
    // a new incarnation (docs/protocol.md).
    if (fault.kind == "stop-prefill" && fault_fired && !resumed &&
        seconds() - fault_seconds >= 2.0) {
      resumed = true;
      rejoin.Begin(c, victim);
      std::erase(skip, victim);  // it runs the rest of the stream again
      c.Signal(victim, SIGCONT).IgnoreError();
      view.Note("resumed " + c.process(victim).name + " with SIGCONT");
    }
    // partition-*: heal (PartitionHealDue), then the victim learns it was
    // failed, fails what it held and rejoins the stream.
    if (fault.kind.starts_with("partition-") && fault_fired && !resumed) {
      const double since = seconds() - fault_seconds;
      if (PartitionHealDue(c, victim, since)) {
        resumed = true;
        rejoin.Begin(c, victim);
        Status healed = hosts.net->Heal(hosts.fault_host);
        if (!healed.ok()) problems.push_back("heal: " + healed.ToString());
        view.Note("healed the partition of " + hosts.net->hostname(hosts.fault_host) + " after " +
                  std::to_string(since).substr(0, 4) + " s");
      }
    }
    if (std::string note = rejoin.Poll(c, total, milliseconds(10000)); !note.empty())
      view.Note(note);
    // --duration: stop admitting on every rank at the same room count.
    if (f.duration_s > 0 && !paused && seconds() >= f.duration_s) {
      paused = true;
      for (int i = 0; i < c.num_ranks(); ++i) c.WriteLine(i, "pause").IgnoreError();
      auto answered = [&] {
        for (int i = 0; i < c.num_ranks(); ++i) {
          const ProcessInfo& p = c.process(i);
          if (paused_replies[i] < 0 && !p.report && !p.stdout_closed &&
              std::find(skip.begin(), skip.end(), i) == skip.end())
            return false;
        }
        return true;
      };
      c.PumpUntil(answered, milliseconds(10000)).IgnoreError();
      int64_t limit = 0;
      for (int i = 0; i < c.num_ranks(); ++i) {
        limit = std::max<int64_t>(limit, paused_replies[i]);
        if (c.process(i).report)
          limit = std::max(limit, c.process(i).report->value("requests", limit));
      }
      for (int i = 0; i < c.num_ranks(); ++i)
        c.WriteLine(i, "limit " + std::to_string(limit)).IgnoreError();
      total = std::min<int64_t>(total, limit);
      view.Note("duration reached: finishing the " + std::to_string(limit) +
                " requests already admitted");
    }
  }
  const double traffic_s = seconds();
  if (!all_reported()) {
    for (int i = 0; i < c.num_ranks(); ++i) {
      if (std::find(skip.begin(), skip.end(), i) != skip.end()) continue;
      if (!c.process(i).report)
        problems.push_back(c.process(i).name + " sent no report within " +
                           std::to_string(f.timeout_s) + " s (hang?)");
    }
  }
  if (fault.kind == "stop-prefill" && fault_fired) {
    // Resume the stopped rank and hear what it has to say.
    c.Signal(victim, SIGCONT).IgnoreError();
    c.PumpUntil([&] { return c.process(victim).report || c.process(victim).stdout_closed; },
                milliseconds(30000))
        .IgnoreError();
  }
  int64_t done;
  uint64_t bytes;
  decode_progress(&done, &bytes);
  view.Update(done, total, bytes, traffic_s, /*force=*/true);
  view.Finish();
  c.Shutdown(milliseconds(15000));
  const double memcpy_after = ScatteredMemcpyGbps(piece, kReferenceBytes);

  DemoRun run;
  run.flags = f;
  run.fault = fault;
  run.fault_fired = fault_fired;
  run.victim = victim;
  run.fault_at_us = fault_at_us;
  run.seconds = traffic_s;
  run.start_seconds = start_seconds;
  run.memcpy_gbps_before = memcpy_before;
  run.memcpy_gbps_after = memcpy_after;
  run.log_dir = log_dir;
  run.problems = problems;
  run.registry = registry;
  run.etcd_victim = etcd_victim;
  run.etcd_victim_pid = etcd_victim_pid;
  if (hosts.fault_host >= 0) run.fault_host = hosts.net->hostname(hosts.fault_host);
  nlohmann::json summary = Summarize(c, run);
  if (f.json) {
    std::cout << internal::DumpJson(summary) << std::endl;
  } else {
    PrintSummary(std::cout, summary);
  }
  return summary.value("ok", false) ? 0 : 1;
}

}  // namespace

bool ParseFaultSpec(const std::string& text, FaultSpec* spec, std::string* error) {
  *spec = FaultSpec();
  if (text.empty()) return true;
  std::string kind = text, when;
  if (size_t at = text.find('@'); at != std::string::npos) {
    kind = text.substr(0, at);
    when = text.substr(at + 1);
  }
  static const char* kKinds[] = {"kill-prefill",      "kill-decode",      "stop-prefill",
                                 "kill-bootstrap",    "kill-etcd-leader", "oom",
                                 "partition-prefill", "partition-decode", "lossy-link"};
  if (std::find(std::begin(kKinds), std::end(kKinds), kind) == std::end(kKinds)) {
    *error = "unknown kind '" + kind +
             "' (kill-prefill, kill-decode, stop-prefill, kill-bootstrap, kill-etcd-leader, oom, "
             "partition-prefill, partition-decode, lossy-link)";
    return false;
  }
  spec->kind = kind;
  if (when.empty()) return true;
  size_t used = 0;
  double value = 0;
  try {
    value = std::stod(when, &used);
  } catch (...) {
    used = 0;
  }
  std::string unit = when.substr(used);
  if (used == 0 || value < 0 || (unit != "" && unit != "s" && unit != "ms")) {
    *error = "bad WHEN '" + when + "' (a request count like 20, or a time like 2s or 500ms)";
    return false;
  }
  if (unit.empty()) {
    spec->after_requests = static_cast<int64_t>(value);
  } else {
    spec->after_ms = static_cast<int64_t>(unit == "s" ? value * 1000 : value);
  }
  return true;
}

void AddDemoCommands(CLI::App& app, std::function<int()>& run) {
  auto f = std::make_shared<DemoFlags>();
  CLI::App* cmd = app.add_subcommand(
      "demo", "Run prefill and decode instances as processes on this host and move verified KV");
  cmd->add_option("--requests", f->requests, "Requests to push through")
      ->check(CLI::Range(1, 1000000));
  cmd->add_option("--duration", f->duration_s,
                  "Stop admitting requests after this many seconds (0 = run all)")
      ->check(CLI::Range(0.0, 3600.0));
  cmd->add_option("--prefill-tp", f->prefill_tp)->check(CLI::Range(1, 16));
  cmd->add_option("--decode-tp", f->decode_tp)->check(CLI::Range(1, 16));
  cmd->add_flag("--mla", f->mla, "MLA layout: one buffer per layer, one prefill rank sends");
  cmd->add_option("--layers", f->layers)->check(CLI::Range(1, 1024));
  cmd->add_option("--heads", f->heads, "KV heads of the model")->check(CLI::Range(1, 1024));
  cmd->add_option("--head-dim", f->head_dim)
      ->check(CLI::Range(1, 65536))
      ->each([f](const std::string&) { f->head_dim_set = true; });
  cmd->add_option("--page-size", f->page_size, "Tokens per page")->check(CLI::Range(1, 65536));
  cmd->add_option("--min-tokens", f->min_tokens)->check(CLI::Range(1, 1 << 24));
  cmd->add_option("--max-tokens", f->max_tokens)->check(CLI::Range(1, 1 << 24));
  cmd->add_option("--chunk-tokens", f->chunk_tokens, "Chunked prefill: tokens per chunk")
      ->check(CLI::Range(1, 1 << 24));
  cmd->add_option("--concurrency", f->concurrency, "Requests in flight per rank")
      ->check(CLI::Range(1, 100000));
  cmd->add_option("--pool-pages", f->pool_pages, "Page slots per rank (0 = sized to fit)")
      ->check(CLI::Range(0, 1 << 24));
  cmd->add_option("--seed", f->seed);
  cmd->add_option("--fault", f->fault,
                  "KIND[@WHEN]: kill-prefill, kill-decode, stop-prefill, kill-bootstrap, "
                  "kill-etcd-leader, oom; with --hosts: partition-prefill, partition-decode "
                  "(the victim's host cut off, healed after detection), lossy-link (5% loss, "
                  "20 ms delay each way on a decode host's link); "
                  "WHEN = finished requests (20) or time (2s, 500ms)");
  cmd->add_option("--hosts", f->hosts,
                  "Run the ranks on N hosts in network namespaces (root): prefill on the "
                  "first half, decode on the rest, the bootstrap server on host 0 (a "
                  "partition's victim on the last host alone)")
      ->check(CLI::Range(2, 32));
  cmd->add_flag("--json", f->json, "Print the summary as one JSON object");
  cmd->add_option("--registry", f->registry,
                  "etcd (start a local etcd) or etcd://HOST:PORT[,HOST:PORT...][/NAMESPACE]; "
                  "default: a bootstrap server process");
  cmd->add_flag("--ucx-only", f->ucx_only, "Same-host paths off: every byte over UCX");
  cmd->add_option("--ucx-tls", f->ucx_tls, "UCX_TLS for the workers, e.g. tcp");
  cmd->add_option("--heartbeat-ms", f->heartbeat_ms)->check(CLI::Range(1, 60000));
  cmd->add_option("--heartbeat-misses", f->heartbeat_misses,
                  "Silent heartbeats before a peer is failed (default 5, 10 with --hosts)")
      ->check(CLI::Range(1, 1000));
  cmd->add_option("--phase-timeout-ms", f->phase_timeout_ms,
                  "Deadline of the bootstrapping and waiting phases of a request")
      ->check(CLI::Range(100, 3600000));
  cmd->add_option("--timeout", f->timeout_s, "Give up after this many seconds")
      ->check(CLI::Range(1, 86400));
  cmd->add_option("--log-dir", f->log_dir,
                  "Where the processes' logs go (default: a new /tmp dir)");
  cmd->add_option("--binary", f->binary, "kvbridge executable for the workers")->group("");
  cmd->add_option("--worker-arg", f->worker_args, "Extra flag for every worker")->group("");
  cmd->callback([f, &run] {
    if (f->min_tokens > f->max_tokens)
      throw CLI::ValidationError("--min-tokens", "larger than --max-tokens");
    run = [f] { return RunDemo(*f); };
  });

  CLI::App* boot = app.add_subcommand("demo-bootstrap", "Bootstrap server for the demo");
  boot->group("");  // internal: started by the demo's launcher
  auto boot_host = std::make_shared<std::string>("127.0.0.1");
  boot->add_option("--host", *boot_host, "Address to listen on (an IPv4 address of this host)");
  auto sglang = std::make_shared<bool>(false);
  boot->add_flag("--sglang-standin", *sglang,
                 "Serve as sglang's own bootstrap server does (no liveness, no records)");
  boot->callback([&run, boot_host, sglang] {
    run = [boot_host, sglang] { return RunBootstrap(*boot_host, *sglang); };
  });
}

}  // namespace kvbridge::tools

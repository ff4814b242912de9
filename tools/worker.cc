#include "tools/worker.h"

#include <fmt/format.h>
#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <deque>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "common/host_identity.h"
#include "connector/api_internal.h"
#include "connector/kv_pool.h"
#include "connector/manager_impl.h"
#include "control/json_fields.h"
#include "kvbridge/manager.h"
#include "kvbridge/receiver.h"
#include "kvbridge/sender.h"
#include "tools/cpu_sides.h"
#include "tools/report_json.h"
#include "transport/fault/fault_transport.h"
#include "transport/ucx/ucx_transport.h"

namespace kvbridge::tools {
namespace {

// Wall-clock microseconds since the epoch, comparable across processes (the
// launcher relates PROGRESS and REPORT lines to when it injected a fault).
int64_t WallMicros() {
  return std::chrono::duration_cast<std::chrono::microseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

using Clock = std::chrono::steady_clock;

struct WorkerFlags {
  std::string role = "prefill";
  int tp_size = 1, tp_rank = 0;
  // Pipeline stage: the pool holds only this stage's layers.
  int pp_size = 1, pp_rank = 0;
  std::string bootstrap = "127.0.0.1:8998";
  std::string advertise_host = "127.0.0.1";
  bool embedded_bootstrap = false;
  std::string registry;  // ManagerOptions::registry
  int requests = 50, concurrency = 8;
  uint32_t seed = 1;
  int min_tokens = 128, max_tokens = 2048, chunk_tokens = 1024;
  internal::ModelShape shape;
  int pool_pages = 4096;
  bool shm = false;
  std::string ucx_tls;
  bool ucx_only = false;
  int heartbeat_ms = 100, heartbeat_misses = 5;
  int bootstrap_timeout_ms = 30000, waiting_timeout_ms = 30000, transfer_timeout_ms = 10000;
  int fatal_after = -1;
  int stall_after = -1;
  double rate = 0;  // > 0: admit at most this many requests per second  // hold every write after
                    // this many rooms finished
  std::string fatal_reason = "CUDA out of memory: tried to allocate 2.00 GiB";
  int deadline_s = 120;
  int quiesce_timeout_ms = 10000;
  int progress_ms = 0;  // > 0: a PROGRESS line on stdout this often
  int room_mod = 0;     // > 0: room ids wrap to 1..room_mod (reuse)
  int abort_every = 0;  // decode, > 0: abort every Nth room after SendMetadata
  // The measured rooms' pattern is filled before the first admission
  // (prefill) and checked after the last room finished (decode), every page
  // still: fill and check take no core inside the measured window.
  bool check_outside_window = false;
  // Start at this request of the plan (a restarted rank rejoins there).
  int first_request = 0;
  // Scheduler step pacing; 0 = yield the CPU only.
  int step_us = 200;
  // Each step polls only the rooms KVManager::TakeChangedRooms lists (and
  // those with chunks left to send), not every room in flight.
  bool poll_changed = false;
  // The first N rooms are not in the figures (bytes, latency).
  int warmup = 0;
  // Fill and check the pattern in 1 page of this many.
  int check_stride = 1;
};

// This process's resident anonymous memory (RssAnon: heap, stacks; not the
// shared-memory pools), kB; 0 when /proc cannot say.
uint64_t RssAnonKb() {
  FILE* f = std::fopen("/proc/self/status", "r");
  if (f == nullptr) return 0;
  char line[256];
  uint64_t kb = 0;
  while (std::fgets(line, sizeof(line), f) != nullptr)
    if (std::sscanf(line, "RssAnon: %lu kB", &kb) == 1) break;
  std::fclose(f);
  return kb;
}

struct RoomPlan {
  uint64_t room;
  int pages;
};

std::vector<RoomPlan> Plan(const WorkerFlags& f) {
  std::mt19937 rng(f.seed);
  std::uniform_int_distribution<int> tokens(f.min_tokens, f.max_tokens);
  std::vector<RoomPlan> plan;
  for (int i = 0; i < f.requests; ++i) {
    int t = tokens(rng);
    uint64_t room = static_cast<uint64_t>(f.room_mod > 0 ? i % f.room_mod + 1 : i + 1);
    plan.push_back({room, (t + f.shape.page_size - 1) / f.shape.page_size});
  }
  return plan;
}

// Hands out scattered pages, as a paged allocator does after hours of use.
class PageAllocator {
 public:
  PageAllocator(int pages, uint32_t seed) {
    for (int i = 0; i < pages; ++i) free_.push_back(i);
    std::mt19937 rng(seed);
    std::shuffle(free_.begin(), free_.end(), rng);
  }
  bool Take(int n, std::vector<int32_t>* out) {
    if (static_cast<int>(free_.size()) < n) return false;
    out->assign(free_.begin(), free_.begin() + n);
    free_.erase(free_.begin(), free_.begin() + n);
    std::sort(out->begin(), out->begin() + n / 2);  // keep some runs contiguous
    return true;
  }
  void Give(const std::vector<int32_t>& pages) {
    free_.insert(free_.end(), pages.begin(), pages.end());
  }

 private:
  std::deque<int32_t> free_;
};

struct Live {
  RoomPlan plan;
  std::vector<int32_t> pages;
  int64_t aux = 0;
  std::vector<int32_t> state;
  std::unique_ptr<KVSender> sender;
  std::unique_ptr<KVReceiver> receiver;
  bool started = false;  // prefill: Init done
  int pages_sent = 0;
  Clock::time_point t0;
  bool failed = false;
  bool warmup = false;     // not in the figures
  bool prefilled = false;  // --check-outside-window: pages taken and filled already
  Clock::time_point failed_at;
  uint64_t visited_step = 0;  // --poll-changed: visited once per step
};

int RunWorker(const WorkerFlags& f) {
  const bool prefill = f.role == "prefill";
  // Decode: aux and state come from prefill's last stage, to decode's last
  // stage (every rank when decode pp is 1); other stages only get pages.
  const bool checks_aux = f.pp_rank == f.pp_size - 1;
  internal::PoolOptions po;
  po.shape = f.shape;
  po.tp_size = f.tp_size;
  po.tp_rank = f.tp_rank;
  // This stage's layers, split the way TestCluster and sglang split them.
  const internal::LayerRange layers = internal::LayersOfStage(f.shape.layers, f.pp_size, f.pp_rank);
  po.first_layer = layers.first;
  po.num_layers = layers.count;
  po.num_pages = f.pool_pages;
  // --check-outside-window holds a row for every measured room to the end.
  po.aux_rows = std::max(64, f.concurrency * 2 + (f.check_outside_window ? f.requests : 0));
  po.state_slots = po.aux_rows;
  po.shared_memory = f.shm;
  auto pool = internal::KvPool::Create(po);
  if (!pool.ok()) {
    std::cerr << "worker: " << pool.status().ToString() << "\n";
    return 2;
  }
  ManagerOptions mo;
  mo.role = prefill ? Role::kPrefill : Role::kDecode;
  mo.args = (*pool)->Args();
  mo.parallel.tp_size = f.tp_size;
  mo.parallel.tp_rank = f.tp_rank;
  mo.parallel.pp_size = f.pp_size;
  mo.parallel.pp_rank = f.pp_rank;
  mo.is_mla = f.shape.mla;
  mo.bootstrap_addr = f.bootstrap;
  mo.advertise_host = f.advertise_host;
  mo.start_bootstrap_server = f.embedded_bootstrap;
  mo.registry = f.registry;
  mo.ucx_tls = f.ucx_tls;
  mo.same_host_path = f.ucx_only ? SameHostPath::kUcx : SameHostPath::kAuto;
  mo.heartbeat_interval = std::chrono::milliseconds(f.heartbeat_ms);
  mo.heartbeat_misses = f.heartbeat_misses;
  mo.bootstrap_timeout = std::chrono::milliseconds(f.bootstrap_timeout_ms);
  mo.waiting_timeout = std::chrono::milliseconds(f.waiting_timeout_ms);
  mo.transfer_timeout = std::chrono::milliseconds(f.transfer_timeout_ms);
  mo.list_room_changes = f.poll_changed;
  // --stall-after: the transport is wrapped so writes can be held (a stalled
  // transfer, for the fault tests and the demo).
  internal::FaultTransport* fault = nullptr;
  std::unique_ptr<internal::Transport> transport;
  if (f.stall_after >= 0) {
    internal::UcxTransportOptions to;
    to.tls = f.ucx_tls;
    to.same_host_paths = !f.ucx_only;
    RankId self;
    self.role = mo.role;
    self.tp = f.tp_rank;
    self.pp = f.pp_rank;
    to.name = self.ShortName();
    auto ucx = internal::CreateUcxTransport(to);
    if (!ucx.ok()) {
      std::cerr << "worker: " << ucx.status().ToString() << "\n";
      return 3;
    }
    auto wrapped = std::make_unique<internal::FaultTransport>(std::move(ucx).value());
    fault = wrapped.get();
    transport = std::move(wrapped);
  }
  auto mgr = internal::CreateManager(mo, std::move(transport));
  if (!mgr.ok()) {
    std::cout << "ERROR " << internal::DumpJson(nlohmann::json{{"error", mgr.status().ToString()}})
              << std::endl;
    return 3;
  }
  KVManager& m = **mgr;
  nlohmann::json ready = RankToJson(m.self());
  ready["incarnation"] = m.self().incarnation;
  std::cout << "READY " << internal::DumpJson(ready) << std::endl;

  const std::vector<RoomPlan> plan = Plan(f);
  PageAllocator alloc(f.pool_pages, f.seed * 7919 + (prefill ? 1 : 2));
  std::deque<int64_t> aux_free;
  for (int i = 0; i < po.aux_rows; ++i) aux_free.push_back(i);
  const int chunk_pages = std::max(1, f.chunk_tokens / f.shape.page_size);
  std::vector<std::unique_ptr<Live>> live, draining;
  WorkerReport report;
  report.requests = f.requests;
  const size_t first = std::min<size_t>(f.first_request, plan.size());
  size_t next = first;
  const auto deadline = Clock::now() + std::chrono::seconds(f.deadline_s);
  int finished = 0;
  bool fatal_pending = f.fatal_after >= 0;
  bool stall_pending = fault != nullptr;
  auto release = [&](Live& l) {
    alloc.Give(l.pages);
    aux_free.push_back(l.aux);
  };
  // Where this rank's thread spends the run: filling (prefill's forward
  // pass) and verifying (decode), for the demo's account of its time.
  double fill_s = 0, verify_s = 0;
  auto seconds_since = [](Clock::time_point t) {
    return std::chrono::duration<double>(Clock::now() - t).count();
  };
  // A room's pages, aux row and state slot (false when the pool is short).
  auto take = [&](Live& l) {
    if (!alloc.Take(l.plan.pages, &l.pages) || aux_free.empty()) return false;
    l.aux = aux_free.front();
    aux_free.pop_front();
    if (f.shape.state_item_len > 0) l.state = {static_cast<int32_t>(l.aux)};
    return true;
  };
  // --check-outside-window, prefill: the measured rooms, filled up front.
  std::vector<std::unique_ptr<Live>> prepared(f.check_outside_window && prefill ? plan.size() : 0);
  for (size_t i = std::max<size_t>(first, f.warmup); i < prepared.size(); ++i) {
    auto l = std::make_unique<Live>();
    l->plan = plan[i];
    if (!take(*l)) {
      std::cerr << "worker: --check-outside-window needs pool pages and rows for every measured "
                   "request at once (--pool-pages)\n";
      return 2;
    }
    const auto fill_t0 = Clock::now();
    (*pool)->Fill(l->plan.room, l->pages, l->aux, l->state, f.check_stride);
    fill_s += seconds_since(fill_t0);
    l->prefilled = true;
    prepared[i] = std::move(l);
  }
  // Decode: a finished room's pages checked, counted in `report`.
  auto check = [&](const Live& l) {
    const auto verify_t0 = Clock::now();
    uint64_t bad = (*pool)->CountCorruptPages(l.plan.room, l.pages, 0, f.check_stride);
    report.corrupt_pages += bad;
    if (bad > 0)
      std::cerr << "worker: room " << l.plan.room << " succeeded with " << bad
                << " corrupt page buffers\n";
    const uint64_t checked = (l.pages.size() + f.check_stride - 1) / f.check_stride;
    report.verified_pages += checked * (*pool)->num_kv_buffers();
    if (checks_aux &&
        (!(*pool)->AuxMatches(l.plan.room, l.aux) || !(*pool)->StateMatches(l.plan.room, l.state)))
      ++report.corrupt_pages;
    verify_s += seconds_since(verify_t0);
  };
  std::vector<std::unique_ptr<Live>> check_later;  // decode, --check-outside-window
  // Pages scrubbed after a quiesced failure must still hold the filler when
  // handed out again: a byte that landed later is a late write. Per page:
  // the failed room whose scrub it holds, or kNotScrubbed.
  constexpr uint64_t kNotScrubbed = UINT64_MAX;  // never a room id of the plan
  std::vector<uint64_t> scrubbed_by(f.pool_pages, kNotScrubbed);
  auto room_busy = [&](uint64_t room) {
    for (const auto* set : {&live, &draining})
      for (const auto& l : *set)
        if (l->plan.room == room) return true;
    return false;
  };
  // --poll-changed: where each live room is in `live` (by room id: the
  // plan's ids are 1..N; kNotLive when it is not), the rooms to visit in the
  // next step besides the changed ones, and the step count.
  constexpr int32_t kNotLive = -1;
  uint64_t max_room = 0;
  for (const RoomPlan& rp : plan) max_room = std::max(max_room, rp.room);
  std::vector<int32_t> index_of(f.poll_changed ? max_room + 1 : 0, kNotLive);
  std::vector<uint64_t> revisit;
  uint64_t step = 0;
  auto last_progress = Clock::now();
  const auto started = Clock::now();
  // The measured window (after --warmup rooms): first admission to last
  // finish; warm-up rooms are counted apart.
  std::optional<Clock::time_point> window_start;
  Clock::time_point window_end{};
  uint64_t warmup_ok = 0, warmup_failed = 0;
  std::shared_ptr<const FailureRecord> first_warmup_failure;  // why the first one failed
  // Memory per room in flight (bench scale): RssAnon before the first
  // admission and at the most rooms live, sampled when a new most is reached
  // (at most every 10 ms).
  const uint64_t rss_base_kb = RssAnonKb();
  uint64_t rss_peak_kb = rss_base_kb;
  size_t peak_live = 0;
  auto last_rss = Clock::now() - std::chrono::seconds(1);
  // Stdin commands while running, read only with --progress-ms (the demo's
  // --duration): "pause" stops admitting and answers "PAUSED {admitted}";
  // "limit M" then admits up to M rooms in all, the same M on every rank, so
  // no room is left half-open. "hold K" admits up to K rooms in all (at
  // least what it already admitted), answers "HELD {admitted, finished, ...}"
  // once none is live or draining, and waits there until "limit M" (a fault
  // test restarts a rank at a point every rank agrees on). "skip K" moves on
  // to request K without admitting those before it (a rank that rejoined
  // after a partition takes up the stream where its partner is).
  size_t limit = plan.size();
  bool paused = false;
  std::optional<size_t> hold_at;
  bool held_reported = false;
  std::string stdin_buf;
  auto read_commands = [&] {
    pollfd pfd{STDIN_FILENO, POLLIN, 0};
    if (poll(&pfd, 1, 0) <= 0) return;
    char buf[256];
    ssize_t n = read(STDIN_FILENO, buf, sizeof(buf));
    if (n <= 0) return;
    stdin_buf.append(buf, static_cast<size_t>(n));
    size_t nl;
    while ((nl = stdin_buf.find('\n')) != std::string::npos) {
      std::string cmd = stdin_buf.substr(0, nl);
      stdin_buf.erase(0, nl + 1);
      if (cmd == "pause") {
        paused = true;
        std::cout << "PAUSED " << nlohmann::json{{"admitted", next}}.dump() << std::endl;
      } else if (cmd.starts_with("limit ")) {
        limit = std::min<size_t>(plan.size(), std::max<size_t>(next, std::stoull(cmd.substr(6))));
        paused = false;
        hold_at.reset();
      } else if (cmd.starts_with("skip ")) {
        // Never admits the requests before K (their other half failed
        // already, e.g. while this rank was cut off): both sides of a pair
        // then go on from the same request.
        const size_t k = std::min<size_t>(plan.size(), std::stoull(cmd.substr(5)));
        if (k > next) {
          report.skipped += k - next;
          next = k;
        }
      } else if (cmd.starts_with("hold ")) {
        hold_at = std::min<size_t>(plan.size(), std::max<size_t>(next, std::stoull(cmd.substr(5))));
        held_reported = false;
      }
    }
  };
  // Where the stream stands, for the HELD and PROGRESS lines.
  auto tally = [&] {
    uint64_t ok = 0;
    for (const RoomOutcome& o : report.outcomes) ok += o.success;
    return nlohmann::json{{"admitted", next},
                          {"finished", finished},
                          {"succeeded", ok},
                          {"failed", report.outcomes.size() - ok}};
  };
  // One scheduler step: poll every room, or (--poll-changed) the rooms
  // whose answer changed, those admitted this step and those with chunks
  // left to send. `visit` polls one room and acts on its answer; true when
  // it finished (and left `slot`).
  // Prefill: chunks still to send (a request of no pages sends one, empty).
  auto chunks_left = [](const Live& l) {
    return l.pages_sent < l.plan.pages + (l.plan.pages == 0);
  };
  auto visit = [&](std::unique_ptr<Live>& slot) -> bool {
    Live& l = *slot;
    KVPoll p = prefill ? l.sender->Poll() : l.receiver->Poll();
    if (prefill && p == KVPoll::kWaitingForInput && !l.started) {
      l.started = l.sender->Init(l.plan.pages, l.aux).ok();
    }
    if (prefill && l.started && chunks_left(l) &&
        (p == KVPoll::kWaitingForInput || p == KVPoll::kTransferring)) {
      int n = std::min(chunk_pages, l.plan.pages - l.pages_sent);
      bool last = l.pages_sent + n == l.plan.pages;
      std::span<const int32_t> chunk(l.pages.data() + l.pages_sent, n);
      l.sender->Send(chunk, last ? std::span<const int32_t>(l.state) : std::span<const int32_t>())
          .IgnoreError();
      l.pages_sent += std::max(n, 1);
      p = l.sender->Poll();
    }
    if (p != KVPoll::kSuccess && p != KVPoll::kFailed) return false;
    ++finished;
    RoomOutcome o;
    o.room = l.plan.room;
    o.success = p == KVPoll::kSuccess;
    o.latency_us = std::chrono::duration<double, std::micro>(Clock::now() - l.t0).count();
    o.finished_at_us = WallMicros();
    const bool check_later_too = f.check_outside_window && !l.warmup && !prefill && o.success;
    if (o.success && !prefill) {
      if (!check_later_too) check(l);
      if (!l.warmup)
        report.bytes += l.pages.size() * (*pool)->num_kv_buffers() * (*pool)->page_bytes();
    }
    if (auto why = prefill ? l.sender->Failure() : l.receiver->Failure())
      o.failure = std::make_shared<const FailureRecord>(std::move(*why));
    if (l.warmup) {
      ++(o.success ? warmup_ok : warmup_failed);
      if (!first_warmup_failure) first_warmup_failure = o.failure;
    } else {
      report.outcomes.push_back(o);
      window_end = Clock::now();
    }
    if (!prefill && !o.success) {
      l.failed_at = Clock::now();
      draining.push_back(std::move(slot));  // pages go back only once quiesced
    } else if (check_later_too) {
      check_later.push_back(std::move(slot));  // its pages stay as they landed
    } else {
      release(l);
      slot.reset();
    }
    return true;
  };
  while ((next < limit || !live.empty() || !draining.empty()) && Clock::now() < deadline) {
    if (f.progress_ms > 0) read_commands();
    // Admit new rooms.
    const auto since_start = std::chrono::duration<double>(Clock::now() - started).count();
    while (next < limit && !paused && (!hold_at || next < *hold_at) &&
           static_cast<int>(live.size()) < f.concurrency &&
           (f.rate <= 0 || next - first < since_start * f.rate)) {
      std::unique_ptr<Live> l;
      if (next < prepared.size() && prepared[next]) {
        l = std::move(prepared[next]);
      } else {
        l = std::make_unique<Live>();
        l->plan = plan[next];
        if (f.room_mod > 0 && room_busy(l->plan.room)) break;  // wait for the old generation
        if (!take(*l)) break;
      }
      for (int32_t page : l->pages) {
        const uint64_t failed_room = std::exchange(scrubbed_by[page], kNotScrubbed);
        if (failed_room == kNotScrubbed) continue;
        if (!(*pool)->PagesHold(std::span<const int32_t>(&page, 1), 0)) {
          ++report.corrupt_pages;
          std::cerr << "worker: page " << page << " was written after room " << failed_room
                    << " failed and quiesced\n";
        }
      }
      l->t0 = Clock::now();
      l->warmup = static_cast<int>(next) < f.warmup;
      if (!l->warmup && !window_start) window_start = l->t0;
      if (prefill) {
        auto s = KVSender::Create(m, l->plan.room);
        if (!s.ok()) return 4;
        l->sender = std::move(s).value();
        // The forward pass: it runs while decode bootstraps and sends its
        // metadata, as in sglang, so it is not part of the transfer.
        if (!l->prefilled) {
          const auto fill_t0 = Clock::now();
          (*pool)->Fill(l->plan.room, l->pages, l->aux, l->state, f.check_stride);
          fill_s += seconds_since(fill_t0);
        }
      } else {
        auto r = KVReceiver::Create(m, l->plan.room);
        if (!r.ok()) return 4;
        l->receiver = std::move(r).value();
        if (l->receiver->Init(0).ok())
          l->receiver->SendMetadata(l->pages, l->aux, l->state).IgnoreError();
        if (f.abort_every > 0 && (next + 1) % f.abort_every == 0) {
          l->receiver->Abort();
        }
      }
      if (f.poll_changed) {
        index_of[l->plan.room] = static_cast<int32_t>(live.size());
        revisit.push_back(l->plan.room);  // a handle's first answer is not a change
      }
      live.push_back(std::move(l));
      ++next;
    }
    if (live.size() > peak_live && Clock::now() - last_rss >= std::chrono::milliseconds(10)) {
      peak_live = live.size();
      rss_peak_kb = std::max(rss_peak_kb, RssAnonKb());
      last_rss = Clock::now();
    }
    if (stall_pending && finished >= f.stall_after) {
      fault->HoldWrites();
      stall_pending = false;
    }
    if (fatal_pending && finished >= f.fatal_after) {
      m.ReportFatal(f.fatal_reason);
      report.fatal_reported = true;
      fatal_pending = false;
    }
    // One scheduler step (visit, above).
    if (f.poll_changed) {
      auto changed = m.TakeChangedRooms();
      if (!changed.ok()) {
        std::cerr << "worker: " << changed.status().ToString() << "\n";
        return 5;
      }
      ++step;
      std::vector<uint64_t> due = std::exchange(revisit, {});
      due.insert(due.end(), changed->begin(), changed->end());
      for (uint64_t room : due) {
        if (room >= index_of.size() || index_of[room] == kNotLive) continue;
        const size_t i = static_cast<size_t>(index_of[room]);
        if (live[i]->visited_step == step) continue;
        live[i]->visited_step = step;
        if (!visit(live[i])) {
          const Live& l = *live[i];
          if (prefill && l.started && chunks_left(l))
            revisit.push_back(room);  // chunks left: no change may come before they go
          continue;
        }
        index_of[room] = kNotLive;
        if (i + 1 != live.size()) {
          live[i] = std::move(live.back());
          index_of[live[i]->plan.room] = static_cast<int32_t>(i);
        }
        live.pop_back();
      }
    } else {
      // Finished rooms leave `live` in one compaction pass per step (an
      // erase per finished room made a step O(rooms^2) at 10,000 rooms);
      // the rooms ahead are prefetched, since each poll is a chain of cache
      // misses (Live, then its sender or receiver) that the loop would
      // otherwise wait on one room at a time.
      size_t kept = 0;
      for (size_t i = 0; i < live.size(); ++i) {
        if (i + 8 < live.size()) __builtin_prefetch(live[i + 8].get());
        if (i + 4 < live.size()) {
          const Live& ahead = *live[i + 4];
          __builtin_prefetch(prefill ? static_cast<const void*>(ahead.sender.get())
                                     : static_cast<const void*>(ahead.receiver.get()));
        }
        if (visit(live[i])) continue;
        if (kept != i) live[kept] = std::move(live[i]);
        ++kept;
      }
      live.resize(kept);
    }
    for (auto it = draining.begin(); it != draining.end();) {
      Live& l = **it;
      bool timed_out = Clock::now() - l.failed_at > std::chrono::milliseconds(f.quiesce_timeout_ms);
      if (!l.receiver->Quiesced() && !timed_out) {
        ++it;
        continue;
      }
      if (!l.receiver->Quiesced()) ++report.unquiesced;
      (*pool)->Scrub(l.pages, 0);
      if (l.receiver->Quiesced())
        for (int32_t page : l.pages) scrubbed_by[page] = l.plan.room;
      release(l);
      it = draining.erase(it);
    }
    if (hold_at && !held_reported && next == *hold_at && live.empty() && draining.empty()) {
      held_reported = true;
      std::cout << "HELD " << internal::DumpJson(tally()) << std::endl;
    }
    if (f.progress_ms > 0 &&
        Clock::now() - last_progress >= std::chrono::milliseconds(f.progress_ms)) {
      last_progress = Clock::now();
      nlohmann::json progress = tally();
      progress["bytes"] = report.bytes;
      progress["verified_pages"] = report.verified_pages;
      progress["corrupt_pages"] = report.corrupt_pages;
      progress["heartbeat_rounds"] = m.Stats().heartbeat_rounds;
      progress["rejoins"] = m.Stats().rejoins;
      progress["at_us"] = WallMicros();
      std::cout << "PROGRESS " << internal::DumpJson(progress) << std::endl;
    }
    // Scheduler step pacing: a real scheduler polls once per forward step.
    if (f.step_us > 0) {
      std::this_thread::sleep_for(std::chrono::microseconds(f.step_us));
    } else {
      std::this_thread::yield();
    }
  }
  for (const auto& l : check_later) check(*l);  // --check-outside-window: now
  report.nonterminal = live.size() + (limit - next);
  report.requests = static_cast<int>(limit - first);
  report.stats = m.Stats();
  // Destroy rooms before the manager.
  live.clear();
  draining.clear();
  check_later.clear();
  report.stats_after = m.Stats();
  nlohmann::json out = ReportToJson(m.self(), report);
  out["at_us"] = WallMicros();
  out["warmup_succeeded"] = warmup_ok;
  out["warmup_failed"] = warmup_failed;
  if (first_warmup_failure) out["warmup_failure"] = FailureToJson(*first_warmup_failure);
  out["fill_seconds"] = fill_s;
  out["peak_live"] = peak_live;
  out["cpus"] = AllowedCpus();  // where it may run (bench requests pins the sides)
  out["rss_anon_base_kb"] = rss_base_kb;
  out["rss_anon_peak_kb"] = rss_peak_kb;
  out["verify_seconds"] = verify_s;
  out["window_seconds"] =
      window_start ? std::chrono::duration<double>(window_end - *window_start).count() : 0.0;
  // What this rank knows of other ranks' failures (sglang's "exception from
  // another rank"): a sibling whose own rooms succeeded still names the rank.
  if (std::optional<FailureRecord> rf = m.RecentRankFailure())
    out["rank_failure"] = FailureToJson(*rf);
  // The processes this rank talks to now and the endpoint it uses for each
  // (a restarted peer must show its new pid and incarnation).
  out["peers"] = nlohmann::json::array();
  for (const internal::PeerSnapshot& p : internal::ManagerAccess::Of(m).Peers()) {
    nlohmann::json j = RankToJson(p.id);
    j["incarnation"] = p.id.incarnation;
    j["endpoint"] = p.endpoint;
    j["failed"] = p.failed;
    out["peers"].push_back(j);
  }
  std::cout << "REPORT " << internal::DumpJson(out) << std::endl;
  std::string line;
  while (std::getline(std::cin, line) && line != "quit") {
  }
  return report.nonterminal == 0 && report.corrupt_pages == 0 ? 0 : 1;
}

}  // namespace

void AddWorkerCommand(CLI::App& app, std::function<int()>& run) {
  auto f = std::make_shared<WorkerFlags>();
  CLI::App* cmd = app.add_subcommand("worker", "Run one rank with a synthetic request stream");
  cmd->group("");  // internal: used by demo and tests
  cmd->add_option("--role", f->role)->check(CLI::IsMember({"prefill", "decode"}))->required();
  cmd->add_option("--tp-size", f->tp_size)->check(CLI::Range(1, 64));
  cmd->add_option("--tp-rank", f->tp_rank)->check(CLI::Range(0, 63));
  cmd->add_option("--pp-size", f->pp_size, "Pipeline stages of this instance")
      ->check(CLI::Range(1, 64));
  cmd->add_option("--pp-rank", f->pp_rank,
                  "This rank's stage; its pool holds only that stage's layers")
      ->check(CLI::Range(0, 63));
  cmd->add_option("--bootstrap", f->bootstrap);
  cmd->add_option("--advertise-host", f->advertise_host,
                  "This host's address as other hosts reach it (sglang's rank_ip)")
      ->check([](const std::string& v) {
        Status st = internal::CheckHostAddress("--advertise-host", v);
        return st.ok() ? std::string() : st.message();
      });
  cmd->add_flag("--embedded-bootstrap", f->embedded_bootstrap);
  cmd->add_option("--registry", f->registry,
                  "\"\" (the bootstrap server) or etcd://HOST:PORT[,HOST:PORT...][/NAMESPACE]");
  cmd->add_option("--requests", f->requests)->check(CLI::Range(0, 1000000));
  cmd->add_option("--concurrency", f->concurrency)->check(CLI::Range(1, 100000));
  cmd->add_option("--seed", f->seed);
  cmd->add_option("--min-tokens", f->min_tokens)->check(CLI::Range(0, 1 << 24));
  cmd->add_option("--max-tokens", f->max_tokens)->check(CLI::Range(0, 1 << 24));
  cmd->add_option("--chunk-tokens", f->chunk_tokens)->check(CLI::Range(1, 1 << 24));
  cmd->add_option("--layers", f->shape.layers)->check(CLI::Range(1, 1024));
  cmd->add_option("--heads", f->shape.total_kv_heads)->check(CLI::Range(1, 1024));
  cmd->add_option("--head-dim", f->shape.head_dim)->check(CLI::Range(1, 65536));
  cmd->add_option("--page-size", f->shape.page_size)->check(CLI::Range(1, 65536));
  cmd->add_option("--state-bytes", f->shape.state_item_len)->check(CLI::Range(0, 1 << 20));
  cmd->add_flag("--mla", f->shape.mla);
  cmd->add_option("--pool-pages", f->pool_pages)->check(CLI::Range(1, 1 << 24));
  cmd->add_flag("--shm", f->shm);
  cmd->add_option("--ucx-tls", f->ucx_tls);
  cmd->add_flag("--ucx-only", f->ucx_only);
  cmd->add_option("--heartbeat-ms", f->heartbeat_ms)->check(CLI::Range(1, 600000));
  cmd->add_option("--heartbeat-misses", f->heartbeat_misses)->check(CLI::Range(1, 1000));
  cmd->add_option("--bootstrap-timeout-ms", f->bootstrap_timeout_ms);
  cmd->add_option("--waiting-timeout-ms", f->waiting_timeout_ms);
  cmd->add_option("--transfer-timeout-ms", f->transfer_timeout_ms);
  cmd->add_option("--fatal-after", f->fatal_after, "ReportFatal after this many rooms finished");
  cmd->add_option("--rate", f->rate, "Admit at most this many requests per second (0 = no limit)");
  cmd->add_option("--stall-after", f->stall_after,
                  "Hold every write after this many rooms finished");
  cmd->add_option("--fatal-reason", f->fatal_reason);
  cmd->add_option("--quiesce-timeout-ms", f->quiesce_timeout_ms,
                  "Give up waiting for a failed room's pages to quiesce after this long");
  cmd->add_option("--deadline-s", f->deadline_s)->check(CLI::Range(1, 86400));
  cmd->add_option("--progress-ms", f->progress_ms, "Print a PROGRESS line this often (0 = never)")
      ->check(CLI::Range(0, 600000));
  cmd->add_option("--room-mod", f->room_mod, "Room ids wrap to 1..K (0 = never reused)")
      ->check(CLI::Range(0, 1 << 30));
  cmd->add_option("--abort-every", f->abort_every,
                  "Decode: abort every Nth room right after SendMetadata, reuse its pages once "
                  "Quiesced()")
      ->check(CLI::Range(0, 1 << 30));
  cmd->add_flag("--poll-changed", f->poll_changed,
                "Poll only the rooms whose answer changed (KVManager::TakeChangedRooms)");
  cmd->add_option("--step-us", f->step_us,
                  "Scheduler step: sleep this long between polls of every room (0 = only yield)")
      ->check(CLI::Range(0, 1000000));
  cmd->add_option("--warmup", f->warmup,
                  "The first N rooms warm the path up and are left out of bytes, latency and "
                  "window_seconds")
      ->check(CLI::Range(0, 1 << 30));
  cmd->add_option("--first-request", f->first_request,
                  "Start at this request of the plan (a restarted rank rejoining the stream)")
      ->check(CLI::Range(0, 1000000));
  cmd->add_flag("--check-outside-window", f->check_outside_window,
                "Fill the measured rooms' pattern before the first admission (prefill) and check "
                "it once every room finished (decode), every page still: no fill or check inside "
                "the measured window. The pool must hold every measured room at once");
  cmd->add_option("--check-stride", f->check_stride,
                  "Fill and check the pattern in 1 page of N (positions 0, N, 2N...; the others "
                  "still move): a benchmark's sample, so pattern work does not compete with the "
                  "copy")
      ->check(CLI::Range(1, 1 << 20));
  cmd->callback([f, &run] {
    if (f->min_tokens > f->max_tokens)
      throw CLI::ValidationError("--min-tokens", "larger than --max-tokens");
    if (f->pp_rank >= f->pp_size)
      throw CLI::ValidationError(
          "--pp-rank",
          std::to_string(f->pp_rank) + " is not below --pp-size " + std::to_string(f->pp_size));
    if (f->pp_size > f->shape.layers)
      throw CLI::ValidationError("--pp-size", std::to_string(f->pp_size) + " stages for " +
                                                  std::to_string(f->shape.layers) +
                                                  " layers: a stage would hold none");
    run = [f] { return RunWorker(*f); };
  });
}

}  // namespace kvbridge::tools

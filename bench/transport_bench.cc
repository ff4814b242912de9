#include "bench/transport_bench.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <memory>
#include <mutex>
#include <thread>
#include <utility>

#include "bench/bench_util.h"
#include "bench/reference.h"

namespace kvbridge::bench {

using internal::DataPath;
using internal::DataPathName;

Result<PathSpec> LookupPath(const std::string& name) {
  PathSpec p;
  p.name = name;
  if (name == "shm") {
    p.expected = DataPath::kSharedMemory;
    p.shared_buffer = true;
    p.target = 0.9;
    p.target_min_block = 64 << 10;
  } else if (name == "cma") {
    p.expected = DataPath::kCrossMemoryAttach;
    p.target = 0.9;
    p.target_min_block = 64 << 10;
  } else if (name == "tcp" || name == "tcp-granted") {
    p.expected = DataPath::kUcxRendezvous;
    p.same_host = false;
    p.options.tls = "tcp";
    p.options.same_host_paths = false;
    p.granted = name == "tcp-granted";
    if (!p.granted) p.target = 0.8;  // the granted path is a reference for requests
    p.target_min_block = 1 << 20;
  } else if (name == "ucx-shm") {
    // UCX's own shared-memory transports with peer error handling: what a
    // same-host peer would get without kvbridge's same-host paths.
    p.expected = DataPath::kUcxRendezvous;
    p.options.same_host_paths = false;
    p.options.shm_error_handling = true;
  } else {
    return InvalidArgumentError("unknown path '" + name +
                                "' (shm, cma, tcp, tcp-granted, ucx-shm)");
  }
  return p;
}

namespace {

// The target process (this binary, re-executed) and the pipe to it.
class TargetProcess {
 public:
  static Result<TargetProcess> Spawn(const std::string& path, uint64_t region_size,
                                     const std::vector<std::string>& wrap) {
    int to_child[2], from_child[2];
    if (pipe2(to_child, O_CLOEXEC) != 0) return InternalError("pipe2 failed");
    if (pipe2(from_child, O_CLOEXEC) != 0) {
      close(to_child[0]);
      close(to_child[1]);
      return InternalError("pipe2 failed");
    }
    char exe[4096];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
    if (n <= 0) return InternalError("readlink /proc/self/exe failed");
    exe[n] = '\0';
    std::vector<std::string> args = wrap;
    args.insert(args.end(), {exe, "bench", "transport-target", "--path", path, "--region-size",
                             std::to_string(region_size), "--in-fd", std::to_string(to_child[0]),
                             "--out-fd", std::to_string(from_child[1])});
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    pid_t parent = getpid();
    pid_t pid = fork();
    if (pid == 0) {
      // Only async-signal-safe calls until exec. The target dies with us.
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (getppid() != parent) _exit(127);
      // A wrapper (nsenter) forks the target: one group reaches both.
      setpgid(0, 0);
      dup2(STDERR_FILENO, STDOUT_FILENO);  // stdout belongs to the bench's report
      fcntl(to_child[0], F_SETFD, 0);
      fcntl(from_child[1], F_SETFD, 0);
      execv(argv[0], argv.data());
      _exit(127);
    }
    if (pid > 0) setpgid(pid, pid);  // as the child does: no race with a kill
    close(to_child[0]);
    close(from_child[1]);
    if (pid < 0) {
      close(to_child[1]);
      close(from_child[0]);
      return InternalError("fork failed");
    }
    return TargetProcess(pid, Channel(from_child[0], to_child[1]));
  }

  TargetProcess(TargetProcess&& o) noexcept
      : pid_(std::exchange(o.pid_, -1)), channel_(std::move(o.channel_)) {}
  TargetProcess& operator=(TargetProcess&&) = delete;
  ~TargetProcess() {
    if (pid_ > 0) {
      if (kill(-pid_, SIGKILL) != 0) kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
  }

  // Sends a command, returns the reply payload after its 'K'.
  Result<std::string> Call(std::string_view command) {
    KVB_RETURN_IF_ERROR(channel_.Send(command));
    return ReadReply();
  }
  Result<std::string> ReadReply() {
    Result<std::string> frame = channel_.Receive();
    if (!frame.ok()) return frame.status();
    const std::string& reply = frame.value();
    if (reply.empty()) return InternalError("target: empty reply");
    if (reply[0] != 'K') return InternalError("target: " + reply.substr(1));
    return reply.substr(1);
  }
  Result<std::string> ReadFrame() { return channel_.Receive(); }

  // Asks the target to shut down cleanly and reaps it.
  Status Quit() {
    Status s = Call("Q").status();  // answered once its transport is gone
    int wstatus = 0;
    waitpid(std::exchange(pid_, -1), &wstatus, 0);
    if (s.ok() && !(WIFEXITED(wstatus) && WEXITSTATUS(wstatus) == 0)) {
      s = InternalError("target exited with status " + std::to_string(wstatus));
    }
    return s;
  }

 private:
  TargetProcess(pid_t pid, Channel channel) : pid_(pid), channel_(std::move(channel)) {}
  pid_t pid_ = -1;
  Channel channel_;
};

// Completion accounting shared with the transport's callbacks; a shared_ptr
// so a callback that fires after a timed-out round still has its state.
struct Inflight {
  std::mutex mu;
  std::condition_variable cv;
  uint64_t outstanding = 0;
  Status first_error;
};

constexpr auto kStallTimeout = std::chrono::seconds(30);
// No further round of a size starts after this many seconds on it.
constexpr double kRoundBudgetSeconds = 2.0;

// Writes `blocks` blocks following `pattern` in batches, at most `depth`
// batches in flight. Returns the elapsed seconds from first post to last
// completion.
Result<double> WriteBlocks(internal::Transport& t, internal::PeerId peer, internal::RegionId local,
                           internal::RemoteRegionId remote, const BlockPattern& pattern,
                           uint64_t blocks, uint64_t batch, uint64_t depth) {
  // Batches are built before the clock starts: only the transport is timed.
  std::vector<std::vector<internal::WriteOp>> batches;
  batches.reserve((blocks + batch - 1) / batch);
  for (uint64_t i = 0; i < blocks; i += batch) {
    std::vector<internal::WriteOp> ops;
    for (uint64_t b = i; b < std::min(blocks, i + batch); ++b) {
      ops.push_back(
          {local, pattern.src_offset(b), remote, pattern.dst_offset(b), pattern.block_size()});
    }
    batches.push_back(std::move(ops));
  }
  auto state = std::make_shared<Inflight>();
  auto done = [state](const Status& s) {
    std::lock_guard<std::mutex> lock(state->mu);
    --state->outstanding;
    if (!s.ok() && state->first_error.ok()) state->first_error = s;
    state->cv.notify_all();
  };
  auto start = Clock::now();
  std::unique_lock<std::mutex> lock(state->mu);
  for (auto& ops : batches) {
    if (!state->cv.wait_for(lock, kStallTimeout, [&] {
          return state->outstanding < depth || !state->first_error.ok();
        })) {
      return DeadlineExceededError("no write completed for 30 s");
    }
    if (!state->first_error.ok()) break;
    ++state->outstanding;
    lock.unlock();
    Status s = t.PostWrites(peer, std::move(ops), done);
    lock.lock();
    if (!s.ok()) {
      --state->outstanding;
      if (state->first_error.ok()) state->first_error = s.WithContext("PostWrites");
      break;
    }
  }
  if (!state->cv.wait_for(lock, kStallTimeout, [&] { return state->outstanding == 0; })) {
    return DeadlineExceededError("writes did not complete within 30 s");
  }
  double seconds = SecondsSince(start);
  KVB_RETURN_IF_ERROR(state->first_error);
  return seconds;
}

// Block indices to verify: spread over the blocks written in the round (each
// a distinct slot), at most 256 MiB in all.
std::vector<uint64_t> PickSamples(const BlockPattern& pattern, uint64_t blocks) {
  uint64_t distinct = std::min<uint64_t>(blocks, pattern.slots());
  uint64_t n = std::min<uint64_t>({32, distinct, (256ull << 20) / pattern.block_size()});
  n = std::max<uint64_t>(n, 1);
  std::vector<uint64_t> samples;
  for (uint64_t k = 0; k < n; ++k) samples.push_back(k * distinct / n);
  if (samples.back() != distinct - 1) samples.back() = distinct - 1;  // include the last
  return samples;
}

std::string RangeCommand(char op, const BlockPattern& pattern,
                         const std::vector<uint64_t>& samples) {
  std::string cmd(1, op);
  for (uint64_t b : samples) {
    PutU64(cmd, pattern.dst_offset(b));
    PutU64(cmd, pattern.block_size());
  }
  return cmd;
}

// How many sampled blocks at the target differ from their source block;
// `first_bad` (optional) gets the index in the round of the first one.
Result<uint64_t> CountBadSamples(TargetProcess& target, const BlockPattern& pattern,
                                 const std::vector<uint64_t>& samples, const MappedRegion& src,
                                 uint64_t* first_bad = nullptr) {
  KVB_ASSIGN_OR_RETURN(std::string hashes, target.Call(RangeCommand('H', pattern, samples)));
  size_t pos = 0;
  uint64_t got = 0;
  uint64_t bad = 0;
  for (uint64_t b : samples) {
    bool have = GetU64(hashes, &pos, &got);
    if (have && got == HashBytes(src.data() + pattern.src_offset(b), pattern.block_size()))
      continue;
    if (bad++ == 0 && first_bad != nullptr) *first_bad = b;
  }
  return bad;
}

// Checks the sampled blocks of a finished round; "" when all match, else
// the DATA_LOSS (or pipe) error for the result.
std::string VerifyRound(TargetProcess& target, const BlockPattern& pattern,
                        const std::vector<uint64_t>& samples, const MappedRegion& src,
                        uint64_t blocks) {
  uint64_t first_bad = 0;
  Result<uint64_t> bad = CountBadSamples(target, pattern, samples, src, &first_bad);
  if (!bad.ok()) return bad.status().ToString();
  if (*bad == 0) return "";
  // Tell "completed before visible" apart from "wrong bytes".
  std::this_thread::sleep_for(std::chrono::seconds(1));
  Result<uint64_t> later = CountBadSamples(target, pattern, samples, src);
  return "DATA_LOSS: " + std::to_string(*bad) + " of " + std::to_string(samples.size()) +
         " sampled blocks differ at the target when their batch completed (first: block " +
         std::to_string(first_bad) + " of " + std::to_string(blocks) + "); " +
         (later.ok() && *later == 0
              ? "all match 1 s later: completion was reported before the bytes were visible"
              : "still wrong 1 s later: bytes lost or misplaced");
}

uint64_t BlocksFor(const TransportBenchOptions& o, uint64_t bs) {
  return std::max<uint64_t>(1, o.bytes / bs);
}

// One path: spawn the target, connect, measure every block size.
Status RunPath(const PathSpec& spec, const TransportBenchOptions& o, const MappedRegion& src,
               MappedRegion& ref_dst, std::vector<BenchResult>& results) {
  std::fprintf(stderr, "[bench] %s: starting target process\n", spec.name.c_str());
  KVB_ASSIGN_OR_RETURN(TargetProcess target,
                       TargetProcess::Spawn(spec.name, o.region_size, o.target_wrap));
  KVB_RETURN_IF_ERROR(target.ReadReply().status());
  KVB_ASSIGN_OR_RETURN(std::string address, target.ReadFrame());
  KVB_ASSIGN_OR_RETURN(std::string remote_key, target.ReadFrame());

  internal::UcxTransportOptions options = spec.options;
  options.name = "bench initiator " + spec.name;
  KVB_ASSIGN_OR_RETURN(std::unique_ptr<internal::Transport> transport,
                       internal::CreateUcxTransport(options));
  KVB_ASSIGN_OR_RETURN(internal::RegisteredRegion local,
                       transport->RegisterMemory(src.data(), src.size(), MemoryKind::kDram));
  KVB_ASSIGN_OR_RETURN(internal::PeerId peer, transport->Connect(address));
  KVB_ASSIGN_OR_RETURN(internal::RemoteRegionId remote, transport->ImportRegion(peer, remote_key));
  KVB_ASSIGN_OR_RETURN(DataPath chosen, transport->PathTo(peer));
  std::string chosen_name(DataPathName(chosen));
  bool mismatch = chosen != spec.expected;
  if (mismatch) {
    std::fprintf(stderr,
                 "\n!!!!! PATH MISMATCH: requested '%s' (expects %s) but the transport chose "
                 "'%s'. The figures below are for '%s'. !!!!!\n\n",
                 spec.name.c_str(), std::string(DataPathName(spec.expected)).c_str(),
                 chosen_name.c_str(), chosen_name.c_str());
  } else {
    std::fprintf(stderr, "[bench] %s: transport chose path %s\n", spec.name.c_str(),
                 chosen_name.c_str());
  }
  if (o.warmup) {
    // Faults in page tables and mappings on both sides, warms the transport.
    uint64_t bs = std::min<uint64_t>(o.region_size, 16ull << 20);
    BlockPattern pattern(o.region_size, bs, 1);
    KVB_RETURN_IF_ERROR(
        WriteBlocks(*transport, peer, local.id, remote, pattern, pattern.slots(), o.batch, o.depth)
            .status()
            .WithContext("warm-up pass"));
  }

  for (uint64_t bs : o.block_sizes) {
    BenchResult r;
    r.path = spec.name;
    r.chosen_path = chosen_name;
    r.path_mismatch = mismatch;
    r.block_size = bs;
    r.blocks = BlocksFor(o, bs);
    r.bytes = r.blocks * bs;
    r.reference = spec.same_host ? "memcpy" : "tcp-socket";
    if (spec.target && bs >= spec.target_min_block) r.target = spec.target;
    BlockPattern pattern(o.region_size, bs, bs * 7919 + spec.name.size());

    // Each repeat runs the reference just before the transport round, over
    // the same pattern, so both see the same machine load; the best of each
    // is kept (noise on a shared box only ever slows a round down).
    std::vector<uint64_t> samples = PickSamples(pattern, r.blocks);
    bool failed = false;
    auto size_start = Clock::now();
    for (uint64_t rep = 0; rep < o.repeat && r.error.empty(); ++rep) {
      if (rep > 0 && SecondsSince(size_start) > kRoundBudgetSeconds) break;
      ++r.rounds;
      if (spec.same_host) {
        r.reference_gbps = std::max(
            r.reference_gbps, MemcpyReference(src.data(), ref_dst.data(), pattern, r.bytes).gbps());
      } else {
        Result<Throughput> t = SocketReference(src.data(), ref_dst.data(), pattern, r.bytes);
        if (!t.ok()) return t.status().WithContext("loopback socket reference");
        r.reference_gbps = std::max(r.reference_gbps, t->gbps());
      }
      // Zero the sampled blocks so a block that was not written fails.
      Status s = target.Call(RangeCommand('C', pattern, samples)).status();
      Result<double> seconds = s.ok() ? WriteBlocks(*transport, peer, local.id, remote, pattern,
                                                    r.blocks, o.batch, o.depth)
                                      : Result<double>(s);
      if (!seconds.ok()) {
        r.error = seconds.status().ToString();
        failed = true;
        break;
      }
      if (r.seconds == 0 || *seconds < r.seconds) r.seconds = *seconds;
      r.error = VerifyRound(target, pattern, samples, src, r.blocks);
    }
    r.verified = r.error.empty();
    if (r.seconds > 0) {
      r.gbps = r.bytes / r.seconds / 1e9;
      r.msg_rate = r.blocks / r.seconds;
      r.ratio = r.reference_gbps > 0 ? r.gbps / r.reference_gbps : 0;
    }
    std::fprintf(stderr, "[bench] %-8s %-8s %7.2f GB/s %8s blk/s   %s %6.2f GB/s  ratio %.2f  %s\n",
                 spec.name.c_str(), FormatSize(bs).c_str(), r.gbps, FormatRate(r.msg_rate).c_str(),
                 r.reference.c_str(), r.reference_gbps, r.ratio,
                 r.error.empty() ? "verified" : r.error.c_str());
    results.push_back(std::move(r));
    if (failed) return Status::Ok();  // the error is in the result; the target is suspect
  }
  transport->Disconnect(peer);
  transport->DeregisterMemory(local.id).IgnoreError();
  transport.reset();
  return target.Quit();
}

}  // namespace

int RunTransportBench(const TransportBenchOptions& o) {
  signal(SIGPIPE, SIG_IGN);
  std::vector<PathSpec> specs;
  for (const auto& name : o.paths) {
    Result<PathSpec> spec = LookupPath(name);
    if (!spec.ok()) {
      std::fprintf(stderr, "kvbridge bench transport: %s\n", spec.status().ToString().c_str());
      return 2;
    }
    specs.push_back(std::move(*spec));
  }
  for (uint64_t bs : o.block_sizes) {
    if (bs > o.region_size) {
      std::fprintf(stderr, "kvbridge bench transport: block size %s exceeds --region-size %s\n",
                   FormatSize(bs).c_str(), FormatSize(o.region_size).c_str());
      return 2;
    }
  }
  auto start = Clock::now();
  std::fprintf(stderr, "[bench] filling the %s source region\n", FormatSize(o.region_size).c_str());
  Result<MappedRegion> src = MappedRegion::Allocate(o.region_size);
  if (!src.ok()) {
    std::fprintf(stderr, "kvbridge bench transport: %s\n", src.status().ToString().c_str());
    return 1;
  }
  FillPattern(src->data(), src->size(), 42);
  Result<MappedRegion> ref_dst = MappedRegion::Allocate(o.region_size);  // reference target
  if (!ref_dst.ok()) {
    std::fprintf(stderr, "kvbridge bench transport: %s\n", ref_dst.status().ToString().c_str());
    return 1;
  }
  // stdout carries only the report (one JSON object with --json); UCX
  // prints its warnings on stdout, so everything else goes to stderr.
  fflush(stdout);
  int report_fd = fcntl(STDOUT_FILENO, F_DUPFD_CLOEXEC, 0);
  FILE* report = report_fd >= 0 ? fdopen(report_fd, "w") : nullptr;
  if (report == nullptr) {
    std::fprintf(stderr, "kvbridge bench transport: cannot duplicate stdout\n");
    return 1;
  }
  dup2(STDERR_FILENO, STDOUT_FILENO);
  std::vector<BenchResult> results;
  int rc = 0;
  for (const PathSpec& spec : specs) {
    size_t before = results.size();
    Status s = RunPath(spec, o, *src, *ref_dst, results);
    if (!s.ok()) {
      std::fprintf(stderr, "[bench] %s: FAILED: %s\n", spec.name.c_str(), s.ToString().c_str());
      for (uint64_t bs : o.block_sizes) {
        bool have = std::any_of(results.begin() + before, results.end(),
                                [&](const BenchResult& r) { return r.block_size == bs; });
        if (have) continue;
        BenchResult r;
        r.path = spec.name;
        r.block_size = bs;
        r.error = s.ToString();
        results.push_back(std::move(r));
      }
    }
  }
  for (const auto& r : results) {
    if (!r.error.empty() || !r.verified) rc = 1;
  }
  std::fprintf(stderr, "[bench] done in %.1f s\n", SecondsSince(start));
  if (o.json) {
    PrintJson(report, o, results);
  } else {
    PrintTable(report, o, results);
  }
  fflush(report);
  dup2(report_fd, STDOUT_FILENO);
  fclose(report);
  return rc;
}

}  // namespace kvbridge::bench

// Cluster: a prefill instance, a decode instance and (optionally) a
// standalone bootstrap server as real `kvbridge worker` processes on this
// host. Used by `kvbridge demo` and the multi-process tests.
//
// Every child runs in its own process group and dies with the thread that
// started it (PR_SET_PDEATHSIG), so a crashed launcher leaves nothing behind.
// Workers speak the worker protocol on stdout ("READY {json}", optional
// "PROGRESS {json}", "REPORT {json}"); the launcher reads every pipe with
// poll() against a deadline and never sleeps to synchronise.
//
// Indices: prefill ranks first, then decode ranks, each side pp-major
// (stage s, tp rank t at s * tp + t: with pp 1, prefill tp0..tpP-1 then
// decode tp0..tpD-1); the standalone bootstrap server, when there is one,
// comes last (bootstrap_index()). A restarted rank keeps its index; what is
// known of its earlier processes moves to history(index).
//
// Thread safety: none; one thread drives a Cluster. Start it from the thread
// that will outlive the children (PR_SET_PDEATHSIG follows the thread).
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "kvbridge/options.h"
#include "kvbridge/status.h"

namespace kvbridge::tools {

enum class BootstrapMode {
  kEmbedded,    // prefill rank 0 runs it (--embedded-bootstrap on a free port)
  kStandalone,  // a process of its own (killable on its own)
};

struct ClusterOptions {
  // The kvbridge executable (the demo passes /proc/self/exe).
  std::string binary;
  int prefill_tp = 1;
  int decode_tp = 1;
  // Pipeline stages per side: pp x tp ranks, each started with --pp-size and
  // --pp-rank (its pool holds that stage's layers of --layers). Decode pp
  // must be 1 or prefill's (the connector fails every room otherwise).
  int prefill_pp = 1;
  int decode_pp = 1;
  BootstrapMode bootstrap = BootstrapMode::kEmbedded;
  // Standalone only: the server is a stand-in for sglang's own
  // (demo-bootstrap --sglang-standin): ranks get no liveness and no failure
  // records from it.
  bool sglang_server = false;
  // Flags for every worker, then per role, then per rank index (e.g.
  // {"--layers", "2"}). The launcher adds --role, --tp-size, --tp-rank,
  // --pp-size, --pp-rank (pp > 1 only) and --bootstrap itself.
  std::vector<std::string> worker_args;
  std::vector<std::string> prefill_args;
  std::vector<std::string> decode_args;
  std::vector<std::vector<std::string>> rank_args;  // indexed like ranks
  // "NAME=value" entries added to every child's environment.
  std::vector<std::string> env;
  // Where children's stderr goes: empty = inherited; otherwise a directory
  // that receives one log file per process ("prefill-tp0.log", ...).
  std::string log_dir;
  // Hosts (tools/hosts.h): the argv prefix each process is started under,
  // e.g. HostNet::Command(h); ranks indexed like ranks, then the standalone
  // bootstrap server. Empty (or shorter than the ranks) = run directly.
  std::vector<std::vector<std::string>> rank_wrap;
  std::vector<std::string> bootstrap_wrap;
  // The address the bootstrap server listens on and is reached at (the
  // standalone one's host, or prefill tp0's with the embedded one).
  std::string bootstrap_host = "127.0.0.1";
  // How long every process has to print READY.
  std::chrono::milliseconds ready_timeout{60000};
  // Embedded bootstrap only: picks the port prefill tp0 listens on; empty =
  // PickFreePort. Called again when tp0 finds its port taken (see Start).
  std::function<Result<int>()> pick_port;
};

// What happened to a child process once reaped.
struct ExitInfo {
  bool reaped = false;
  bool exited = false;  // normal exit; code holds the status
  int code = 0;
  int signal = 0;                // the terminating signal when !exited
  std::string ToString() const;  // "exit 0", "signal 9 (SIGKILL)", "running"
};

struct ProcessInfo {
  Role role = Role::kPrefill;
  int tp = 0;
  int pp = 0;
  // RankId::ShortName of the rank: "prefill tp0", "decode tp1",
  // "prefill tp1 pp1" (pp shown when non-zero), or "bootstrap".
  std::string name;
  // The launcher's child: the pid Signal() and reaping use. Under a
  // wrapper (rank_wrap) it is the wrapper's, whose process group holds the
  // process.
  pid_t pid = -1;
  // The pid the process reports for itself (READY "pid"; failure records
  // carry it): pid when run directly, its PID-namespace pid under a host.
  pid_t own_pid = -1;
  nlohmann::json ready;                    // the READY object
  std::optional<nlohmann::json> progress;  // the latest PROGRESS object
  std::optional<nlohmann::json> report;    // the REPORT object
  bool stdout_closed = false;
  ExitInfo exit;
  // Wall-clock time of the last SIGKILL/SIGSTOP sent by Signal(), µs since
  // the epoch (the clock of FailureRecord::detected_at); 0 if none.
  int64_t signalled_at_us = 0;
};

class Cluster {
 public:
  // Starts the bootstrap server (standalone mode), then every rank, and
  // waits for each READY line. Errors: InvalidArgument (bad sizes, no
  // binary), Internal (fork/pipe), Unavailable naming the process that
  // exited or printed ERROR before READY, DeadlineExceeded naming the ones
  // still silent after ready_timeout. On error every started child is
  // killed and reaped. With the embedded bootstrap, prefill tp0 is started
  // up to 3 times while it reports its port already in use; the earlier
  // tries are in history(0).
  static Result<std::unique_ptr<Cluster>> Start(const ClusterOptions& options);
  ~Cluster();  // SIGKILLs and reaps every child still running

  Cluster(const Cluster&) = delete;
  Cluster& operator=(const Cluster&) = delete;

  // Number of worker ranks (prefill + decode, every stage).
  int num_ranks() const { return prefill_ranks() + decode_pp_ * decode_tp_; }
  int prefill_ranks() const { return prefill_pp_ * prefill_tp_; }
  int prefill_tp() const { return prefill_tp_; }
  int decode_tp() const { return decode_tp_; }
  int prefill_pp() const { return prefill_pp_; }
  int decode_pp() const { return decode_pp_; }
  // The index of rank (tp, pp) of a side; pp 0 is the only stage with pp 1.
  int RankIndex(Role role, int tp, int pp = 0) const {
    return role == Role::kPrefill ? pp * prefill_tp_ + tp : prefill_ranks() + pp * decode_tp_ + tp;
  }
  // Index of the standalone bootstrap process, -1 when embedded.
  int bootstrap_index() const { return bootstrap_index_; }
  // Every process (ranks then bootstrap).
  const std::vector<ProcessInfo>& processes() const { return procs_; }
  const ProcessInfo& process(int index) const { return procs_.at(index); }
  // "bootstrap_host:port".
  const std::string& bootstrap_addr() const { return bootstrap_addr_; }

  // Sends `sig` to the process group of process `index`; records the time
  // for SIGKILL and SIGSTOP. InvalidArgument for a bad index; OK if it
  // already exited.
  Status Signal(int index, int sig);
  // Writes `line` + "\n" to the stdin of process `index`.
  Status WriteLine(int index, const std::string& line);

  // Reads whatever the children print for up to `timeout` (returns earlier
  // once something was read); updates ready/progress/report and reaps
  // children whose stdout closed. Lines that are not part of the protocol
  // go to `on_line` (index, line) when set.
  void Pump(std::chrono::milliseconds timeout);
  std::function<void(int, const std::string&)> on_line;

  // Pumps until `done()` holds; DeadlineExceeded after `timeout`.
  Status PumpUntil(const std::function<bool()>& done, std::chrono::milliseconds timeout);

  // Waits until every rank not in `skip` and still alive has printed REPORT
  // (a rank whose stdout closed without one counts as finished: see
  // exit). DeadlineExceeded naming the silent ranks after `timeout`.
  Status CollectReports(std::chrono::milliseconds timeout, const std::vector<int>& skip = {});

  // Starts rank `index` again at the same position after its process ended
  // (e.g. Signal(index, SIGKILL)): same role, tp and pp rank, bootstrap address,
  // host and arguments, plus `extra_args`; waits up to `timeout` for the old
  // process to be reaped (it is never killed here) and then for the new
  // READY. The old ProcessInfo is appended to history(index); process(index)
  // is the new one. The transport address is not pinned: it is a UCX worker
  // address (random worker id, the process's pid), new for every process;
  // "the same address" is the same registry position on the same host and
  // bootstrap server. Stderr goes to "<name>.restartN.log" under log_dir.
  // Errors: InvalidArgument (not a rank), FailedPrecondition (the old process
  // still runs at the deadline), Start's errors for the new process (which
  // is then killed and reaped).
  Status Restart(int index, const std::vector<std::string>& extra_args,
                 std::chrono::milliseconds timeout);
  // Earlier processes of `index`, oldest first (empty if never restarted).
  const std::vector<ProcessInfo>& history(int index) const { return history_.at(index); }

  // Resumes stopped children (SIGCONT), closes every stdin and waits up to
  // `timeout` for all children to exit; the ones still running are then
  // SIGKILLed. Afterwards exit holds every child's fate. Idempotent.
  void Shutdown(std::chrono::milliseconds timeout);

 private:
  Cluster() = default;
  Status Spawn(int index, const std::vector<std::string>& args, const ClusterOptions& options);
  // Blocks (poll on a pidfd, pumping stdout) until `index` is reaped or the
  // deadline passes; true once reaped.
  bool WaitExit(int index, std::chrono::steady_clock::time_point deadline);
  Status WaitReady(const std::vector<int>& indices, std::chrono::milliseconds timeout);
  void HandleLine(int index, const std::string& line);
  const std::vector<std::string>& Wrapper(int index) const;
  void TryReap(int index, bool block);
  // Ends the slot's process (waits up to `timeout` for it to exit, then
  // SIGKILLs its group), drains its last output, appends it to history and
  // leaves a fresh ProcessInfo with the same identity in its place.
  void RetireProcess(int index, std::chrono::milliseconds timeout);

  struct Pipes {
    int in = -1;   // child's stdin
    int out = -1;  // child's stdout
    std::string buffer;
    bool stopped = false;
  };
  int prefill_tp_ = 0;
  int decode_tp_ = 0;
  int prefill_pp_ = 1;
  int decode_pp_ = 1;
  int bootstrap_index_ = -1;
  std::string bootstrap_addr_;
  std::vector<ProcessInfo> procs_;
  std::vector<Pipes> pipes_;
  ClusterOptions options_;
  std::vector<std::vector<std::string>> args_;     // what each process was started with
  std::vector<std::vector<ProcessInfo>> history_;  // earlier processes per index
  bool shut_down_ = false;
};

// A free TCP port on 127.0.0.1 (bound and released; a small race remains).
Result<int> PickFreePort();

// `binary` with a /proc/ link (/proc/self/exe) resolved to its target:
// started through a wrapper (nsenter, taskset) or a shell, the link would
// name the wrapper. Unchanged when it is not such a link.
std::string ResolvedBinary(const std::string& binary);

}  // namespace kvbridge::tools

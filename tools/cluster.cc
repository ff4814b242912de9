#include "tools/cluster.h"

#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <string>
#include <string_view>

#include "common/process.h"
#include "control/auth.h"
#include "kvbridge/errors.h"

extern char** environ;

namespace kvbridge::tools {
namespace {

using Clock = std::chrono::steady_clock;
using internal::RemainingMs;

std::string Errno(const char* what) { return std::string(what) + ": " + strerror(errno); }

std::string FileName(const std::string& name, size_t restarts) {
  std::string s = name;
  std::replace(s.begin(), s.end(), ' ', '-');
  return s + (restarts > 0 ? ".restart" + std::to_string(restarts) : "") + ".log";
}

int64_t WallMicros() {
  return std::chrono::duration_cast<std::chrono::microseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// How many ports prefill tp0 is given before Start gives up (see Start).
constexpr int kEmbeddedBootstrapTries = 3;

}  // namespace

std::string ExitInfo::ToString() const {
  if (!reaped) return "running";
  if (exited) return "exit " + std::to_string(code);
  const char* name = sigabbrev_np(signal);
  return "signal " + std::to_string(signal) + (name ? std::string(" (SIG") + name + ")" : "");
}

std::string ResolvedBinary(const std::string& binary) {
  if (!binary.starts_with("/proc/")) return binary;
  char target[4096];
  const ssize_t len = readlink(binary.c_str(), target, sizeof(target) - 1);
  return len > 0 ? std::string(target, static_cast<size_t>(len)) : binary;
}

Result<int> PickFreePort() {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return InternalError(Errno("socket"));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    std::string why = Errno("bind");
    close(fd);
    return InternalError(why);
  }
  close(fd);
  return static_cast<int>(ntohs(addr.sin_port));
}

Result<std::unique_ptr<Cluster>> Cluster::Start(const ClusterOptions& o) {
  if (o.binary.empty()) return InvalidArgumentError("cluster: no kvbridge binary given");
  if (o.prefill_tp < 1 || o.decode_tp < 1 || o.prefill_pp < 1 || o.decode_pp < 1)
    return InvalidArgumentError("cluster: prefill_tp " + std::to_string(o.prefill_tp) +
                                ", decode_tp " + std::to_string(o.decode_tp) + ", prefill_pp " +
                                std::to_string(o.prefill_pp) + " and decode_pp " +
                                std::to_string(o.decode_pp) + " must be >= 1");
  signal(SIGPIPE, SIG_IGN);  // a dead child must not kill the launcher
  // Every process of the cluster inherits one secret.
  internal::EnsureAuthTokenInEnvironment();
  std::unique_ptr<Cluster> c(new Cluster());
  c->options_ = o;
  c->prefill_tp_ = o.prefill_tp;
  c->decode_tp_ = o.decode_tp;
  c->prefill_pp_ = o.prefill_pp;
  c->decode_pp_ = o.decode_pp;
  const auto ready_deadline = Clock::now() + o.ready_timeout;
  auto left = [&] { return std::chrono::milliseconds(RemainingMs(ready_deadline)); };

  // Rank slots first so that indices are stable; the bootstrap goes last.
  for (int i = 0; i < c->num_ranks(); ++i) {
    ProcessInfo p;
    const bool prefill = i < c->prefill_ranks();
    const int tp_size = prefill ? o.prefill_tp : o.decode_tp;
    const int side_index = prefill ? i : i - c->prefill_ranks();
    p.role = prefill ? Role::kPrefill : Role::kDecode;
    p.tp = side_index % tp_size;
    p.pp = side_index / tp_size;
    RankId id;
    id.role = p.role;
    id.tp = p.tp;
    id.pp = p.pp;
    p.name = id.ShortName();
    c->procs_.push_back(p);
    c->pipes_.emplace_back();
  }
  if (o.bootstrap == BootstrapMode::kStandalone) {
    ProcessInfo p;
    p.role = Role::kBootstrap;
    p.name = "bootstrap";
    c->bootstrap_index_ = static_cast<int>(c->procs_.size());
    c->procs_.push_back(p);
    c->pipes_.emplace_back();
    std::vector<std::string> args = {"demo-bootstrap", "--host", o.bootstrap_host};
    if (o.sglang_server) args.push_back("--sglang-standin");
    KVB_RETURN_IF_ERROR(c->Spawn(c->bootstrap_index_, args, o));
    KVB_RETURN_IF_ERROR(c->WaitReady({c->bootstrap_index_}, left()));
    c->bootstrap_addr_ = c->procs_[c->bootstrap_index_].ready.value("address", std::string());
  }

  auto args_for = [&](int i) {
    const ProcessInfo& p = c->procs_[i];
    const bool prefill = p.role == Role::kPrefill;
    std::vector<std::string> a = {"worker",
                                  "--role",
                                  std::string(RoleName(p.role)),
                                  "--tp-size",
                                  std::to_string(prefill ? o.prefill_tp : o.decode_tp),
                                  "--tp-rank",
                                  std::to_string(p.tp),
                                  "--bootstrap",
                                  c->bootstrap_addr_};
    // Only with pp > 1, so pp 1 ranks start with exactly the flags they
    // always had.
    const int pp_size = prefill ? o.prefill_pp : o.decode_pp;
    if (pp_size > 1)
      a.insert(a.end(), {"--pp-size", std::to_string(pp_size), "--pp-rank", std::to_string(p.pp)});
    if (prefill && p.tp == 0 && p.pp == 0 && o.bootstrap == BootstrapMode::kEmbedded)
      a.push_back("--embedded-bootstrap");
    a.insert(a.end(), o.worker_args.begin(), o.worker_args.end());
    const auto& role_args = p.role == Role::kPrefill ? o.prefill_args : o.decode_args;
    a.insert(a.end(), role_args.begin(), role_args.end());
    if (i < static_cast<int>(o.rank_args.size()))
      a.insert(a.end(), o.rank_args[i].begin(), o.rank_args[i].end());
    return a;
  };
  // Prefill rank 0 first when it hosts the registry: the others need it up.
  std::vector<int> rest;
  int first = 0;
  if (o.bootstrap == BootstrapMode::kEmbedded) {
    // The port was free when picked, but a process running beside this one
    // can take it before prefill tp0 listens: then tp0 is started again on
    // another port (the other ranks are not started yet).
    const auto pick = o.pick_port ? o.pick_port : PickFreePort;
    for (int attempt = 1;; ++attempt) {
      KVB_ASSIGN_OR_RETURN(int port, pick());
      c->bootstrap_addr_ = o.bootstrap_host + ":" + std::to_string(port);
      Status s = c->Spawn(0, args_for(0), o);
      if (s.ok()) s = c->WaitReady({0}, left());
      if (s.ok()) break;
      const bool port_taken = s.message().find("address already in use") != std::string::npos;
      if (!port_taken || attempt == kEmbeddedBootstrapTries)
        return s.WithContext("prefill tp0 started " + std::to_string(attempt) + " time(s)");
      c->RetireProcess(0, left());
    }
    first = 1;
  }
  for (int i = first; i < c->num_ranks(); ++i) {
    KVB_RETURN_IF_ERROR(c->Spawn(i, args_for(i), o));
    rest.push_back(i);
  }
  KVB_RETURN_IF_ERROR(c->WaitReady(rest, left()));
  return c;
}

Status Cluster::Spawn(int index, const std::vector<std::string>& args, const ClusterOptions& o) {
  const ProcessInfo& info = procs_[index];
  if (args_.size() < procs_.size()) args_.resize(procs_.size());
  if (history_.size() < procs_.size()) history_.resize(procs_.size());
  args_[index] = args;
  int in[2], out[2];
  if (pipe2(in, O_CLOEXEC) != 0) return InternalError(Errno("pipe"));
  if (pipe2(out, O_CLOEXEC) != 0) {
    close(in[0]);
    close(in[1]);
    return InternalError(Errno("pipe"));
  }
  int err = -1;
  if (!o.log_dir.empty()) {
    std::string path = o.log_dir + "/" + FileName(info.name, history_[index].size());
    err = open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (err < 0) {
      for (int fd : {in[0], in[1], out[0], out[1]}) close(fd);
      return InternalError(Errno(("open " + path).c_str()));
    }
  }
  // Everything the child needs is built before fork: after it, the child
  // only makes async-signal-safe calls.
  std::vector<std::string> env_strings;
  for (char** e = environ; *e != nullptr; ++e) {
    std::string_view entry(*e);
    std::string_view name = entry.substr(0, entry.find('='));
    bool overridden = std::any_of(o.env.begin(), o.env.end(), [&](const std::string& x) {
      return x.size() > name.size() && x.compare(0, name.size(), name) == 0 &&
             x[name.size()] == '=';
    });
    if (!overridden) env_strings.emplace_back(entry);
  }
  env_strings.insert(env_strings.end(), o.env.begin(), o.env.end());
  std::vector<char*> envp;
  for (auto& e : env_strings) envp.push_back(e.data());
  envp.push_back(nullptr);
  const std::vector<std::string>& wrap = Wrapper(index);
  std::vector<char*> argv;
  for (const auto& w : wrap) argv.push_back(const_cast<char*>(w.c_str()));
  argv.push_back(const_cast<char*>(o.binary.c_str()));
  const char* program = argv.front();
  for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  const pid_t parent = getpid();

  pid_t pid = fork();
  if (pid < 0) {
    for (int fd : {in[0], in[1], out[0], out[1], err})
      if (fd >= 0) close(fd);
    return InternalError(Errno("fork"));
  }
  if (pid == 0) {
    setpgid(0, 0);
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(126);  // the launcher died before prctl
    dup2(in[0], STDIN_FILENO);
    dup2(out[1], STDOUT_FILENO);
    if (err >= 0) dup2(err, STDERR_FILENO);
    execve(program, argv.data(), envp.data());
    _exit(127);
  }
  setpgid(pid, pid);  // also from here: no race with a Signal() right after
  close(in[0]);
  close(out[1]);
  if (err >= 0) close(err);
  procs_[index].pid = pid;
  pipes_[index].in = in[1];
  pipes_[index].out = out[0];
  return Status::Ok();
}

const std::vector<std::string>& Cluster::Wrapper(int index) const {
  static const std::vector<std::string> kNone;
  if (index == bootstrap_index_) return options_.bootstrap_wrap;
  return index < static_cast<int>(options_.rank_wrap.size()) ? options_.rank_wrap[index] : kNone;
}

void Cluster::HandleLine(int index, const std::string& line) {
  ProcessInfo& p = procs_[index];
  auto parse = [&](size_t skip) {
    return nlohmann::json::parse(line.substr(skip), nullptr, /*allow_exceptions=*/false);
  };
  if (line.starts_with("READY ")) {
    p.ready = parse(6);
  } else if (line.starts_with("PROGRESS ")) {
    nlohmann::json j = parse(9);
    if (!j.is_discarded()) p.progress = std::move(j);
  } else if (line.starts_with("REPORT ")) {
    nlohmann::json j = parse(7);
    if (!j.is_discarded()) p.report = std::move(j);
  } else if (on_line) {
    on_line(index, line);
  }
}

void Cluster::TryReap(int index, bool block) {
  ProcessInfo& p = procs_[index];
  if (p.pid <= 0 || p.exit.reaped) return;
  int status = 0;
  pid_t r = waitpid(p.pid, &status, block ? 0 : WNOHANG);
  if (r != p.pid) return;
  p.exit.reaped = true;
  p.exit.exited = WIFEXITED(status);
  p.exit.code = WIFEXITED(status) ? WEXITSTATUS(status) : 0;
  p.exit.signal = WIFSIGNALED(status) ? WTERMSIG(status) : 0;
}

void Cluster::Pump(std::chrono::milliseconds timeout) {
  std::vector<pollfd> fds;
  std::vector<int> owners;
  for (size_t i = 0; i < pipes_.size(); ++i) {
    if (pipes_[i].out < 0) continue;
    fds.push_back({pipes_[i].out, POLLIN, 0});
    owners.push_back(static_cast<int>(i));
  }
  if (fds.empty()) return;
  int r = poll(fds.data(), fds.size(), static_cast<int>(timeout.count()));
  if (r <= 0) return;
  for (size_t k = 0; k < fds.size(); ++k) {
    if (fds[k].revents == 0) continue;
    int i = owners[k];
    Pipes& pp = pipes_[i];
    char chunk[65536];
    ssize_t n = read(pp.out, chunk, sizeof(chunk));
    if (n < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    if (n <= 0) {
      if (!pp.buffer.empty()) HandleLine(i, pp.buffer);
      pp.buffer.clear();
      close(pp.out);
      pp.out = -1;
      procs_[i].stdout_closed = true;
      TryReap(i, /*block=*/false);
      continue;
    }
    pp.buffer.append(chunk, static_cast<size_t>(n));
    size_t start = 0, nl;
    while ((nl = pp.buffer.find('\n', start)) != std::string::npos) {
      HandleLine(i, pp.buffer.substr(start, nl - start));
      start = nl + 1;
    }
    pp.buffer.erase(0, start);
  }
}

Status Cluster::PumpUntil(const std::function<bool()>& done, std::chrono::milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  while (!done()) {
    int left = RemainingMs(deadline);
    if (left == 0)
      return DeadlineExceededError("cluster: condition not met within " +
                                   std::to_string(timeout.count()) + " ms");
    Pump(std::chrono::milliseconds(std::min(left, 100)));
  }
  return Status::Ok();
}

Status Cluster::WaitReady(const std::vector<int>& indices, std::chrono::milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  std::string error_line;
  auto saved = on_line;
  on_line = [&](int i, const std::string& line) {
    if (line.starts_with("ERROR ")) error_line = procs_[i].name + ": " + line.substr(6);
  };
  Status result = Status::Ok();
  for (;;) {
    std::vector<std::string> missing, gone;
    for (int i : indices) {
      if (!procs_[i].ready.is_null()) continue;
      (procs_[i].stdout_closed ? gone : missing).push_back(procs_[i].name);
    }
    if (!error_line.empty()) {
      result = UnavailableError("cluster: " + error_line);
      break;
    }
    if (!gone.empty()) {
      int i = indices.front();
      for (int k : indices)
        if (procs_[k].stdout_closed && procs_[k].ready.is_null()) i = k;
      TryReap(i, /*block=*/true);
      result =
          UnavailableError("cluster: " + procs_[i].name + " (pid " + std::to_string(procs_[i].pid) +
                           ") ended before READY: " + procs_[i].exit.ToString());
      break;
    }
    if (missing.empty()) break;
    int left = RemainingMs(deadline);
    if (left == 0) {
      std::string names;
      for (const auto& n : missing) names += (names.empty() ? "" : ", ") + n;
      result = DeadlineExceededError("cluster: no READY from " + names + " within " +
                                     std::to_string(timeout.count()) + " ms");
      break;
    }
    Pump(std::chrono::milliseconds(std::min(left, 200)));
  }
  on_line = saved;
  for (int i : indices) {
    ProcessInfo& p = procs_[i];
    if (!p.ready.is_object()) continue;
    p.own_pid = p.ready.value("pid", p.pid);
    // Run directly, the process may still be a child of what was started
    // (a shell): signal the pid it reports. Under a wrapper, that pid means
    // nothing out here.
    if (Wrapper(i).empty()) p.pid = p.own_pid;
  }
  return result;
}

Status Cluster::Signal(int index, int sig) {
  if (index < 0 || index >= static_cast<int>(procs_.size()) || procs_[index].pid <= 0)
    return InvalidArgumentError("cluster: no process " + std::to_string(index));
  ProcessInfo& p = procs_[index];
  if (p.exit.reaped) return Status::Ok();
  if (sig == SIGKILL || sig == SIGSTOP) p.signalled_at_us = WallMicros();
  if (kill(-p.pid, sig) != 0 && errno != ESRCH) return InternalError(Errno("kill"));
  if (sig == SIGSTOP) pipes_[index].stopped = true;
  if (sig == SIGCONT) pipes_[index].stopped = false;
  return Status::Ok();
}

Status Cluster::WriteLine(int index, const std::string& line) {
  if (index < 0 || index >= static_cast<int>(procs_.size()))
    return InvalidArgumentError("cluster: no process " + std::to_string(index));
  int fd = pipes_[index].in;
  if (fd < 0) return UnavailableError("cluster: stdin of " + procs_[index].name + " is closed");
  std::string data = line + "\n";
  size_t done = 0;
  while (done < data.size()) {
    ssize_t n = write(fd, data.data() + done, data.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0)
      return UnavailableError("cluster: write to " + procs_[index].name + ": " + strerror(errno));
    done += static_cast<size_t>(n);
  }
  return Status::Ok();
}

bool Cluster::WaitExit(int index, Clock::time_point deadline) {
  ProcessInfo& p = procs_[index];
  int pidfd = -1;
  for (;;) {
    // Drain stdout (a child blocked on a full pipe never exits) and reap.
    Pump(std::chrono::milliseconds(0));
    TryReap(index, /*block=*/false);
    if (p.pid <= 0 || p.exit.reaped) break;
    int left = RemainingMs(deadline);
    if (left == 0) break;
    if (pidfd < 0) pidfd = static_cast<int>(syscall(SYS_pidfd_open, p.pid, 0));
    std::vector<pollfd> fds;
    if (pidfd >= 0) fds.push_back({pidfd, POLLIN, 0});
    if (pipes_[index].out >= 0) fds.push_back({pipes_[index].out, POLLIN, 0});
    poll(fds.data(), fds.size(), std::min(left, 100));
  }
  if (pidfd >= 0) close(pidfd);
  return p.pid <= 0 || p.exit.reaped;
}

Status Cluster::Restart(int index, const std::vector<std::string>& extra_args,
                        std::chrono::milliseconds timeout) {
  if (index < 0 || index >= num_ranks())
    return InvalidArgumentError("cluster: no rank " + std::to_string(index));
  if (shut_down_) return FailedPreconditionError("cluster: already shut down");
  const auto deadline = Clock::now() + timeout;
  if (!WaitExit(index, deadline))
    return FailedPreconditionError("cluster: cannot restart " + procs_[index].name + " (pid " +
                                   std::to_string(procs_[index].pid) + "): still running");
  RetireProcess(index, std::chrono::milliseconds(RemainingMs(deadline)));
  std::vector<std::string> args = args_[index];
  args.insert(args.end(), extra_args.begin(), extra_args.end());
  Status s = Spawn(index, args, options_);
  if (s.ok()) s = WaitReady({index}, std::chrono::milliseconds(RemainingMs(deadline)));
  if (!s.ok() && procs_[index].pid > 0 && !procs_[index].exit.reaped) {
    kill(-procs_[index].pid, SIGKILL);
    TryReap(index, /*block=*/true);
  }
  return s;
}

void Cluster::RetireProcess(int index, std::chrono::milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  ProcessInfo& p = procs_[index];
  if (p.pid > 0 && !WaitExit(index, deadline)) {
    kill(-p.pid, SIGKILL);
    TryReap(index, /*block=*/true);
  }
  // Whatever the old process left in its pipe is its last word; then the
  // slot is free for the new process.
  while (pipes_[index].out >= 0 && RemainingMs(deadline) > 0)
    Pump(std::chrono::milliseconds(std::min(RemainingMs(deadline), 100)));
  if (pipes_[index].out >= 0) close(pipes_[index].out);
  if (pipes_[index].in >= 0) close(pipes_[index].in);
  pipes_[index] = Pipes{};
  ProcessInfo next;
  next.role = p.role;
  next.tp = p.tp;
  next.pp = p.pp;
  next.name = p.name;
  history_[index].push_back(std::move(p));
  procs_[index] = std::move(next);
}

Status Cluster::CollectReports(std::chrono::milliseconds timeout, const std::vector<int>& skip) {
  auto pending = [&] {
    std::vector<int> out;
    for (int i = 0; i < num_ranks(); ++i) {
      if (std::find(skip.begin(), skip.end(), i) != skip.end()) continue;
      if (!procs_[i].report && !procs_[i].stdout_closed) out.push_back(i);
    }
    return out;
  };
  Status s = PumpUntil([&] { return pending().empty(); }, timeout);
  if (s.ok()) return s;
  std::string names;
  for (int i : pending()) names += (names.empty() ? "" : ", ") + procs_[i].name;
  return DeadlineExceededError("cluster: no REPORT from " + names + " within " +
                               std::to_string(timeout.count()) + " ms");
}

void Cluster::Shutdown(std::chrono::milliseconds timeout) {
  if (shut_down_) return;
  shut_down_ = true;
  for (size_t i = 0; i < procs_.size(); ++i) {
    if (pipes_[i].stopped) Signal(static_cast<int>(i), SIGCONT).IgnoreError();
    if (pipes_[i].in >= 0) close(pipes_[i].in);
    pipes_[i].in = -1;
  }
  // Drain stdout (a child blocked on a full pipe would never exit) and reap
  // through pidfds, all against one deadline.
  const auto deadline = Clock::now() + timeout;
  for (;;) {
    std::vector<pollfd> fds;
    std::vector<int> pidfds;
    bool running = false;
    for (size_t i = 0; i < procs_.size(); ++i) {
      TryReap(static_cast<int>(i), /*block=*/false);
      if (procs_[i].pid <= 0 || procs_[i].exit.reaped) continue;
      running = true;
      int fd = static_cast<int>(syscall(SYS_pidfd_open, procs_[i].pid, 0));
      if (fd >= 0) {
        pidfds.push_back(fd);
        fds.push_back({fd, POLLIN, 0});
      }
      if (pipes_[i].out >= 0) fds.push_back({pipes_[i].out, POLLIN, 0});
    }
    int left = RemainingMs(deadline);
    if (!running || left == 0) {
      for (int fd : pidfds) close(fd);
      break;
    }
    poll(fds.data(), fds.size(), std::min(left, 100));
    for (int fd : pidfds) close(fd);
    Pump(std::chrono::milliseconds(0));
  }
  for (size_t i = 0; i < procs_.size(); ++i) {
    if (procs_[i].pid <= 0 || procs_[i].exit.reaped) continue;
    kill(-procs_[i].pid, SIGKILL);
    kill(-procs_[i].pid, SIGCONT);
    TryReap(static_cast<int>(i), /*block=*/true);
  }
  for (auto& pp : pipes_) {
    if (pp.out >= 0) close(pp.out);
    pp.out = -1;
  }
}

Cluster::~Cluster() {
  for (size_t i = 0; i < procs_.size(); ++i) {
    if (procs_[i].pid <= 0 || procs_[i].exit.reaped) continue;
    kill(-procs_[i].pid, SIGKILL);
    TryReap(static_cast<int>(i), /*block=*/true);
  }
  for (auto& pp : pipes_) {
    if (pp.in >= 0) close(pp.in);
    if (pp.out >= 0) close(pp.out);
  }
}

}  // namespace kvbridge::tools

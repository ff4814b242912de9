#include "tools/hosts.h"

#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "common/process.h"

namespace kvbridge::tools {
namespace {

// The absolute path of `name` on PATH (plus the sbin directories, which a
// non-login root shell may lack), or "".
std::string FindProgram(const std::string& name) {
  std::string path = getenv("PATH") ? getenv("PATH") : "";
  path += ":/usr/sbin:/sbin:/usr/bin:/bin";
  std::stringstream dirs(path);
  std::string dir;
  while (std::getline(dirs, dir, ':')) {
    if (dir.empty()) continue;
    std::string p = dir + "/" + name;
    if (access(p.c_str(), X_OK) == 0) return p;
  }
  return "";
}

std::string Join(const std::vector<std::string>& argv) {
  std::string s;
  for (const auto& a : argv) s += (s.empty() ? "" : " ") + a;
  return s;
}

// Output of `ip netns list`, one name per entry.
std::vector<std::string> ListNetns(const std::string& ip) {
  std::vector<std::string> names;
  FILE* f = popen((ip + " netns list 2>/dev/null").c_str(), "r");
  if (f == nullptr) return names;
  char line[512];
  while (fgets(line, sizeof(line), f) != nullptr) {
    std::string s(line);
    names.push_back(s.substr(0, s.find_first_of(" \n")));
  }
  pclose(f);
  return names;
}

// Namespaces of launchers that died without cleaning up ("kvb<pid>-...",
// pid no longer running) go first.
void RemoveStale(const std::string& ip) {
  for (const std::string& name : ListNetns(ip)) {
    if (!name.starts_with("kvb")) continue;
    size_t dash = name.find('-');
    if (dash == std::string::npos || dash == 3) continue;
    char* end = nullptr;
    long pid = strtol(name.c_str() + 3, &end, 10);
    if (end != name.c_str() + dash || pid <= 0) continue;
    if (kill(static_cast<pid_t>(pid), 0) == 0 || errno != ESRCH) continue;
    RunTool({ip, "netns", "delete", name}).IgnoreError();
  }
}

// The first line `fd` gives within `ms` (or what it gave until then).
std::string ReadLine(int fd, int ms) {
  std::string text;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(ms);
  while (text.find('\n') == std::string::npos) {
    pollfd p{fd, POLLIN, 0};
    int left = internal::RemainingMs(deadline);
    if (left == 0 || poll(&p, 1, left) <= 0) break;
    char buf[256];
    ssize_t n = read(fd, buf, sizeof(buf));
    if (n <= 0) break;
    text.append(buf, static_cast<size_t>(n));
  }
  return text;
}

}  // namespace

Status RunTool(const std::vector<std::string>& argv) {
  int out[2];
  if (pipe2(out, O_CLOEXEC) != 0) return InternalError(std::string("pipe: ") + strerror(errno));
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  pid_t pid = fork();
  if (pid < 0) {
    close(out[0]);
    close(out[1]);
    return InternalError(std::string("fork: ") + strerror(errno));
  }
  if (pid == 0) {
    dup2(out[1], STDOUT_FILENO);
    dup2(out[1], STDERR_FILENO);
    int devnull = open("/dev/null", O_RDONLY);
    if (devnull >= 0) dup2(devnull, STDIN_FILENO);
    execv(args[0], args.data());
    _exit(127);
  }
  close(out[1]);
  std::string text;
  char buf[4096];
  ssize_t n;
  while ((n = read(out[0], buf, sizeof(buf))) != 0) {
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) break;
    if (text.size() < 8192) text.append(buf, static_cast<size_t>(n));
  }
  close(out[0]);
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (WIFEXITED(status) && WEXITSTATUS(status) == 0) return Status::Ok();
  while (!text.empty() && (text.back() == '\n' || text.back() == ' ')) text.pop_back();
  return InternalError("`" + Join(argv) + "` failed (" +
                       (WIFEXITED(status) ? "exit " + std::to_string(WEXITSTATUS(status))
                                          : "signal " + std::to_string(WTERMSIG(status))) +
                       "): " + text);
}

std::string HostNet::Unsupported() {
  if (geteuid() != 0)
    return "network namespaces need root (euid " + std::to_string(geteuid()) + ")";
  if (FindProgram("ip").empty()) return "no `ip` (Debian iproute2) on PATH";
  if (FindProgram("unshare").empty()) return "no `unshare` (Debian util-linux) on PATH";
  if (FindProgram("nsenter").empty()) return "no `nsenter` (Debian util-linux) on PATH";
  if (FindProgram("nft").empty()) return "no `nft` (Debian nftables) on PATH";
  return "";
}

Result<std::unique_ptr<HostNet>> HostNet::Create(int hosts) {
  if (hosts < 1 || hosts > 64)
    return InvalidArgumentError("hosts: " + std::to_string(hosts) + " hosts; 1..64 supported");
  if (std::string why = Unsupported(); !why.empty())
    return FailedPreconditionError("hosts: " + why);
  std::unique_ptr<HostNet> n(new HostNet());
  n->ip_ = FindProgram("ip");
  n->unshare_ = FindProgram("unshare");
  n->nsenter_ = FindProgram("nsenter");
  n->nft_ = FindProgram("nft");
  n->sh_ = FindProgram("sh");
  RemoveStale(n->ip_);
  const pid_t pid = getpid();
  n->prefix_ = "kvb" + std::to_string(pid);
  n->subnet_ = static_cast<int>(pid % 250) + 1;
  const std::string& ip = n->ip_;
  n->bridge_ns_ = n->prefix_ + "-br";
  KVB_RETURN_IF_ERROR(RunTool({ip, "netns", "add", n->bridge_ns_}));
  const std::string& br = n->bridge_ns_;
  KVB_RETURN_IF_ERROR(RunTool({ip, "-n", br, "link", "add", "br0", "type", "bridge"}));
  KVB_RETURN_IF_ERROR(RunTool({ip, "-n", br, "link", "set", "br0", "up"}));
  for (int h = 0; h < hosts; ++h) {
    const std::string ns = n->prefix_ + "-h" + std::to_string(h);
    KVB_RETURN_IF_ERROR(RunTool({ip, "netns", "add", ns}));
    n->netns_.push_back(ns);  // from here the destructor deletes it
    n->ruled_.push_back(false);
    const std::string port = "p" + std::to_string(h);
    KVB_RETURN_IF_ERROR(RunTool({ip, "link", "add", kDevice, "netns", ns, "type", "veth", "peer",
                                 "name", port, "netns", br}));
    KVB_RETURN_IF_ERROR(RunTool({ip, "-n", br, "link", "set", port, "master", "br0", "up"}));
    KVB_RETURN_IF_ERROR(
        RunTool({ip, "-n", ns, "addr", "add", n->address(h) + "/24", "dev", kDevice}));
    KVB_RETURN_IF_ERROR(RunTool({ip, "-n", ns, "link", "set", kDevice, "up"}));
    KVB_RETURN_IF_ERROR(RunTool({ip, "-n", ns, "link", "set", "lo", "up"}));
    n->holder_.push_back(-1);
    n->init_.push_back(-1);
    n->delayer_.push_back({});
    KVB_RETURN_IF_ERROR(n->StartInit(h));
  }
  return n;
}

HostNet::~HostNet() {
  for (Delayer& d : delayer_) {
    if (d.pid <= 0) continue;
    // End of stdin stops it (it prints its counters); SIGKILL if it has
    // not within a second.
    close(d.stdin_fd);
    const int pidfd = static_cast<int>(syscall(SYS_pidfd_open, d.pid, 0));
    pollfd p{pidfd, POLLIN, 0};
    if (pidfd < 0 || poll(&p, 1, 1000) != 1) kill(d.pid, SIGKILL);
    if (pidfd >= 0) close(pidfd);
    while (waitpid(d.pid, nullptr, 0) < 0 && errno == EINTR) {
    }
  }
  // Killing unshare kills the init (--kill-child), and with it every
  // process left in the host's PID namespace.
  for (pid_t pid : holder_) {
    if (pid <= 0) continue;
    kill(pid, SIGKILL);
    while (waitpid(pid, nullptr, 0) < 0 && errno == EINTR) {
    }
  }
  for (const std::string& ns : netns_) RunTool({ip_, "netns", "delete", ns}).IgnoreError();
  if (!bridge_ns_.empty()) RunTool({ip_, "netns", "delete", bridge_ns_}).IgnoreError();
}

std::string HostNet::hostname(int h) const { return "kvb-h" + std::to_string(h); }

std::string HostNet::address(int h) const {
  return "10.77." + std::to_string(subnet_) + "." + std::to_string(h + 1);
}

Status HostNet::StartInit(int h) {
  // The hostname is set through /proc of the new UTS namespace (no
  // hostname(1) needed); /dev/shm and /tmp are the host's own. "ready"
  // says the namespaces are set up; then the shell becomes a sleeping init.
  // /tmp is the host's own too, unless the programs the hosts run live
  // there (a checkout under /tmp): a private /tmp would hide them, and every
  // rank would fail to start with "No such file or directory".
  std::error_code ec;
  const std::string exe = std::filesystem::read_symlink("/proc/self/exe", ec).string();
  const bool private_tmp = ec || exe.rfind("/tmp/", 0) != 0;
  const std::string script = "echo " + hostname(h) +
                             " > /proc/sys/kernel/hostname && "
                             "mount -t tmpfs kvbshm /dev/shm && " +
                             std::string(private_tmp ? "mount -t tmpfs kvbtmp /tmp && " : "") +
                             "echo ready && exec sleep 2147483647";
  std::vector<std::string> argv = {
      ip_,     "netns",        "exec",   netns_.at(h),   unshare_, "--pid", "--uts", "--mount",
      "--ipc", "--mount-proc", "--fork", "--kill-child", sh_,      "-c",    script};
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  int out[2];
  if (pipe2(out, O_CLOEXEC) != 0) return InternalError(std::string("pipe: ") + strerror(errno));
  const pid_t parent = getpid();
  pid_t pid = fork();
  if (pid < 0) {
    close(out[0]);
    close(out[1]);
    return InternalError(std::string("fork: ") + strerror(errno));
  }
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(126);
    dup2(out[1], STDOUT_FILENO);
    execv(args[0], args.data());
    _exit(127);
  }
  close(out[1]);
  holder_[h] = pid;
  const std::string text = ReadLine(out[0], 10000);
  close(out[0]);
  if (!text.starts_with("ready"))
    return InternalError("hosts: the init of " + hostname(h) + " did not start (`" + Join(argv) +
                         "` printed \"" + text + "\")");
  // unshare --fork has exactly one child: the namespace's init.
  std::ifstream children("/proc/" + std::to_string(pid) + "/task/" + std::to_string(pid) +
                         "/children");
  pid_t init = 0;
  if (!(children >> init) || init <= 0)
    return InternalError("hosts: cannot find the init of " + hostname(h) + " under pid " +
                         std::to_string(pid));
  init_[h] = init;
  return Status::Ok();
}

std::vector<std::string> HostNet::Command(int h) const {
  const std::string target = std::to_string(init_.at(h));
  return {nsenter_, "--target", target, "--net", "--pid", "--uts", "--mount", "--ipc", "--"};
}

std::vector<std::string> HostNet::NetCommand(int h) const {
  return {nsenter_, "--net=/run/netns/" + netns_.at(h), "--"};
}

std::vector<std::string> HostNet::Env() {
  // UCX tells machines apart by the kernel's boot id, which namespaces
  // share: it would reach another "host" through its same-machine
  // transports (sysv/posix segments, cma), which the transport enables
  // with peer-failure support (ucx_transport.cc). Without that support UCX
  // leaves them out, as between real hosts; and only the bridge device,
  // never a loopback address that means another host here.
  return {std::string("UCX_NET_DEVICES=") + kDevice, "UCX_POSIX_ERROR_HANDLING=n",
          "UCX_SYSV_ERROR_HANDLING=n"};
}

Status HostNet::Exec(int h, const std::vector<std::string>& argv) const {
  std::vector<std::string> a = {ip_, "netns", "exec", netns_.at(h)};
  a.insert(a.end(), argv.begin(), argv.end());
  return RunTool(a);
}

Status HostNet::Nft(int h, const std::string& rules) {
  if (!ruled_.at(h)) {
    KVB_RETURN_IF_ERROR(Exec(h, {nft_,
                                 "add table inet kvbfault; "
                                 "add chain inet kvbfault in { type filter hook input "
                                 "priority -10 ; policy accept ; } ; "
                                 "add chain inet kvbfault out { type filter hook output "
                                 "priority -10 ; policy accept ; }"}));
    ruled_[h] = true;
  }
  return Exec(h, {nft_, rules});
}

Status HostNet::Partition(int h, Direction dir) {
  std::string rules;
  const std::string dev = std::string("\"") + kDevice + "\"";
  if (dir != Direction::kOutgoing) rules += "add rule inet kvbfault in iifname " + dev + " drop; ";
  if (dir != Direction::kIncoming) rules += "add rule inet kvbfault out oifname " + dev + " drop";
  return Nft(h, rules);
}

Status HostNet::Lossy(int h, int percent) {
  if (percent < 1 || percent > 100)
    return InvalidArgumentError("hosts: loss of " + std::to_string(percent) + "%; 1..100");
  const std::string dev = std::string("\"") + kDevice + "\"";
  const std::string cond = " numgen random mod 100 < " + std::to_string(percent) + " drop";
  return Nft(h, "add rule inet kvbfault in iifname " + dev + cond +
                    "; add rule inet kvbfault out oifname " + dev + cond);
}

Status HostNet::Heal(int h) {
  if (!ruled_.at(h)) return Status::Ok();
  KVB_RETURN_IF_ERROR(Exec(h, {nft_, "delete table inet kvbfault"}));
  ruled_[h] = false;
  return Status::Ok();
}

Status HostNet::SetLink(int h, bool up) {
  return RunTool({ip_, "-n", netns_.at(h), "link", "set", kDevice, up ? "up" : "down"});
}

Status HostNet::Delay(int h, int ms, const std::string& kvbridge, const std::string& log) {
  if (ms < 1 || ms > 10000)
    return InvalidArgumentError("hosts: delay of " + std::to_string(ms) + " ms; 1..10000");
  if (delayer_.at(h).pid > 0)
    return FailedPreconditionError("hosts: " + hostname(h) + " already has a delay");
  // Port p<h> leaves the bridge; veth d<h>/e<h> takes its place (e<h> in
  // the bridge) and the delayer joins p<h> to d<h>.
  const std::string& br = bridge_ns_;
  const std::string p = "p" + std::to_string(h), d = "d" + std::to_string(h),
                    e = "e" + std::to_string(h);
  KVB_RETURN_IF_ERROR(
      RunTool({ip_, "-n", br, "link", "add", d, "type", "veth", "peer", "name", e}));
  KVB_RETURN_IF_ERROR(RunTool({ip_, "-n", br, "link", "set", e, "master", "br0", "up"}));
  KVB_RETURN_IF_ERROR(RunTool({ip_, "-n", br, "link", "set", d, "up"}));
  KVB_RETURN_IF_ERROR(RunTool({ip_, "-n", br, "link", "set", p, "nomaster"}));
  // Everything the child needs is made before fork (it only makes
  // async-signal-safe calls).
  const std::string ns_path = "/run/netns/" + br;
  std::vector<std::string> argv = {
      kvbridge,     "link-delay",       "--dev-a",      p,      "--dev-b", d,
      "--delay-ms", std::to_string(ms), "--deadline-s", "86400"};
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  const int ns_fd = open(ns_path.c_str(), O_RDONLY | O_CLOEXEC);
  if (ns_fd < 0) return InternalError("hosts: open " + ns_path + ": " + strerror(errno));
  const int log_fd =
      log.empty() ? -1 : open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  int in[2], out[2];
  if (pipe2(in, O_CLOEXEC) != 0 || pipe2(out, O_CLOEXEC) != 0) {
    close(ns_fd);
    return InternalError(std::string("pipe: ") + strerror(errno));
  }
  const pid_t parent = getpid();
  const pid_t pid = fork();
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (getppid() != parent || setns(ns_fd, CLONE_NEWNET) != 0) _exit(126);
    dup2(in[0], STDIN_FILENO);
    dup2(out[1], STDOUT_FILENO);
    if (log_fd >= 0) dup2(log_fd, STDERR_FILENO);
    execv(args[0], args.data());
    _exit(127);
  }
  close(ns_fd);
  if (log_fd >= 0) close(log_fd);
  close(in[0]);
  close(out[1]);
  if (pid < 0) {
    close(in[1]);
    close(out[0]);
    return InternalError(std::string("fork: ") + strerror(errno));
  }
  delayer_[h] = {pid, in[1]};  // from here the destructor stops it
  const std::string text = ReadLine(out[0], 10000);
  close(out[0]);
  if (!text.starts_with("ready"))
    return InternalError("hosts: the delayer of " + hostname(h) + " did not start (`" + Join(argv) +
                         "` printed \"" + text + "\")");
  return Status::Ok();
}

}  // namespace kvbridge::tools

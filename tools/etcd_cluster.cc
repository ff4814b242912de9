#include "tools/etcd_cluster.h"

#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <condition_variable>
#include <cstring>
#include <filesystem>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <set>
#include <thread>

#include "control/etcd_gateway.h"
#include "tools/cluster.h"
#include "tools/hosts.h"

namespace kvbridge::tools {
namespace {

using Clock = std::chrono::steady_clock;
constexpr std::string_view kReadyLine = "ready to serve client requests";

std::string Errno(const char* what) { return std::string(what) + ": " + std::strerror(errno); }

// Runs `fn` on a thread of its own that joined network namespace `netns`
// (ip netns name; "" = runs `fn` here): a member on a host is reachable
// only from inside the hosts' network.
template <class F>
auto InNetns(const std::string& netns, F fn) -> decltype(fn()) {
  if (netns.empty()) return fn();
  decltype(fn()) out = InternalError("etcd cluster: cannot join network namespace " + netns);
  std::thread t([&] {
    const std::string path = "/run/netns/" + netns;
    int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return;
    const bool joined = ::setns(fd, CLONE_NEWNET) == 0;
    ::close(fd);
    if (joined) out = fn();
  });
  t.join();
  return out;
}

// A free port not in `taken`, added to it.
Result<int> PickDistinctPort(std::set<int>& taken) {
  for (int tries = 0; tries < 16; ++tries) {
    KVB_ASSIGN_OR_RETURN(int port, PickFreePort());
    if (taken.insert(port).second) return port;
  }
  return InternalError("etcd cluster: no distinct free port after 16 picks");
}

// The last non-empty line of `text` (etcd logs one JSON object per line).
std::string LastLine(const std::string& text) {
  size_t end = text.find_last_not_of("\n ");
  if (end == std::string::npos) return "(nothing)";
  size_t begin = text.rfind('\n', end);
  return text.substr(begin == std::string::npos ? 0 : begin + 1,
                     end + 1 - (begin == std::string::npos ? 0 : begin + 1));
}

}  // namespace

struct EtcdCluster::Member {
  std::string name;
  std::string host = "127.0.0.1";  // the address it listens on
  std::vector<std::string> wrap;   // argv prefix (HostNet::Command), or none
  std::string netns;               // its host's network namespace, or ""
  int client_port = 0;
  int peer_port = 0;
  std::string endpoint;
  pid_t pid = -1;
  int out = -1;  // read end of its stderr
  int log = -1;  // copy of its stderr, or -1
  bool reaped = false;
};

// Reads every member's stderr until it closes; notes the ready line.
struct EtcdCluster::Reader {
  std::mutex mu;
  std::condition_variable cv;
  std::map<int, bool> ready;        // member -> ready line seen
  std::map<int, bool> closed;       // member -> stderr closed
  std::map<int, std::string> tail;  // member -> the end of its stderr
  int wake[2] = {-1, -1};
  std::thread thread;

  void Run(std::vector<std::pair<int, int>> fds, std::vector<int> logs) {
    std::vector<std::string> lines(fds.size());
    for (;;) {
      std::vector<pollfd> p{{wake[0], POLLIN, 0}};
      std::vector<size_t> which;
      for (size_t i = 0; i < fds.size(); ++i) {
        std::lock_guard<std::mutex> lock(mu);
        if (!closed[fds[i].first]) {
          p.push_back({fds[i].second, POLLIN, 0});
          which.push_back(i);
        }
      }
      if (::poll(p.data(), p.size(), -1) < 0 && errno != EINTR) return;
      if (p[0].revents != 0) return;
      for (size_t k = 1; k < p.size(); ++k) {
        if (p[k].revents == 0) continue;
        const size_t i = which[k - 1];
        char buf[4096];
        ssize_t n = ::read(fds[i].second, buf, sizeof buf);
        std::lock_guard<std::mutex> lock(mu);
        if (n <= 0) {
          closed[fds[i].first] = true;
          cv.notify_all();
          continue;
        }
        if (logs[i] >= 0 && ::write(logs[i], buf, n) < 0) {
          // A log that cannot be written is dropped; the member keeps running.
        }
        lines[i].append(buf, n);
        std::string& t = tail[fds[i].first];
        t.append(buf, n);
        if (t.size() > 600) t.erase(0, t.size() - 600);
        if (lines[i].find(kReadyLine) != std::string::npos) {
          ready[fds[i].first] = true;
          cv.notify_all();
        }
        if (size_t nl = lines[i].rfind('\n'); nl != std::string::npos) lines[i].erase(0, nl + 1);
      }
    }
  }
};

// Starts member `m` (the others named in `initial`); its stderr is m.out.
static Status SpawnMember(const EtcdClusterOptions& o, EtcdCluster::Member& m,
                          const std::string& root, const std::string& initial,
                          const std::string& token) {
  const std::string client = "http://" + m.host + ":" + std::to_string(m.client_port);
  const std::string peer = "http://" + m.host + ":" + std::to_string(m.peer_port);
  std::vector<std::string> args = m.wrap;
  args.insert(args.end(), {o.binary,
                           "--name",
                           m.name,
                           "--data-dir",
                           root + "/" + m.name,
                           "--listen-client-urls",
                           client,
                           "--advertise-client-urls",
                           client,
                           "--listen-peer-urls",
                           peer,
                           "--initial-advertise-peer-urls",
                           peer,
                           "--initial-cluster",
                           initial,
                           "--initial-cluster-state",
                           "new",
                           "--initial-cluster-token",
                           token,
                           "--heartbeat-interval",
                           std::to_string(o.heartbeat_ms),
                           "--election-timeout",
                           std::to_string(o.election_ms)});
  int pipefd[2];
  if (::pipe2(pipefd, O_CLOEXEC) != 0) return InternalError(Errno("pipe"));
  if (!o.log_dir.empty()) {
    const std::string path = o.log_dir + "/etcd-" + m.name + ".log";
    m.log = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  }
  const pid_t parent = ::getpid();
  pid_t pid = ::fork();
  if (pid < 0) return InternalError(Errno("fork"));
  if (pid == 0) {
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != parent) ::_exit(127);
    ::setpgid(0, 0);
    ::dup2(pipefd[1], 2);
    int null = ::open("/dev/null", O_RDWR);
    if (null >= 0) {
      ::dup2(null, 0);
      ::dup2(null, 1);
    }
    std::vector<char*> argv;
    for (std::string& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    ::execv(argv[0], argv.data());
    ::_exit(127);
  }
  ::close(pipefd[1]);
  m.pid = pid;
  m.out = pipefd[0];
  return Status::Ok();
}

bool EtcdCluster::Available(const std::string& binary) {
  return ::access(binary.c_str(), X_OK) == 0;
}

Result<std::unique_ptr<EtcdCluster>> EtcdCluster::Start(const EtcdClusterOptions& o) {
  if (o.members < 1 || o.members > 7) {
    return InvalidArgumentError("etcd cluster: members must be 1..7, got " +
                                std::to_string(o.members));
  }
  if (!Available(o.binary)) return FailedPreconditionError("etcd binary " + o.binary + " missing");
  // Ports picked here are free when picked, not when etcd binds them: a
  // test running beside this one may take one in between. A member that
  // exits before it was ready is then started again on fresh ports.
  const bool picked = o.net == nullptr || o.member_hosts.empty();
  Result<std::unique_ptr<EtcdCluster>> c = StartOnce(o);
  for (int attempt = 1; picked && attempt < 3 && c.status().code() == StatusCode::kUnavailable;
       ++attempt) {
    std::fprintf(stderr, "etcd cluster: %s; starting again on fresh ports\n",
                 c.status().ToString().c_str());
    c = StartOnce(o);
  }
  return c;
}

Result<std::unique_ptr<EtcdCluster>> EtcdCluster::StartOnce(const EtcdClusterOptions& o) {
  std::unique_ptr<EtcdCluster> c(new EtcdCluster());
  char tmpl[] = "/tmp/kvbridge-etcd-XXXXXX";
  if (::mkdtemp(tmpl) == nullptr) return InternalError(Errno("mkdtemp"));
  c->root_ = tmpl;
  std::string initial;
  std::set<int> taken;  // no two members share a port
  for (int i = 0; i < o.members; ++i) {
    auto m = std::make_unique<Member>();
    m->name = "m" + std::to_string(i);
    if (o.net != nullptr && !o.member_hosts.empty()) {
      // A host's ports are its own: fixed ones, distinct per member.
      const int h = o.member_hosts[i % o.member_hosts.size()];
      if (h < 0 || h >= o.net->size())
        return InvalidArgumentError("etcd cluster: no host " + std::to_string(h));
      m->host = o.net->address(h);
      m->wrap = o.net->Command(h);
      m->netns = o.net->netns(h);
      m->client_port = 2379 + 10 * i;
      m->peer_port = 2380 + 10 * i;
    } else {
      KVB_ASSIGN_OR_RETURN(m->client_port, PickDistinctPort(taken));
      KVB_ASSIGN_OR_RETURN(m->peer_port, PickDistinctPort(taken));
    }
    m->endpoint = m->host + ":" + std::to_string(m->client_port);
    initial += (i ? "," : "") + m->name + "=http://" + m->host + ":" + std::to_string(m->peer_port);
    c->members_.push_back(std::move(m));
  }
  c->reader_ = std::make_unique<Reader>();
  if (::pipe2(c->reader_->wake, O_CLOEXEC) != 0) return InternalError(Errno("pipe"));
  std::vector<std::pair<int, int>> fds;
  std::vector<int> logs;
  for (int i = 0; i < o.members; ++i) {
    Member& m = *c->members_[i];
    KVB_RETURN_IF_ERROR(SpawnMember(o, m, c->root_, initial, std::string(tmpl + 5)));
    fds.push_back({i, m.out});
    logs.push_back(m.log);
  }
  Reader* r = c->reader_.get();
  r->thread = std::thread([r, fds, logs] { r->Run(fds, logs); });
  std::map<int, bool> ready, closed;
  std::map<int, std::string> tail;
  {
    std::unique_lock<std::mutex> lock(r->mu);
    r->cv.wait_until(lock, Clock::now() + o.ready_timeout, [&] {
      for (int i = 0; i < o.members; ++i)
        if (!r->ready[i] && !r->closed[i]) return false;
      return true;
    });
    ready = r->ready;
    closed = r->closed;
    tail = r->tail;
  }
  std::string missing;
  for (int i = 0; i < o.members; ++i) {
    if (ready[i]) continue;
    if (closed[i]) {
      return UnavailableError("etcd member " + std::to_string(i) + " exited before it was ready" +
                              (o.log_dir.empty() ? "" : " (see " + o.log_dir + ")") +
                              "; its last words: " + LastLine(tail[i]));
    }
    missing += (missing.empty() ? "" : ", ") + std::to_string(i);
  }
  if (!missing.empty()) {
    return DeadlineExceededError("etcd members " + missing + " not ready after " +
                                 std::to_string(o.ready_timeout.count()) + " ms");
  }
  return c;
}

EtcdCluster::~EtcdCluster() {
  for (auto& m : members_) {
    if (m->pid > 0 && !m->reaped) {
      ::kill(-m->pid, SIGKILL);
      ::kill(m->pid, SIGKILL);
      ::waitpid(m->pid, nullptr, 0);
      m->reaped = true;
    }
  }
  if (reader_) {
    if (reader_->wake[1] >= 0 && ::write(reader_->wake[1], "x", 1) < 0) {
      // The reader then ends when the pipes close.
    }
    if (reader_->thread.joinable()) reader_->thread.join();
    for (int fd : reader_->wake)
      if (fd >= 0) ::close(fd);
  }
  for (auto& m : members_) {
    if (m->out >= 0) ::close(m->out);
    if (m->log >= 0) ::close(m->log);
  }
  if (!root_.empty()) {
    std::error_code ec;
    std::filesystem::remove_all(root_, ec);
  }
}

const std::string& EtcdCluster::endpoint(int i) const { return members_.at(i)->endpoint; }

std::string EtcdCluster::Endpoints() const {
  std::string out;
  for (size_t i = 0; i < members_.size(); ++i) out += (i ? "," : "") + members_[i]->endpoint;
  return out;
}

std::string EtcdCluster::Url(const std::string& ns) const {
  return "etcd://" + Endpoints() + "/" + ns;
}

pid_t EtcdCluster::pid(int i) const { return members_.at(i)->pid; }

bool EtcdCluster::running(int i) const { return !members_.at(i)->reaped; }

Status EtcdCluster::Kill(int i) {
  if (i < 0 || i >= members()) return InvalidArgumentError("no etcd member " + std::to_string(i));
  Member& m = *members_[i];
  if (m.reaped) return Status::Ok();
  ::kill(-m.pid, SIGKILL);  // its group: on a host, nsenter and etcd
  ::kill(m.pid, SIGKILL);
  ::waitpid(m.pid, nullptr, 0);
  m.reaped = true;
  return Status::Ok();
}

Result<int> EtcdCluster::Leader(std::chrono::milliseconds timeout) const {
  const auto deadline = Clock::now() + timeout;
  std::string last = "no member answered";
  for (;;) {
    for (int i = 0; i < members(); ++i) {
      if (!running(i)) continue;
      internal::EtcdGatewayOptions go;
      go.endpoints = {internal::EtcdEndpoint{members_[i]->host, members_[i]->client_port}};
      go.timeout = std::chrono::milliseconds(500);
      auto gw = internal::EtcdGateway::Create(go);
      if (!gw.ok()) return gw.status();
      auto st = InNetns(members_[i]->netns, [&] {
        return (*gw)->Call("/v3/maintenance/status", nlohmann::json::object(), false);
      });
      if (!st.ok()) {
        last = st.status().message();
        continue;
      }
      // Member ids are uint64 (beyond int64 half the time): compared as text.
      std::string self, leader;
      if (st->contains("header") && (*st)["header"].is_object())
        self = (*st)["header"].value("member_id", nlohmann::json()).dump();
      leader = st->value("leader", nlohmann::json()).dump();
      if (self != "null" && self == leader) return i;
      last = "member " + std::to_string(i) + " reports leader " + leader;
    }
    if (Clock::now() >= deadline) break;
    // Polls a condition with a deadline: an election settles in about one
    // election timeout.
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return UnavailableError("no etcd member reports itself leader within " +
                          std::to_string(timeout.count()) + " ms: " + last);
}

}  // namespace kvbridge::tools

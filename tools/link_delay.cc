#include "tools/link_delay.h"

#include <arpa/inet.h>
#include <linux/if_ether.h>
#include <linux/if_packet.h>
#include <net/if.h>
#include <poll.h>
#include <signal.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <deque>
#include <memory>
#include <vector>

namespace kvbridge::tools {
namespace {

using Clock = std::chrono::steady_clock;

volatile sig_atomic_t g_stop = 0;
void OnTerm(int) { g_stop = 1; }

struct Frame {
  Clock::time_point due;
  std::vector<char> bytes;  // virtio_net_hdr + Ethernet frame
};

// One direction of the wire: frames read from `in`, written to `out`.
struct Lane {
  int in = -1;
  int out = -1;
  const char* name = "";
  std::deque<Frame> queue;
  uint64_t queued_bytes = 0;
  uint64_t forwarded = 0, dropped_full = 0, send_errors = 0, recv_errors = 0;
  bool blocked = false;  // the last send said EAGAIN: wait for POLLOUT
};

// An AF_PACKET socket on `dev` carrying virtio-net headers. Created with
// protocol 0 so that it hears nothing until bound to the one device.
Result<int> OpenPacket(const std::string& dev) {
  const unsigned index = if_nametoindex(dev.c_str());
  if (index == 0)
    return InvalidArgumentError("link-delay: no device " + dev + ": " + strerror(errno));
  int fd = socket(AF_PACKET, SOCK_RAW | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) return InternalError(std::string("link-delay: AF_PACKET socket: ") + strerror(errno));
  auto fail = [&](const char* what) {
    Status s =
        InternalError("link-delay: " + std::string(what) + " on " + dev + ": " + strerror(errno));
    close(fd);
    return s;
  };
  int one = 1;
  if (setsockopt(fd, SOL_PACKET, PACKET_VNET_HDR, &one, sizeof(one)) != 0)
    return fail("PACKET_VNET_HDR");
  if (setsockopt(fd, SOL_PACKET, PACKET_IGNORE_OUTGOING, &one, sizeof(one)) != 0)
    return fail("PACKET_IGNORE_OUTGOING");
  int buf = 32 << 20;  // a 20 ms burst at a few GB/s is tens of MB
  if (setsockopt(fd, SOL_SOCKET, SO_RCVBUFFORCE, &buf, sizeof(buf)) != 0) return fail("rcvbuf");
  if (setsockopt(fd, SOL_SOCKET, SO_SNDBUFFORCE, &buf, sizeof(buf)) != 0) return fail("sndbuf");
  sockaddr_ll sll{};
  sll.sll_family = AF_PACKET;
  sll.sll_protocol = htons(ETH_P_ALL);
  sll.sll_ifindex = static_cast<int>(index);
  if (bind(fd, reinterpret_cast<sockaddr*>(&sll), sizeof(sll)) != 0) return fail("bind");
  packet_mreq mr{};
  mr.mr_ifindex = static_cast<int>(index);
  mr.mr_type = PACKET_MR_PROMISC;
  if (setsockopt(fd, SOL_PACKET, PACKET_ADD_MEMBERSHIP, &mr, sizeof(mr)) != 0)
    return fail("promiscuous mode");
  return fd;
}

// Reads what `lane.in` holds (at most a batch, so sends stay timely).
void Receive(Lane& lane, std::vector<char>& buf, const LinkDelayOptions& o) {
  for (int i = 0; i < 256; ++i) {
    sockaddr_ll from{};
    socklen_t len = sizeof(from);
    ssize_t n = recvfrom(lane.in, buf.data(), buf.size(), MSG_TRUNC,
                         reinterpret_cast<sockaddr*>(&from), &len);
    if (n < 0) {
      if (errno == EAGAIN || errno == EINTR) return;
      ++lane.recv_errors;  // e.g. ENETDOWN while a link is down: go on
      return;
    }
    if (from.sll_pkttype == PACKET_OUTGOING) continue;
    if (static_cast<size_t>(n) > buf.size() ||
        lane.queued_bytes + static_cast<uint64_t>(n) > o.max_queue_bytes) {
      ++lane.dropped_full;
      continue;
    }
    Frame f{Clock::now() + std::chrono::milliseconds(o.delay_ms),
            std::vector<char>(buf.data(), buf.data() + n)};
    lane.queued_bytes += static_cast<uint64_t>(n);
    lane.queue.push_back(std::move(f));
  }
}

// Writes every frame whose time has come.
void SendDue(Lane& lane, Clock::time_point now) {
  lane.blocked = false;
  while (!lane.queue.empty() && lane.queue.front().due <= now) {
    const Frame& f = lane.queue.front();
    ssize_t n = send(lane.out, f.bytes.data(), f.bytes.size(), 0);
    if (n < 0 && (errno == EAGAIN || errno == EINTR)) {
      lane.blocked = true;
      return;
    }
    if (n < 0)
      ++lane.send_errors;  // ENOBUFS, ENETDOWN: the frame is lost, as on a wire
    else
      ++lane.forwarded;
    lane.queued_bytes -= f.bytes.size();
    lane.queue.pop_front();
  }
}

}  // namespace

Status RunLinkDelay(const LinkDelayOptions& o) {
  if (o.delay_ms < 1 || o.delay_ms > 10000)
    return InvalidArgumentError("link-delay: --delay-ms " + std::to_string(o.delay_ms) +
                                "; 1..10000");
  if (o.deadline_s < 1) return InvalidArgumentError("link-delay: --deadline-s must be >= 1");
  if (o.dev_a.empty() || o.dev_b.empty() || o.dev_a == o.dev_b)
    return InvalidArgumentError("link-delay: two different devices needed");
  KVB_ASSIGN_OR_RETURN(int a, OpenPacket(o.dev_a));
  auto b_or = OpenPacket(o.dev_b);
  if (!b_or.ok()) {
    close(a);
    return b_or.status();
  }
  const int b = *b_or;
  Lane lanes[2];
  lanes[0].in = a, lanes[0].out = b, lanes[0].name = "a->b";
  lanes[1].in = b, lanes[1].out = a, lanes[1].name = "b->a";
  std::vector<char> buf(256 << 10);
  const auto deadline = Clock::now() + std::chrono::seconds(o.deadline_s);
  std::printf("ready\n");
  std::fflush(stdout);
  std::string why = "deadline";
  while (true) {
    if (g_stop) {
      why = "SIGTERM";
      break;
    }
    const auto now = Clock::now();
    if (now >= deadline) break;
    for (Lane& l : lanes) SendDue(l, now);
    auto wake = deadline;
    for (const Lane& l : lanes)
      if (!l.queue.empty() && !l.blocked && l.queue.front().due < wake) wake = l.queue.front().due;
    const auto wait = std::chrono::duration_cast<std::chrono::nanoseconds>(wake - Clock::now());
    timespec ts{0, 0};
    if (wait.count() > 0) {
      ts.tv_sec = static_cast<time_t>(wait.count() / 1000000000);
      ts.tv_nsec = static_cast<long>(wait.count() % 1000000000);
    }
    pollfd p[3] = {{STDIN_FILENO, POLLIN, 0},
                   {a, static_cast<short>(POLLIN | (lanes[1].blocked ? POLLOUT : 0)), 0},
                   {b, static_cast<short>(POLLIN | (lanes[0].blocked ? POLLOUT : 0)), 0}};
    if (ppoll(p, 3, &ts, nullptr) < 0 && errno != EINTR) {
      why = std::string("ppoll: ") + strerror(errno);
      break;
    }
    if (p[0].revents & (POLLIN | POLLHUP | POLLERR)) {
      char c;
      if (read(STDIN_FILENO, &c, 1) <= 0) {
        why = "stdin closed";
        break;
      }
    }
    if (p[1].revents & (POLLIN | POLLERR)) Receive(lanes[0], buf, o);
    if (p[2].revents & (POLLIN | POLLERR)) Receive(lanes[1], buf, o);
  }
  for (const Lane& l : lanes)
    std::fprintf(stderr,
                 "link-delay %s->%s %s: forwarded %llu, dropped (queue full) %llu, send errors "
                 "%llu, recv errors %llu, left queued %zu (stopped: %s)\n",
                 o.dev_a.c_str(), o.dev_b.c_str(), l.name,
                 static_cast<unsigned long long>(l.forwarded),
                 static_cast<unsigned long long>(l.dropped_full),
                 static_cast<unsigned long long>(l.send_errors),
                 static_cast<unsigned long long>(l.recv_errors), l.queue.size(), why.c_str());
  close(a);
  close(b);
  return Status::Ok();
}

void AddLinkDelayCommand(CLI::App& app, std::function<int()>& run) {
  auto o = std::make_shared<LinkDelayOptions>();
  CLI::App* cmd = app.add_subcommand("link-delay", "Forward frames between two devices, delayed");
  cmd->group("");  // internal: HostNet::Delay runs it
  cmd->add_option("--dev-a", o->dev_a, "One device (e.g. a host's bridge port)")->required();
  cmd->add_option("--dev-b", o->dev_b, "The other device")->required();
  cmd->add_option("--delay-ms", o->delay_ms, "Held per frame, each direction")
      ->check(CLI::Range(1, 10000));
  cmd->add_option("--deadline-s", o->deadline_s, "Stop after this long")
      ->check(CLI::Range(1, 86400));
  auto queue_mib = std::make_shared<int>(64);
  cmd->add_option("--max-queue-mib", *queue_mib, "Held at most, per direction")
      ->check(CLI::Range(1, 4096));
  cmd->callback([o, queue_mib, &run] {
    o->max_queue_bytes = static_cast<uint64_t>(*queue_mib) << 20;
    run = [o] {
      prctl(PR_SET_PDEATHSIG, SIGTERM);
      struct sigaction sa {};
      sa.sa_handler = OnTerm;
      sigaction(SIGTERM, &sa, nullptr);
      Status s = RunLinkDelay(*o);
      if (!s.ok()) std::fprintf(stderr, "kvbridge link-delay: %s\n", s.ToString().c_str());
      return s.ok() ? 0 : 1;
    };
  });
}

}  // namespace kvbridge::tools

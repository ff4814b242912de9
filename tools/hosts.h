// Hosts on one machine: each "host" is a network namespace of its own with
// UTS (hostname), PID, IPC and mount namespaces of its own (private /proc,
// SysV segments, /dev/shm and /tmp), held by a small init process per host; every process
// started on a host (Command) joins all four, so the ranks of one host see
// each other as on one machine and nothing of the other hosts. The hosts are
// joined by veth pairs through a bridge that lives in a namespace of its
// own, on a private /24 (10.77.S.0/24, S from the launcher's pid). So a rank
// on one host cannot see another host's processes, /proc or shared memory,
// and every byte between hosts goes over the network (UCX TCP).
//
// Faults are injected from outside the processes, inside a host's network
// namespace: nftables drop rules (partition, one direction, random loss)
// and `ip link set eth0 down`. Delay: this kernel has no netem
// (CONFIG_NET_SCH_NETEM unset; see docs/transport.md), so Delay cuts the
// host's port out of the bridge and forwards its frames through
// `kvbridge link-delay` (tools/link_delay.h), which holds each one.
//
// Names carry the launcher's pid ("kvb<pid>-h0", "kvb<pid>-br"), so
// parallel runs never collide; Create removes namespaces left by launchers
// that no longer run; the destructor removes this one's (the processes in a
// namespace must be gone first: destroy the Cluster before the HostNet).
//
// Needs root, iproute2 (`ip`), util-linux `unshare` and `nsenter`, and
// nftables (`nft`).
// Thread safety: none; one thread drives a HostNet.
#pragma once

#include <sys/types.h>

#include <memory>
#include <string>
#include <vector>

#include "kvbridge/status.h"

namespace kvbridge::tools {

// Which of a host's packets a partition drops.
enum class Direction {
  kBoth,      // nothing in, nothing out
  kOutgoing,  // what the host sends is lost; it still hears the others
  kIncoming,  // the host hears nothing; what it sends still arrives
};

class HostNet {
 public:
  // Why hosts cannot be made here ("needs root", "no ip (iproute2)"), or ""
  // when they can. Tests GTEST_SKIP with this reason.
  static std::string Unsupported();

  // Creates `hosts` hosts (1..64), all reachable from each other.
  // Errors: FailedPrecondition (Unsupported()), InvalidArgument (count),
  // Internal naming the `ip` command that failed and what it printed.
  static Result<std::unique_ptr<HostNet>> Create(int hosts);
  ~HostNet();  // deletes every namespace this HostNet made (best effort)

  HostNet(const HostNet&) = delete;
  HostNet& operator=(const HostNet&) = delete;

  int size() const { return static_cast<int>(netns_.size()); }
  // The hostname processes on host `h` see ("kvb-h0", ...).
  std::string hostname(int h) const;
  // Host `h`'s IPv4 address on the bridge ("10.77.S.(h+1)").
  std::string address(int h) const;
  const std::string& netns(int h) const { return netns_.at(h); }
  // The device that reaches the other hosts, inside every host.
  static constexpr const char* kDevice = "eth0";

  // The argv prefix that runs a program on host `h` (nsenter into the
  // host's namespaces): append the program and its arguments. nsenter forks
  // the program and waits for it; both are in one process group, so
  // signalling the group of the wrapper's pid reaches the program. When the
  // launcher dies, the host's init dies and the kernel kills every process
  // of the host.
  std::vector<std::string> Command(int h) const;
  // The argv prefix that runs a program in host `h`'s network namespace
  // only (nsenter --net): its traffic leaves through host `h`'s kDevice as
  // a process on `h` would, but it keeps this machine's PID and mount
  // namespaces, so it can itself start processes on other hosts with
  // Command() (from inside a host, the other hosts' inits are not in /proc).
  std::vector<std::string> NetCommand(int h) const;
  // "NAME=value" entries every process on a host needs: UCX uses only
  // kDevice, and no same-machine transport (it cannot tell namespaces
  // apart: they share the boot id it identifies a machine by).
  static std::vector<std::string> Env();

  // Runs `argv` inside host `h`'s network namespace and waits for it.
  // Internal naming the command and its output when it fails.
  Status Exec(int h, const std::vector<std::string>& argv) const;

  // Drops host `h`'s traffic to and from every other host (per `dir`).
  Status Partition(int h, Direction dir = Direction::kBoth);
  // Drops `percent` (1..100) of host `h`'s packets at random, both ways.
  Status Lossy(int h, int percent);
  // Removes every drop rule of host `h` (no-op if none).
  Status Heal(int h);
  // `ip link set eth0 down` / up inside host `h`.
  Status SetLink(int h, bool up);
  // Holds every frame to and from host `h` `ms` (1..10000) milliseconds
  // (each direction: a round trip gains 2 x ms), from now until this
  // HostNet goes: `kvbridge` (the binary at that path) runs `link-delay` in
  // the bridge's namespace, its stderr to `log` ("" = inherited). Once per
  // host. FailedPrecondition when `h` already has one; Internal naming the
  // command that failed.
  Status Delay(int h, int ms, const std::string& kvbridge, const std::string& log = "");

 private:
  HostNet() = default;
  Status Nft(int h, const std::string& rules);
  Status StartInit(int h);

  std::string prefix_;  // "kvb<pid>"
  int subnet_ = 0;      // S of 10.77.S.0/24
  std::string bridge_ns_;
  std::vector<std::string> netns_;
  std::vector<bool> ruled_;    // host has the kvbfault nft table
  std::vector<pid_t> holder_;  // per host: the unshare process (our child)
  std::vector<pid_t> init_;    // per host: its PID namespace's init, as seen here
  struct Delayer {
    pid_t pid = -1;
    int stdin_fd = -1;  // closing it stops the delayer
  };
  std::vector<Delayer> delayer_;  // per host
  std::string ip_, unshare_, nsenter_, nft_, sh_;
};

// Runs `argv` (argv[0] an absolute path) and waits; Internal naming the
// command and what it printed (stdout and stderr) unless it exits 0.
Status RunTool(const std::vector<std::string>& argv);

}  // namespace kvbridge::tools

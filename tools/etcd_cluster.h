// EtcdCluster: an etcd cluster of 1..7 members as child processes of this
// one, on free 127.0.0.1 ports with data directories of their own under a
// fresh temporary directory, or each on a host of a HostNet (tools/hosts.h),
// reached at that host's address. Used by `kvbridge demo --registry etcd` and by
// the etcd tests; a deployment points kvbridge at its own cluster instead.
//
// A member is ready once it logged "ready to serve client requests" (etcd
// prints it after joining the cluster): its stderr is read by a thread of
// the cluster (poll(), no sleeps) and copied to <log_dir>/etcd-m<i>.log when
// log_dir is set. Members die with the thread that started them
// (PR_SET_PDEATHSIG); the destructor SIGKILLs and reaps them and removes
// the data directories.
//
// Thread safety: none, except that the reader thread is internal.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "kvbridge/status.h"

namespace kvbridge::tools {

class HostNet;

struct EtcdClusterOptions {
  int members = 1;
  std::string binary = "/usr/bin/etcd";
  std::string log_dir;  // empty: members' logs are read and dropped
  std::chrono::milliseconds ready_timeout{30000};
  // etcd's raft timing: a new leader within about one election timeout.
  int heartbeat_ms = 50;
  int election_ms = 500;
  // Hosts: member i runs on host member_hosts[i % size] of `net` (which
  // must outlive the cluster), started through HostNet::Command and
  // listening on that host's address, ports 2379 + 10 i (clients) and
  // 2380 + 10 i (peers). Null: every member here on 127.0.0.1.
  const HostNet* net = nullptr;
  std::vector<int> member_hosts;
};

class EtcdCluster {
 public:
  // Whether `binary` exists and is executable (the tests skip without it).
  static bool Available(const std::string& binary = "/usr/bin/etcd");

  // InvalidArgument (members outside 1..7), Internal (fork, pipes, temp
  // dir), Unavailable naming a member that exited before it was ready and
  // its last line of stderr (on ports picked here, after two more tries on
  // fresh ports), DeadlineExceeded naming the ones not ready after
  // ready_timeout.
  static Result<std::unique_ptr<EtcdCluster>> Start(const EtcdClusterOptions& options);
  ~EtcdCluster();

  EtcdCluster(const EtcdCluster&) = delete;
  EtcdCluster& operator=(const EtcdCluster&) = delete;

  int members() const { return static_cast<int>(members_.size()); }
  // "ADDRESS:port" of member i's client port (127.0.0.1 without hosts).
  const std::string& endpoint(int i) const;
  // Every member's client endpoint, comma separated.
  std::string Endpoints() const;
  // "etcd://<Endpoints()>/<ns>".
  std::string Url(const std::string& ns) const;
  pid_t pid(int i) const;
  bool running(int i) const;

  // The index of the member that is leader now, as the running members
  // report it (/v3/maintenance/status; asked from inside each member's
  // host). Unavailable when none reports one within `timeout`.
  Result<int> Leader(std::chrono::milliseconds timeout) const;
  // SIGKILLs member i (its process group: on a host, the nsenter wrapper
  // and etcd) and reaps it.
  Status Kill(int i);

  struct Member;
  struct Reader;

 private:
  // One try of Start (Start retries one whose picked port was taken).
  static Result<std::unique_ptr<EtcdCluster>> StartOnce(const EtcdClusterOptions& options);
  EtcdCluster() = default;
  std::vector<std::unique_ptr<Member>> members_;
  std::unique_ptr<Reader> reader_;
  std::string root_;  // the temporary directory
};

}  // namespace kvbridge::tools

// What the etcd process tests on loopback (etcd_cluster_test.cc) and on
// hosts (netns/etcd_hosts_test.cc) check alike: ranks alive by their leases,
// and a leader killed mid-run losing no registration, no failure record and
// no request.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>

#include "control/etcd_registry.h"
#include "kvbridge/errors.h"
#include "tools/cluster.h"
#include "tools/etcd_cluster.h"

namespace kvbridge::tools::etcd_check {

// A record for a room far above the rooms the workers use: touches no
// request.
FailureRecord RoomRecord(uint64_t room);

// Ranks whose registration is alive in etcd now.
int CountAlive(const internal::EtcdRegistryClient& etcd);

// Requests the rank has finished, from its report or its last progress.
uint64_t Finished(const ProcessInfo& p);

// Waits on `etcd`'s watch until `done` holds, pumping the cluster's pipes
// meanwhile (no child may block on a full pipe); false at the deadline.
bool WaitInEtcd(Cluster& c, const internal::EtcdRegistryClient& etcd,
                const std::function<bool()>& done, std::chrono::milliseconds timeout);

struct LeaderKill {
  int killed = -1;  // the member that was leader
  int next = -1;    // the one elected after it
};

// With `c` (prefill tp 2, decode tp 2, `requests` each) running on `etcd`
// and `watcher` a client of the same namespace: publishes three records,
// waits for the four ranks alive and 30 requests done per decode rank,
// kills the leader, publishes two more during the election (they must get
// the next sequence numbers), then checks that every rank succeeded every
// request with no corrupt page, that the four registrations are still
// alive, and that the five records are there in order. Fails the calling
// test through gtest's assertions.
void KillLeaderMidRun(Cluster& c, EtcdCluster& etcd, const internal::EtcdRegistryClient& watcher,
                      int requests, LeaderKill* out);

}  // namespace kvbridge::tools::etcd_check

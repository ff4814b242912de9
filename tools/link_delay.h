// `kvbridge link-delay` (internal): a delaying wire between two network
// devices of one namespace. This kernel has no netem (CONFIG_NET_SCH_NETEM
// unset, no fq, no nft queue), so HostNet::Delay cuts a host's port out of
// the bridge and runs this between the port and a veth whose peer is
// enslaved in its place: every Ethernet frame read from one device (an
// AF_PACKET socket with virtio-net headers, so TSO/GSO frames and partial
// checksums pass unchanged) is written to the other `delay_ms` after it was
// read, in order, in both directions.
//
// Bounded and self-stopping: at most `max_queue_bytes` wait per direction
// (more is dropped, as a full router queue would, and counted); it exits
// when stdin reaches end of file (the launcher closed it or died), when
// the deadline passes, on SIGTERM, and (PR_SET_PDEATHSIG) when its parent
// dies. It prints "ready" on stdout once both sockets are bound, and its
// counters on stderr when it stops.
// Thread safety: one thread.
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <functional>
#include <string>

#include "kvbridge/status.h"

namespace kvbridge::tools {

struct LinkDelayOptions {
  std::string dev_a;                       // e.g. "p1" (the host's side)
  std::string dev_b;                       // e.g. "d1" (the bridge's side)
  int delay_ms = 20;                       // added to each frame, each direction (1..10000)
  int deadline_s = 3600;                   // stops by itself after this long
  uint64_t max_queue_bytes = 64ull << 20;  // per direction
};

// Runs the wire until one of the stop conditions; Ok when it stopped by
// one of them. InvalidArgument (bad options), Internal (socket calls,
// naming the device and errno).
Status RunLinkDelay(const LinkDelayOptions& o);

void AddLinkDelayCommand(CLI::App& app, std::function<int()>& run);

}  // namespace kvbridge::tools

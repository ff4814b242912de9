// Who and where a process is, and the one rule for "same host": two
// processes share a host when their host names are equal and their boot ids
// (which name the PID namespace too) are equal and known. A host name alone is not enough (two
// machines may both be called "debian", two containers may share a name), and a boot id alone is
// not either (network namespaces on one kernel are separate hosts to kvbridge: each has its own
// name). The transport (choosing a path) and the connector (asking /proc about a peer, choosing a
// grant's reach) both ask SameHost; neither compares names by hand.
#pragma once

#include <string>
#include <string_view>

#include "kvbridge/status.h"

namespace kvbridge::internal {

struct HostIdentity {
  std::string host;  // gethostname()
  // /proc/sys/kernel/random/boot_id, "/", the PID namespace
  // (/proc/self/ns/pid: "pid:[4026531836]"); empty: unknown.
  std::string boot_id;
  int pid = 0;
};

// This process; pid stays current across fork().
const HostIdentity& ThisHost();
// Read afresh (ThisHost keeps the first reading).
HostIdentity ReadThisHost();
// The kernel's boot id of a `boot_id` (without its PID namespace).
std::string_view KernelBootId(std::string_view boot_id);

// Same host name and the same boot id, which must be known.
bool SameHost(const HostIdentity& a, const HostIdentity& b);
// The same declared process: host name, boot id (both may be unknown) and
// pid equal. Not a same-host test: use SameHost for that.
bool SameProcess(const HostIdentity& a, const HostIdentity& b);

// Where other hosts reach a process, as it advertises itself (a prefill
// rank's rank_ip, ManagerOptions::advertise_host) and as peers read it: an
// IPv4 or IPv6 literal (IPv6 bare, without brackets) or a DNS host name
// (letters, digits and '-' in dot-separated labels of 1-63 characters, at
// most 253 in all). InvalidArgument naming `field` otherwise: the value ends
// up in URLs and connect calls, where a space, '/', '@' or a port would make
// it name something else.
Status CheckHostAddress(std::string_view field, std::string_view value);

}  // namespace kvbridge::internal

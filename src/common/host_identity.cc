#include "common/host_identity.h"

#include <arpa/inet.h>
#include <pthread.h>
#include <unistd.h>

#include <cctype>
#include <fstream>
#include <string>

#include "common/log.h"

namespace kvbridge::internal {
namespace {

HostIdentity* MutableThisHost() {
  static HostIdentity* id = [] {
    auto* h = new HostIdentity(ReadThisHost());  // never destroyed: usable during exit
    if (h->host.empty() || h->boot_id.empty()) {
      KVB_LOG_WARN("cannot read host name or boot id; every peer is judged as on another host");
    }
    // A forked child is another process: keep pid current without a syscall
    // on every call. The child runs this before any other thread exists.
    pthread_atfork(nullptr, nullptr, [] { MutableThisHost()->pid = getpid(); });
    return h;
  }();
  return id;
}

}  // namespace

HostIdentity ReadThisHost() {
  HostIdentity h;
  char buf[256] = {};
  if (gethostname(buf, sizeof(buf) - 1) == 0) h.host = buf;
  std::ifstream in("/proc/sys/kernel/random/boot_id");
  std::getline(in, h.boot_id);
  // PID namespaces of one kernel share its boot id, and containers with the
  // host's network its name too; a pid and /proc mean nothing across them
  // (a stopped peer read as exited). Each is a host of its own to kvbridge.
  char ns[64] = {};
  const ssize_t n = readlink("/proc/self/ns/pid", ns, sizeof(ns) - 1);
  if (!h.boot_id.empty() && n > 0) h.boot_id += "/" + std::string(ns, static_cast<size_t>(n));
  h.pid = getpid();
  return h;
}

std::string_view KernelBootId(std::string_view boot_id) {
  return boot_id.substr(0, boot_id.find('/'));
}

const HostIdentity& ThisHost() { return *MutableThisHost(); }

bool SameHost(const HostIdentity& a, const HostIdentity& b) {
  return !a.boot_id.empty() && a.host == b.host && a.boot_id == b.boot_id;
}

bool SameProcess(const HostIdentity& a, const HostIdentity& b) {
  return a.host == b.host && a.boot_id == b.boot_id && a.pid == b.pid;
}

Status CheckHostAddress(std::string_view field, std::string_view value) {
  const std::string v(value);
  auto bad = [&](std::string_view why) {
    std::string shown = v.size() > 64 ? v.substr(0, 64) + "..." : v;
    for (char& c : shown)
      if (!std::isprint(static_cast<unsigned char>(c))) c = '?';
    return InvalidArgumentError(std::string(field) + " '" + shown + "' " + std::string(why) +
                                ": give an IPv4 or IPv6 address or a host name");
  };
  if (v.empty()) return bad("is empty");
  in6_addr addr;
  if (inet_pton(AF_INET, v.c_str(), &addr) == 1 || inet_pton(AF_INET6, v.c_str(), &addr) == 1)
    return Status();
  if (v.find(':') != std::string::npos || v.front() == '[')
    return bad("is not an IP address (IPv6 without brackets, no port)");
  if (v.size() > 253) return bad("is longer than 253 characters");
  size_t label = 0;
  for (size_t i = 0; i <= v.size(); ++i) {
    const char c = i < v.size() ? v[i] : '.';
    if (c == '.') {
      if (label == 0 || label > 63) return bad("has an empty label or one over 63 characters");
      if (v[i - 1] == '-' || v[i - label] == '-')
        return bad("has a label that starts or ends with '-'");
      label = 0;
    } else if (std::isalnum(static_cast<unsigned char>(c)) || c == '-') {
      ++label;
    } else {
      return bad("holds a character other than letters, digits, '-' and '.'");
    }
  }
  return Status();
}

}  // namespace kvbridge::internal

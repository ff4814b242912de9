#include "common/host_identity.h"

#include <pthread.h>
#include <unistd.h>

#include <fstream>

#include "common/log.h"

namespace kvbridge::internal {
namespace {

HostIdentity* MutableThisHost() {
  static HostIdentity* id = [] {
    auto* h = new HostIdentity();  // never destroyed: usable during exit
    char buf[256] = {};
    if (gethostname(buf, sizeof(buf) - 1) == 0) h->host = buf;
    std::ifstream in("/proc/sys/kernel/random/boot_id");
    std::getline(in, h->boot_id);
    if (h->host.empty() || h->boot_id.empty()) {
      KVB_LOG_WARN("cannot read host name or boot id; every peer is judged as on another host");
    }
    h->pid = getpid();
    // A forked child is another process: keep pid current without a syscall
    // on every call. The child runs this before any other thread exists.
    pthread_atfork(nullptr, nullptr, [] { MutableThisHost()->pid = getpid(); });
    return h;
  }();
  return id;
}

}  // namespace

const HostIdentity& ThisHost() { return *MutableThisHost(); }

bool SameHost(const HostIdentity& a, const HostIdentity& b) {
  return !a.boot_id.empty() && a.host == b.host && a.boot_id == b.boot_id;
}

bool SameProcess(const HostIdentity& a, const HostIdentity& b) {
  return a.host == b.host && a.boot_id == b.boot_id && a.pid == b.pid;
}

}  // namespace kvbridge::internal

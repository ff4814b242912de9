// Same-host write grants: how a writer on this host learns, from the region
// owner itself, where it may write, without taking a pid, fd or address
// from the wire.
//
// The owner runs a SameHostExporter: a SOCK_SEQPACKET unix socket in the
// abstract namespace (name "kvbridge-<pid>-<random>"), served by one thread.
// Its name travels in the region descriptor. A writer that imports a
// same-host region calls RequestSameHostGrant: it connects, reads the
// listener's credentials with SO_PEERCRED (the kernel's word, not the
// peer's) and refuses unless that pid is the one the descriptor declares;
// it then asks for {region id, token}. The owner answers only for a region
// it exported with that token, or with the token of a grant it added to the
// region and has not revoked (constant-time compares), with the region's
// base and length from its own table, and, for AllocateSharedBuffer memory,
// the memfd itself passed with SCM_RIGHTS. The writer then
//   * maps the fd it received (shared segment: memcpy), or
//   * uses process_vm_writev into the SO_PEERCRED pid (cross-memory attach),
// and refuses a grant whose base or length differ from the descriptor.
// A forged descriptor thus reaches at most the memory of the process that
// holds the socket it names, and only where that process says.
//
// Thread safety: SameHostExporter is thread-safe; RequestSameHostGrant is a
// blocking call (bounded by `timeout`) for any thread.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "common/thread_annotations.h"
#include "kvbridge/status.h"
#include "transport/region_token.h"
#include "transport/shm/shm.h"

namespace kvbridge::internal {

// A region as its owner exports it on the same-host socket.
struct ExportedRegion {
  uint64_t region_id = 0;
  RegionToken token;
  uint64_t base = 0;
  uint64_t length = 0;
  // AllocateSharedBuffer memory: the segment and where the region starts.
  std::optional<SharedSegmentRef> segment;
};

class SameHostExporter {
 public:
  // Binds the socket and starts the serving thread. Errors: Unavailable
  // (socket, bind or listen failed; the caller falls back to UCX).
  static Result<std::unique_ptr<SameHostExporter>> Start();
  ~SameHostExporter();
  SameHostExporter(const SameHostExporter&) = delete;
  SameHostExporter& operator=(const SameHostExporter&) = delete;

  // Abstract socket name without the leading NUL.
  const std::string& name() const { return name_; }
  // Exports a region; a segment's fd is dup'ed and kept until Remove.
  Status Add(const ExportedRegion& region);
  void Remove(uint64_t region_id);
  // A per-peer grant of an exported region: `token` is answered like the
  // region's own until RevokeGrant(grant). Errors: NotFound (region not
  // exported), ResourceExhausted (kMaxGrantsPerRegion live grants).
  Status AddGrant(uint64_t region_id, uint64_t grant, const RegionToken& token);
  // Every later request with one of the grant's tokens is refused like a
  // wrong token; a mapping handed out before stays with its holder.
  void RevokeGrant(uint64_t grant);
  static constexpr size_t kMaxGrantsPerRegion = 4096;
  // Requests refused so far (unknown region, wrong token, garbled).
  uint64_t refused() const;

 private:
  struct Entry {
    ExportedRegion region;
    int fd = -1;                                           // dup of the segment's memfd, or -1
    std::vector<std::pair<uint64_t, RegionToken>> grants;  // live per-peer tokens
  };
  // The region's own token or a live grant's (every one compared).
  static bool Admits(const Entry& e, const RegionToken& token);
  SameHostExporter(int listen_fd, int stop_fd, std::string name);
  void Serve();
  void Answer(int conn);

  const int listen_fd_;
  const int stop_fd_;
  const std::string name_;
  mutable Mutex mu_;
  std::map<uint64_t, Entry> regions_ KVB_GUARDED_BY(mu_);
  uint64_t refused_ KVB_GUARDED_BY(mu_) = 0;
  std::thread thread_;
};

// What the owner granted.
struct SameHostGrant {
  int pid = 0;  // from SO_PEERCRED: process_vm_writev target
  std::optional<MappedPeerSegment> segment;
  uint64_t segment_offset = 0;  // region start within `segment`
};

// Asks the owner listening on `socket_name` for region `region_id`.
// `declared_pid`, `base`, `length`: what the descriptor says; the grant is
// refused unless the socket's owner and its answer agree. Errors:
// Unavailable (no such socket, timeout: fall back to UCX), PermissionDenied
// (socket held by another pid, token refused), InvalidArgument (the owner's
// region differs from the descriptor, garbled answer).
Result<SameHostGrant> RequestSameHostGrant(std::string_view socket_name, int declared_pid,
                                           uint64_t region_id, const RegionToken& token,
                                           uint64_t base, uint64_t length,
                                           std::chrono::milliseconds timeout);

}  // namespace kvbridge::internal

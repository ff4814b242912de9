// Same-host data paths: shared segments (memfd) and cross-memory attach.
//
// AllocateSharedBuffer (kvbridge/memory.h) hands out memfd-backed memory and
// records it here, so RegisterMemory can tell that a region is shareable. A
// peer on the same host receives the memfd from the owner itself over a unix
// socket (SCM_RIGHTS, see same_host.h), maps it and writes with memcpy; no
// pid or fd number is ever taken from the wire. Regions that are not
// shareable are written with process_vm_writev into the pid the kernel
// reported for the owner's socket (needs ptrace access to the peer: same uid
// without Yama restrictions, or root).
//
// Thread safety: all functions are thread-safe; MappedPeerSegment is a
// move-only value.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>

#include "common/host_identity.h"
#include "kvbridge/status.h"

namespace kvbridge::internal {

// Where a range of AllocateSharedBuffer memory of this process lives.
struct SharedSegmentRef {
  int fd = -1;                // memfd in this process
  uint64_t offset = 0;        // of the queried address within the segment
  uint64_t segment_size = 0;  // whole segment
};
// The segment holding [addr, addr + length), if all of it lies in one
// AllocateSharedBuffer allocation of this process.
std::optional<SharedSegmentRef> FindSharedSegment(const void* addr, size_t length);

// A peer's shared segment mapped into this process.
class MappedPeerSegment {
 public:
  // Maps all `size` bytes of `fd` (a memfd the owner passed us; the caller
  // keeps owning the fd) shared. Errors: InvalidArgument (not a kvbridge
  // memfd, or not `size` bytes), ResourceExhausted (mmap failed).
  static Result<MappedPeerSegment> Map(int fd, uint64_t size);
  MappedPeerSegment(MappedPeerSegment&& other) noexcept;
  MappedPeerSegment& operator=(MappedPeerSegment&& other) noexcept;
  MappedPeerSegment(const MappedPeerSegment&) = delete;
  MappedPeerSegment& operator=(const MappedPeerSegment&) = delete;
  ~MappedPeerSegment();

  uint8_t* data() const { return data_; }
  size_t size() const { return size_; }

 private:
  MappedPeerSegment(uint8_t* data, size_t size) : data_(data), size_(size) {}
  uint8_t* data_ = nullptr;
  size_t size_ = 0;
};

// One-sided writes into another process with process_vm_writev.
struct CmaSegment {
  const void* local = nullptr;
  uint64_t remote_addr = 0;
  size_t length = 0;
};
// Checks that this process may write into `pid` (a harmless 1-byte read of
// `remote_addr`). Errors: Unavailable (no such process), PermissionDenied.
Status ProbeCrossMemoryAttach(int pid, uint64_t remote_addr);
// Writes every segment fully (splitting at IOV_MAX, resuming after partial
// writes). Errors: Unavailable (process gone: ESRCH), InvalidArgument (EFAULT:
// an address is not mapped), PermissionDenied (EPERM).
Status CrossMemoryWrite(int pid, std::span<const CmaSegment> segments);

}  // namespace kvbridge::internal

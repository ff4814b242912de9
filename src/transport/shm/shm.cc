#include "transport/shm/shm.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstdint>
#include <cstring>
#include <map>
#include <mutex>
#include <vector>

#include "common/log.h"
#include "kvbridge/memory.h"

namespace kvbridge::internal {
namespace {

// The name every kvbridge memfd carries; Map checks it so that a stale ref
// whose fd number now holds some other file of the same size is rejected.
constexpr char kMemfdName[] = "kvbridge-shm";

std::string ErrnoText(int err) {
  return std::string(std::strerror(err)) + " (errno " + std::to_string(err) + ")";
}

std::string Hex(uint64_t v) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "0x%llx", static_cast<unsigned long long>(v));
  return buf;
}

struct Allocation {
  size_t size = 0;
  int fd = -1;
};

// Process-wide registry of AllocateSharedBuffer memory, keyed by base address.
class SharedRegistry {
 public:
  static SharedRegistry& Get() {
    static auto* registry = new SharedRegistry();  // never destroyed: usable during exit
    return *registry;
  }

  void Add(uintptr_t base, Allocation a) {
    std::lock_guard<std::mutex> lock(mu_);
    allocations_[base] = a;
  }

  std::optional<Allocation> Remove(uintptr_t base) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = allocations_.find(base);
    if (it == allocations_.end()) return std::nullopt;
    Allocation a = it->second;
    allocations_.erase(it);
    return a;
  }

  // The allocation containing [addr, addr + length), with its base.
  std::optional<std::pair<uintptr_t, Allocation>> Find(uintptr_t addr, size_t length) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = allocations_.upper_bound(addr);
    if (it == allocations_.begin()) return std::nullopt;
    --it;
    const uintptr_t base = it->first;
    const size_t size = it->second.size;
    const uint64_t offset = addr - base;
    if (offset >= size || length > size - offset) return std::nullopt;
    return std::make_pair(base, it->second);
  }

 private:
  std::mutex mu_;
  std::map<uintptr_t, Allocation> allocations_;  // guarded by mu_
};

size_t PageSize() {
  static const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  return page;
}

// Maps errno from process_vm_readv/writev to a Status naming the target.
Status CmaError(int err, std::string_view what, int pid, uint64_t remote_addr, size_t length) {
  std::string msg = std::string(what) + " pid " + std::to_string(pid) + " at " + Hex(remote_addr) +
                    " (" + std::to_string(length) + " bytes): " + ErrnoText(err);
  switch (err) {
    case ESRCH:
      return UnavailableError(msg + ": process is gone");
    case EFAULT:
      return InvalidArgumentError(msg + ": address not mapped");
    case EPERM:
    case EACCES:
      return Status(StatusCode::kPermissionDenied, msg + ": no ptrace access to the process");
    case ENOMEM:
      return ResourceExhaustedError(msg);
    case EINVAL:
      return InvalidArgumentError(msg);
    default:
      return InternalError(msg);
  }
}

}  // namespace

std::optional<SharedSegmentRef> FindSharedSegment(const void* addr, size_t length) {
  if (addr == nullptr) return std::nullopt;
  auto found = SharedRegistry::Get().Find(reinterpret_cast<uintptr_t>(addr), length);
  if (!found) return std::nullopt;
  SharedSegmentRef ref;
  ref.fd = found->second.fd;
  ref.offset = reinterpret_cast<uintptr_t>(addr) - found->first;
  ref.segment_size = found->second.size;
  return ref;
}

Result<MappedPeerSegment> MappedPeerSegment::Map(int fd, uint64_t size) {
  const std::string path = "/proc/self/fd/" + std::to_string(fd);
  if (fd < 0 || size == 0 || size > static_cast<uint64_t>(SIZE_MAX)) {
    return InvalidArgumentError("bad shared segment: fd " + std::to_string(fd) + " size " +
                                std::to_string(size));
  }
  // The link target of a memfd is "/memfd:<name> (deleted)".
  char target[256] = {};
  const ssize_t n = readlink(path.c_str(), target, sizeof(target) - 1);
  const std::string want = std::string("/memfd:") + kMemfdName;
  struct stat st {};
  if (n < 0 || std::string_view(target, static_cast<size_t>(n)).substr(0, want.size()) != want) {
    return InvalidArgumentError("fd " + std::to_string(fd) +
                                " is not a kvbridge shared segment (it is '" +
                                std::string(target, n < 0 ? 0 : static_cast<size_t>(n)) + "')");
  }
  // Sealed at its size (AllocateSharedBuffer): an owner that could shrink
  // it would make a write through this mapping fault (SIGBUS) in this
  // process. Checked before the size: a seal cannot be taken back.
  const int seals = fcntl(fd, F_GET_SEALS);
  if (seals < 0 || (seals & F_SEAL_SHRINK) == 0) {
    return InvalidArgumentError("shared segment fd " + std::to_string(fd) +
                                " is not sealed against shrinking (F_SEAL_SHRINK); refusing to "
                                "map memory its owner could cut short");
  }
  if (fstat(fd, &st) != 0) return InternalError("fstat " + path + ": " + ErrnoText(errno));
  if (static_cast<uint64_t>(st.st_size) != size) {
    return InvalidArgumentError("shared segment has " + std::to_string(st.st_size) +
                                " bytes, its owner says " + std::to_string(size));
  }
  // MAP_POPULATE: the page tables are filled here, once per peer, at ~0.07
  // s/GiB; left to demand faults, the first write into each 4 KiB page
  // through this mapping took a fault inside a transfer (~0.5 s/GiB, the
  // demo's first pass over decode's pools). A KV pool is meant to be resident.
  void* p = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
  if (p == MAP_FAILED) {
    return ResourceExhaustedError("mmap of shared segment (" + std::to_string(size) +
                                  " bytes): " + ErrnoText(errno));
  }
  return MappedPeerSegment(static_cast<uint8_t*>(p), size);
}

MappedPeerSegment::MappedPeerSegment(MappedPeerSegment&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)), size_(std::exchange(other.size_, 0)) {}

MappedPeerSegment& MappedPeerSegment::operator=(MappedPeerSegment&& other) noexcept {
  if (this != &other) {
    if (data_ != nullptr) munmap(data_, size_);
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
  }
  return *this;
}

MappedPeerSegment::~MappedPeerSegment() {
  if (data_ != nullptr) munmap(data_, size_);
}

Status ProbeCrossMemoryAttach(int pid, uint64_t remote_addr) {
  char byte;
  iovec local{&byte, 1};
  iovec remote{reinterpret_cast<void*>(remote_addr), 1};
  if (process_vm_readv(pid, &local, 1, &remote, 1, 0) == 1) return Status::Ok();
  Status status = CmaError(errno, "cross-memory attach probe of", pid, remote_addr, 1);
  KVB_LOG_DEBUG("{}", status.ToString());
  return status;
}

Status CrossMemoryWrite(int pid, std::span<const CmaSegment> segments) {
  // Callers hand us page-scattered blocks, often more than IOV_MAX of them:
  // each call takes up to IOV_MAX segments, and a partial write (the kernel
  // stops at the first fault) resumes at the first byte not written, so that
  // the next call reports the fault with its exact address.
  static const size_t kIovMax = [] {
    long v = sysconf(_SC_IOV_MAX);
    return v > 0 ? static_cast<size_t>(v) : size_t{IOV_MAX};
  }();
  for (const CmaSegment& s : segments) {
    if (s.length > 0 && (s.local == nullptr || s.remote_addr == 0)) {
      return InvalidArgumentError("cross-memory write to pid " + std::to_string(pid) + " at " +
                                  Hex(s.remote_addr) + ": null address");
    }
  }
  std::vector<iovec> local;
  std::vector<iovec> remote;
  size_t index = 0;    // first segment not fully written
  size_t done_in = 0;  // bytes of segments[index] already written
  while (true) {
    while (index < segments.size() && segments[index].length == done_in) {
      ++index;
      done_in = 0;
    }
    if (index == segments.size()) return Status::Ok();
    local.clear();
    remote.clear();
    size_t want = 0;
    for (size_t i = index; i < segments.size() && local.size() < kIovMax; ++i) {
      const CmaSegment& s = segments[i];
      const size_t skip = (i == index) ? done_in : 0;
      const size_t len = s.length - skip;
      if (len == 0) continue;
      if (want + len < want || want + len > static_cast<size_t>(SSIZE_MAX)) break;
      local.push_back({const_cast<uint8_t*>(static_cast<const uint8_t*>(s.local)) + skip, len});
      remote.push_back({reinterpret_cast<void*>(s.remote_addr + skip), len});
      want += len;
    }
    const ssize_t n =
        process_vm_writev(pid, local.data(), local.size(), remote.data(), remote.size(), 0);
    if (n < 0) {
      if (errno == EINTR) continue;
      const CmaSegment& s = segments[index];
      Status status = CmaError(errno, "cross-memory write to", pid, s.remote_addr + done_in,
                               s.length - done_in);
      KVB_LOG_WARN("{}", status.ToString());
      return status;
    }
    if (n == 0) {
      const CmaSegment& s = segments[index];
      return InternalError("cross-memory write to pid " + std::to_string(pid) + " at " +
                           Hex(s.remote_addr + done_in) + " made no progress");
    }
    // Advance `n` bytes through the segments.
    size_t left = static_cast<size_t>(n);
    while (left > 0) {
      const size_t room = segments[index].length - done_in;
      if (left < room) {
        done_in += left;
        left = 0;
      } else {
        left -= room;
        ++index;
        done_in = 0;
      }
    }
  }
}

}  // namespace kvbridge::internal

namespace kvbridge {

Result<void*> AllocateSharedBuffer(size_t length) {
  using internal::ErrnoText;
  if (length == 0) return InvalidArgumentError("AllocateSharedBuffer: length 0");
  const size_t page = internal::PageSize();
  if (length > SIZE_MAX - page) {
    return InvalidArgumentError("AllocateSharedBuffer: length " + std::to_string(length) +
                                " too large");
  }
  const size_t size = (length + page - 1) / page * page;
  const int fd = memfd_create(internal::kMemfdName, MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (fd < 0) {
    Status status = ResourceExhaustedError("memfd_create: " + ErrnoText(errno));
    KVB_LOG_ERROR("AllocateSharedBuffer({}): {}", length, status.ToString());
    return status;
  }
  if (ftruncate(fd, static_cast<off_t>(size)) != 0) {
    Status status = ResourceExhaustedError("ftruncate memfd to " + std::to_string(size) +
                                           " bytes: " + ErrnoText(errno));
    close(fd);
    KVB_LOG_ERROR("AllocateSharedBuffer({}): {}", length, status.ToString());
    return status;
  }
  // Its size is fixed for good: peers map it (MappedPeerSegment::Map checks).
  if (fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0) {
    Status status = InternalError("sealing memfd: " + ErrnoText(errno));
    close(fd);
    KVB_LOG_ERROR("AllocateSharedBuffer({}): {}", length, status.ToString());
    return status;
  }
  void* p = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) {
    Status status =
        ResourceExhaustedError("mmap " + std::to_string(size) + " bytes: " + ErrnoText(errno));
    close(fd);
    KVB_LOG_ERROR("AllocateSharedBuffer({}): {}", length, status.ToString());
    return status;
  }
  // The fd stays open while allocated: RegisterMemory passes it to peers.
  internal::SharedRegistry::Get().Add(reinterpret_cast<uintptr_t>(p), {size, fd});
  return p;
}

Status FreeSharedBuffer(void* ptr) {
  auto a = internal::SharedRegistry::Get().Remove(reinterpret_cast<uintptr_t>(ptr));
  if (!a) {
    return NotFoundError("FreeSharedBuffer: " + internal::Hex(reinterpret_cast<uintptr_t>(ptr)) +
                         " is not the start of an AllocateSharedBuffer allocation");
  }
  munmap(ptr, a->size);
  close(a->fd);
  return Status::Ok();
}

}  // namespace kvbridge

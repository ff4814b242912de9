// Memory kinds and the same-host shared-memory allocator.
//
// KV pools are normally allocated by the application; kvbridge registers them
// as they are. On one host, pools allocated with AllocateSharedBuffer() can be
// mapped by the peer process, so prefill writes become a plain memcpy into
// decode's pages (memcpy speed, truly one-sided). Pools allocated any other way
// use cross-memory attach (process_vm_writev) on one host, and UCX between
// hosts. The path chosen per peer is logged and reported by the benchmarks.
//
// Thread safety: all functions are safe to call from any thread.
#pragma once

#include <cstddef>
#include <string_view>

#include "kvbridge/export.h"
#include "kvbridge/status.h"

namespace kvbridge {

enum class MemoryKind {
  kDram,  // host memory
  kVram,  // GPU memory (passed to UCX as CUDA memory)
};

KVB_EXPORT std::string_view MemoryKindName(MemoryKind kind);

// Allocates `length` bytes (rounded up to the page size) of zero-filled memory
// backed by an anonymous memfd that peers on this host can map. The memory is
// released with FreeSharedBuffer; it lives as long as any peer maps it.
// Errors: InvalidArgument (length 0), ResourceExhausted (memfd/mmap failed).
KVB_EXPORT Result<void*> AllocateSharedBuffer(size_t length);

// Releases memory from AllocateSharedBuffer. NotFound when `ptr` did not come
// from it.
KVB_EXPORT Status FreeSharedBuffer(void* ptr);

}  // namespace kvbridge

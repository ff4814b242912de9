// StreamCopy: memcpy for bulk writes into a peer's shared segment, with
// non-temporal stores.
//
// A same-host transfer writes pages the writing process never reads back,
// and the reader (the decode rank) reads them later, after the batch's
// completion has crossed two threads and a message. Ordinary stores first
// read every destination cache line into this core's cache (a
// read-for-ownership), so a copy moves three bytes through memory per byte
// written; non-temporal stores skip that read and the cache, two bytes per
// byte. glibc's memcpy only does so for single copies larger than a share
// of the last-level cache; a KV transfer is many 8-64 KiB pieces that add up
// to far more than the cache.
//
// Non-temporal stores are weakly ordered: call StreamFence() after the last
// StreamCopy of a batch and before anything announces the batch complete.
//
// Thread safety: none needed (pure functions over the caller's memory).
#pragma once

#include <cstddef>

namespace kvbridge::internal {

// Pieces shorter than this are copied with plain memcpy (the store buffer
// drains the same either way and a short copy's destination may be read
// soon).
inline constexpr size_t kStreamCopyMinBytes = 4096;

// Copies `n` bytes from `src` to `dst` (not overlapping). Any alignment and
// length; uses non-temporal stores where the CPU has them and
// n >= kStreamCopyMinBytes, plain memcpy otherwise.
void StreamCopy(void* dst, const void* src, size_t n);

// Orders every StreamCopy store of this thread before its later stores
// (x86 sfence; a no-op where StreamCopy is plain memcpy).
void StreamFence();

}  // namespace kvbridge::internal

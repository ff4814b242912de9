// The box's single-thread memcpy rate, measured by the command that prints a
// figure beside it (demo, bench requests, bench scale): the reference a
// same-host transfer figure is read against, in the same run and under the
// same load.
#pragma once

#include <cstddef>

namespace kvbridge::tools {

// GB/s (10^9 B/s) of memcpy on this thread of `bytes` in `piece`-byte pieces
// from a source region into a destination region, each piece to and from a
// shuffled place (as pages a paged allocator handed out), both regions
// touched first (no page faults timed). Best of `passes`. 0 when it cannot
// allocate.
double ScatteredMemcpyGbps(size_t piece, size_t bytes, int passes = 3);

}  // namespace kvbridge::tools

// The box's single-thread memcpy rate, measured by the command that prints a
// figure beside it (demo, bench requests, bench scale): the reference a
// same-host transfer figure is read against, in the same run and under the
// same load.
#pragma once

#include <cstddef>

#include "engine/plan.h"

namespace kvbridge::tools {

// GB/s (10^9 B/s) of memcpy on this thread of `bytes` in `piece`-byte pieces
// from a source region into a destination region, each piece to and from a
// shuffled place (as pages a paged allocator handed out), both regions
// touched first (no page faults timed). Best of `passes`. 0 when it cannot
// allocate.
double ScatteredMemcpyGbps(size_t piece, size_t bytes, int passes = 3);

// GB/s of memcpy on this thread of the runs the engine plans
// (internal::PlanKvPages) for `slice` from `prefill`'s pages into
// `decode`'s: the same pieces at the same offsets inside each page (one
// token's head slice when the sides hold different heads, a whole page when
// they hold the same). Both layouts hold one layer (K and V buffers; their
// item_len gives the page size, their lengths are ignored); as many pages as
// fit `bytes` on the larger side are allocated, touched, and paired in
// shuffled order. Best of `passes`. 0 when it cannot plan or allocate.
double PlannedMemcpyGbps(internal::RankLayout prefill, internal::RankLayout decode,
                         const internal::HeadSlice& slice, size_t bytes, int passes = 3);

}  // namespace kvbridge::tools

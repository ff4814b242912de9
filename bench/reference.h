// Reference figures measured in the same run as the transport figures, over
// exactly the same scattered block pattern: what a transport path should be
// compared with. Private to bench/.
#pragma once

#include <cstdint>

#include "bench/bench_util.h"
#include "kvbridge/status.h"

namespace kvbridge::bench {

struct Throughput {
  uint64_t bytes = 0;
  uint64_t blocks = 0;
  double seconds = 0;
  double gbps() const { return seconds > 0 ? bytes / seconds / 1e9 : 0; }
  double msg_rate() const { return seconds > 0 ? blocks / seconds : 0; }
};

// Single-thread memcpy of `bytes` in blocks from `src` to `dst` (both at
// least the pattern's region size), following `pattern`.
Throughput MemcpyReference(const uint8_t* src, uint8_t* dst, const BlockPattern& pattern,
                           uint64_t bytes);

// Plain loopback TCP: one thread send()s each block from its place in `src`,
// another recv()s it (MSG_WAITALL) into its place in `dst`, over one
// 127.0.0.1 connection with default socket options.
// Errors: Internal (socket calls failed), DataLoss (bytes differ).
Result<Throughput> SocketReference(const uint8_t* src, uint8_t* dst, const BlockPattern& pattern,
                                   uint64_t bytes);

}  // namespace kvbridge::bench

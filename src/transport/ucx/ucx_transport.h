// UCX transport factory. No UCX type leaves src/transport/ucx.
//
// The transport picks a data path per imported region and logs it: same-host
// shared segment (memcpy), cross-memory attach (process_vm_writev), UCX
// active-message rendezvous, or UCX put (force_put). It owns a progress thread
// and a same-host writer thread; all Transport methods are thread-safe and
// callbacks run on the progress thread, never inside a UCX callback. How the
// ordering guarantee of transport.h is kept: see ucx_transport_impl.h.
// Note: shm_error_handling sets UCX_POSIX_ERROR_HANDLING/UCX_SYSV_ERROR_HANDLING
// in the process environment (unless already set) before UCX reads it.
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include "kvbridge/status.h"
#include "transport/transport.h"

namespace kvbridge::internal {

struct UcxTransportOptions {
  // UCX_TLS for this context ("" = UCX default, e.g. "tcp" to force TCP).
  std::string tls;
  // Enable UCX's shared-memory transports together with peer error handling
  // (UCX_POSIX_ERROR_HANDLING / UCX_SYSV_ERROR_HANDLING).
  bool shm_error_handling = true;
  // Use the same-host paths (shared segment, cross-memory attach) for peers
  // on this host. When false every write goes through UCX.
  bool same_host_paths = true;
  // Keepalive interval for peer failure detection on idle endpoints.
  std::chrono::milliseconds keepalive_interval{200};
  // After doing work the progress thread polls this long before it sleeps:
  // the answer to a message just sent often comes within tens of
  // microseconds, and each sleep-and-wake costs about as much (1-page
  // requests: ~55 -> ~35 us above the copy on a 2-core VM). 0: sleep at once.
  std::chrono::microseconds progress_spin{50};
  // Blocks at least this large are sent with rendezvous; smaller ones eager.
  size_t rndv_threshold = 64 * 1024;
  // Over a tcp lane, consecutive writes into one remote region (scattered
  // pages) travel together in one eager message of up to this many bytes
  // and kMaxGatherPieces pieces (0: one message per write). Writes this
  // large go alone, as does every write over an RDMA lane.
  // KVBRIDGE_UCX_GATHER=0 turns it off (to compare).
  size_t gather_bytes = 1 << 20;
  // Same-host batches up to this many bytes are copied on the progress
  // thread (lower latency); larger ones on the writer thread (0: all).
  size_t inline_copy_bytes = 4 << 20;
  // Writer threads for larger same-host batches (at least 1), and the batch
  // size above which a batch is split into parts copied at once (by the
  // writers, plus the progress thread for a batch it copies inline).
  int writer_threads = 2;
  size_t split_copy_bytes = 1 << 20;
  // Cross-host writes with ucp_put_nbx + flush instead of active messages
  // (for hosts with a real RMA lane). Also set by KVBRIDGE_UCX_PATH=put.
  bool force_put = false;
  // Target side: incoming write batches open at once per sender endpoint;
  // a block that would open more is refused (ResourceExhausted), so a flood
  // of half-sent batches cannot grow the target's state.
  size_t max_incoming_batches_per_peer = 4096;
  // How long an import waits for the owner's same-host socket.
  std::chrono::milliseconds same_host_timeout{2000};
  // RevokeGrant waits at most this long for receives admitted under the
  // grant to finish (DeadlineExceeded after it).
  std::chrono::milliseconds revoke_timeout{5000};
  // Name used in logs ("prefill tp1").
  std::string name = "ucx";
};

Result<std::unique_ptr<Transport>> CreateUcxTransport(const UcxTransportOptions& options);

}  // namespace kvbridge::internal

// Move-only RAII owners of UCX handles. Private to src/transport/ucx.
//
// Each owner releases exactly one UCX object. Endpoints are different: closing
// one is asynchronous and needs the worker progressed, so UcpEp hands its
// handle to the caller (Release) and the transport drives the close request.
//
// Thread safety: none; the transport's progress thread owns every handle
// except UcpContext/UcpWorker, which are created and destroyed by the owner of
// the transport while the progress thread is not running.
#pragma once

#include <ucp/api/ucp.h>

#include <string>
#include <string_view>
#include <utility>

#include "kvbridge/status.h"

namespace kvbridge::internal::ucx {

// "UCX <what>: <ucs_status_string>" with a code chosen from the UCX status.
Status FromUcs(ucs_status_t status, std::string_view what);

template <typename H, void (*Release)(H)>
class UniqueHandle {
 public:
  UniqueHandle() = default;
  explicit UniqueHandle(H h) : h_(h) {}
  UniqueHandle(UniqueHandle&& o) noexcept : h_(std::exchange(o.h_, nullptr)) {}
  UniqueHandle& operator=(UniqueHandle&& o) noexcept {
    if (this != &o) {
      reset();
      h_ = std::exchange(o.h_, nullptr);
    }
    return *this;
  }
  UniqueHandle(const UniqueHandle&) = delete;
  UniqueHandle& operator=(const UniqueHandle&) = delete;
  ~UniqueHandle() { reset(); }

  H get() const { return h_; }
  explicit operator bool() const { return h_ != nullptr; }
  void reset() {
    if (h_ != nullptr) Release(std::exchange(h_, nullptr));
  }

 private:
  H h_ = nullptr;
};

void ReleaseContext(ucp_context_h h);
void ReleaseWorker(ucp_worker_h h);
void ReleaseRkey(ucp_rkey_h h);
void ReleaseConfig(ucp_config_t* h);

using UcpContext = UniqueHandle<ucp_context_h, ReleaseContext>;
using UcpWorker = UniqueHandle<ucp_worker_h, ReleaseWorker>;
using UcpRkey = UniqueHandle<ucp_rkey_h, ReleaseRkey>;
using UcpConfig = UniqueHandle<ucp_config_t*, ReleaseConfig>;

// A registered memory region; unmapped from its context on destruction.
class UcpMem {
 public:
  UcpMem() = default;
  UcpMem(ucp_context_h ctx, ucp_mem_h memh) : ctx_(ctx), memh_(memh) {}
  UcpMem(UcpMem&& o) noexcept
      : ctx_(std::exchange(o.ctx_, nullptr)), memh_(std::exchange(o.memh_, nullptr)) {}
  UcpMem& operator=(UcpMem&& o) noexcept;
  UcpMem(const UcpMem&) = delete;
  UcpMem& operator=(const UcpMem&) = delete;
  ~UcpMem() { reset(); }

  ucp_mem_h get() const { return memh_; }
  void reset();
  // The packed remote key (ucp_rkey_pack) as bytes.
  Result<std::string> PackRkey() const;

 private:
  ucp_context_h ctx_ = nullptr;
  ucp_mem_h memh_ = nullptr;
};

// An endpoint that has not been closed yet. The destructor force-closes and
// frees the close request without waiting (only for error paths: normal
// shutdown goes through Release + ucp_ep_close_nbx + progress).
class UcpEp {
 public:
  UcpEp() = default;
  explicit UcpEp(ucp_ep_h ep) : ep_(ep) {}
  UcpEp(UcpEp&& o) noexcept : ep_(std::exchange(o.ep_, nullptr)) {}
  UcpEp& operator=(UcpEp&& o) noexcept;
  UcpEp(const UcpEp&) = delete;
  UcpEp& operator=(const UcpEp&) = delete;
  ~UcpEp();

  ucp_ep_h get() const { return ep_; }
  // Gives up ownership; the caller must close the endpoint.
  ucp_ep_h Release() { return std::exchange(ep_, nullptr); }

 private:
  ucp_ep_h ep_ = nullptr;
};

// A worker of `context` for the progress thread alone (single-threaded
// mode); `efd` gets its wakeup fd, or -1 when it has none.
Result<UcpWorker> CreateWorker(ucp_context_h context, int* efd);
// This worker's address as bytes; with `network_only`, of its network
// devices only (UCP_WORKER_ADDRESS_FLAG_NET_ONLY; empty when it has none).
Result<std::string> WorkerAddress(ucp_worker_h worker, bool network_only = false);
// The most GatherPieces a data AM's header may carry on this worker (its
// max_am_header, at most kMaxGatherPieces); 0 when it takes none.
size_t MaxGatherPieces(ucp_worker_h worker);

// Sets the UCX environment variables kvbridge depends on (error handling on
// the shared-memory lanes when `tls` may use them and `shm_error_handling`,
// non-blocking tcp connects, 256 KiB tcp receive segments), each unless the
// user set it.
void SetEnvironmentDefaults(const std::string& tls, bool shm_error_handling);

}  // namespace kvbridge::internal::ucx

namespace kvbridge::internal::ucx {

// The UCX transports of `ep`'s bulk-data lanes (am_bw / rma_bw), from
// ucp_ep_print_info, e.g. "tcp"; several are joined by ','. Empty when UCX
// prints no lanes. Call on the thread that progresses the endpoint.
std::string EndpointWire(ucp_ep_h ep);

// Whether UCX_TLS `tls` lets UCX pick a shared-memory transport (posix,
// sysv, cma, ...): "" and "^..." (all but some) may.
bool MayUseSharedMemory(std::string_view tls);

}  // namespace kvbridge::internal::ucx

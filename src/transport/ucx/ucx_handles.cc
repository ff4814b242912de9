#include "transport/ucx/ucx_handles.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <set>
#include <string>

#include "transport/ucx/ucx_blobs.h"

namespace kvbridge::internal::ucx {

Status FromUcs(ucs_status_t status, std::string_view what) {
  std::string msg = "UCX " + std::string(what) + ": " + ucs_status_string(status);
  switch (status) {
    case UCS_OK:
      return Status::Ok();
    case UCS_ERR_INVALID_PARAM:
    case UCS_ERR_INVALID_ADDR:
      return InvalidArgumentError(std::move(msg));
    case UCS_ERR_NO_MEMORY:
    case UCS_ERR_NO_RESOURCE:
    case UCS_ERR_EXCEEDS_LIMIT:
      return ResourceExhaustedError(std::move(msg));
    case UCS_ERR_UNSUPPORTED:
    case UCS_ERR_NOT_IMPLEMENTED:
      return UnimplementedError(std::move(msg));
    case UCS_ERR_CANCELED:
      return AbortedError(std::move(msg));
    case UCS_ERR_TIMED_OUT:
    case UCS_ERR_ENDPOINT_TIMEOUT:
    case UCS_ERR_CONNECTION_RESET:
    case UCS_ERR_UNREACHABLE:
    case UCS_ERR_REJECTED:
    case UCS_ERR_NOT_CONNECTED:
    case UCS_ERR_IO_ERROR:
    case UCS_ERR_NO_DEVICE:
      return UnavailableError(std::move(msg));
    default:
      return InternalError(std::move(msg));
  }
}

void ReleaseContext(ucp_context_h h) { ucp_cleanup(h); }
void ReleaseWorker(ucp_worker_h h) { ucp_worker_destroy(h); }
void ReleaseRkey(ucp_rkey_h h) { ucp_rkey_destroy(h); }
void ReleaseConfig(ucp_config_t* h) { ucp_config_release(h); }

UcpMem& UcpMem::operator=(UcpMem&& o) noexcept {
  if (this != &o) {
    reset();
    ctx_ = std::exchange(o.ctx_, nullptr);
    memh_ = std::exchange(o.memh_, nullptr);
  }
  return *this;
}

void UcpMem::reset() {
  if (memh_ != nullptr) ucp_mem_unmap(ctx_, std::exchange(memh_, nullptr));
  ctx_ = nullptr;
}

Result<std::string> UcpMem::PackRkey() const {
  void* buf = nullptr;
  size_t size = 0;
  ucs_status_t st = ucp_rkey_pack(ctx_, memh_, &buf, &size);
  if (st != UCS_OK) return FromUcs(st, "rkey pack");
  std::string out(static_cast<const char*>(buf), size);
  ucp_rkey_buffer_release(buf);
  return out;
}

UcpEp& UcpEp::operator=(UcpEp&& o) noexcept {
  if (this != &o) {
    UcpEp dying(std::move(*this));
    ep_ = std::exchange(o.ep_, nullptr);
  }
  return *this;
}

UcpEp::~UcpEp() {
  if (ep_ == nullptr) return;
  ucp_request_param_t param{};
  param.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
  param.flags = UCP_EP_CLOSE_FLAG_FORCE;
  ucs_status_ptr_t req = ucp_ep_close_nbx(ep_, &param);
  if (UCS_PTR_IS_PTR(req)) ucp_request_free(req);
}

Result<UcpWorker> CreateWorker(ucp_context_h context, int* efd) {
  ucp_worker_params_t wp{};
  wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
  wp.thread_mode = UCS_THREAD_MODE_SINGLE;  // only the progress thread uses it
  ucp_worker_h worker = nullptr;
  ucs_status_t s = ucp_worker_create(context, &wp, &worker);
  if (s != UCS_OK) return FromUcs(s, "worker create");
  UcpWorker out(worker);
  if (ucp_worker_get_efd(worker, efd) != UCS_OK) *efd = -1;
  return out;
}

Result<std::string> WorkerAddress(ucp_worker_h worker, bool network_only) {
  ucp_worker_attr_t attr{};
  attr.field_mask = UCP_WORKER_ATTR_FIELD_ADDRESS | UCP_WORKER_ATTR_FIELD_ADDRESS_FLAGS;
  attr.address_flags = network_only ? UCP_WORKER_ADDRESS_FLAG_NET_ONLY : 0;
  ucs_status_t st = ucp_worker_query(worker, &attr);
  if (st != UCS_OK) return FromUcs(st, "worker address");
  std::string out(reinterpret_cast<const char*>(attr.address), attr.address_length);
  ucp_worker_release_address(worker, attr.address);
  return out;
}

// UCT transport settings are read from the environment when interfaces
// open; overwrite=0 keeps an explicit user choice.
void SetEnvironmentDefaults(const std::string& tls, bool shm_error_handling) {
  const bool shm_tls = tls.empty() || tls.find("shm") != std::string::npos ||
                       tls.find("posix") != std::string::npos ||
                       tls.find("sysv") != std::string::npos ||
                       tls.find("all") != std::string::npos;
  if (shm_error_handling && shm_tls) {
    setenv("UCX_POSIX_ERROR_HANDLING", "y", 0);
    setenv("UCX_SYSV_ERROR_HANDLING", "y", 0);
  }
  // UCX 1.13 connects TCP endpoints with a blocking connect() inside
  // ucp_ep_create on the progress thread: between two namespaces, 1 ms when
  // the peer answers, 1 s per lost SYN, 135 s when SYNs are dropped, and no
  // message moves meanwhile. Non-blocking, a failure reaches the endpoint's
  // error handler like any other.
  setenv("UCX_TCP_CONN_NB", "y", 0);
  // UCX's tcp lane receives into 64 KiB segments by default: a gathered
  // message of up to gather_bytes (1 MiB) then arrives in 16+ fragments,
  // each received, reassembled and handed over on its own. In 256 KiB
  // segments, alternating A/B runs of `kvbridge bench requests --path tcp
  // --check-outside-window` moved 4096-token requests at 3.4-3.5 GB/s
  // against 1.2-2.7 (docs/benchmarks.md, "UCX's tcp receive segments"). The
  // receive pool grows 8 segments (2 MiB) at a time instead of 512 KiB.
  setenv("UCX_TCP_RX_SEG_SIZE", "256K", 0);
}

size_t MaxGatherPieces(ucp_worker_h worker) {
  ucp_worker_attr_t attr{};
  attr.field_mask = UCP_WORKER_ATTR_FIELD_MAX_AM_HEADER;
  if (ucp_worker_query(worker, &attr) != UCS_OK || attr.max_am_header <= sizeof(DataHeader))
    return 0;
  return std::min(kMaxGatherPieces,
                  (attr.max_am_header - sizeof(DataHeader)) / sizeof(GatherPiece));
}

}  // namespace kvbridge::internal::ucx

namespace kvbridge::internal::ucx {

// UCX 1.13 has no ucp_ep_query for transports; its printed endpoint
// configuration has one line per lane: "lane[1]:  2:tcp/eth0.0 md[1] ...
// am am_bw#0 wireup". The transport is the word between "N:" and "/".
std::string EndpointWire(ucp_ep_h ep) {
  char* text = nullptr;
  size_t size = 0;
  FILE* f = open_memstream(&text, &size);
  if (f == nullptr) return {};
  ucp_ep_print_info(ep, f);
  fclose(f);
  std::string all(text != nullptr ? text : "", size);
  free(text);
  std::set<std::string> bulk, any;
  size_t start = 0;
  while (start < all.size()) {
    size_t end = all.find('\n', start);
    if (end == std::string::npos) end = all.size();
    std::string_view line(all.data() + start, end - start);
    start = end + 1;
    size_t lane = line.find("lane[");
    if (lane == std::string_view::npos) continue;
    size_t colon = line.find(':', line.find(']', lane) + 2);
    size_t slash = colon == std::string_view::npos ? colon : line.find('/', colon);
    if (slash == std::string_view::npos) continue;
    std::string_view tl = line.substr(colon + 1, slash - colon - 1);
    if (tl.empty() || tl.find(' ') != std::string_view::npos) continue;
    any.emplace(tl);
    if (line.find("am_bw") != std::string_view::npos ||
        line.find("rma_bw") != std::string_view::npos)
      bulk.emplace(tl);
  }
  const std::set<std::string>& use = bulk.empty() ? any : bulk;
  std::string out;
  for (const std::string& t : use) out += (out.empty() ? "" : ",") + t;
  return out;
}

bool MayUseSharedMemory(std::string_view tls) {
  if (tls.empty() || tls.front() == '^') return true;
  for (size_t start = 0; start <= tls.size();) {
    size_t end = tls.find(',', start);
    if (end == std::string_view::npos) end = tls.size();
    const std::string_view name = tls.substr(start, end - start);
    for (std::string_view shm : {"all", "sm", "shm", "mm", "posix", "sysv", "xpmem", "cma", "knem"})
      if (name == shm) return true;
    start = end + 1;
  }
  return false;
}

}  // namespace kvbridge::internal::ucx

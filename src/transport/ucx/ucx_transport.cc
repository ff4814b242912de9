// Lifecycle, threads, registration, connection and import. The data path
// (batches, messages, active-message handlers, failure) is in ucx_datapath.cc.
#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <future>

#include "common/log.h"
#include "common/process.h"
#include "transport/ucx/ucx_transport_impl.h"

namespace kvbridge::internal {

Result<std::unique_ptr<Transport>> CreateUcxTransport(const UcxTransportOptions& options) {
  return ucx::UcxTransport::Create(options);
}

namespace ucx {
namespace {

void EpErrorCallback(void* arg, ucp_ep_h, ucs_status_t status) {
  auto* peer = static_cast<Peer*>(arg);
  peer->transport->OnEpError(peer, status);
}

ucs_status_t DataAmCallback(void* arg, const void* header, size_t header_length, void* data,
                            size_t length, const ucp_am_recv_param_t* param) {
  return static_cast<UcxTransport*>(arg)->OnDataAm(header, header_length, data, length, param);
}

// Our messages and ACKs travel eager. Sent by rendezvous, `data` would be
// UCX's descriptor of the message, not its bytes: refused unread.
ucs_status_t MessageAmCallback(void* arg, const void*, size_t, void* data, size_t length,
                               const ucp_am_recv_param_t* param) {
  auto* t = static_cast<UcxTransport*>(arg);
  if ((param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) != 0) return t->RefuseRendezvous("message");
  return t->OnMessageAm(data, length);
}

ucs_status_t AckAmCallback(void* arg, const void* header, size_t header_length, void* data,
                           size_t length, const ucp_am_recv_param_t* param) {
  auto* t = static_cast<UcxTransport*>(arg);
  if ((param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) != 0) return t->RefuseRendezvous("ACK");
  return t->OnAckAm(header, header_length, data, length);
}

Status SetAmHandler(ucp_worker_h worker, unsigned id, ucp_am_recv_callback_t cb, void* arg) {
  ucp_am_handler_param_t p{};
  p.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_FLAGS |
                 UCP_AM_HANDLER_PARAM_FIELD_CB | UCP_AM_HANDLER_PARAM_FIELD_ARG;
  p.id = id;
  p.flags = UCP_AM_FLAG_WHOLE_MSG;
  p.cb = cb;
  p.arg = arg;
  return FromUcs(ucp_worker_set_am_recv_handler(worker, &p), "set AM handler");
}

}  // namespace

UcxTransport::UcxTransport(const UcxTransportOptions& options) : options_(options) {
  const char* env = std::getenv("KVBRIDGE_UCX_PATH");
  force_put_ = options.force_put || (env != nullptr && std::string_view(env) == "put");
}

Result<std::unique_ptr<Transport>> UcxTransport::Create(const UcxTransportOptions& options) {
  std::unique_ptr<UcxTransport> t(new UcxTransport(options));
  Status st = t->Init();
  if (!st.ok()) {
    KVB_LOG_ERROR("ucx transport {}: {}", options.name, st.ToString());
    return st;
  }
  return std::unique_ptr<Transport>(std::move(t));
}

Status UcxTransport::Init() {
  SetEnvironmentDefaults(options_.tls, options_.shm_error_handling);
  ucp_config_t* raw_config = nullptr;
  ucs_status_t s = ucp_config_read(nullptr, nullptr, &raw_config);
  if (s != UCS_OK) return FromUcs(s, "config read");
  UcpConfig config(raw_config);
  auto modify = [&](const char* name, const std::string& value) -> Status {
    return FromUcs(ucp_config_modify(config.get(), name, value.c_str()),
                   std::string("config ") + name + "=" + value);
  };
  if (!options_.tls.empty()) KVB_RETURN_IF_ERROR(modify("TLS", options_.tls));
  KVB_RETURN_IF_ERROR(
      modify("KEEPALIVE_INTERVAL", std::to_string(options_.keepalive_interval.count()) + "ms"));
  // The ordering argument in ucx_transport_impl.h relies on one eager lane.
  KVB_RETURN_IF_ERROR(modify("MAX_EAGER_LANES", "1"));

  ucp_params_t params{};
  params.field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_NAME;
  params.features = UCP_FEATURE_RMA | UCP_FEATURE_AM | UCP_FEATURE_WAKEUP;
  params.name = options_.name.c_str();
  ucp_context_h ctx = nullptr;
  s = ucp_init(&params, config.get(), &ctx);
  if (s != UCS_OK) return FromUcs(s, "init");
  context_ = UcpContext(ctx);

  KVB_ASSIGN_OR_RETURN(worker_, CreateWorker(context_.get(), &worker_efd_));
  KVB_ASSIGN_OR_RETURN(net_worker_, CreateWorker(context_.get(), &net_worker_efd_));
  KVB_ASSIGN_OR_RETURN(out_worker_, CreateWorker(context_.get(), &out_worker_efd_));
  const char* gather = std::getenv("KVBRIDGE_UCX_GATHER");
  if (options_.gather_bytes > 0 && !(gather != nullptr && std::string_view(gather) == "0"))
    max_gather_pieces_ =
        std::min({MaxGatherPieces(worker_.get()), MaxGatherPieces(net_worker_.get()),
                  MaxGatherPieces(out_worker_.get())});
  // Data and messages arrive on the two workers peers connect to; ACKs come
  // back on out_worker_ (a target replies on the endpoint data came from).
  for (ucp_worker_h w : {worker_.get(), net_worker_.get(), out_worker_.get()}) {
    KVB_RETURN_IF_ERROR(SetAmHandler(w, kAmData, DataAmCallback, this));
    KVB_RETURN_IF_ERROR(SetAmHandler(w, kAmMessage, MessageAmCallback, this));
    KVB_RETURN_IF_ERROR(SetAmHandler(w, kAmAck, AckAmCallback, this));
  }

  KVB_ASSIGN_OR_RETURN(std::string worker_address, WorkerAddress(worker_.get()));
  KVB_ASSIGN_OR_RETURN(std::string network_address, WorkerAddress(net_worker_.get(), true));
  address_ = EncodeAddress(AddressBlob{ThisHost(), std::move(worker_address), network_address});
  network_address_ = network_address.empty()
                         ? address_
                         : EncodeAddress(AddressBlob{ThisHost(), network_address, network_address});

  if (options_.same_host_paths) {
    auto exporter = SameHostExporter::Start();
    if (exporter.ok()) {
      exporter_ = std::move(*exporter);
    } else {
      KVB_LOG_WARN("ucx transport {}: no same-host socket, peers will write over UCX: {}",
                   options_.name, exporter.status().ToString());
    }
  }
  wake_fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (wake_fd_ < 0) return ResourceExhaustedError("eventfd failed");
  progress_thread_ = std::thread([this] { ProgressLoop(); });
  progress_id_ = progress_thread_.get_id();
  for (int i = 0; i < std::max(1, options_.writer_threads); ++i)
    writer_threads_.emplace_back([this] { WriterLoop(); });
  KVB_LOG_INFO("ucx transport {}: up (tls={}, same_host_paths={}, keepalive={}ms, wakeup={})",
               options_.name, options_.tls.empty() ? "default" : options_.tls,
               options_.same_host_paths, options_.keepalive_interval.count(), Wakeup());
  return Status::Ok();
}

UcxTransport::~UcxTransport() {
  if (progress_thread_.joinable()) {
    RunSync([this] {
      std::vector<std::shared_ptr<Peer>> peers;
      {
        std::lock_guard<std::mutex> lock(mu_);
        for (auto& [id, peer] : peers_) peers.push_back(peer);
        peers_.clear();
      }
      for (auto& peer : peers) ClosePeer(peer, peer->failed);
      for (auto& peer : lingering_) ClosePeer(peer, peer->failed);
      lingering_.clear();
    });
    stopping_ = true;
    Post([] {});
    progress_thread_.join();
  }
  if (!writer_threads_.empty()) {
    {
      std::lock_guard<std::mutex> lock(writer_mu_);
      writer_stop_ = true;
    }
    writer_cv_.notify_all();
    for (std::thread& t : writer_threads_) t.join();
    writer_threads_.clear();
  }
  // Writer completions posted after the progress thread stopped: their
  // batches belong to closed peers and complete with Aborted here.
  RunCommands();
  for (auto& c : closing_) ucp_request_free(c.request);
  closing_.clear();
  {
    std::lock_guard<std::mutex> lock(mu_);
    regions_.clear();  // ucp_mem_unmap before the context goes
  }
  out_worker_.reset();
  net_worker_.reset();
  worker_.reset();
  context_.reset();
  if (wake_fd_ >= 0) close(wake_fd_);
}

void UcxTransport::Post(std::function<void()> fn, const char* what) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    commands_.push_back(Command{std::move(fn), what});
  }
  uint64_t one = 1;
  [[maybe_unused]] ssize_t n = write(wake_fd_, &one, sizeof(one));
}

void UcxTransport::RunSync(const std::function<void()>& fn) {
  if (OnProgressThread()) {
    fn();
    return;
  }
  std::promise<void> done;
  Post(
      [&] {
        fn();
        done.set_value();
      },
      "a call another thread waits for");
  done.get_future().wait();
}

bool UcxTransport::RunCommands() {
  std::deque<Command> cmds;
  {
    std::lock_guard<std::mutex> lock(mu_);
    cmds.swap(commands_);
  }
  for (auto& cmd : cmds) {
    StepWatch::Scope step(step_, cmd.what, std::chrono::steady_clock::now());
    cmd.fn();
  }
  return !cmds.empty();
}

void UcxTransport::ProgressLoop() {
  NameThisThread("kvb-ucx-prog");
  using Clock = std::chrono::steady_clock;
  // Keepalive and close timeouts need the worker progressed now and then.
  const int idle_ms =
      static_cast<int>(std::clamp<int64_t>(options_.keepalive_interval.count() / 2, 1, 100));
  std::optional<Clock::time_point> stop_deadline;
  // After work, keep polling a little before sleeping (progress_spin).
  const std::chrono::microseconds spin = options_.progress_spin;
  Clock::time_point last_work = Clock::now();
  for (;;) {
    bool did = RunCommands();
    // One clock read per pass, as before the step was named: the step's
    // start, and the time the spin below is judged on (bench progress-step).
    const Clock::time_point now = Clock::now();
    {
      StepWatch::Scope step(step_, "UCX progress (taking arriving data and acks)", now);
      for (ucp_worker_h w : {worker_.get(), net_worker_.get(), out_worker_.get()}) {
        progressing_ = w;
        did |= ucp_worker_progress(w) != 0;
      }
    }
    PollClosing();
    if (did) {
      last_work = now;
    } else if (spin.count() > 0 && !stopping_ && now - last_work < spin) {
      std::this_thread::yield();
      continue;
    }
    if (stopping_) {
      if (!stop_deadline) stop_deadline = Clock::now() + std::chrono::seconds(3);
      bool busy = !closing_.empty() || active_batches_ > 0;
      if (!busy || Clock::now() > *stop_deadline) break;
      continue;
    }
    if (did) continue;
    const bool wakeup = Wakeup();
    if (wakeup && (ucp_worker_arm(worker_.get()) == UCS_ERR_BUSY ||
                   ucp_worker_arm(net_worker_.get()) == UCS_ERR_BUSY ||
                   ucp_worker_arm(out_worker_.get()) == UCS_ERR_BUSY))
      continue;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!commands_.empty()) continue;
    }
    pollfd fds[4] = {{wake_fd_, POLLIN, 0},
                     {worker_efd_, POLLIN, 0},
                     {net_worker_efd_, POLLIN, 0},
                     {out_worker_efd_, POLLIN, 0}};
    poll(fds, wakeup ? 4 : 1, wakeup ? idle_ms : 1);
    uint64_t drained;
    [[maybe_unused]] ssize_t n = read(wake_fd_, &drained, sizeof(drained));
  }
  progress_done_ = true;
}

void UcxTransport::PollClosing() {
  for (size_t i = 0; i < closing_.size();) {
    if (ucp_request_check_status(closing_[i].request) != UCS_INPROGRESS) {
      ucp_request_free(closing_[i].request);
      closing_[i] = std::move(closing_.back());
      closing_.pop_back();
    } else {
      ++i;
    }
  }
}

void UcxTransport::WriterLoop() {
  NameThisThread("kvb-ucx-writer");
  for (;;) {
    std::function<void()> job;
    {
      std::unique_lock<std::mutex> lock(writer_mu_);
      writer_cv_.wait(lock, [&] { return writer_stop_ || !writer_jobs_.empty(); });
      if (writer_jobs_.empty()) return;
      job = std::move(writer_jobs_.front());
      writer_jobs_.pop_front();
    }
    job();
  }
}

void UcxTransport::PostToWriter(std::function<void()> fn) {
  {
    std::lock_guard<std::mutex> lock(writer_mu_);
    writer_jobs_.push_back(std::move(fn));
  }
  writer_cv_.notify_one();
}

Result<RegisteredRegion> UcxTransport::RegisterMemory(void* addr, size_t length, MemoryKind kind) {
  if (addr == nullptr || length == 0) {
    return InvalidArgumentError("RegisterMemory: null address or zero length");
  }
  ucp_mem_map_params_t mp{};
  mp.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH |
                  UCP_MEM_MAP_PARAM_FIELD_MEMORY_TYPE;
  mp.address = addr;
  mp.length = length;
  mp.memory_type = kind == MemoryKind::kVram ? UCS_MEMORY_TYPE_CUDA : UCS_MEMORY_TYPE_HOST;
  auto region = std::make_unique<LocalRegion>();
  region->addr = static_cast<uint8_t*>(addr);
  region->length = length;
  region->kind = kind;
  Status st;
  std::string packed;
  RunSync([&] {
    ucp_mem_h memh = nullptr;
    ucs_status_t s = ucp_mem_map(context_.get(), &mp, &memh);
    if (s != UCS_OK) {
      st = FromUcs(s, std::string("mem map of ") + std::string(MemoryKindName(kind)) + " memory (" +
                          std::to_string(length) + " bytes)");
      if (kind == MemoryKind::kVram) {
        st = UnimplementedError("VRAM registration needs UCX with CUDA support: " + st.message());
      }
      return;
    }
    region->mem = UcpMem(context_.get(), memh);
    auto rkey = region->mem.PackRkey();
    if (!rkey.ok()) {
      st = rkey.status();
      return;
    }
    packed = std::move(*rkey);
  });
  if (!st.ok()) {
    KVB_LOG_ERROR("ucx transport {}: RegisterMemory: {}", options_.name, st.ToString());
    return st;
  }
  KVB_ASSIGN_OR_RETURN(region->token, NewRegionToken());
  RemoteKeyBlob blob;
  blob.token = region->token;
  blob.owner = ThisHost();
  blob.base = reinterpret_cast<uint64_t>(addr);
  blob.length = length;
  blob.kind = kind;
  blob.packed_rkey = std::move(packed);
  ExportedRegion exported{0, blob.token, blob.base, blob.length, std::nullopt};
  if (kind == MemoryKind::kDram) exported.segment = FindSharedSegment(addr, length);
  RegisteredRegion out;
  {
    std::lock_guard<std::mutex> lock(mu_);
    out.id = blob.region_id = exported.region_id = next_region_id_++;
    regions_[out.id] = std::move(region);
  }
  if (exporter_ && kind == MemoryKind::kDram) {
    Status added = exporter_->Add(exported);
    if (added.ok()) {
      blob.same_host_socket = exporter_->name();
      blob.shareable = exported.segment.has_value();
    } else {
      KVB_LOG_WARN("ucx transport {}: region {} not offered to same-host peers: {}", options_.name,
                   out.id, added.ToString());
    }
  }
  out.remote_key = EncodeRemoteKey(blob);
  return out;
}

Status UcxTransport::DeregisterMemory(RegionId id) {
  std::unique_ptr<LocalRegion> region;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = regions_.find(id);
    if (it == regions_.end())
      return NotFoundError("DeregisterMemory: unknown region " + std::to_string(id));
    region = std::move(it->second);
    regions_.erase(it);
  }
  if (exporter_) exporter_->Remove(id);  // no new same-host grants
  RunSync([&] { region.reset(); });      // ucp_mem_unmap on the progress thread
  return Status::Ok();
}

std::shared_ptr<Peer> UcxTransport::FindPeerLocked(PeerId id) const {
  auto it = peers_.find(id);
  return it == peers_.end() ? nullptr : it->second;
}

Result<PeerId> UcxTransport::ConnectTo(std::string_view peer_address, bool network_only) {
  KVB_ASSIGN_OR_RETURN(AddressBlob blob, DecodeAddress(peer_address));
  auto peer = std::make_shared<Peer>();
  peer->host = blob.host;
  peer->name = "host " + blob.host.host + " pid " + std::to_string(blob.host.pid);
  peer->transport = this;
  peer->opened = std::chrono::steady_clock::now();
  // On out_worker_ (ucx_transport_impl.h) unless shared memory may carry it.
  const bool paired = SameHost(blob.host, ThisHost()) && MayUseSharedMemory(options_.tls);
  ucp_worker_h maker = paired ? worker_.get() : out_worker_.get();
  ucp_worker_h net_maker = paired ? net_worker_.get() : out_worker_.get();
  Status st;
  RunSync([&] {
    ucp_ep_params_t ep{};
    ep.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                    UCP_EP_PARAM_FIELD_ERR_HANDLER;
    ep.err_mode = UCP_ERR_HANDLING_MODE_PEER;
    ep.err_handler.cb = EpErrorCallback;
    ep.err_handler.arg = peer.get();
    ucp_ep_h handle = nullptr;
    ucs_status_t s = UCS_ERR_UNREACHABLE;
    if (network_only && !blob.network_address.empty()) {
      ep.address = reinterpret_cast<const ucp_address_t*>(blob.network_address.data());
      s = ucp_ep_create(net_maker, &ep, &handle);
      if (s != UCS_OK)
        KVB_LOG_WARN("ucx transport {}: no network endpoint to {} ({}); connecting as usual",
                     options_.name, peer->name, ucs_status_string(s));
    }
    if (s != UCS_OK) {
      ep.address = reinterpret_cast<const ucp_address_t*>(blob.worker_address.data());
      s = ucp_ep_create(maker, &ep, &handle);
    }
    if (s != UCS_OK) {
      st = FromUcs(s, "connect to " + peer->name);
      if (st.code() != StatusCode::kInvalidArgument) st = UnavailableError(st.message());
      return;
    }
    peer->ep = UcpEp(handle);
    // Unguessable, so that nobody else can inject ACKs for our batches.
    do {
      auto connection = SecureRandomU64();
      if (!connection.ok()) {
        st = connection.status();
        return;
      }
      peer->connection = *connection;
    } while (peers_by_connection_.count(peer->connection) != 0);
    peers_by_connection_[peer->connection] = peer;
  });
  if (!st.ok()) {
    KVB_LOG_ERROR("ucx transport {}: {}", options_.name, st.ToString());
    return st;
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    peer->id = next_peer_id_++;
    peers_[peer->id] = peer;
  }
  KVB_LOG_INFO("ucx transport {}: connected to peer {} ({}{}) as peer id {}", options_.name,
               peer->name, SameHost(peer->host, ThisHost()) ? "same host" : "remote host",
               network_only ? ", messages over the network" : "", peer->id);
  return peer->id;
}

Result<DataPath> UcxTransport::ChoosePath(const Peer& peer, ImportedRegion& region) const {
  const RemoteKeyBlob& b = region.blob;
  const char* why = "remote host";
  // A per-peer grant (GrantRegion) has no packed rkey: active messages,
  // each admitted by the owner, so that the owner can revoke them; and, for
  // a same-host mapping grant (a socket named), the owner's own grant of
  // the memory, tried as for the region's key.
  if (b.packed_rkey.empty() && b.same_host_socket.empty()) return DataPath::kUcxRendezvous;
  const bool put = force_put_ && !b.packed_rkey.empty();
  const DataPath ucx_path = put ? DataPath::kUcxPut : DataPath::kUcxRendezvous;
  if (b.kind == MemoryKind::kVram) {
    why = "VRAM region";
  } else if (!options_.same_host_paths) {
    why = "same-host paths disabled";
  } else if (SameHost(peer.host, ThisHost()) && b.same_host_socket.empty()) {
    why = "same host, the owner offers no same-host socket";
  } else if (SameHost(peer.host, ThisHost())) {
    // Where we may write comes from the owner over its socket, never from
    // the descriptor: see same_host.h.
    auto grant = RequestSameHostGrant(b.same_host_socket, b.owner.pid, b.region_id, b.token, b.base,
                                      b.length, options_.same_host_timeout);
    if (!grant.ok() && grant.status().code() != StatusCode::kUnavailable) {
      Status st = grant.status().WithContext("ImportRegion from " + peer.name);
      KVB_LOG_ERROR("ucx transport {}: {}", options_.name, st.ToString());
      return st;
    }
    if (!grant.ok()) {
      KVB_LOG_WARN("ucx transport {}: same-host grant from peer {} unavailable: {}", options_.name,
                   peer.name, grant.status().ToString());
      why = "same host, owner's socket unreachable";
    } else if (grant->segment) {
      region.segment = std::move(grant->segment);
      region.segment_offset = grant->segment_offset;
      return DataPath::kSharedMemory;
    } else {
      Status probe = ProbeCrossMemoryAttach(grant->pid, b.base);
      if (probe.ok()) {
        region.cma_pid = grant->pid;
        return DataPath::kCrossMemoryAttach;
      }
      KVB_LOG_WARN("ucx transport {}: cross-memory attach to peer {} unavailable: {}",
                   options_.name, peer.name, probe.ToString());
      why = "same host, no shared segment or cross-memory attach";
    }
  }
  // Debug: the connector's one line per peer names the path (issue 14).
  KVB_LOG_DEBUG("ucx transport {}: UCX path for peer {} ({})", options_.name, peer.name, why);
  return ucx_path;
}

Result<RemoteRegionId> UcxTransport::ImportRegion(PeerId peer_id, std::string_view remote_key) {
  KVB_ASSIGN_OR_RETURN(RemoteKeyBlob blob, DecodeRemoteKey(remote_key));
  std::shared_ptr<Peer> peer;
  {
    std::lock_guard<std::mutex> lock(mu_);
    peer = FindPeerLocked(peer_id);
    if (!peer) return NotFoundError("ImportRegion: unknown peer " + std::to_string(peer_id));
    if (peer->dead) return UnavailableError(peer->terminal.message());
    // One import (one unpacked rkey) per (endpoint, region): reuse it.
    for (const auto& [id, r] : peer->regions) {
      // A descriptor with another token or socket is another import: a
      // forged one imported first must not stand in for the genuine one.
      if (r->blob.region_id == blob.region_id && r->blob.base == blob.base &&
          r->blob.length == blob.length && r->blob.owner.pid == blob.owner.pid &&
          TokensEqual(r->blob.token, blob.token) &&
          r->blob.same_host_socket == blob.same_host_socket) {
        return id;
      }
    }
  }
  if (!SameProcess(blob.owner, peer->host)) {
    return InvalidArgumentError("ImportRegion: remote key of host " + blob.owner.host + " pid " +
                                std::to_string(blob.owner.pid) + " is foreign to peer " +
                                peer->name);
  }
  auto region = std::make_shared<ImportedRegion>();
  region->blob = std::move(blob);
  std::string wire;
  KVB_ASSIGN_OR_RETURN(region->path, ChoosePath(*peer, *region));
  Status st;
  RunSync([&] {
    if (!peer->ep.get()) {
      st = UnavailableError("ImportRegion: peer " + peer->name + " is closed");
      return;
    }
    ucp_rkey_h rkey = nullptr;
    if (region->blob.packed_rkey.empty()) {  // a grant: no one-sided lane
      if (region->path == DataPath::kUcxRendezvous) wire = EndpointWire(peer->ep.get());
      return;
    }
    ucs_status_t s = ucp_ep_rkey_unpack(peer->ep.get(), region->blob.packed_rkey.data(), &rkey);
    if (s != UCS_OK) {
      st = InvalidArgumentError("ImportRegion: cannot unpack remote key of peer " + peer->name +
                                ": " + ucs_status_string(s));
      return;
    }
    region->rkey = UcpRkey(rkey);
    if (region->path == DataPath::kUcxRendezvous || region->path == DataPath::kUcxPut)
      wire = EndpointWire(peer->ep.get());
  });
  if (!st.ok()) {
    KVB_LOG_ERROR("ucx transport {}: {}", options_.name, st.ToString());
    return st;
  }
  region->gather = region->path == DataPath::kUcxRendezvous && wire == "tcp";  // see the field
  RemoteRegionId id;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (peer->dead) return UnavailableError(peer->terminal.message());
    id = next_remote_id_++;
    peer->regions[id] = region;
    peer->last_path = region->path;
    peer->wire = wire;
  }
  KVB_LOG_DEBUG("ucx transport {}: peer {} region {} ({} bytes at {:#x}) -> path {}{}{}",
                options_.name, peer->name, region->blob.region_id, region->blob.length,
                region->blob.base, DataPathName(region->path), wire.empty() ? "" : " over ", wire);
  return id;
}

Result<DataPath> UcxTransport::PathTo(PeerId peer_id) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto peer = FindPeerLocked(peer_id);
  if (!peer) return NotFoundError("PathTo: unknown peer " + std::to_string(peer_id));
  if (!peer->last_path) return NotFoundError("PathTo: no region imported from " + peer->name);
  return *peer->last_path;
}

}  // namespace ucx
}  // namespace kvbridge::internal

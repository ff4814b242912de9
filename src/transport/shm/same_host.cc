#include "transport/shm/same_host.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "common/log.h"
#include "common/process.h"
#include "common/wire.h"

namespace kvbridge::internal {
namespace {

constexpr uint32_t kRequestMagic = 0x4b565351;  // "KVSQ"
constexpr uint32_t kReplyMagic = 0x4b565350;    // "KVSP"
constexpr size_t kMaxMessage = 512;

std::string Errno(int err) {
  return std::string(std::strerror(err)) + " (errno " + std::to_string(err) + ")";
}

sockaddr_un AbstractAddress(std::string_view name, socklen_t* len) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  const size_t n = std::min(name.size(), sizeof(addr.sun_path) - 1);
  std::memcpy(addr.sun_path + 1, name.data(), n);  // sun_path[0] = 0: abstract
  *len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + n);
  return addr;
}

void SetTimeouts(int fd, std::chrono::milliseconds timeout) {
  timeval tv{};
  tv.tv_sec = timeout.count() / 1000;
  tv.tv_usec = (timeout.count() % 1000) * 1000;
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
}

std::string EncodeReply(StatusCode code, std::string_view message, const ExportedRegion* r) {
  WireWriter w;
  w.U32(kReplyMagic);
  w.U32(static_cast<uint32_t>(code));
  w.Bytes(message.substr(0, 200));
  w.U64(r ? r->region_id : 0);
  w.U64(r ? r->base : 0);
  w.U64(r ? r->length : 0);
  w.U8(r && r->segment ? 1 : 0);
  w.U64(r && r->segment ? r->segment->offset : 0);
  w.U64(r && r->segment ? r->segment->segment_size : 0);
  return w.FinishWithCrc();
}

// Sends `bytes` with `fd` (if >= 0) attached as SCM_RIGHTS.
bool SendWithFd(int conn, const std::string& bytes, int fd) {
  iovec iov{const_cast<char*>(bytes.data()), bytes.size()};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
  if (fd >= 0) {
    msg.msg_control = control;
    msg.msg_controllen = sizeof(control);
    cmsghdr* c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int));
    std::memcpy(CMSG_DATA(c), &fd, sizeof(int));
  }
  return sendmsg(conn, &msg, MSG_NOSIGNAL) == static_cast<ssize_t>(bytes.size());
}

}  // namespace

Result<std::unique_ptr<SameHostExporter>> SameHostExporter::Start() {
  uint64_t nonce = 0;
  KVB_ASSIGN_OR_RETURN(nonce, SecureRandomU64());
  char buf[64];
  std::snprintf(buf, sizeof(buf), "kvbridge-%d-%016llx", static_cast<int>(getpid()),
                static_cast<unsigned long long>(nonce));
  const std::string name = buf;
  const int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) return UnavailableError("same-host socket: " + Errno(errno));
  socklen_t len = 0;
  sockaddr_un addr = AbstractAddress(name, &len);
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), len) != 0 || listen(fd, 64) != 0) {
    const int err = errno;
    close(fd);
    return UnavailableError("same-host socket @" + name + ": " + Errno(err));
  }
  const int stop = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (stop < 0) {
    close(fd);
    return UnavailableError("same-host socket: eventfd: " + Errno(errno));
  }
  std::unique_ptr<SameHostExporter> e(new SameHostExporter(fd, stop, name));
  e->thread_ = std::thread([p = e.get()] { p->Serve(); });
  return e;
}

SameHostExporter::SameHostExporter(int listen_fd, int stop_fd, std::string name)
    : listen_fd_(listen_fd), stop_fd_(stop_fd), name_(std::move(name)) {}

SameHostExporter::~SameHostExporter() {
  uint64_t one = 1;
  [[maybe_unused]] ssize_t n = write(stop_fd_, &one, sizeof(one));
  if (thread_.joinable()) thread_.join();
  close(listen_fd_);
  close(stop_fd_);
  MutexLock lock(mu_);
  for (auto& [id, e] : regions_) {
    if (e.fd >= 0) close(e.fd);
  }
}

Status SameHostExporter::Add(const ExportedRegion& region) {
  Entry e{region, -1};
  if (region.segment) {
    e.fd = fcntl(region.segment->fd, F_DUPFD_CLOEXEC, 0);
    if (e.fd < 0) return InternalError("dup of shared segment fd: " + Errno(errno));
  }
  MutexLock lock(mu_);
  auto [it, fresh] = regions_.emplace(region.region_id, e);
  if (!fresh) {
    if (e.fd >= 0) close(e.fd);
    return InvalidArgumentError("region " + std::to_string(region.region_id) + " exported twice");
  }
  return Status::Ok();
}

void SameHostExporter::Remove(uint64_t region_id) {
  MutexLock lock(mu_);
  auto it = regions_.find(region_id);
  if (it == regions_.end()) return;
  if (it->second.fd >= 0) close(it->second.fd);
  regions_.erase(it);
}

Status SameHostExporter::AddGrant(uint64_t region_id, uint64_t grant, const RegionToken& token) {
  MutexLock lock(mu_);
  auto it = regions_.find(region_id);
  if (it == regions_.end())
    return NotFoundError("same-host grant: region " + std::to_string(region_id) + " not exported");
  if (it->second.grants.size() >= kMaxGrantsPerRegion) {
    return ResourceExhaustedError("same-host grant: region " + std::to_string(region_id) + " has " +
                                  std::to_string(kMaxGrantsPerRegion) +
                                  " live grants (kMaxGrantsPerRegion)");
  }
  it->second.grants.emplace_back(grant, token);
  return Status::Ok();
}

void SameHostExporter::RevokeGrant(uint64_t grant) {
  MutexLock lock(mu_);
  for (auto& [id, e] : regions_) {
    std::erase_if(e.grants, [&](const auto& g) { return g.first == grant; });
  }
}

bool SameHostExporter::Admits(const Entry& e, const RegionToken& token) {
  bool match = TokensEqual(e.region.token, token);
  for (const auto& [grant, t] : e.grants) match |= TokensEqual(t, token);
  return match;
}

uint64_t SameHostExporter::refused() const {
  MutexLock lock(mu_);
  return refused_;
}

void SameHostExporter::Serve() {
  NameThisThread("kvb-same-host");
  for (;;) {
    pollfd fds[2] = {{listen_fd_, POLLIN, 0}, {stop_fd_, POLLIN, 0}};
    if (poll(fds, 2, -1) < 0 && errno != EINTR) return;
    if (fds[1].revents != 0) return;
    const int conn = accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (conn < 0) continue;
    // One short request per connection; a client that stalls holds the
    // thread for at most the timeout.
    SetTimeouts(conn, std::chrono::milliseconds(1000));
    Answer(conn);
    close(conn);
  }
}

void SameHostExporter::Answer(int conn) {
  char buf[kMaxMessage];
  const ssize_t n = recv(conn, buf, sizeof(buf), MSG_TRUNC);
  if (n == 0) return;  // closed without asking (e.g. it did not believe our pid)
  WireReader r(std::string_view(buf, n > 0 ? std::min<size_t>(n, sizeof(buf)) : 0));
  uint32_t magic = 0;
  uint64_t region_id = 0;
  std::string_view token_bytes;
  RegionToken token;
  const bool parsed = n > 0 && static_cast<size_t>(n) <= sizeof(buf) && r.CheckCrc() &&
                      r.U32(&magic) && magic == kRequestMagic && r.U64(&region_id) &&
                      r.BytesView(&token_bytes) && token_bytes.size() == token.bytes.size() &&
                      r.AtEnd();
  ucred cred{};
  socklen_t len = sizeof(cred);
  getsockopt(conn, SOL_SOCKET, SO_PEERCRED, &cred, &len);
  std::string reply;
  int fd = -1;
  bool granted = false;
  uint64_t refused = 0;
  {
    MutexLock lock(mu_);
    auto it = parsed ? regions_.find(region_id) : regions_.end();
    if (parsed) std::memcpy(token.bytes.data(), token_bytes.data(), token.bytes.size());
    // Unknown region and wrong token get the same answer: no oracle.
    if (it == regions_.end() || !Admits(it->second, token)) {
      refused = ++refused_;
      reply = EncodeReply(StatusCode::kPermissionDenied,
                          parsed ? "no region with that id and token" : "garbled request", nullptr);
    } else {
      reply = EncodeReply(StatusCode::kOk, "", &it->second.region);
      fd = it->second.fd;
      granted = true;
    }
    // Sent under the lock: Remove cannot close `fd` meanwhile.
    granted &= SendWithFd(conn, reply, fd);
  }
  if (granted) {
    KVB_LOG_DEBUG("same-host socket @{}: granted region {} to pid {} uid {}", name_, region_id,
                  cred.pid, cred.uid);
  } else if (refused <= 16 || refused % 1024 == 0) {
    KVB_LOG_WARN("same-host socket @{}: refused request #{} from pid {} uid {} (region {}): {}",
                 name_, refused, cred.pid, cred.uid, region_id,
                 parsed ? "no region with that id and token" : "garbled request");
  }
}

namespace {

// Receives one message and at most one SCM_RIGHTS fd (*fd, -1 if none).
// Any other fds that came along are closed.
ssize_t ReceiveWithFd(int conn, char* buf, size_t size, int* fd) {
  *fd = -1;
  iovec iov{buf, size};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  alignas(cmsghdr) char control[CMSG_SPACE(4 * sizeof(int))] = {};
  msg.msg_control = control;
  msg.msg_controllen = sizeof(control);
  const ssize_t n = recvmsg(conn, &msg, MSG_CMSG_CLOEXEC);
  for (cmsghdr* c = CMSG_FIRSTHDR(&msg); n >= 0 && c != nullptr; c = CMSG_NXTHDR(&msg, c)) {
    if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
    const size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    for (size_t i = 0; i < count; ++i) {
      int got = -1;
      std::memcpy(&got, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
      if (*fd < 0) {
        *fd = got;
      } else {
        close(got);
      }
    }
  }
  if ((msg.msg_flags & (MSG_TRUNC | MSG_CTRUNC)) != 0) return -2;
  return n;
}

// Owns an fd for the scope.
struct FdCloser {
  int fd;
  ~FdCloser() {
    if (fd >= 0) close(fd);
  }
};

struct Reply {
  uint32_t code = 0;
  std::string message;
  uint64_t region_id = 0, base = 0, length = 0, offset = 0, segment_size = 0;
  uint8_t has_segment = 0;
};

bool DecodeReply(std::string_view bytes, Reply* out) {
  WireReader r(bytes);
  uint32_t magic = 0;
  return r.CheckCrc() && r.U32(&magic) && magic == kReplyMagic && r.U32(&out->code) &&
         r.Bytes(&out->message) && r.U64(&out->region_id) && r.U64(&out->base) &&
         r.U64(&out->length) && r.U8(&out->has_segment) && out->has_segment <= 1 &&
         r.U64(&out->offset) && r.U64(&out->segment_size) && r.AtEnd();
}

}  // namespace

Result<SameHostGrant> RequestSameHostGrant(std::string_view socket_name, int declared_pid,
                                           uint64_t region_id, const RegionToken& token,
                                           uint64_t base, uint64_t length,
                                           std::chrono::milliseconds timeout) {
  const std::string where = "same-host socket @" + std::string(socket_name);
  if (socket_name.empty() || socket_name.size() > 100) {
    return InvalidArgumentError("same-host socket name of " + std::to_string(socket_name.size()) +
                                " bytes");
  }
  FdCloser conn{socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0)};
  if (conn.fd < 0) return UnavailableError(where + ": socket: " + Errno(errno));
  SetTimeouts(conn.fd, timeout);
  socklen_t len = 0;
  sockaddr_un addr = AbstractAddress(socket_name, &len);
  if (connect(conn.fd, reinterpret_cast<sockaddr*>(&addr), len) != 0) {
    return UnavailableError(where + ": connect: " + Errno(errno));
  }
  // Who holds the socket is the kernel's word; what the descriptor declares
  // must agree with it.
  ucred cred{};
  socklen_t cred_len = sizeof(cred);
  if (getsockopt(conn.fd, SOL_SOCKET, SO_PEERCRED, &cred, &cred_len) != 0 || cred.pid <= 0) {
    return UnavailableError(where + ": SO_PEERCRED: " + Errno(errno));
  }
  if (cred.pid != declared_pid) {
    return Status(StatusCode::kPermissionDenied,
                  where + " is held by pid " + std::to_string(cred.pid) +
                      ", not by the declared owner pid " + std::to_string(declared_pid));
  }
  WireWriter w;
  w.U32(kRequestMagic);
  w.U64(region_id);
  w.Bytes(std::string_view(reinterpret_cast<const char*>(token.bytes.data()), token.bytes.size()));
  const std::string request = w.FinishWithCrc();
  if (send(conn.fd, request.data(), request.size(), MSG_NOSIGNAL) !=
      static_cast<ssize_t>(request.size())) {
    return UnavailableError(where + ": send: " + Errno(errno));
  }
  char buf[kMaxMessage];
  int raw_fd = -1;
  const ssize_t n = ReceiveWithFd(conn.fd, buf, sizeof(buf), &raw_fd);
  FdCloser fd{raw_fd};
  if (n == -1) return UnavailableError(where + ": receive: " + Errno(errno));
  Reply reply;
  if (n < 0 || !DecodeReply(std::string_view(buf, static_cast<size_t>(n)), &reply)) {
    return InvalidArgumentError(where + ": garbled answer (" + std::to_string(n) + " bytes)");
  }
  if (reply.code != 0) {
    return Status(StatusCode::kPermissionDenied,
                  where + " refused region " + std::to_string(region_id) + ": " + reply.message);
  }
  if (reply.region_id != region_id || reply.base != base || reply.length != length) {
    return InvalidArgumentError(where + ": the owner's region " + std::to_string(reply.region_id) +
                                " (" + std::to_string(reply.length) + " bytes at " +
                                std::to_string(reply.base) + ") is not the declared one (" +
                                std::to_string(length) + " bytes at " + std::to_string(base) + ")");
  }
  SameHostGrant grant;
  grant.pid = cred.pid;
  if (reply.has_segment) {
    if (fd.fd < 0) return InvalidArgumentError(where + ": segment announced but no fd passed");
    if (reply.offset > reply.segment_size || length > reply.segment_size - reply.offset) {
      return InvalidArgumentError(where + ": region does not fit its segment");
    }
    KVB_ASSIGN_OR_RETURN(MappedPeerSegment mapped,
                         MappedPeerSegment::Map(fd.fd, reply.segment_size));
    grant.segment = std::move(mapped);
    grant.segment_offset = reply.offset;
  }
  return grant;
}

}  // namespace kvbridge::internal

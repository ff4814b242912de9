// The target process of `kvbridge bench transport`: owns the destination
// region and answers the bench's commands on a pipe.
//
// Pipe protocol (frames, see Channel). Every reply starts with 'K' (ok) or
// 'E' (error, followed by the message).
//   target -> bench at start:  'K', then the transport Address(), then the
//                              region's remote-key blob (a per-peer grant's
//                              key for a granted path).
//   'C' (offset, length)*      zero these ranges (before a measured round)
//   'H' (offset, length)*      reply 'K' + HashBytes of each range
//   'Q'                        deregister, shut down, reply 'K', exit 0
#include <signal.h>

#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <variant>
#include <vector>

#include "bench/bench_util.h"
#include "bench/transport_bench.h"
#include "kvbridge/memory.h"

namespace kvbridge::bench {
namespace {

// Parses the (offset, length) list of a command, checking every range lies
// inside the region.
Result<std::vector<std::pair<uint64_t, uint64_t>>> ParseRanges(std::string_view cmd,
                                                               uint64_t region_size) {
  std::vector<std::pair<uint64_t, uint64_t>> ranges;
  size_t pos = 1;
  uint64_t off = 0, len = 0;
  while (GetU64(cmd, &pos, &off) && GetU64(cmd, &pos, &len)) {
    if (off > region_size || len > region_size - off) {
      return InvalidArgumentError("range outside the target region");
    }
    ranges.emplace_back(off, len);
  }
  if (pos != cmd.size()) return InvalidArgumentError("truncated range list");
  return ranges;
}

// The destination region: application memory (mmap) or a shared buffer.
class TargetRegion {
 public:
  static Result<TargetRegion> Allocate(bool shared, uint64_t size) {
    TargetRegion r;
    if (shared) {
      KVB_ASSIGN_OR_RETURN(void* p, AllocateSharedBuffer(size));
      r.shared_ = static_cast<uint8_t*>(p);
      // Fault every page in now, not inside a timed round.
      std::memset(r.shared_, 0, size);
    } else {
      KVB_ASSIGN_OR_RETURN(r.app_, MappedRegion::Allocate(size));
    }
    return r;
  }
  TargetRegion() = default;
  TargetRegion(TargetRegion&& o) noexcept
      : app_(std::move(o.app_)), shared_(std::exchange(o.shared_, nullptr)) {}
  TargetRegion& operator=(TargetRegion&&) = delete;
  ~TargetRegion() {
    if (shared_ != nullptr) FreeSharedBuffer(shared_).IgnoreError();
  }
  uint8_t* data() const { return shared_ != nullptr ? shared_ : app_.data(); }

 private:
  MappedRegion app_;
  uint8_t* shared_ = nullptr;
};

std::string Error(const Status& s) { return "E" + s.ToString(); }

}  // namespace

int RunTransportTarget(const std::string& path, uint64_t region_size, int in_fd, int out_fd) {
  signal(SIGPIPE, SIG_IGN);
  Channel channel(in_fd, out_fd);
  auto fail = [&](const Status& s) {
    std::fprintf(stderr, "bench target (%s): %s\n", path.c_str(), s.ToString().c_str());
    channel.Send(Error(s)).IgnoreError();
    return 1;
  };
  Result<PathSpec> spec = LookupPath(path);
  if (!spec.ok()) return fail(spec.status());
  Result<TargetRegion> region = TargetRegion::Allocate(spec->shared_buffer, region_size);
  if (!region.ok()) return fail(region.status().WithContext("target region"));
  internal::UcxTransportOptions options = spec->options;
  options.name = "bench target " + path;
  Result<std::unique_ptr<internal::Transport>> transport = internal::CreateUcxTransport(options);
  if (!transport.ok()) return fail(transport.status().WithContext("create transport"));
  Result<internal::RegisteredRegion> reg =
      (*transport)->RegisterMemory(region->data(), region_size, MemoryKind::kDram);
  if (!reg.ok()) return fail(reg.status().WithContext("register target region"));
  std::string key = reg->remote_key;
  if (spec->granted) {
    Result<std::string> granted =
        (*transport)->GrantRegion(reg->id, /*grant=*/1, internal::Transport::GrantReach::kMediated);
    if (!granted.ok()) return fail(granted.status().WithContext("grant the target region"));
    key = *granted;
  }
  Status s = channel.Send("K");
  if (s.ok()) s = channel.Send((*transport)->Address());
  if (s.ok()) s = channel.Send(key);
  if (!s.ok()) return fail(s);

  int rc = 0;
  for (;;) {
    Result<std::string> cmd = channel.Receive();
    if (!cmd.ok()) {  // the bench went away: nothing left to serve
      rc = 1;
      break;
    }
    if (cmd->empty()) continue;
    char op = (*cmd)[0];
    if (op == 'Q') break;
    auto ranges = ParseRanges(*cmd, region_size);
    std::string reply = "K";
    if (!ranges.ok()) {
      reply = Error(ranges.status());
    } else if (op == 'C') {
      for (auto [off, len] : *ranges) std::memset(region->data() + off, 0, len);
    } else if (op == 'H') {
      for (auto [off, len] : *ranges) PutU64(reply, HashBytes(region->data() + off, len));
    } else {
      reply = Error(InvalidArgumentError(std::string("unknown command '") + op + "'"));
    }
    if (!channel.Send(reply).ok()) {
      rc = 1;
      break;
    }
  }
  (*transport)->DeregisterMemory(reg->id).IgnoreError();
  transport->reset();
  if (rc == 0) channel.Send("K").IgnoreError();
  return rc;
}

}  // namespace kvbridge::bench

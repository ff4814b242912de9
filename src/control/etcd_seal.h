// Sealed etcd values (issue 12). With an etcd registry there is no kvbridge
// server between a rank and the store, and etcd checks only that a writer
// holds a role on the namespace's key range. So every value kvbridge writes
// there carries a tag, HMAC-SHA256 keyed by the deployment's secret (under
// its own label) over the value's full etcd key and its JSON text, and every
// value read is used only when its tag is right:
// - an etcd user without the deployment's secret cannot add a failure
//   record that fences a rank, register a rank in place of prefill rank 0,
//   or mark a rank alive under a new incarnation;
// - a sealed value copied to another key (an old failure record under a new
//   sequence number, one rank's record at another position) does not open.
// What it does not stop: a holder of the secret (a rank of the deployment)
// can seal anything, as it can prove any rank's identity in the handshake;
// a writer can delete keys or keep a lease alive (etcd leases carry no
// value); an old sealed value put back at its own key reads as it did
// (failure records are read by sequence number, so ranks past it ignore it).
//
// Thread safety: an immutable value type.
#pragma once

#include <array>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "kvbridge/status.h"

namespace kvbridge::internal {

class EtcdSeal {
 public:
  // `secret`: the deployment's token (control/auth.h), never empty.
  explicit EtcdSeal(std::string_view secret);

  // The text to store at `key`: `value` (an object without "mac") with its
  // tag added as "mac".
  std::string Seal(std::string_view key, nlohmann::json value) const;
  // Removes "mac" from `value` (an object read from `key`) and checks it:
  // Unauthenticated naming the key when it is missing, not a string or not
  // this deployment's tag for this key and value.
  Status Open(std::string_view key, nlohmann::json& value) const;

 private:
  std::string Tag(std::string_view key, const nlohmann::json& value) const;
  std::array<uint8_t, 32> key_{};
};

}  // namespace kvbridge::internal

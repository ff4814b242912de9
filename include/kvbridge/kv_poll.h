// KVPoll: the state of one request's transfer, with sglang's values.
//
// Ordered so that a MIN over a rank group gives the group's state: one Failed
// rank makes the whole group Failed.
#pragma once

#include <string_view>

#include "kvbridge/export.h"

namespace kvbridge {

enum class KVPoll : int {
  kFailed = 0,
  kBootstrapping = 1,
  kWaitingForInput = 2,
  kTransferring = 3,
  kSuccess = 4,
};

KVB_EXPORT std::string_view KVPollName(KVPoll poll);

}  // namespace kvbridge

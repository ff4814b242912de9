// Internal factories (tests inject a transport).
#pragma once

#include <memory>

#include "kvbridge/manager.h"
#include "transport/transport.h"

namespace kvbridge::internal {

// KVManager::Create with `transport` instead of UCX (null = UCX).
Result<std::unique_ptr<KVManager>> CreateManager(const ManagerOptions& options,
                                                 std::unique_ptr<Transport> transport);

}  // namespace kvbridge::internal

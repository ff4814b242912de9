// Internal factories (tests inject a transport).
#pragma once

#include <memory>

#include "kvbridge/manager.h"
#include "transport/transport.h"

namespace kvbridge::internal {

// KVManager::Create with `transport` instead of UCX (null = UCX).
Result<std::unique_ptr<KVManager>> CreateManager(const ManagerOptions& options,
                                                 std::unique_ptr<Transport> transport);

// The implementation behind a KVManager, for the library itself, its tools
// and its tests; the public header does not expose it.
class ManagerAccess {
 public:
  static ManagerImpl& Of(KVManager& manager) { return *manager.impl_; }
  static const ManagerImpl& Of(const KVManager& manager) { return *manager.impl_; }
};

}  // namespace kvbridge::internal

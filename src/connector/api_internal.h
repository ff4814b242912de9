// Internal factories (tests inject a transport).
#pragma once

#include <memory>

#include "connector/core_hooks.h"
#include "kvbridge/manager.h"
#include "transport/transport.h"

namespace kvbridge::internal {

// KVManager::Create with `transport` instead of UCX (null = UCX), and a
// test's `hooks` (none: the system's clock and a ticker thread).
Result<std::unique_ptr<KVManager>> CreateManager(const ManagerOptions& options,
                                                 std::unique_ptr<Transport> transport);
Result<std::unique_ptr<KVManager>> CreateManager(const ManagerOptions& options,
                                                 std::unique_ptr<Transport> transport,
                                                 CoreHooks hooks);

// The implementation behind a KVManager, for the library itself, its tools
// and its tests; the public header does not expose it.
class ManagerAccess {
 public:
  static ManagerImpl& Of(KVManager& manager) { return *manager.impl_; }
  static const ManagerImpl& Of(const KVManager& manager) { return *manager.impl_; }
  static std::unique_ptr<KVManager> Wrap(std::unique_ptr<ManagerImpl> impl);
};

}  // namespace kvbridge::internal

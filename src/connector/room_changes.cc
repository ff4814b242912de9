// KVManager::TakeChangedRooms: the rooms whose Poll() answer changed since
// the last call (RoomChanges in rooms.h lists them as they change).
#include "connector/manager_impl.h"

namespace kvbridge::internal {

Result<std::vector<uint64_t>> ManagerImpl::TakeChangedRooms() {
  MutexLock lock(mu_);
  if (!changes_.listing())
    return FailedPreconditionError(
        "TakeChangedRooms needs ManagerOptions::list_room_changes (off for this manager): "
        "poll each request instead");
  std::vector<uint64_t> listed = changes_.Take();
  // Only rooms whose handle is alive; each is listed again once it changes.
  std::vector<uint64_t> live;
  live.reserve(listed.size());
  auto clear = [&](uint64_t id, auto& rooms) {
    auto it = rooms.find(id);
    if (it == rooms.end() || !it->second->change_listed) return;
    it->second->change_listed = false;
    live.push_back(id);
  };
  for (uint64_t id : listed) {
    clear(id, senders_);
    clear(id, receivers_);
  }
  return live;
}

}  // namespace kvbridge::internal

#include "transport/transport.h"

namespace kvbridge::internal {

std::string_view DataPathName(DataPath path) {
  switch (path) {
    case DataPath::kLoopback:
      return "loopback";
    case DataPath::kSharedMemory:
      return "shm";
    case DataPath::kCrossMemoryAttach:
      return "cma";
    case DataPath::kUcxRendezvous:
      return "ucx-rndv";
    case DataPath::kUcxPut:
      return "ucx-put";
  }
  return "unknown";
}

}  // namespace kvbridge::internal

namespace kvbridge {

std::string_view MemoryKindName(MemoryKind kind) {
  return kind == MemoryKind::kVram ? "vram" : "dram";
}

}  // namespace kvbridge

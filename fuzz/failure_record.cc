// Fuzz target: DecodeFailureRecord (connector/protocol.h), the checksummed
// failure record blob. Each input is tried as it is and with its CRC-32
// appended, so the fuzzer explores the record decoder behind the checksum.
//
// Checks: a rejected blob says why; an accepted record re-encodes to a
// blob of the same size that decodes to the same encoding again; its text
// (Message, which subtracts its two timestamps) is well defined.
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

#include "common/wire.h"
#include "connector/protocol.h"

using namespace kvbridge;            // NOLINT: a fuzz target's own namespace
using namespace kvbridge::internal;  // NOLINT

namespace {

void Check(bool ok) {
  if (!ok) std::abort();
}

void Try(std::string_view blob) {
  Result<FailureRecord> f = DecodeFailureRecord(blob);
  if (!f.ok()) {
    Check(f.status().code() == StatusCode::kInvalidArgument && !f.status().message().empty());
    return;
  }
  const std::string again = EncodeFailureRecord(*f);
  Check(again.size() == blob.size());
  Result<FailureRecord> f2 = DecodeFailureRecord(again);
  Check(f2.ok() && EncodeFailureRecord(*f2) == again);
  (void)f->Message();
  (void)f->ToStatus();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view in(reinterpret_cast<const char*>(data), size);
  Try(in);
  WireWriter crc;
  crc.U32(Crc32(in));
  Try(std::string(in) + crc.Finish());
  return 0;
}

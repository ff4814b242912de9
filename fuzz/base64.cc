// Fuzz target: Base64Decode (common/base64.h), which reads transport
// addresses out of the bootstrap registry's JSON.
//
// Checks: decoding never crashes; the decoder is strict, so whatever it
// accepts is exactly what Base64Encode gives for the decoded bytes; and any
// bytes survive encode then decode.
#include "common/base64.h"

#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

using kvbridge::internal::Base64Decode;
using kvbridge::internal::Base64Encode;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view in(reinterpret_cast<const char*>(data), size);
  auto decoded = Base64Decode(in);
  if (decoded.ok()) {
    if (Base64Encode(*decoded) != in) std::abort();
  } else if (decoded.status().message().empty()) {
    std::abort();
  }
  auto back = Base64Decode(Base64Encode(in));
  if (!back.ok() || *back != in) std::abort();
  return 0;
}

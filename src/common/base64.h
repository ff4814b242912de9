// Base64 (RFC 4648, standard alphabet, with padding) for binary blobs that
// travel inside JSON, e.g. a rank's transport address in the bootstrap
// registry. Decoding is strict: a blob that is not exactly what Base64Encode
// would produce is rejected rather than guessed at.
//
// Thread safety: free functions without shared state.
#pragma once

#include <string>
#include <string_view>

#include "kvbridge/status.h"

namespace kvbridge::internal {

// Encodes any bytes; the output length is 4 * ceil(n / 3).
std::string Base64Encode(std::string_view bytes);

// Decodes canonical base64. InvalidArgument (naming the offset) for a length
// that is not a multiple of 4, a character outside the alphabet, misplaced
// padding, or non-zero bits in the padding.
Result<std::string> Base64Decode(std::string_view text);

}  // namespace kvbridge::internal

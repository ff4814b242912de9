// Strict readers for fields of JSON objects that arrive over HTTP. Each
// returns InvalidArgument naming the object and the field ("rank record:
// field 'pid' must be an integer, got string") so that a bad request is
// answered with what to fix.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "kvbridge/status.h"

namespace kvbridge::internal {

// Serialises without throwing on invalid UTF-8 (replaced by U+FFFD).
std::string DumpJson(const nlohmann::json& j);

// Deepest nesting of arrays and objects that ParseJson accepts. Every JSON
// text kvbridge reads comes from another process (a rank, an HTTP client, a
// registry); nlohmann's dump and comparison recurse, so a text nested 100k
// deep would overflow the stack long after it parsed.
inline constexpr int kMaxJsonDepth = 64;

// Parses `text` without throwing. InvalidArgument, beginning with `what`
// ("PUT /route: request body"), when it is larger than `max_bytes`, nested
// deeper than kMaxJsonDepth (checked before parsing) or not valid JSON.
Result<nlohmann::json> ParseJson(std::string_view text, std::string_view what,
                                 size_t max_bytes = size_t{4} << 20);

// The first `max_chars` of `text`, with "... (N bytes)" when it was longer,
// as valid UTF-8 (ValidUtf8): for log lines and messages that quote what a
// peer sent.
std::string Clip(std::string_view text, size_t max_chars = 256);

class JsonFields {
 public:
  // `what` names the object in messages, e.g. "rank record".
  JsonFields(const nlohmann::json& j, std::string_view what) : j_(j), what_(what) {}

  // InvalidArgument unless the value is a JSON object.
  Status RequireObject() const;
  bool Has(const char* name) const { return j_.is_object() && j_.contains(name); }
  // Present and not null (Python's None: sglang sends optional fields so).
  bool HasValue(const char* name) const { return Has(name) && !j_.at(name).is_null(); }

  Status Int(const char* name, int64_t min, int64_t max, int64_t* out) const;
  Status Int(const char* name, int min, int max, int* out) const;
  Status Uint64(const char* name, uint64_t* out) const;
  Status String(const char* name, std::string* out) const;
  Status Bool(const char* name, bool* out) const;
  Status Object(const char* name, nlohmann::json* out) const;
  Status Array(const char* name, const nlohmann::json** out) const;

  Status Error(std::string_view message) const;

 private:
  Result<const nlohmann::json*> Get(const char* name) const;
  Status WrongType(const char* name, std::string_view want, const nlohmann::json& v) const;

  const nlohmann::json& j_;
  std::string what_;
};

}  // namespace kvbridge::internal

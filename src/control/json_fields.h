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

class JsonFields {
 public:
  // `what` names the object in messages, e.g. "rank record".
  JsonFields(const nlohmann::json& j, std::string_view what) : j_(j), what_(what) {}

  // InvalidArgument unless the value is a JSON object.
  Status RequireObject() const;
  bool Has(const char* name) const { return j_.is_object() && j_.contains(name); }

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

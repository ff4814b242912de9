#include "control/json_fields.h"

#include <algorithm>
#include <limits>

#include "common/text.h"

namespace kvbridge::internal {

std::string DumpJson(const nlohmann::json& j) {
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

namespace {

// The deepest nesting of [ and { in `text`, outside strings; stops counting
// once it passes `limit`.
int NestingDepth(std::string_view text, int limit) {
  int depth = 0;
  int deepest = 0;
  bool in_string = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (c == '\\') {
        ++i;
      } else if (c == '"') {
        in_string = false;
      }
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      deepest = std::max(deepest, ++depth);
      if (deepest > limit) return deepest;
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
  return deepest;
}

}  // namespace

Result<nlohmann::json> ParseJson(std::string_view text, std::string_view what, size_t max_bytes) {
  if (text.size() > max_bytes) {
    return InvalidArgumentError(std::string(what) + " is " + std::to_string(text.size()) +
                                " bytes, more than the limit of " + std::to_string(max_bytes));
  }
  if (NestingDepth(text, kMaxJsonDepth) > kMaxJsonDepth) {
    return InvalidArgumentError(std::string(what) + " nests arrays/objects deeper than " +
                                std::to_string(kMaxJsonDepth) + " levels");
  }
  nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return InvalidArgumentError(std::string(what) + " is not valid JSON");
  return j;
}

std::string Clip(std::string_view text, size_t max_chars) {
  if (text.size() <= max_chars) return ValidUtf8(text);
  return ValidUtf8(Utf8Prefix(text, max_chars)) + "... (" + std::to_string(text.size()) + " bytes)";
}

Status JsonFields::Error(std::string_view message) const {
  return InvalidArgumentError(what_ + ": " + std::string(message));
}

Status JsonFields::RequireObject() const {
  if (j_.is_object()) return Status::Ok();
  return Error(std::string("expected a JSON object, got ") + j_.type_name());
}

Result<const nlohmann::json*> JsonFields::Get(const char* name) const {
  KVB_RETURN_IF_ERROR(RequireObject());
  auto it = j_.find(name);
  if (it == j_.end()) return Error(std::string("missing field '") + name + "'");
  return &*it;
}

Status JsonFields::WrongType(const char* name, std::string_view want,
                             const nlohmann::json& v) const {
  return Error(std::string("field '") + name + "' must be " + std::string(want) + ", got " +
               v.type_name());
}

Status JsonFields::Int(const char* name, int64_t min, int64_t max, int64_t* out) const {
  KVB_ASSIGN_OR_RETURN(const nlohmann::json* v, Get(name));
  if (!v->is_number_integer()) return WrongType(name, "an integer", *v);
  bool in_range;
  int64_t value = 0;
  if (v->is_number_unsigned()) {
    uint64_t u = v->get<uint64_t>();
    in_range = (min <= 0 || u >= static_cast<uint64_t>(min)) && u <= static_cast<uint64_t>(max);
    value = in_range ? static_cast<int64_t>(u) : max;
  } else {
    value = v->get<int64_t>();
    in_range = value >= min && value <= max;
  }
  if (!in_range) {
    return Error(std::string("field '") + name + "' = " + DumpJson(*v) + " out of range [" +
                 std::to_string(min) + ", " + std::to_string(max) + "]");
  }
  *out = value;
  return Status::Ok();
}

Status JsonFields::Int(const char* name, int min, int max, int* out) const {
  int64_t v = 0;
  KVB_RETURN_IF_ERROR(Int(name, int64_t{min}, int64_t{max}, &v));
  *out = static_cast<int>(v);
  return Status::Ok();
}

Status JsonFields::Uint64(const char* name, uint64_t* out) const {
  KVB_ASSIGN_OR_RETURN(const nlohmann::json* v, Get(name));
  if (!v->is_number_integer()) return WrongType(name, "a non-negative integer", *v);
  if (!v->is_number_unsigned() && v->get<int64_t>() < 0) {
    return Error(std::string("field '") + name + "' = " + DumpJson(*v) + " must be >= 0");
  }
  *out = v->get<uint64_t>();
  return Status::Ok();
}

Status JsonFields::String(const char* name, std::string* out) const {
  KVB_ASSIGN_OR_RETURN(const nlohmann::json* v, Get(name));
  if (!v->is_string()) return WrongType(name, "a string", *v);
  *out = v->get<std::string>();
  return Status::Ok();
}

Status JsonFields::Bool(const char* name, bool* out) const {
  KVB_ASSIGN_OR_RETURN(const nlohmann::json* v, Get(name));
  if (!v->is_boolean()) return WrongType(name, "a boolean", *v);
  *out = v->get<bool>();
  return Status::Ok();
}

Status JsonFields::Object(const char* name, nlohmann::json* out) const {
  KVB_ASSIGN_OR_RETURN(const nlohmann::json* v, Get(name));
  if (!v->is_object()) return WrongType(name, "an object", *v);
  *out = *v;
  return Status::Ok();
}

Status JsonFields::Array(const char* name, const nlohmann::json** out) const {
  KVB_ASSIGN_OR_RETURN(const nlohmann::json* v, Get(name));
  if (!v->is_array()) return WrongType(name, "an array", *v);
  *out = v;
  return Status::Ok();
}

}  // namespace kvbridge::internal

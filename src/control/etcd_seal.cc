#include "control/etcd_seal.h"

#include <openssl/crypto.h>

#include "common/digest.h"
#include "control/auth.h"
#include "control/json_fields.h"

namespace kvbridge::internal {
namespace {

constexpr std::string_view kSealLabel = "kvbridge etcd value key v1";
constexpr const char* kMacField = "mac";

}  // namespace

EtcdSeal::EtcdSeal(std::string_view secret) : key_(DeriveKey(secret, kSealLabel)) {}

std::string EtcdSeal::Tag(std::string_view key, const nlohmann::json& value) const {
  std::string data(key);
  data.push_back('\0');  // a key holds no NUL: key and value cannot shift into each other
  data += DumpJson(value);
  return HexOf(HmacSha256(key_, data));
}

std::string EtcdSeal::Seal(std::string_view key, nlohmann::json value) const {
  value[kMacField] = Tag(key, value);
  return DumpJson(value);
}

Status EtcdSeal::Open(std::string_view key, nlohmann::json& value) const {
  const std::string what = "etcd key " + Clip(key, 120);
  auto it = value.find(kMacField);
  if (it == value.end() || !it->is_string()) {
    return UnauthenticatedError(
        what + " carries no tag: it was not written by a rank of this deployment (every value " +
        "kvbridge writes is sealed with the deployment's secret)");
  }
  const std::string mac = it->get<std::string>();
  value.erase(it);
  const std::string want = Tag(key, value);
  if (mac.size() != want.size() || CRYPTO_memcmp(mac.data(), want.data(), want.size()) != 0) {
    return UnauthenticatedError(what + " has a tag that is not this deployment's for this key: " +
                                "written without the secret in " + kAuthTokenEnv +
                                " (or another secret), or copied from another key");
  }
  return Status();
}

}  // namespace kvbridge::internal

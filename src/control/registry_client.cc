#include "control/registry_client.h"

#include "control/bootstrap_client.h"
#include "control/etcd_registry.h"
#include "control/json_fields.h"

namespace kvbridge::internal {

bool IsEtcdRegistry(std::string_view registry) { return registry.starts_with("etcd://"); }

Result<std::unique_ptr<RegistryClient>> CreateRegistryClient(
    std::string_view registry, std::string_view bootstrap_addr, std::chrono::milliseconds timeout,
    std::string auth_token, std::chrono::milliseconds unresponsive_after) {
  if (registry.empty() || registry == "bootstrap") {
    KVB_ASSIGN_OR_RETURN(auto client,
                         BootstrapClient::Create(bootstrap_addr, timeout, std::move(auth_token)));
    return std::unique_ptr<RegistryClient>(std::move(client));
  }
  if (!IsEtcdRegistry(registry)) {
    return InvalidArgumentError("registry '" + Clip(registry, 120) +
                                "': expected \"\" or \"bootstrap\" (the bootstrap server at "
                                "bootstrap_addr) or etcd://HOST:PORT[,HOST:PORT...][/NAMESPACE]");
  }
  KVB_ASSIGN_OR_RETURN(EtcdRegistryOptions o, ParseEtcdRegistryUrl(registry));
  o.gateway.timeout = timeout;
  o.auth_token = std::move(auth_token);
  o.unresponsive_after = unresponsive_after;
  // Dead well after unresponsive: a rank that stalls for a second is not
  // fenced by etcd alone (its peers' heartbeats decide that sooner).
  o.dead_after = std::max(unresponsive_after * 3, std::chrono::milliseconds(3000));
  KVB_ASSIGN_OR_RETURN(auto client, EtcdRegistryClient::Create(std::move(o)));
  return std::unique_ptr<RegistryClient>(std::move(client));
}

}  // namespace kvbridge::internal

// RankEndpoint: a prefill rank's own registry record, served at
// GET /kvbridge/rank on the port the rank registers as its rank_port.
//
// sglang's own bootstrap server keeps only where a prefill rank is (rank_ip,
// rank_port) and answers a rank lookup with those two; a kvbridge decode rank
// then reads the rest of the record (transport address, layout, pid,
// incarnation) here (BootstrapClient::GetRank). Read-only and unauthenticated,
// as GET /route is on either server: it holds nothing a registry lookup does
// not already give. Connections are bounded (ConnectionThreads).
//
// Thread safety: SetRecord and port() may be called from any thread.
#pragma once

#include <memory>
#include <mutex>
#include <string>

#include "control/http_server.h"
#include "kvbridge/status.h"

namespace kvbridge::internal {

inline constexpr char kRankEndpointPath[] = "/kvbridge/rank";

class RankEndpoint {
 public:
  // Listens on `host` at a free port. Errors: those of HttpServerThread::Start.
  static Result<std::unique_ptr<RankEndpoint>> Start(const std::string& host);
  ~RankEndpoint();  // stops serving

  // The record (JSON text) served from now on; 503 until the first call.
  void SetRecord(std::string json);
  int port() const { return serving_.port(); }

 private:
  RankEndpoint() = default;
  httplib::Server http_;
  HttpServerThread serving_;  // after `http_`: stops serving before it goes
  std::mutex mu_;
  std::string record_;  // guarded by mu_
};

}  // namespace kvbridge::internal

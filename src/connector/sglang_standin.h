// A stand-in for sglang's own bootstrap server, for the connector's tests:
// the routes a kvbridge rank uses (docs/sglang.md: registration, parallel
// info and rank lookup, rows H1-H3, and B1-B4; no dp-rank routes), from that
// table as python/tests/sglang_bootstrap_standin.py is. What matters is what it
// lacks: no /heartbeat, /failure, /failures or /ranks (404), so a kvbridge
// rank there gets liveness from its peers only and no failure record from a
// registry; a registration keeps only rank_ip and rank_port, and a lookup
// answers those two. Writes are not checked for a token.
#pragma once

#include <httplib.h>

#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <tuple>

#include "control/http_server.h"
#include "kvbridge/status.h"

namespace kvbridge::internal {

class SglangStandinServer {
 public:
  // Serves on `host` (an IPv4 address of this host) at a free port.
  static Result<std::unique_ptr<SglangStandinServer>> Start(const std::string& host = "127.0.0.1");
  int port() const { return serving_.port(); }
  ~SglangStandinServer();

  std::string address() const { return serving_.address(); }
  int registrations() const;  // PUT /route answered 200
  // Tests: while held, every lookup is answered 503, as before every prefill
  // rank registered; held_lookups() counts those answers.
  void HoldLookups(bool hold);
  int held_lookups() const;
  // Tests: lists the registered rank at (dp, cp, tp, pp) at `port` from now
  // on, as sglang's server would after a rank at that port registered
  // (e.g. a port where nothing answers). False when no rank is there.
  bool MoveRank(int dp, int cp, int tp, int pp, int port);

 private:
  SglangStandinServer() = default;
  void Register(const httplib::Request& req, httplib::Response& res);
  void Lookup(const httplib::Request& req, httplib::Response& res);

  struct Shape {
    int attn_tp_size = 1, attn_cp_size = 1, dp_size = 1, pp_size = 1, page_size = 1;
    std::string kv_cache_dtype;
    int expected = 1;
  };
  using Key = std::tuple<int, int, int, int>;  // dp, cp, tp, pp

  httplib::Server http_;
  HttpServerThread serving_;  // after `http_`: stops serving before it goes
  mutable std::mutex mu_;
  std::optional<Shape> shape_;        // guarded by mu_: the first registration's
  std::map<Key, std::string> ranks_;  // guarded by mu_: {rank_ip, rank_port} as JSON
  int registrations_ = 0;             // guarded by mu_
  bool hold_lookups_ = false;         // guarded by mu_
  int held_lookups_ = 0;              // guarded by mu_
};

}  // namespace kvbridge::internal

#include "control/rank_endpoint.h"

namespace kvbridge::internal {

Result<std::unique_ptr<RankEndpoint>> RankEndpoint::Start(const std::string& host) {
  std::unique_ptr<RankEndpoint> e(new RankEndpoint());
  RankEndpoint* self = e.get();
  e->http_.set_read_timeout(std::chrono::seconds(5));
  e->http_.set_write_timeout(std::chrono::seconds(5));
  e->http_.set_payload_max_length(1024);  // GETs only
  e->http_.Get(kRankEndpointPath, [self](const httplib::Request&, httplib::Response& res) {
    std::string body;
    {
      std::lock_guard<std::mutex> lock(self->mu_);
      body = self->record_;
    }
    if (body.empty()) {
      res.status = 503;
      res.set_content(R"({"error":"rank record not set yet"})", "application/json");
      return;
    }
    res.set_content(body, "application/json");
  });
  HttpServeOptions serve;
  serve.limits.max_body_bytes = 1024;
  serve.max_connections = 4;  // one decode rank asks once per prefill rank it meets
  KVB_RETURN_IF_ERROR(e->serving_.Start(e->http_, host, 0, "rank endpoint", serve));
  return e;
}

RankEndpoint::~RankEndpoint() { serving_.Stop(); }

void RankEndpoint::SetRecord(std::string json) {
  std::lock_guard<std::mutex> lock(mu_);
  record_ = std::move(json);
}

}  // namespace kvbridge::internal

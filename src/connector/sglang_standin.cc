#include "connector/sglang_standin.h"

#include <nlohmann/json.hpp>

namespace kvbridge::internal {

using nlohmann::json;

Result<std::unique_ptr<SglangStandinServer>> SglangStandinServer::Start(const std::string& host) {
  std::unique_ptr<SglangStandinServer> s(new SglangStandinServer());
  SglangStandinServer* self = s.get();
  s->http_.Get("/health", [](const httplib::Request&, httplib::Response& res) {
    res.set_content("OK", "text/plain");
  });
  s->http_.Put("/route", [self](const httplib::Request& req, httplib::Response& res) {
    self->Register(req, res);
  });
  s->http_.Get("/route", [self](const httplib::Request& req, httplib::Response& res) {
    self->Lookup(req, res);
  });
  HttpServeOptions serve;
  serve.limits.max_body_bytes = 1 << 20;  // registrations
  KVB_RETURN_IF_ERROR(s->serving_.Start(s->http_, host, 0, "sglang stand-in", serve));
  return s;
}

SglangStandinServer::~SglangStandinServer() { serving_.Stop(); }

int SglangStandinServer::registrations() const {
  std::lock_guard<std::mutex> lock(mu_);
  return registrations_;
}

void SglangStandinServer::HoldLookups(bool hold) {
  std::lock_guard<std::mutex> lock(mu_);
  hold_lookups_ = hold;
}

int SglangStandinServer::held_lookups() const {
  std::lock_guard<std::mutex> lock(mu_);
  return held_lookups_;
}

void SglangStandinServer::Register(const httplib::Request& req, httplib::Response& res) {
  try {
    const json d = json::parse(req.body);
    const int system_dp = d.at("system_dp_size").get<int>();
    const int dp_size = system_dp == 1 ? d.at("attn_dp_size").get<int>() : system_dp;
    const int dp_group =
        system_dp == 1 ? d.at("attn_dp_rank").get<int>() : d.at("system_dp_rank").get<int>();
    const Key key{dp_group, d.at("attn_cp_rank").get<int>(), d.at("attn_tp_rank").get<int>(),
                  d.at("pp_rank").get<int>()};
    const json where = {{"rank_ip", d.at("rank_ip")}, {"rank_port", d.at("rank_port")}};
    std::lock_guard<std::mutex> lock(mu_);
    if (!shape_) {
      Shape s;
      s.attn_tp_size = d.at("attn_tp_size").get<int>();
      s.attn_cp_size = d.at("attn_cp_size").get<int>();
      s.dp_size = dp_size;
      s.pp_size = d.at("pp_size").get<int>();
      s.page_size = d.at("page_size").get<int>();
      s.kv_cache_dtype = d.at("kv_cache_dtype").get<std::string>();
      for (int size : {s.attn_tp_size, s.attn_cp_size, s.dp_size, s.pp_size}) {
        if (size < 1 || size > 1024) {
          res.status = 500;
          res.set_content("size out of range", "text/plain");
          return;
        }
      }
      s.expected = s.attn_tp_size * s.attn_cp_size * s.dp_size * s.pp_size;
      shape_ = s;
    }
    ranks_[key] = where.dump();
    ++registrations_;
    res.set_content("OK", "text/plain");
  } catch (const json::exception& e) {
    res.status = 500;
    res.set_content(e.what(), "text/plain");
  }
}

bool SglangStandinServer::MoveRank(int dp, int cp, int tp, int pp, int port) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = ranks_.find(Key{dp, cp, tp, pp});
  if (it == ranks_.end()) return false;
  json where = json::parse(it->second);
  where["rank_port"] = port;
  it->second = where.dump();
  return true;
}

void SglangStandinServer::Lookup(const httplib::Request& req, httplib::Response& res) {
  const char* names[] = {"prefill_dp_rank", "prefill_cp_rank", "target_tp_rank", "target_pp_rank"};
  int v[4];
  for (int i = 0; i < 4; ++i) {
    if (!req.has_param(names[i])) {
      res.status = 400;
      res.set_content("Missing inputs for bootstrap server.", "text/plain");
      return;
    }
    try {
      v[i] = std::stoi(req.get_param_value(names[i]));
    } catch (const std::exception&) {
      res.status = 400;
      res.set_content("bad rank", "text/plain");
      return;
    }
  }
  std::lock_guard<std::mutex> lock(mu_);
  held_lookups_ += hold_lookups_;
  if (hold_lookups_ || !shape_ || static_cast<int>(ranks_.size()) < shape_->expected) {
    res.status = 503;
    res.set_content("Prefill server not fully registered", "text/plain");
    return;
  }
  if (v[0] == -1 && v[1] == -1 && v[2] == -1 && v[3] == -1) {
    const json info = {
        {"attn_tp_size", shape_->attn_tp_size}, {"attn_cp_size", shape_->attn_cp_size},
        {"dp_size", shape_->dp_size},           {"pp_size", shape_->pp_size},
        {"page_size", shape_->page_size},       {"kv_cache_dtype", shape_->kv_cache_dtype},
        {"follow_bootstrap_room", true}};
    res.set_content(info.dump(), "application/json");
    return;
  }
  auto it = ranks_.find(Key{v[0], v[1], v[2], v[3]});
  if (it == ranks_.end()) {
    res.status = 404;
    res.set_content("Bootstrap info not Found", "text/plain");
    return;
  }
  res.set_content(it->second, "application/json");
}

}  // namespace kvbridge::internal

// The metrics registry renders valid Prometheus text, rejects names that
// break the conventions, counts correctly under concurrency; MetricsServer
// and BootstrapServer serve it over HTTP (scraped and parsed here).
#include "control/metrics.h"

#include <gtest/gtest.h>
#include <httplib.h>

#include <limits>
#include <map>
#include <set>
#include <sstream>
#include <thread>

#include "control/auth.h"
#include "control/bootstrap_client.h"
#include "kvbridge/bootstrap.h"

namespace kvbridge::internal {
namespace {

using nlohmann::json;

// A parsed exposition: families with their HELP/TYPE and samples
// ("name{a="x",b="y"}" -> value, labels in the order they were written).
struct Exposition {
  std::map<std::string, std::string> type;
  std::map<std::string, std::string> help;
  std::map<std::string, double> samples;
  std::string error;  // first line that does not parse

  double Get(const std::string& series) const {
    auto it = samples.find(series);
    return it == samples.end() ? -1 : it->second;
  }
};

double ParseValue(const std::string& v) {
  if (v == "+Inf") return std::numeric_limits<double>::infinity();
  if (v == "-Inf") return -std::numeric_limits<double>::infinity();
  if (v == "NaN") return std::numeric_limits<double>::quiet_NaN();
  size_t used = 0;
  double d = std::stod(v, &used);
  if (used != v.size()) throw std::invalid_argument(v);
  return d;
}

Exposition Parse(const std::string& text) {
  Exposition e;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    std::istringstream words(line);
    if (line.rfind("# HELP ", 0) == 0) {
      std::string hash, kw, name;
      words >> hash >> kw >> name;
      e.help[name] = line.substr(8 + name.size());
      continue;
    }
    if (line.rfind("# TYPE ", 0) == 0) {
      std::string hash, kw, name, type;
      words >> hash >> kw >> name >> type;
      e.type[name] = type;
      continue;
    }
    // name{labels} value: the value follows the last space (label values
    // in these tests hold no spaces).
    size_t sp = line.rfind(' ');
    if (sp == std::string::npos) {
      if (e.error.empty()) e.error = line;
      continue;
    }
    std::string series = line.substr(0, sp);
    std::string name = series.substr(0, series.find('{'));
    bool named_family = e.type.count(name) > 0;
    for (const char* suffix : {"_bucket", "_sum", "_count"}) {
      std::string s(suffix);
      if (name.size() > s.size() && name.compare(name.size() - s.size(), s.size(), s) == 0 &&
          e.type.count(name.substr(0, name.size() - s.size()))) {
        named_family = true;
      }
    }
    try {
      if (!named_family) throw std::invalid_argument("sample before its # TYPE");
      e.samples[series] = ParseValue(line.substr(sp + 1));
    } catch (const std::exception&) {
      if (e.error.empty()) e.error = line;
    }
  }
  return e;
}

TEST(MetricsRegistry, RendersCountersGaugesAndHistograms) {
  MetricsRegistry r;
  Counter* c = r.GetCounter("kvbridge_test_events_total", "Events seen", {{"kind", "a"}}).value();
  c->Increment();
  c->Increment(2.5);
  c->Increment(-7);  // ignored: counters never go down
  Gauge* g = r.GetGauge("kvbridge_test_peers", "Live peers").value();
  g->Set(3);
  g->Add(-1);
  Histogram* h =
      r.GetHistogram("kvbridge_test_latency_seconds", "Latency", {0.1, 1}, {{"role", "prefill"}})
          .value();
  h->Observe(0.05);
  h->Observe(0.1);  // le is inclusive
  h->Observe(0.5);
  h->Observe(30);

  Exposition e = Parse(r.Render());
  ASSERT_TRUE(e.error.empty()) << e.error;
  EXPECT_EQ(e.type["kvbridge_test_events_total"], "counter");
  EXPECT_EQ(e.type["kvbridge_test_peers"], "gauge");
  EXPECT_EQ(e.type["kvbridge_test_latency_seconds"], "histogram");
  EXPECT_EQ(e.help["kvbridge_test_events_total"], "Events seen");
  EXPECT_DOUBLE_EQ(e.Get("kvbridge_test_events_total{kind=\"a\"}"), 3.5);
  EXPECT_DOUBLE_EQ(e.Get("kvbridge_test_peers"), 2);
  EXPECT_EQ(e.Get("kvbridge_test_latency_seconds_bucket{role=\"prefill\",le=\"0.1\"}"), 2);
  EXPECT_EQ(e.Get("kvbridge_test_latency_seconds_bucket{role=\"prefill\",le=\"1\"}"), 3);
  EXPECT_EQ(e.Get("kvbridge_test_latency_seconds_bucket{role=\"prefill\",le=\"+Inf\"}"), 4);
  EXPECT_EQ(e.Get("kvbridge_test_latency_seconds_count{role=\"prefill\"}"), 4);
  EXPECT_DOUBLE_EQ(e.Get("kvbridge_test_latency_seconds_sum{role=\"prefill\"}"), 30.65);
}

TEST(MetricsRegistry, SameNameAndLabelsIsTheSameSeries) {
  MetricsRegistry r;
  Counter* a = r.GetCounter("kvbridge_x_total", "X", {{"a", "1"}, {"b", "2"}}).value();
  Counter* b = r.GetCounter("kvbridge_x_total", "X", {{"b", "2"}, {"a", "1"}}).value();
  Counter* other = r.GetCounter("kvbridge_x_total", "X", {{"a", "1"}, {"b", "3"}}).value();
  EXPECT_EQ(a, b);
  EXPECT_NE(a, other);
}

TEST(MetricsRegistry, EscapesLabelValuesAndHelp) {
  MetricsRegistry r;
  r.GetGauge("kvbridge_x", "line one\nback\\slash", {{"v", "q\"b\\n\nl"}}).value()->Set(1);
  const std::string text = r.Render();
  EXPECT_NE(text.find("# HELP kvbridge_x line one\\nback\\\\slash\n"), std::string::npos) << text;
  EXPECT_NE(text.find("kvbridge_x{v=\"q\\\"b\\\\n\\nl\"} 1\n"), std::string::npos) << text;
}

TEST(MetricsRegistry, RejectsNamesThatBreakTheConventions) {
  MetricsRegistry r;
  struct Case {
    const char* name;
    MetricLabels labels;
  };
  const Case bad_counters[] = {
      {"kvbridge_events", {}},              // counter without _total
      {"events_total", {}},                 // no kvbridge_ prefix
      {"kvbridge_bad-name_total", {}},      // invalid character
      {"kvbridge_x_total", {{"1a", "v"}}},  // invalid label name
      {"kvbridge_x_total", {{"__reserved", "v"}}},
      {"kvbridge_x_total", {{"a", "1"}, {"a", "2"}}},
  };
  for (const Case& c : bad_counters) {
    Result<Counter*> got = r.GetCounter(c.name, "h", c.labels);
    ASSERT_FALSE(got.ok()) << c.name;
    EXPECT_EQ(got.status().code(), StatusCode::kInvalidArgument) << got.status().ToString();
  }
  EXPECT_EQ(r.GetHistogram("kvbridge_h_seconds", "h", {1, 0.5}).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(r.GetHistogram("kvbridge_h_seconds", "h", {1}, {{"le", "x"}}).status().code(),
            StatusCode::kInvalidArgument);
}

TEST(MetricsRegistry, ConflictingRedefinitionIsFailedPrecondition) {
  MetricsRegistry r;
  ASSERT_TRUE(r.GetGauge("kvbridge_g", "G", {{"a", "1"}}).ok());
  EXPECT_EQ(r.GetHistogram("kvbridge_g", "G", {1}).status().code(),
            StatusCode::kFailedPrecondition);
  EXPECT_EQ(r.GetGauge("kvbridge_g", "other help", {{"a", "1"}}).status().code(),
            StatusCode::kFailedPrecondition);
  EXPECT_EQ(r.GetGauge("kvbridge_g", "G", {{"b", "1"}}).status().code(),
            StatusCode::kFailedPrecondition);
  ASSERT_TRUE(r.GetHistogram("kvbridge_h_seconds", "H", {1, 2}).ok());
  EXPECT_EQ(r.GetHistogram("kvbridge_h_seconds", "H", {1, 3}).status().code(),
            StatusCode::kFailedPrecondition);
}

TEST(MetricsRegistry, ConcurrentUpdatesAreAllCounted) {
  auto r = std::make_shared<MetricsRegistry>();
  constexpr int kThreads = 4, kPerThread = 20000;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([r, t] {
      Counter* c = r->GetCounter("kvbridge_c_total", "C").value();
      Histogram* h = r->GetHistogram("kvbridge_h_seconds", "H", LatencyBuckets()).value();
      Gauge* g = r->GetGauge("kvbridge_g", "G", {{"t", std::to_string(t)}}).value();
      for (int i = 0; i < kPerThread; ++i) {
        c->Increment();
        h->Observe(0.001 * (i % 100));
        g->Add(1);
        if (i % 1000 == 0) r->Render();  // scrapes race with updates
      }
    });
  }
  for (auto& th : threads) th.join();
  Exposition e = Parse(r->Render());
  ASSERT_TRUE(e.error.empty()) << e.error;
  EXPECT_EQ(e.Get("kvbridge_c_total"), kThreads * kPerThread);
  EXPECT_EQ(e.Get("kvbridge_h_seconds_count"), kThreads * kPerThread);
  EXPECT_EQ(e.Get("kvbridge_h_seconds_bucket{le=\"+Inf\"}"), kThreads * kPerThread);
  EXPECT_EQ(e.Get("kvbridge_g{t=\"3\"}"), kPerThread);
}

TEST(MetricsRegistry, CollectorsRunBeforeEachRender) {
  MetricsRegistry r;
  int calls = 0;
  r.AddCollector([&r, &calls] { r.GetGauge("kvbridge_calls", "Calls").value()->Set(++calls); });
  EXPECT_EQ(Parse(r.Render()).Get("kvbridge_calls"), 1);
  EXPECT_EQ(Parse(r.Render()).Get("kvbridge_calls"), 2);
}

TEST(MetricsRegistry, SeriesPerFamilyAreCapped) {
  MetricsRegistry r;
  for (size_t i = 0; i < kMaxSeriesPerFamily; ++i) {
    ASSERT_TRUE(r.GetCounter("kvbridge_c_total", "C", {{"id", std::to_string(i)}}).ok()) << i;
  }
  Result<Counter*> over = r.GetCounter("kvbridge_c_total", "C", {{"id", "one-more"}});
  ASSERT_FALSE(over.ok());
  EXPECT_EQ(over.status().code(), StatusCode::kResourceExhausted) << over.status().ToString();
  // The series already there still answer, and other families are not
  // affected by this one being full.
  EXPECT_TRUE(r.GetCounter("kvbridge_c_total", "C", {{"id", "0"}}).ok());
  EXPECT_TRUE(r.GetGauge("kvbridge_g", "G", {{"id", "one-more"}}).ok());
  Exposition e = Parse(r.Render());
  ASSERT_TRUE(e.error.empty()) << e.error;
  EXPECT_EQ(e.Get("kvbridge_c_total{id=\"999\"}"), 0);
  EXPECT_EQ(e.Get("kvbridge_c_total{id=\"one-more\"}"), -1);  // absent
}

TEST(MetricsRegistry, NanAndNegativeUpdatesAreIgnored) {
  MetricsRegistry r;
  Counter* c = r.GetCounter("kvbridge_c_total", "C").value();
  c->Increment(std::numeric_limits<double>::quiet_NaN());
  c->Increment(-1);
  c->Increment(2);
  Histogram* h = r.GetHistogram("kvbridge_h_seconds", "H", {1}).value();
  h->Observe(std::numeric_limits<double>::quiet_NaN());
  h->Observe(0.5);
  Exposition e = Parse(r.Render());
  EXPECT_EQ(e.Get("kvbridge_c_total"), 2);
  EXPECT_EQ(e.Get("kvbridge_h_seconds_count"), 1);
  EXPECT_EQ(e.Get("kvbridge_h_seconds_sum"), 0.5);
}

TEST(MetricsRegistry, RenderIsSortedByNameThenLabels) {
  MetricsRegistry r;
  r.GetGauge("kvbridge_b", "B", {{"k", "y"}}).value()->Set(1);
  r.GetCounter("kvbridge_a_total", "A").value()->Increment();
  r.GetGauge("kvbridge_b", "B", {{"k", "x"}}).value()->Set(2);
  const std::string text = r.Render();
  const size_t a = text.find("# HELP kvbridge_a_total");
  const size_t bx = text.find("kvbridge_b{k=\"x\"} 2");
  const size_t by = text.find("kvbridge_b{k=\"y\"} 1");
  ASSERT_NE(a, std::string::npos) << text;
  ASSERT_NE(bx, std::string::npos) << text;
  ASSERT_NE(by, std::string::npos) << text;
  EXPECT_LT(a, bx);
  EXPECT_LT(bx, by);
}

TEST(HttpLabels, MethodsAndCodesComeFromAFixedSet) {
  const std::pair<std::string, std::string> methods[] = {
      {"GET", "GET"},
      {"PUT", "PUT"},
      {"POST", "POST"},
      {"DELETE", "DELETE"},
      {"HEAD", "HEAD"},
      {"PATCH", "PATCH"},
      {"OPTIONS", "OPTIONS"},
      {"get", "other"},
      {"BREW", "other"},
      {"", "other"},
      {"TRACE", "other"},
      {"GET\n", "other"},
      {std::string(10000, 'G'), "other"},
  };
  for (const auto& [in, want] : methods) EXPECT_EQ(HttpMethodLabel(in), want) << in.size();
  EXPECT_EQ(HttpCodeLabel(200), "200");
  EXPECT_EQ(HttpCodeLabel(599), "599");
  EXPECT_EQ(HttpCodeLabel(100), "100");
  EXPECT_EQ(HttpCodeLabel(99), "other");
  EXPECT_EQ(HttpCodeLabel(600), "other");
  EXPECT_EQ(HttpCodeLabel(-1), "other");
}

TEST(MetricsServer, ServesTheRegistryOverHttp) {
  auto registry = std::make_shared<MetricsRegistry>();
  registry->GetCounter("kvbridge_transfer_bytes_total", "Bytes").value()->Increment(4096);
  Result<std::unique_ptr<MetricsServer>> server = MetricsServer::Start(0, registry, "127.0.0.1");
  ASSERT_TRUE(server.ok()) << server.status().ToString();
  ASSERT_GT((*server)->port(), 0);
  EXPECT_EQ((*server)->address(), "127.0.0.1:" + std::to_string((*server)->port()));

  httplib::Client cli("127.0.0.1", (*server)->port());
  httplib::Result res = cli.Get("/metrics");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 200);
  EXPECT_EQ(res->get_header_value("Content-Type"), kMetricsContentType);
  Exposition e = Parse(res->body);
  ASSERT_TRUE(e.error.empty()) << e.error;
  EXPECT_EQ(e.type["kvbridge_transfer_bytes_total"], "counter");
  EXPECT_EQ(e.Get("kvbridge_transfer_bytes_total"), 4096);

  registry->GetCounter("kvbridge_transfer_bytes_total", "Bytes").value()->Increment(1);
  res = cli.Get("/metrics");
  ASSERT_TRUE(res);
  EXPECT_EQ(Parse(res->body).Get("kvbridge_transfer_bytes_total"), 4097);
  res = cli.Get("/nope");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 404);

  // A second server on the same port is refused, not silently shared.
  Result<std::unique_ptr<MetricsServer>> twin =
      MetricsServer::Start((*server)->port(), registry, "127.0.0.1");
  ASSERT_FALSE(twin.ok());
  EXPECT_EQ(twin.status().code(), StatusCode::kAlreadyExists) << twin.status().ToString();

  (*server)->Stop();
  (*server)->Stop();  // idempotent
  httplib::Client after("127.0.0.1", (*server)->port());
  after.set_connection_timeout(std::chrono::seconds(2));
  EXPECT_FALSE(after.Get("/metrics"));
}

TEST(MetricsServer, RejectsBadArguments) {
  EXPECT_EQ(MetricsServer::Start(70000, std::make_shared<MetricsRegistry>()).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(MetricsServer::Start(0, nullptr).status().code(), StatusCode::kInvalidArgument);
}

RankRecord Rank(RankRole role, int tp, uint64_t incarnation) {
  RankRecord r;
  r.role = role;
  r.attn_tp_size = 2;
  r.attn_tp_rank = tp;
  r.rank_ip = "127.0.0.1";
  r.rank_port = 18000 + tp;
  r.page_size = 16;
  r.kv_cache_dtype = "bfloat16";
  r.host = "node-a";
  r.pid = 4000 + tp;
  r.incarnation = incarnation;
  return r;
}

TEST(BootstrapServerMetrics, RanksFailuresAndRequestsAreExposed) {
  BootstrapServerOptions o;
  o.host = "127.0.0.1";
  o.port = 0;
  Result<std::unique_ptr<BootstrapServer>> server = BootstrapServer::Start(o);
  ASSERT_TRUE(server.ok()) << server.status().ToString();
  auto client = BootstrapClient::Create((*server)->address(), std::chrono::seconds(5),
                                        AuthTokenFromEnvironment())
                    .value();
  // Prefill tp0 has a client of its own: it reports the failure below.
  auto prefill0 = BootstrapClient::Create((*server)->address(), std::chrono::seconds(5),
                                          AuthTokenFromEnvironment())
                      .value();
  ASSERT_TRUE(prefill0->RegisterRank(Rank(RankRole::kPrefill, 0, 11)).ok());
  ASSERT_TRUE(client->RegisterRank(Rank(RankRole::kPrefill, 1, 12)).ok());
  ASSERT_TRUE(client->RegisterRank(Rank(RankRole::kDecode, 0, 21)).ok());
  // Names decode tp0 as the origin: the registry marks it dead.
  ASSERT_TRUE(prefill0
                  ->PublishFailure(json{
                      {"cause", "peer_exited"},
                      {"origin",
                       {{"role", "decode"}, {"dp", 0}, {"tp", 0}, {"pp", 0}, {"incarnation", 21}}},
                      {"detected_by",
                       {{"role", "prefill"}, {"dp", 0}, {"tp", 0}, {"pp", 0}, {"incarnation", 11}}},
                      {"message", "room 1: decode tp0 exited"}})
                  .ok());
  // Refused (400): an unknown cause is not a record.
  ASSERT_FALSE(client->PublishFailure(json{{"cause", "no_such_cause"}}).ok());
  ASSERT_FALSE(client->GetRank(0, 0, 5, 0).ok());  // 404

  httplib::Client cli("127.0.0.1", (*server)->port());
  httplib::Result res = cli.Get("/metrics");
  ASSERT_TRUE(res);
  ASSERT_EQ(res->status, 200);
  EXPECT_EQ(res->get_header_value("Content-Type"), kMetricsContentType);
  Exposition e = Parse(res->body);
  ASSERT_TRUE(e.error.empty()) << e.error << "\n" << res->body;
  EXPECT_EQ(e.type["kvbridge_bootstrap_ranks"], "gauge");
  EXPECT_EQ(e.type["kvbridge_bootstrap_failure_records_total"], "counter");
  EXPECT_EQ(e.type["kvbridge_bootstrap_requests_total"], "counter");
  EXPECT_EQ(e.Get("kvbridge_bootstrap_ranks{role=\"prefill\",state=\"alive\"}"), 2);
  EXPECT_EQ(e.Get("kvbridge_bootstrap_ranks{role=\"decode\",state=\"dead\"}"), 1);
  EXPECT_EQ(e.Get("kvbridge_bootstrap_ranks{role=\"decode\",state=\"alive\"}"), 0);
  EXPECT_EQ(e.Get("kvbridge_bootstrap_failure_records_total{cause=\"peer_exited\"}"), 1);
  // The refused record is counted under no cause (Get: -1 = no such series).
  EXPECT_EQ(e.Get("kvbridge_bootstrap_failure_records_total{cause=\"unknown\"}"), -1);
  EXPECT_EQ(
      e.Get("kvbridge_bootstrap_requests_total{code=\"200\",method=\"PUT\",route=\"/route\"}"), 3);
  EXPECT_EQ(
      e.Get("kvbridge_bootstrap_requests_total{code=\"200\",method=\"POST\",route=\"/failure\"}"),
      1);
  EXPECT_EQ(
      e.Get("kvbridge_bootstrap_requests_total{code=\"404\",method=\"GET\",route=\"/route\"}"), 1);

  // Unknown paths are counted under one label value, not one each.
  ASSERT_TRUE(cli.Get("/a"));
  ASSERT_TRUE(cli.Get("/b"));
  res = cli.Get("/metrics");
  ASSERT_TRUE(res);
  e = Parse(res->body);
  EXPECT_EQ(e.Get("kvbridge_bootstrap_requests_total{code=\"404\",method=\"GET\",route=\"other\"}"),
            2);
  EXPECT_EQ(
      e.Get("kvbridge_bootstrap_requests_total{code=\"200\",method=\"GET\",route=\"/metrics\"}"),
      1);
}

// A client that invents HTTP methods gets its requests counted under
// method="other": the label set does not grow with what it sends.
TEST(BootstrapServerMetrics, HostileMethodsDoNotGrowTheLabelSet) {
  BootstrapServerOptions o;
  o.host = "127.0.0.1";
  o.port = 0;
  Result<std::unique_ptr<BootstrapServer>> server = BootstrapServer::Start(o);
  ASSERT_TRUE(server.ok()) << server.status().ToString();
  constexpr int kInvented = 50;
  for (int i = 0; i < kInvented; ++i) {
    httplib::Client cli("127.0.0.1", (*server)->port());
    httplib::Request req;
    req.method = "BREW" + std::to_string(i);
    req.path = "/route";
    httplib::Result res = cli.send(req);
    ASSERT_TRUE(res) << i;  // answered (an error code), not dropped
    EXPECT_GE(res->status, 400) << i;
  }
  httplib::Client cli("127.0.0.1", (*server)->port());
  httplib::Result res = cli.Get("/metrics");
  ASSERT_TRUE(res);
  Exposition e = Parse(res->body);
  ASSERT_TRUE(e.error.empty()) << e.error << "\n" << res->body;
  const std::set<std::string> allowed = {"\"GET\"",    "\"HEAD\"",  "\"POST\"",    "\"PUT\"",
                                         "\"DELETE\"", "\"PATCH\"", "\"OPTIONS\"", "\"other\""};
  double other = 0;
  int series = 0;
  for (const auto& [name, value] : e.samples) {
    if (name.rfind("kvbridge_bootstrap_requests_total{", 0) != 0) continue;
    ++series;
    const size_t at = name.find("method=");
    ASSERT_NE(at, std::string::npos) << name;
    const std::string method = name.substr(at + 7, name.find_first_of(",}", at) - at - 7);
    EXPECT_EQ(allowed.count(method), 1u) << name;
    if (method == "\"other\"") other += value;
  }
  EXPECT_EQ(other, kInvented);
  EXPECT_LE(series, 3);  // the invented ones in one series (or one per status), no more
}

}  // namespace
}  // namespace kvbridge::internal

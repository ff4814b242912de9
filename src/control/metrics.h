// Metrics: Prometheus counters, gauges and histograms kept by prometheus-cpp
// (its core registry and its text serializer, exposition format 0.0.4), and
// a small HTTP server (cpp-httplib, the server the bootstrap registry uses)
// exposing them at GET /metrics. The bootstrap server serves its registry on
// its own port; every KVManager can start a MetricsServer on a configurable
// port. prometheus-cpp stays behind this header: nothing else includes it.
//
// Names follow Prometheus conventions and are checked when a metric is
// created: they start with "kvbridge_", use [a-zA-Z0-9_:], counters end in
// "_total", units are base units in the name ("_seconds", "_bytes"). The
// metrics kvbridge exports are listed in docs/metrics.md.
//
// Label values must come from bounded sets (routes, causes, states): a value
// a client chose (an HTTP method, a path) goes through a fixed table first
// (HttpMethodLabel, HttpCodeLabel), and a family refuses more than
// kMaxSeriesPerFamily label sets, so no sender can grow the registry
// without bound.
//
// Usage:
//   auto registry = std::make_shared<MetricsRegistry>();
//   KVB_ASSIGN_OR_RETURN(Counter* bytes, registry->GetCounter(
//       "kvbridge_transfer_bytes_total", "Payload bytes written"));
//   bytes->Increment(n);  // hot path: one atomic update, no registry lock
//   KVB_ASSIGN_OR_RETURN(auto server, MetricsServer::Start(9100, registry));
//
// Thread safety: every method of every class here may be called
// concurrently. Counter and Gauge updates are atomic; a Histogram
// observation takes that series' own (prometheus-cpp) lock; creating a
// metric and rendering take the registry's lock. Metric pointers stay valid
// as long as the registry.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/thread_annotations.h"
#include "kvbridge/status.h"

namespace prometheus {
class Counter;
class Gauge;
class Histogram;
class Registry;
}  // namespace prometheus

namespace kvbridge::internal {

// Label name/value pairs, e.g. {{"route", "/ranks"}, {"code", "200"}}. The
// order does not matter; the same set always names the same series.
using MetricLabels = std::vector<std::pair<std::string, std::string>>;

// The Content-Type of a /metrics answer.
inline constexpr char kMetricsContentType[] = "text/plain; version=0.0.4; charset=utf-8";

// The most label sets one family holds; GetCounter/GetGauge/GetHistogram
// answer ResourceExhausted past it.
inline constexpr size_t kMaxSeriesPerFamily = 1000;

// An HTTP method as a label value: one of GET, HEAD, POST, PUT, DELETE,
// OPTIONS, PATCH, else "other" (the method is whatever a client sent).
std::string_view HttpMethodLabel(std::string_view method);
// An HTTP status as a label value: "100" .. "599", else "other".
std::string HttpCodeLabel(int status);

// A monotonically increasing value (events, bytes).
class Counter {
 public:
  // Adds `amount`; a negative or NaN amount is ignored (counters never go
  // down).
  void Increment(double amount = 1);
  double Value() const;

 private:
  friend class MetricsRegistry;
  explicit Counter(prometheus::Counter& c) : c_(c) {}
  prometheus::Counter& c_;
};

// A value that goes up and down (live peers, rooms in a state).
class Gauge {
 public:
  void Set(double value);
  void Add(double delta);
  double Value() const;

 private:
  friend class MetricsRegistry;
  explicit Gauge(prometheus::Gauge& g) : g_(g) {}
  prometheus::Gauge& g_;
};

// Observations in cumulative buckets (latencies in seconds, sizes in bytes);
// `le` is inclusive. A NaN observation is ignored.
class Histogram {
 public:
  void Observe(double value);

 private:
  friend class MetricsRegistry;
  explicit Histogram(prometheus::Histogram& h) : h_(h) {}
  prometheus::Histogram& h_;
};

// Latency buckets in seconds, 100 us to 60 s (about x2.5 apart).
std::vector<double> LatencyBuckets();
// start, start*factor, ... (`count` bounds). Preconditions: start > 0,
// factor > 1, count >= 1.
std::vector<double> ExponentialBuckets(double start, double factor, int count);

class MetricsRegistry {
 public:
  MetricsRegistry();
  ~MetricsRegistry();
  MetricsRegistry(const MetricsRegistry&) = delete;
  MetricsRegistry& operator=(const MetricsRegistry&) = delete;

  // The series `name`{labels}, created on first use; the same name and
  // labels return the same object. Errors: InvalidArgument for a name or
  // label name Prometheus rejects, a name without the "kvbridge_" prefix, a
  // counter name without "_total", a histogram without increasing finite
  // bounds or with an "le" label; FailedPrecondition when `name` exists with
  // another type, help text, set of label names or bucket bounds;
  // ResourceExhausted for a new label set past kMaxSeriesPerFamily.
  Result<Counter*> GetCounter(std::string_view name, std::string_view help,
                              const MetricLabels& labels = {});
  Result<Gauge*> GetGauge(std::string_view name, std::string_view help,
                          const MetricLabels& labels = {});
  Result<Histogram*> GetHistogram(std::string_view name, std::string_view help,
                                  std::vector<double> bounds, const MetricLabels& labels = {});

  // `collect` runs at the start of every Render(), without the registry's
  // lock held, to refresh values computed on demand (e.g. ranks by state).
  // It may create and set metrics; it may run concurrently with itself when
  // two scrapes overlap.
  void AddCollector(std::function<void()> collect);

  // Every series in the text exposition format (prometheus-cpp's
  // TextSerializer): families sorted by name, each with its # HELP and
  // # TYPE lines, its series sorted by labels.
  std::string Render();

 private:
  struct Family;
  template <typename T>
  Result<T*> Get(int type, std::string_view name, std::string_view help,
                 const std::vector<double>* bounds, const MetricLabels& labels);

  const std::unique_ptr<prometheus::Registry> registry_;  // has its own lock
  Mutex mu_;
  std::map<std::string, std::unique_ptr<Family>, std::less<>> families_ KVB_GUARDED_BY(mu_);
  Mutex collectors_mu_;
  std::vector<std::shared_ptr<std::function<void()>>> collectors_ KVB_GUARDED_BY(collectors_mu_);
};

// Serves GET /metrics (registry->Render()) on its own port until stopped
// or destroyed. Other paths answer 404.
class MetricsServer {
 public:
  // Binds host:port (port 0 = pick a free one, see port()) and returns once
  // it accepts requests. InvalidArgument for a port outside [0, 65535] or a
  // null registry; AlreadyExists "host:port" when the port is taken;
  // Unavailable for any other bind failure.
  static Result<std::unique_ptr<MetricsServer>> Start(int port,
                                                      std::shared_ptr<MetricsRegistry> registry,
                                                      const std::string& host = "0.0.0.0");
  ~MetricsServer();  // Stop()s.
  MetricsServer(const MetricsServer&) = delete;
  MetricsServer& operator=(const MetricsServer&) = delete;

  int port() const;
  std::string address() const;  // "host:port" as bound
  // Stops accepting, finishes requests in flight, joins. Idempotent.
  void Stop();

 private:
  struct Impl;
  explicit MetricsServer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace kvbridge::internal

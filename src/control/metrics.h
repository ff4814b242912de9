// Metrics: a registry of Prometheus counters, gauges and histograms, and a
// small HTTP server exposing them in the text exposition format (0.0.4) at
// GET /metrics. The bootstrap server serves its registry on its own port;
// every KVManager can start a MetricsServer on a configurable port.
//
// Names follow Prometheus conventions and are checked when a metric is
// created: they start with "kvbridge_", use [a-zA-Z0-9_:], counters end in
// "_total", units are base units in the name ("_seconds", "_bytes"). The
// metrics kvbridge exports are listed in docs/metrics.md.
//
// Usage:
//   auto registry = std::make_shared<MetricsRegistry>();
//   KVB_ASSIGN_OR_RETURN(Counter* bytes, registry->GetCounter(
//       "kvbridge_transfer_bytes_total", "Payload bytes written"));
//   bytes->Increment(n);  // hot path: one atomic add, no lock
//   KVB_ASSIGN_OR_RETURN(auto server, MetricsServer::Start(9100, registry));
//
// Thread safety: every method of every class here may be called
// concurrently. Counter, Gauge and Histogram updates are lock-free; creating
// a metric and rendering take the registry's lock. Metric pointers stay
// valid as long as the registry.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "kvbridge/status.h"

namespace kvbridge::internal {

// Label name/value pairs, e.g. {{"route", "/ranks"}, {"code", "200"}}. The
// order does not matter; the same set always names the same series.
using MetricLabels = std::vector<std::pair<std::string, std::string>>;

// The Content-Type of a /metrics answer.
inline constexpr char kMetricsContentType[] = "text/plain; version=0.0.4; charset=utf-8";

// A monotonically increasing value (events, bytes).
class Counter {
 public:
  // Adds `amount`; a negative or NaN amount is ignored (counters never go
  // down).
  void Increment(double amount = 1);
  double Value() const { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<double> value_{0};
};

// A value that goes up and down (live peers, rooms in a state).
class Gauge {
 public:
  void Set(double value) { value_.store(value, std::memory_order_relaxed); }
  void Add(double delta);
  double Value() const { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<double> value_{0};
};

// Observations in cumulative buckets (latencies in seconds, sizes in bytes).
class Histogram {
 public:
  // `bounds`: strictly increasing finite upper bounds; +Inf is implicit.
  explicit Histogram(std::vector<double> bounds);
  void Observe(double value);

  struct Snapshot {
    std::vector<double> bounds;
    std::vector<uint64_t> cumulative;  // bounds.size() + 1 entries, the last is +Inf
    double sum = 0;
    uint64_t count = 0;  // == cumulative.back()
  };
  Snapshot Snap() const;
  const std::vector<double>& bounds() const { return bounds_; }

 private:
  std::vector<double> bounds_;
  std::unique_ptr<std::atomic<uint64_t>[]> buckets_;  // per bucket, not cumulative
  std::atomic<double> sum_{0};
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
  // another type, help text, set of label names or bucket bounds.
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

  // Every series in the text exposition format: families sorted by name,
  // each with its # HELP and # TYPE lines.
  std::string Render();

 private:
  struct Family;
  template <typename T>
  Result<T*> Get(int type, std::string_view name, std::string_view help,
                 const std::vector<double>* bounds, const MetricLabels& labels);

  std::mutex mu_;
  std::map<std::string, std::unique_ptr<Family>, std::less<>> families_;  // GUARDED_BY(mu_)
  std::mutex collectors_mu_;
  std::vector<std::shared_ptr<std::function<void()>>> collectors_;  // GUARDED_BY(collectors_mu_)
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

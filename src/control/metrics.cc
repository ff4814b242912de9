#include "control/metrics.h"

#include <httplib.h>
#include <prometheus/counter.h>
#include <prometheus/family.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>
#include <prometheus/text_serializer.h>

#include <algorithm>
#include <cmath>
#include <exception>

#include "common/log.h"
#include "control/http_server.h"

namespace kvbridge::internal {
namespace {

enum MetricType { kCounterType = 0, kGaugeType = 1, kHistogramType = 2 };

const char* TypeName(int type) {
  switch (type) {
    case kCounterType:
      return "counter";
    case kGaugeType:
      return "gauge";
    default:
      return "histogram";
  }
}

bool ValidName(std::string_view s, bool colon_ok) {
  if (s.empty()) return false;
  for (size_t i = 0; i < s.size(); ++i) {
    char c = s[i];
    bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' ||
              (colon_ok && c == ':') || (i > 0 && c >= '0' && c <= '9');
    if (!ok) return false;
  }
  return true;
}

bool EndsWith(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

// prometheus-cpp 1.0's TextSerializer escapes label values but writes help
// text as given, so a newline in it would end the # HELP line.
std::string EscapeHelp(std::string_view v) {
  std::string out;
  for (char c : v) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out += c;
    }
  }
  return out;
}

// The checks prometheus-cpp would throw for, and kvbridge's own
// conventions. `sorted`: the labels sorted by name.
Status Validate(int type, std::string_view name, const MetricLabels& sorted,
                const std::vector<double>* bounds, const std::string& what) {
  if (!ValidName(name, /*colon_ok=*/true)) {
    return InvalidArgumentError(what + ": not a valid Prometheus metric name");
  }
  if (name.substr(0, 9) != "kvbridge_") {
    return InvalidArgumentError(what + ": names start with 'kvbridge_'");
  }
  if (type == kCounterType && !EndsWith(name, "_total")) {
    return InvalidArgumentError(what + ": counter names end in '_total'");
  }
  for (size_t i = 0; i < sorted.size(); ++i) {
    const std::string& k = sorted[i].first;
    if (!ValidName(k, /*colon_ok=*/false) || k.substr(0, 2) == "__") {
      return InvalidArgumentError(what + ": invalid label name '" + k + "'");
    }
    if (i > 0 && sorted[i - 1].first == k) {
      return InvalidArgumentError(what + ": label '" + k + "' given twice");
    }
    if (type == kHistogramType && k == "le") {
      return InvalidArgumentError(what + ": histograms reserve the label 'le'");
    }
  }
  if (bounds != nullptr) {
    for (size_t i = 0; i < bounds->size(); ++i) {
      if (!std::isfinite((*bounds)[i]) || (i > 0 && (*bounds)[i] <= (*bounds)[i - 1])) {
        return InvalidArgumentError(what + ": bucket bounds must be finite and increasing");
      }
    }
  }
  return Status::Ok();
}

// One family as prometheus-cpp keeps it; exactly one pointer is set.
struct PrometheusFamily {
  prometheus::Family<prometheus::Counter>* counters = nullptr;
  prometheus::Family<prometheus::Gauge>* gauges = nullptr;
  prometheus::Family<prometheus::Histogram>* histograms = nullptr;
};

// prometheus-cpp reports errors by throwing; they stop here. The inputs
// were validated first, so a throw is a bug (or out of memory).
Result<PrometheusFamily> AddFamily(prometheus::Registry& registry, int type,
                                   const std::string& name, const std::string& help,
                                   const std::string& what) {
  PrometheusFamily f;
  try {
    const std::string escaped = EscapeHelp(help);
    if (type == kCounterType) {
      f.counters = &prometheus::BuildCounter().Name(name).Help(escaped).Register(registry);
    } else if (type == kGaugeType) {
      f.gauges = &prometheus::BuildGauge().Name(name).Help(escaped).Register(registry);
    } else {
      f.histograms = &prometheus::BuildHistogram().Name(name).Help(escaped).Register(registry);
    }
  } catch (const std::exception& e) {
    return InternalError(what + ": prometheus-cpp refused the family: " + e.what());
  }
  return f;
}

}  // namespace

std::string_view HttpMethodLabel(std::string_view method) {
  static constexpr std::string_view kMethods[] = {"GET",    "HEAD",    "POST", "PUT",
                                                  "DELETE", "OPTIONS", "PATCH"};
  for (std::string_view m : kMethods) {
    if (method == m) return m;
  }
  return "other";
}

std::string HttpCodeLabel(int status) {
  return status >= 100 && status <= 599 ? std::to_string(status) : "other";
}

void Counter::Increment(double amount) {
  if (!(amount >= 0)) return;  // negative or NaN
  c_.Increment(amount);
}
double Counter::Value() const { return c_.Value(); }

void Gauge::Set(double value) { g_.Set(value); }
void Gauge::Add(double delta) { g_.Increment(delta); }
double Gauge::Value() const { return g_.Value(); }

void Histogram::Observe(double value) {
  if (std::isnan(value)) return;  // would land in the first bucket and poison the sum
  h_.Observe(value);
}

std::vector<double> ExponentialBuckets(double start, double factor, int count) {
  std::vector<double> b;
  double v = start;
  for (int i = 0; i < count; ++i, v *= factor) b.push_back(v);
  return b;
}

std::vector<double> LatencyBuckets() {
  return {0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05,
          0.1,    0.25,    0.5,    1,     2.5,    5,     10,   30,    60};
}

// What a name was first registered with (later calls must agree), and the
// series handed out so far.
struct MetricsRegistry::Family {
  int type = kCounterType;
  std::string help;
  std::vector<std::string> label_names;  // sorted
  std::vector<double> bounds;            // histograms
  PrometheusFamily prometheus;
  std::map<MetricLabels, std::unique_ptr<Counter>> counters;
  std::map<MetricLabels, std::unique_ptr<Gauge>> gauges;
  std::map<MetricLabels, std::unique_ptr<Histogram>> histograms;
  size_t series() const { return counters.size() + gauges.size() + histograms.size(); }
};

MetricsRegistry::MetricsRegistry() : registry_(std::make_unique<prometheus::Registry>()) {}
MetricsRegistry::~MetricsRegistry() = default;

template <typename T>
Result<T*> MetricsRegistry::Get(int type, std::string_view name, std::string_view help,
                                const std::vector<double>* bounds, const MetricLabels& labels) {
  const std::string what = "metric '" + std::string(name) + "'";
  MetricLabels sorted = labels;
  std::sort(sorted.begin(), sorted.end());
  KVB_RETURN_IF_ERROR(Validate(type, name, sorted, bounds, what));
  std::vector<std::string> label_names;
  for (const auto& [k, v] : sorted) label_names.push_back(k);

  MutexLock lock(mu_);
  auto it = families_.find(name);
  if (it == families_.end()) {
    auto f = std::make_unique<Family>();
    KVB_ASSIGN_OR_RETURN(f->prometheus,
                         AddFamily(*registry_, type, std::string(name), std::string(help), what));
    f->type = type;
    f->help = std::string(help);
    f->label_names = label_names;
    if (bounds != nullptr) f->bounds = *bounds;
    it = families_.emplace(std::string(name), std::move(f)).first;
  }
  Family& f = *it->second;
  if (f.type != type) {
    return FailedPreconditionError(what + " is a " + TypeName(f.type) + ", not a " +
                                   TypeName(type));
  }
  if (f.help != help) return FailedPreconditionError(what + " exists with another help text");
  if (f.label_names != label_names) {
    return FailedPreconditionError(what + " exists with other label names");
  }
  if (bounds != nullptr && f.bounds != *bounds) {
    return FailedPreconditionError(what + " exists with other bucket bounds");
  }
  auto& series = [&f]() -> auto& {
    if constexpr (std::is_same_v<T, Counter>) {
      return f.counters;
    } else if constexpr (std::is_same_v<T, Gauge>) {
      return f.gauges;
    } else {
      return f.histograms;
    }
  }
  ();
  auto found = series.find(sorted);
  if (found != series.end()) return found->second.get();
  if (f.series() >= kMaxSeriesPerFamily) {
    return ResourceExhaustedError(what + ": more than " + std::to_string(kMaxSeriesPerFamily) +
                                  " label sets; label values must come from a bounded set");
  }
  const prometheus::Labels prometheus_labels(sorted.begin(), sorted.end());
  std::unique_ptr<T> made;
  try {
    if constexpr (std::is_same_v<T, Counter>) {
      made.reset(new Counter(f.prometheus.counters->Add(prometheus_labels)));
    } else if constexpr (std::is_same_v<T, Gauge>) {
      made.reset(new Gauge(f.prometheus.gauges->Add(prometheus_labels)));
    } else {
      made.reset(new Histogram(f.prometheus.histograms->Add(prometheus_labels, f.bounds)));
    }
  } catch (const std::exception& e) {
    return InternalError(what + ": prometheus-cpp refused the series: " + e.what());
  }
  return series.emplace(std::move(sorted), std::move(made)).first->second.get();
}

Result<Counter*> MetricsRegistry::GetCounter(std::string_view name, std::string_view help,
                                             const MetricLabels& labels) {
  return Get<Counter>(kCounterType, name, help, nullptr, labels);
}

Result<Gauge*> MetricsRegistry::GetGauge(std::string_view name, std::string_view help,
                                         const MetricLabels& labels) {
  return Get<Gauge>(kGaugeType, name, help, nullptr, labels);
}

Result<Histogram*> MetricsRegistry::GetHistogram(std::string_view name, std::string_view help,
                                                 std::vector<double> bounds,
                                                 const MetricLabels& labels) {
  return Get<Histogram>(kHistogramType, name, help, &bounds, labels);
}

void MetricsRegistry::AddCollector(std::function<void()> collect) {
  MutexLock lock(collectors_mu_);
  collectors_.push_back(std::make_shared<std::function<void()>>(std::move(collect)));
}

std::string MetricsRegistry::Render() {
  std::vector<std::shared_ptr<std::function<void()>>> collectors;
  {
    MutexLock lock(collectors_mu_);
    collectors = collectors_;
  }
  for (const auto& c : collectors) (*c)();

  // prometheus-cpp collects families in registration order and series in
  // hash order; sorted, two scrapes of the same state read the same.
  std::vector<prometheus::MetricFamily> families = registry_->Collect();
  std::sort(families.begin(), families.end(),
            [](const auto& a, const auto& b) { return a.name < b.name; });
  for (prometheus::MetricFamily& f : families) {
    std::sort(f.metric.begin(), f.metric.end(),
              [](const auto& a, const auto& b) { return a.label < b.label; });
  }
  return prometheus::TextSerializer().Serialize(families);
}

struct MetricsServer::Impl {
  std::shared_ptr<MetricsRegistry> registry;
  httplib::Server http;
  HttpServerThread serving;  // after `http`: stops serving before it goes
};

Result<std::unique_ptr<MetricsServer>> MetricsServer::Start(
    int port, std::shared_ptr<MetricsRegistry> registry, const std::string& host) {
  if (registry == nullptr) return InvalidArgumentError("metrics server: null registry");
  if (port < 0 || port > 65535) {
    return InvalidArgumentError("metrics server: port " + std::to_string(port) +
                                " out of range [0, 65535]");
  }
  auto impl = std::make_unique<Impl>();
  impl->registry = std::move(registry);
  impl->http.set_keep_alive_timeout(1);  // bounds how long Stop() waits for idle scrapers
  MetricsRegistry* reg = impl->registry.get();
  impl->http.Get("/metrics", [reg](const httplib::Request&, httplib::Response& res) {
    res.set_content(reg->Render(), kMetricsContentType);
  });

  KVB_RETURN_IF_ERROR(impl->serving.Start(impl->http, host, port, "metrics server"));
  KVB_LOG_INFO("metrics at http://{}/metrics", impl->serving.address());
  return std::unique_ptr<MetricsServer>(new MetricsServer(std::move(impl)));
}

MetricsServer::MetricsServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
MetricsServer::~MetricsServer() { Stop(); }
int MetricsServer::port() const { return impl_->serving.port(); }
std::string MetricsServer::address() const { return impl_->serving.address(); }

void MetricsServer::Stop() { impl_->serving.Stop(); }

}  // namespace kvbridge::internal

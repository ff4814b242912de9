#include "control/metrics.h"

#include <httplib.h>

#include <algorithm>
#include <cmath>

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

// Prometheus floats: integers without a fraction, +Inf/-Inf/NaN spelled its way.
std::string FormatValue(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  if (v == std::floor(v) && std::fabs(v) < 1e15) {
    return std::to_string(static_cast<int64_t>(v));
  }
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.17g", v);
  // Shortest form that round-trips.
  for (int precision = 6; precision < 17; ++precision) {
    char shorter[32];
    std::snprintf(shorter, sizeof(shorter), "%.*g", precision, v);
    if (std::strtod(shorter, nullptr) == v) return shorter;
  }
  return buf;
}

std::string EscapeLabelValue(std::string_view v) {
  std::string out;
  for (char c : v) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '"') {
      out += "\\\"";
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out += c;
    }
  }
  return out;
}

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

// {a="x",b="y"}, with `extra` (le="...") appended; "" when there are none.
std::string LabelText(const MetricLabels& labels, const std::string& extra = "") {
  if (labels.empty() && extra.empty()) return "";
  std::string out = "{";
  for (const auto& [k, v] : labels) {
    if (out.size() > 1) out += ",";
    out += k + "=\"" + EscapeLabelValue(v) + "\"";
  }
  if (!extra.empty()) {
    if (out.size() > 1) out += ",";
    out += extra;
  }
  return out + "}";
}

}  // namespace

void Counter::Increment(double amount) {
  if (!(amount >= 0)) return;  // negative or NaN
  value_.fetch_add(amount, std::memory_order_relaxed);
}

void Gauge::Add(double delta) { value_.fetch_add(delta, std::memory_order_relaxed); }

Histogram::Histogram(std::vector<double> bounds)
    : bounds_(std::move(bounds)),
      buckets_(std::make_unique<std::atomic<uint64_t>[]>(bounds_.size() + 1)) {
  for (size_t i = 0; i <= bounds_.size(); ++i) buckets_[i].store(0, std::memory_order_relaxed);
}

void Histogram::Observe(double value) {
  if (std::isnan(value)) return;
  size_t i = std::lower_bound(bounds_.begin(), bounds_.end(), value) - bounds_.begin();
  buckets_[i].fetch_add(1, std::memory_order_relaxed);
  sum_.fetch_add(value, std::memory_order_relaxed);
}

Histogram::Snapshot Histogram::Snap() const {
  Snapshot s;
  s.bounds = bounds_;
  s.cumulative.resize(bounds_.size() + 1);
  uint64_t total = 0;
  for (size_t i = 0; i <= bounds_.size(); ++i) {
    total += buckets_[i].load(std::memory_order_relaxed);
    s.cumulative[i] = total;
  }
  s.count = total;
  s.sum = sum_.load(std::memory_order_relaxed);
  return s;
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

struct MetricsRegistry::Family {
  int type = kCounterType;
  std::string help;
  std::vector<std::string> label_names;  // sorted
  std::vector<double> bounds;            // histograms
  std::map<MetricLabels, std::unique_ptr<Counter>> counters;
  std::map<MetricLabels, std::unique_ptr<Gauge>> gauges;
  std::map<MetricLabels, std::unique_ptr<Histogram>> histograms;
};

MetricsRegistry::MetricsRegistry() = default;
MetricsRegistry::~MetricsRegistry() = default;

template <typename T>
Result<T*> MetricsRegistry::Get(int type, std::string_view name, std::string_view help,
                                const std::vector<double>* bounds, const MetricLabels& labels) {
  const std::string what = "metric '" + std::string(name) + "'";
  if (!ValidName(name, /*colon_ok=*/true)) {
    return InvalidArgumentError(what + ": not a valid Prometheus metric name");
  }
  if (name.substr(0, 9) != "kvbridge_") {
    return InvalidArgumentError(what + ": names start with 'kvbridge_'");
  }
  if (type == kCounterType && !EndsWith(name, "_total")) {
    return InvalidArgumentError(what + ": counter names end in '_total'");
  }
  MetricLabels sorted = labels;
  std::sort(sorted.begin(), sorted.end());
  std::vector<std::string> label_names;
  for (const auto& [k, v] : sorted) {
    if (!ValidName(k, /*colon_ok=*/false) || k.substr(0, 2) == "__") {
      return InvalidArgumentError(what + ": invalid label name '" + k + "'");
    }
    if (!label_names.empty() && label_names.back() == k) {
      return InvalidArgumentError(what + ": label '" + k + "' given twice");
    }
    if (type == kHistogramType && k == "le") {
      return InvalidArgumentError(what + ": histograms reserve the label 'le'");
    }
    label_names.push_back(k);
  }
  if (bounds != nullptr) {
    for (size_t i = 0; i < bounds->size(); ++i) {
      if (!std::isfinite((*bounds)[i]) || (i > 0 && (*bounds)[i] <= (*bounds)[i - 1])) {
        return InvalidArgumentError(what + ": bucket bounds must be finite and increasing");
      }
    }
  }

  std::lock_guard<std::mutex> lock(mu_);
  auto it = families_.find(name);
  if (it == families_.end()) {
    auto f = std::make_unique<Family>();
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
  if constexpr (std::is_same_v<T, Counter>) {
    auto& slot = f.counters[sorted];
    if (!slot) slot = std::make_unique<Counter>();
    return slot.get();
  } else if constexpr (std::is_same_v<T, Gauge>) {
    auto& slot = f.gauges[sorted];
    if (!slot) slot = std::make_unique<Gauge>();
    return slot.get();
  } else {
    auto& slot = f.histograms[sorted];
    if (!slot) slot = std::make_unique<Histogram>(f.bounds);
    return slot.get();
  }
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
  std::lock_guard<std::mutex> lock(collectors_mu_);
  collectors_.push_back(std::make_shared<std::function<void()>>(std::move(collect)));
}

std::string MetricsRegistry::Render() {
  std::vector<std::shared_ptr<std::function<void()>>> collectors;
  {
    std::lock_guard<std::mutex> lock(collectors_mu_);
    collectors = collectors_;
  }
  for (const auto& c : collectors) (*c)();

  std::string out;
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& [name, f] : families_) {
    out += "# HELP " + name + " " + EscapeHelp(f->help) + "\n";
    out += "# TYPE " + name + " " + TypeName(f->type) + "\n";
    for (const auto& [labels, c] : f->counters) {
      out += name + LabelText(labels) + " " + FormatValue(c->Value()) + "\n";
    }
    for (const auto& [labels, g] : f->gauges) {
      out += name + LabelText(labels) + " " + FormatValue(g->Value()) + "\n";
    }
    for (const auto& [labels, h] : f->histograms) {
      Histogram::Snapshot s = h->Snap();
      for (size_t i = 0; i <= s.bounds.size(); ++i) {
        std::string le = i < s.bounds.size() ? FormatValue(s.bounds[i]) : "+Inf";
        out += name + "_bucket" + LabelText(labels, "le=\"" + le + "\"") + " " +
               std::to_string(s.cumulative[i]) + "\n";
      }
      out += name + "_sum" + LabelText(labels) + " " + FormatValue(s.sum) + "\n";
      out += name + "_count" + LabelText(labels) + " " + std::to_string(s.count) + "\n";
    }
  }
  return out;
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
  impl->http.new_task_queue = [] { return new httplib::ThreadPool(2); };
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

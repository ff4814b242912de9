#include "common/log.h"

#include <spdlog/sinks/dist_sink.h>
#include <spdlog/sinks/stdout_sinks.h>
#include <unistd.h>

#include <cstdlib>
#include <mutex>

namespace kvbridge::internal {
namespace {

std::string HostName() {
  char buf[256] = {};
  if (gethostname(buf, sizeof(buf) - 1) != 0) return "unknown-host";
  return buf;
}

void ApplyPattern(spdlog::logger& logger, std::string_view identity) {
  std::string pattern = "%Y-%m-%dT%H:%M:%S.%e %^%L%$ [";
  pattern += identity.empty() ? std::string("kvbridge") : std::string(identity);
  pattern += " " + HostName() + " pid " + std::to_string(getpid()) + "] %v";
  logger.set_pattern(pattern);
}

// stderr, and the sinks tests add: the set changes under dist_sink's lock.
const std::shared_ptr<spdlog::sinks::dist_sink_mt>& Sinks() {
  static auto* sinks = new std::shared_ptr<spdlog::sinks::dist_sink_mt>(
      std::make_shared<spdlog::sinks::dist_sink_mt>(
          std::vector<spdlog::sink_ptr>{std::make_shared<spdlog::sinks::stderr_sink_mt>()}));
  return *sinks;
}

spdlog::logger& Make() {
  static spdlog::logger* logger = [] {
    auto* l = new spdlog::logger("kvbridge", Sinks());
    ApplyPattern(*l, "");
    l->set_level(spdlog::level::warn);
    if (const char* env = std::getenv("KVBRIDGE_LOG_LEVEL")) {
      auto level = spdlog::level::from_str(env);
      if (level != spdlog::level::off || std::string_view(env) == "off") l->set_level(level);
    }
    l->flush_on(spdlog::level::warn);
    return l;
  }();
  return *logger;
}

}  // namespace

spdlog::logger& Log() { return Make(); }

void SetLogIdentity(std::string_view identity) { ApplyPattern(Make(), identity); }

bool SetLogLevel(std::string_view level) {
  auto parsed = spdlog::level::from_str(std::string(level));
  if (parsed == spdlog::level::off && level != "off") return false;
  Make().set_level(parsed);
  return true;
}

void AddLogSink(std::shared_ptr<spdlog::sinks::sink> sink) { Sinks()->add_sink(std::move(sink)); }

void RemoveLogSink(const std::shared_ptr<spdlog::sinks::sink>& sink) { Sinks()->remove_sink(sink); }

}  // namespace kvbridge::internal

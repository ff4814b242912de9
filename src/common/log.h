// Logging: one line per event, the rank identity on every line.
//
// Level from KVBRIDGE_LOG_LEVEL (trace, debug, info, warn, error, off;
// default warn) or SetLogLevel(). Identity ("prefill dp0 tp1 pp0") is set once
// per process by the manager and printed with host and pid on every line.
#pragma once

#include <spdlog/sinks/sink.h>
#include <spdlog/spdlog.h>

#include <memory>
#include <string>
#include <string_view>

namespace kvbridge::internal {

// The process-wide logger (stderr).
spdlog::logger& Log();

// Sets the identity printed on every line.
void SetLogIdentity(std::string_view identity);
// Parses a level name; false when unknown.
bool SetLogLevel(std::string_view level);

// Every line logged from now on also goes to `sink`, until it is removed
// (tests read what an operator would read: common/log_capture.h). Safe while
// other threads log.
void AddLogSink(std::shared_ptr<spdlog::sinks::sink> sink);
void RemoveLogSink(const std::shared_ptr<spdlog::sinks::sink>& sink);

}  // namespace kvbridge::internal

#define KVB_LOG_TRACE(...) ::kvbridge::internal::Log().trace(__VA_ARGS__)
#define KVB_LOG_DEBUG(...) ::kvbridge::internal::Log().debug(__VA_ARGS__)
#define KVB_LOG_INFO(...) ::kvbridge::internal::Log().info(__VA_ARGS__)
#define KVB_LOG_WARN(...) ::kvbridge::internal::Log().warn(__VA_ARGS__)
#define KVB_LOG_ERROR(...) ::kvbridge::internal::Log().error(__VA_ARGS__)

// For tests: what this process logged while a LogCapture lived, as an
// operator reads it on stderr.
#pragma once

#include <spdlog/sinks/ringbuffer_sink.h>

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "common/log.h"

namespace kvbridge::internal::testing {

class LogCapture {
 public:
  // Keeps the last `lines` lines.
  explicit LogCapture(size_t lines = 4096)
      : sink_(std::make_shared<spdlog::sinks::ringbuffer_sink_mt>(lines)) {
    sink_->set_pattern("%L %v");
    AddLogSink(sink_);
  }
  ~LogCapture() { RemoveLogSink(sink_); }
  LogCapture(const LogCapture&) = delete;
  LogCapture& operator=(const LogCapture&) = delete;

  // Each line with its level and message (a manager that sets its identity
  // gives every sink stderr's pattern from then on).
  std::vector<std::string> Lines() const { return sink_->last_formatted(); }
  // The lines that contain `needle`.
  std::vector<std::string> Matching(std::string_view needle) const {
    std::vector<std::string> out;
    for (std::string& line : Lines())
      if (line.find(needle) != std::string::npos) out.push_back(std::move(line));
    return out;
  }

 private:
  std::shared_ptr<spdlog::sinks::ringbuffer_sink_mt> sink_;
};

}  // namespace kvbridge::internal::testing

// Minimal leveled logging to stderr: "2026-12-02T15:04:05.123Z I tcp: message".
//
//   CANOPY_LOG(kInfo, "listening on {}", uri);
//
// Formatting uses fmt. The level threshold is process-wide, set once at start
// (SetLogLevel) or from $CANOPY_LOG (debug|info|warn|error). Each line is
// written with one write(2), so lines from different threads do not interleave.
#pragma once

#include <fmt/format.h>

#include <string_view>

namespace canopy {

enum class LogLevel : int { kDebug = 0, kInfo = 1, kWarn = 2, kError = 3, kOff = 4 };

void SetLogLevel(LogLevel level);
LogLevel GetLogLevel();
// Parses "debug", "info", "warn", "error", "off"; kInfo for anything else.
LogLevel ParseLogLevel(std::string_view name);
void LogLine(LogLevel level, std::string_view message);

}  // namespace canopy

#define CANOPY_LOG(level, ...)                                              \
  do {                                                                      \
    if (::canopy::LogLevel::level >= ::canopy::GetLogLevel())               \
      ::canopy::LogLine(::canopy::LogLevel::level, fmt::format(__VA_ARGS__)); \
  } while (0)

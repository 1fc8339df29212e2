#include "base/logging.h"

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <ctime>
#include <string>

namespace canopy {
namespace {

LogLevel InitialLevel() {
  const char* env = std::getenv("CANOPY_LOG");
  return env ? ParseLogLevel(env) : LogLevel::kInfo;
}

std::atomic<int>& LevelCell() {
  static std::atomic<int> level{static_cast<int>(InitialLevel())};
  return level;
}

}  // namespace

void SetLogLevel(LogLevel level) { LevelCell().store(static_cast<int>(level)); }
LogLevel GetLogLevel() { return static_cast<LogLevel>(LevelCell().load(std::memory_order_relaxed)); }

LogLevel ParseLogLevel(std::string_view name) {
  if (name == "debug") return LogLevel::kDebug;
  if (name == "warn") return LogLevel::kWarn;
  if (name == "error") return LogLevel::kError;
  if (name == "off") return LogLevel::kOff;
  return LogLevel::kInfo;
}

void LogLine(LogLevel level, std::string_view message) {
  using namespace std::chrono;
  auto now = system_clock::now();
  std::time_t secs = system_clock::to_time_t(now);
  auto millis = duration_cast<milliseconds>(now.time_since_epoch()).count() % 1000;
  std::tm tm;
  gmtime_r(&secs, &tm);
  static constexpr char kLetters[] = "DIWE";
  std::string line = fmt::format("{:04}-{:02}-{:02}T{:02}:{:02}:{:02}.{:03}Z {} {}\n", tm.tm_year + 1900,
                                 tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec, millis,
                                 kLetters[static_cast<int>(level) & 3], message);
  ssize_t ignored = ::write(STDERR_FILENO, line.data(), line.size());
  (void)ignored;
}

}  // namespace canopy

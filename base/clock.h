// Monotonic time helpers and a Deadline value for bounded waits.
// Thread safety: pure values.
#pragma once

#include <chrono>
#include <cstdint>

namespace canopy {

using Clock = std::chrono::steady_clock;

inline uint64_t NowNanos() {
  return static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch()).count());
}

// A point in time after which an operation gives up. Deadline::Infinite()
// never expires.
class Deadline {
 public:
  static Deadline After(std::chrono::nanoseconds d) { return Deadline(Clock::now() + d); }
  static Deadline Infinite() { return Deadline(Clock::time_point::max()); }
  bool expired() const { return Clock::now() >= at_; }
  bool infinite() const { return at_ == Clock::time_point::max(); }
  // Remaining time, clamped at zero; a large value for Infinite().
  std::chrono::milliseconds remaining() const {
    if (infinite()) return std::chrono::hours(24 * 365);
    auto left = at_ - Clock::now();
    if (left <= Clock::duration::zero()) return std::chrono::milliseconds(0);
    return std::chrono::ceil<std::chrono::milliseconds>(left);
  }
  // Remaining milliseconds as an int for poll/epoll_wait: -1 when infinite.
  int poll_timeout_ms() const {
    if (infinite()) return -1;
    auto ms = remaining().count();
    return ms > 1'000'000'000 ? 1'000'000'000 : static_cast<int>(ms);
  }
  Clock::time_point at() const { return at_; }

 private:
  explicit Deadline(Clock::time_point at) : at_(at) {}
  Clock::time_point at_;
};

}  // namespace canopy

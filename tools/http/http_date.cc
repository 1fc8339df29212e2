#include "tools/http/http_date.h"

#include <fmt/format.h>

namespace canopy::http {
namespace {

constexpr const char* kDays[] = {"Sun", "Mon", "Tue", "Wed", "Thu", "Fri", "Sat"};
constexpr const char* kMonths[] = {"Jan", "Feb", "Mar", "Apr", "May", "Jun",
                                   "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"};

}  // namespace

std::string HttpDate(std::time_t t) {
  std::tm tm;
  gmtime_r(&t, &tm);
  return fmt::format("{}, {:02} {} {:04} {:02}:{:02}:{:02} GMT", kDays[tm.tm_wday % 7], tm.tm_mday,
                     kMonths[tm.tm_mon % 12], tm.tm_year + 1900, tm.tm_hour, tm.tm_min, tm.tm_sec);
}

std::string ClfDate(std::time_t t) {
  std::tm tm;
  gmtime_r(&t, &tm);
  return fmt::format("{:02}/{}/{:04}:{:02}:{:02}:{:02} +0000", tm.tm_mday, kMonths[tm.tm_mon % 12],
                     tm.tm_year + 1900, tm.tm_hour, tm.tm_min, tm.tm_sec);
}

}  // namespace canopy::http

// Time formats used by HTTP and its logs. Thread safety: pure functions.
#pragma once

#include <ctime>
#include <string>

namespace canopy::http {

// IMF-fixdate, e.g. "Wed, 02 Dec 2026 15:40:17 GMT" (Date, Last-Modified).
std::string HttpDate(std::time_t t);
// Common Log Format time, e.g. "02/Dec/2026:15:40:17 +0000" (UTC).
std::string ClfDate(std::time_t t);

}  // namespace canopy::http

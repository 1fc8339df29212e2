#include "base/units.h"

#include <cctype>
#include <cmath>

#include "fmt/format.h"

namespace canopy {

Result<uint64_t> ParseByteSize(std::string_view text, bool allow_zero) {
  auto bad = [&](std::string_view why) {
    return Status::InvalidArgument("bad size '" + std::string(text) + "': " + std::string(why) +
                                   " (e.g. 65536, 64K, 4M, 1G)");
  };
  size_t i = 0;
  uint64_t value = 0;
  while (i < text.size() && std::isdigit(static_cast<unsigned char>(text[i]))) {
    uint64_t digit = static_cast<uint64_t>(text[i] - '0');
    if (value > (UINT64_MAX - digit) / 10) return bad("too large");
    value = value * 10 + digit;
    ++i;
  }
  if (i == 0) return bad("no number");
  std::string unit;
  for (char c : text.substr(i)) unit.push_back(static_cast<char>(std::tolower(static_cast<unsigned char>(c))));
  uint64_t multiple = 1;
  if (unit.empty() || unit == "b") {
    multiple = 1;
  } else if (unit == "k" || unit == "kib") {
    multiple = 1ull << 10;
  } else if (unit == "m" || unit == "mib") {
    multiple = 1ull << 20;
  } else if (unit == "g" || unit == "gib") {
    multiple = 1ull << 30;
  } else if (unit == "t" || unit == "tib") {
    multiple = 1ull << 40;
  } else if (unit == "kb") {
    multiple = 1000;
  } else if (unit == "mb") {
    multiple = 1000 * 1000;
  } else if (unit == "gb") {
    multiple = 1000ull * 1000 * 1000;
  } else {
    return bad("unknown unit");
  }
  if (value > UINT64_MAX / multiple) return bad("too large");
  value *= multiple;
  if (value == 0 && !allow_zero) return bad("must be greater than 0");
  return value;
}

std::string FormatBytes(uint64_t bytes) {
  if (bytes < 1024) return fmt::format("{} B", bytes);
  const char* units[] = {"KiB", "MiB", "GiB", "TiB", "PiB"};
  double v = static_cast<double>(bytes) / 1024.0;
  int u = 0;
  while (v >= 1024.0 && u < 4) {
    v /= 1024.0;
    ++u;
  }
  return fmt::format("{:.{}f} {}", v, v < 10 ? 2 : 1, units[u]);
}

Result<uint64_t> ParseBitRate(std::string_view text, bool allow_zero) {
  auto bad = [&](std::string_view why) {
    return Status::InvalidArgument("bad bit rate '" + std::string(text) + "': " + std::string(why) +
                                   " (bits per second, decimal: e.g. 800k, 80M, 2.5G)");
  };
  size_t i = 0;
  long double value = 0;
  size_t digits = 0;
  while (i < text.size() && std::isdigit(static_cast<unsigned char>(text[i]))) {
    value = value * 10 + (text[i] - '0');
    ++i;
    ++digits;
    if (digits > 30) return bad("too large");
  }
  if (i < text.size() && text[i] == '.') {
    ++i;
    long double scale = 0.1L;
    size_t fraction_digits = 0;
    while (i < text.size() && std::isdigit(static_cast<unsigned char>(text[i]))) {
      value += (text[i] - '0') * scale;
      scale /= 10;
      ++i;
      ++fraction_digits;
    }
    if (fraction_digits == 0) return bad("no digits after '.'");
    digits += fraction_digits;
  }
  if (digits == 0) return bad("no number");
  std::string unit;
  for (char c : text.substr(i)) unit.push_back(static_cast<char>(std::tolower(static_cast<unsigned char>(c))));
  long double multiple = 1;
  if (!unit.empty() && (unit[0] == 'k' || unit[0] == 'm' || unit[0] == 'g' || unit[0] == 't')) {
    multiple = unit[0] == 'k' ? 1e3L : unit[0] == 'm' ? 1e6L : unit[0] == 'g' ? 1e9L : 1e12L;
    unit.erase(0, 1);
  }
  if (!unit.empty() && unit != "bit/s" && unit != "bps" && unit != "b/s") return bad("unknown unit");
  long double rate = std::round(value * multiple);
  if (rate == 0 && value == 0) {
    if (!allow_zero) return bad("must be greater than 0");
    return uint64_t{0};
  }
  if (rate < 1) return bad("below 1 bit/s");
  if (rate > 9.2e18L) return bad("too large");
  return static_cast<uint64_t>(rate);
}

std::string FormatBitRate(uint64_t bits_per_second) {
  if (bits_per_second < 1000) return fmt::format("{} bit/s", bits_per_second);
  const char* units[] = {"kbit/s", "Mbit/s", "Gbit/s", "Tbit/s", "Pbit/s", "Ebit/s"};
  double v = static_cast<double>(bits_per_second) / 1000.0;
  int u = 0;
  while (v >= 1000.0 && u < 5) {
    v /= 1000.0;
    ++u;
  }
  return fmt::format("{:.{}f} {}", v, v < 10 ? 2 : 1, units[u]);
}

}  // namespace canopy

#include "base/units.h"

#include <cctype>

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

}  // namespace canopy

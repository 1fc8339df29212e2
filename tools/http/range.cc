#include "tools/http/range.h"

#include "tools/http/message.h"

namespace canopy::http {
namespace {

std::string_view Trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

bool ParseNumber(std::string_view s, uint64_t* out) {
  if (s.empty() || s.size() > 19) return false;
  uint64_t v = 0;
  for (char c : s) {
    if (c < '0' || c > '9') return false;
    v = v * 10 + static_cast<uint64_t>(c - '0');
  }
  *out = v;
  return true;
}

}  // namespace

RangeResult ParseRange(std::string_view value, uint64_t size, ByteRange* range) {
  value = Trim(value);
  size_t eq = value.find('=');
  if (eq == std::string_view::npos || !EqualsIgnoreCase(Trim(value.substr(0, eq)), "bytes")) {
    return RangeResult::kIgnore;
  }
  std::string_view spec = Trim(value.substr(eq + 1));
  if (spec.find(',') != std::string_view::npos) return RangeResult::kIgnore;  // multipart not served
  size_t dash = spec.find('-');
  if (dash == std::string_view::npos) return RangeResult::kIgnore;
  std::string_view a = Trim(spec.substr(0, dash));
  std::string_view b = Trim(spec.substr(dash + 1));
  uint64_t first = 0;
  uint64_t last = 0;
  if (a.empty()) {  // suffix: the last n bytes
    uint64_t n = 0;
    if (!ParseNumber(b, &n)) return RangeResult::kIgnore;
    if (n == 0 || size == 0) return RangeResult::kUnsatisfiable;
    if (n > size) n = size;
    range->first = size - n;
    range->length = n;
    return RangeResult::kSatisfiable;
  }
  if (!ParseNumber(a, &first)) return RangeResult::kIgnore;
  if (b.empty()) {
    last = size == 0 ? 0 : size - 1;
  } else {
    if (!ParseNumber(b, &last) || last < first) return RangeResult::kIgnore;
    if (size > 0 && last >= size) last = size - 1;
  }
  if (first >= size) return RangeResult::kUnsatisfiable;
  range->first = first;
  range->length = last - first + 1;
  return RangeResult::kSatisfiable;
}

}  // namespace canopy::http

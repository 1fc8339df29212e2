// Single byte ranges (RFC 9110 §14): "bytes=a-b", "bytes=a-", "bytes=-n".
// Thread safety: pure functions.
#pragma once

#include <cstdint>
#include <string_view>

namespace canopy::http {

struct ByteRange {
  uint64_t first = 0;
  uint64_t length = 0;  // bytes [first, first + length)
};

enum class RangeResult {
  kIgnore,          // no usable single range (syntax error, several ranges, other unit): send 200
  kSatisfiable,     // send 206 with *range
  kUnsatisfiable,   // send 416 with "Content-Range: bytes */size"
};

// Interprets a Range header value against a representation of `size` bytes.
// "a-b" with b >= size is clipped to the end; "-n" with n > size means the
// whole file; "a-" or "a-b" with a >= size and "-0" are unsatisfiable.
RangeResult ParseRange(std::string_view value, uint64_t size, ByteRange* range);

}  // namespace canopy::http

#include "base/crc32c.h"

#include <isa-l/crc.h>

#include <algorithm>

namespace canopy::crc32c {

uint32_t Extend(uint32_t crc, const void* data, size_t n) {
  // ISA-L's crc32_iscsi works on the raw register (no final inversion) and
  // takes an int length, so invert around it and feed it bounded pieces.
  uint32_t reg = ~crc;
  auto* p = static_cast<unsigned char*>(const_cast<void*>(data));
  constexpr size_t kMaxPiece = size_t{1} << 30;
  while (n > 0) {
    size_t piece = std::min(n, kMaxPiece);
    reg = crc32_iscsi(p, static_cast<int>(piece), reg);
    p += piece;
    n -= piece;
  }
  return ~reg;
}

}  // namespace canopy::crc32c

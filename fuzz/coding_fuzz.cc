// Fuzzes the bounds-checked ByteReader: a program of reads driven by the input
// itself must never read out of bounds, whatever the bytes say.
#include <cstdint>
#include <string_view>

#include "base/coding.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view in(reinterpret_cast<const char*>(data), size);
  canopy::ByteReader r(in);
  while (!r.empty()) {
    auto op = r.ReadFixed8();
    if (!op.ok()) break;
    bool ok = true;
    switch (*op % 6) {
      case 0: ok = r.ReadFixed16().ok(); break;
      case 1: ok = r.ReadFixed32().ok(); break;
      case 2: ok = r.ReadFixed64().ok(); break;
      case 3: ok = r.ReadVarint64().ok(); break;
      case 4: ok = r.ReadLengthPrefixed(1 << 16).ok(); break;
      case 5: ok = r.ReadVarintBounded(1000, "count").ok(); break;
    }
    if (!ok) break;
  }
  return 0;
}

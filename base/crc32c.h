// CRC32C (Castagnoli), the checksum of every frame, WAL record and snapshot
// chunk in canopy. Backed by ISA-L (hardware-accelerated where the CPU has
// SSE4.2/PCLMUL). Standard parameters: Crc32c("123456789") == 0xE3069283.
//
// Thread safety: pure functions.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace canopy::crc32c {

// CRC of data[0, n) continuing from the CRC `crc` of preceding bytes
// (use 0 for the first piece): Extend(Value(a), b) == Value(a + b).
uint32_t Extend(uint32_t crc, const void* data, size_t n);

inline uint32_t Value(const void* data, size_t n) { return Extend(0, data, n); }
inline uint32_t Value(std::string_view bytes) { return Extend(0, bytes.data(), bytes.size()); }

}  // namespace canopy::crc32c

// Byte sizes on command lines and in reports (shared by every tool).
// Thread safety: pure functions.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "base/result.h"

namespace canopy {

// "4096", "64k", "64K", "64KiB", "4M", "4MiB", "1G", "1GiB" (binary multiples
// of 1024); also "1kB"/"1MB"/"1GB" as decimal (1000). InvalidArgument for
// anything else, for 0 when !allow_zero, and on overflow.
Result<uint64_t> ParseByteSize(std::string_view text, bool allow_zero = false);

// "0 B", "512 B", "4.0 KiB", "1.50 GiB".
std::string FormatBytes(uint64_t bytes);

}  // namespace canopy

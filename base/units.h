// Byte sizes and bit rates on command lines and in reports (shared by every tool).
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

// A bit rate in bits per second, decimal as iperf3 -b: "1000000", "500k",
// "80M", "2.5G", "1T" (k/M/G/T = 10^3/10^6/10^9/10^12, either case), with an
// optional "bit/s", "bps" or "b/s" after the multiple ("80Mbit/s"). Fractions
// are allowed ("2.5G"); the result is rounded to whole bits per second.
// InvalidArgument for anything else, for 0 when !allow_zero, below 1 bit/s
// and beyond 2^63 bit/s.
Result<uint64_t> ParseBitRate(std::string_view text, bool allow_zero = false);

// "950 bit/s", "80.0 Mbit/s", "2.50 Gbit/s" (decimal multiples).
std::string FormatBitRate(uint64_t bits_per_second);

}  // namespace canopy

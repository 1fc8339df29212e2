// Helpers shared by the in-process benchmark binaries (tree_bench,
// versions_bench): the process's resident set and a fatal-error exit.
// Benchmarks only: no library code depends on this header.
#pragma once

#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>

#include "base/status.h"

namespace canopy::bench {

// Resident set size of this process in bytes (/proc/self/statm).
inline uint64_t RssBytes() {
  std::ifstream statm("/proc/self/statm");
  uint64_t size = 0, resident = 0;
  statm >> size >> resident;
  return resident * static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
}

// Prints "TOOL: WHAT: STATUS" on stderr and exits 1.
[[noreturn]] inline void Die(const char* tool, const std::string& what, const Status& s) {
  std::fprintf(stderr, "%s: %s: %s\n", tool, what.c_str(), s.ToString().c_str());
  std::exit(1);
}

}  // namespace canopy::bench
